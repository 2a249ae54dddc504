//! The commit point (CONTRACT §4): the rules a version must satisfy
//! (`rules.rs`), the pure decision of what a commit makes of a node
//! (`plan.rs`), and carrying it out in one store transaction (`apply.rs`).

mod apply;
mod batch;
mod plan;
pub mod rules;

pub(crate) use self::apply::blob_bytes;
pub use self::apply::Committed;
pub(crate) use self::batch::BatchHandle;
pub use self::batch::MAX_BATCH_NODES;
pub use self::plan::{Content, Intent, Outcome, Plan, Refusal, View};
pub use self::rules::{Derived, MetaIntent};
