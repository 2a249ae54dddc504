//! The filesystem operations of the core, by syscall family: lookup and
//! attributes (`lookup.rs`), listings (`listing.rs`), file I/O
//! (`files.rs`), changes to the tree (`tree.rs`), a node's move
//! (`moves.rs`).

use crate::core::Draft;
use crate::core::Slot;
use crate::store::NodeRec;
use std::sync::Arc;
use std::sync::Mutex;
mod files;
mod listing;
mod lookup;
mod moves;
mod tree;

use super::commit::{blob_bytes, Intent};
use super::inodes::Key;
use crate::schema::place::NODE_FILES;

/// A node as one caller sees it: its visible committed record and, for
/// writers, its draft.
pub(in crate::core) type NodeView = (Option<NodeRec>, Option<Arc<Mutex<Draft>>>);

/// Entries handed to one readdir reply at most (a reply buffer holds fewer).
pub(in crate::core) const READDIR_BATCH: usize = 1024;

/// Directory listings kept between the readdir calls of one reading.
pub(in crate::core) const MAX_LISTINGS: usize = 4096;

pub(in crate::core) fn arc(s: &str) -> Arc<str> {
    Arc::from(s)
}

pub(in crate::core) fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

use crate::locks::{read as read_lock, write as write_lock};

/// The file names of a node as a writer sees them, in protocol order.
pub(super) fn view_names(rec: Option<&NodeRec>, draft: Option<&Draft>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if let Some(r) = rec {
        names.extend(r.files.iter().map(|f| f.name.clone()));
    }
    if let Some(d) = draft {
        for (n, s) in &d.files {
            match s {
                Slot::File(_) => names.push(n.clone()),
                Slot::Whiteout => names.retain(|x| x != n),
            }
        }
    }
    names.sort_by_key(|n| {
        (
            NODE_FILES.iter().position(|x| x == n).unwrap_or(usize::MAX),
            n.clone(),
        )
    });
    names.dedup();
    names
}
