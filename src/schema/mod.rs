//! The vocabulary every layer shares, with no state and no I/O: the tree's
//! places and names, node status, the outbox event, counter keys, time, the
//! summaries a commit derives and the redaction of secrets. It imports
//! nothing of ours but `error`.

pub mod counters;
pub mod derive;
pub mod event;
pub mod names;
pub mod place;
pub mod redact;
pub mod time;

use serde::{Deserialize, Serialize};

/// The status of a committed node version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
pub enum Status {
    Active,
    Archived,
    Broken,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "ACTIVE",
            Status::Archived => "ARCHIVED",
            Status::Broken => "BROKEN",
        }
    }
    pub fn all() -> [Status; 3] {
        [Status::Active, Status::Archived, Status::Broken]
    }
}
