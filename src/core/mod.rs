//! Filesystem semantics without a kernel: the tree, drafts and the commit
//! point, visibility, tenancy. The FUSE adapter (`crate::fuse`) converts
//! arguments and calls these methods; tests call them directly.
//!
//! This file is the facade: the modules and what they export. `Fs` and
//! its parts are in `fs.rs`, the plain types in `types.rs`; each other
//! module adds the operations of one concern to `Fs`.

pub mod agent;
mod asof;
mod audit;
pub mod commit;
pub(crate) mod draft;
mod features;
mod flock;
pub mod forget;
mod fs;
mod handles;
mod ids;
pub mod inbox;
pub mod inodes;
mod kcache;
pub mod metrics;
pub mod ops;
pub mod quota;
pub mod recall;
mod remote;
pub mod repair;
pub mod scratch;
pub mod search;
mod services;
mod shown;
pub mod transfer;
pub mod ttl;
mod types;
pub mod versions;
mod view;

pub use self::draft::{DFile, Draft, Slot};
pub use self::fs::Fs;
pub(crate) use self::handles::{Control, DraftHandle, Handle, RestoreHandle};
pub use self::kcache::Target;
pub use self::metrics::LOG_LINES_DROPPED;
pub(crate) use self::types::{cookie, Listing};
pub use self::types::{
    signal_pending, Attr, Caller, DirBatch, DirEntry, Kind, Opened, SetAttr, Stats,
    DEFAULT_DRAFT_MEMORY, MAX_FILE_BYTES,
};
