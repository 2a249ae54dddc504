//! The per-daemon cache of node records and directories.

use crate::locks::lock;
use crate::store::{NodeRec, Op};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Node records and directory existence as last read, so the many lookups
/// of one write cost no round trip each. An entry goes when this daemon
/// changes it (after its transaction) or the feed says another did (before
/// the core hears of it); a read that raced a change is not kept (the
/// epoch moved). Commits never trust it: their compare-and-set reads the
/// row in the transaction, and a conflict drops the entry.
#[derive(Default)]
pub(super) struct Cache {
    pub(super) epoch: AtomicU64,
    pub(super) nodes: Mutex<std::collections::HashMap<String, Option<NodeRec>>>,
    pub(super) dirs: Mutex<std::collections::HashMap<String, bool>>,
}

pub(super) const CACHE_MAX: usize = 200_000;

impl Cache {
    pub(super) fn forget(&self, paths: &[&str]) {
        if paths.is_empty() {
            return;
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let mut n = lock(&self.nodes);
        let mut d = lock(&self.dirs);
        for p in paths {
            n.remove(*p);
            d.remove(*p);
        }
    }

    /// What this daemon's own transaction, just committed, wrote: the
    /// entries of its paths become the values written (a commit's next
    /// lookups of its node and directories cost no round trip).
    pub(super) fn learn(&self, ops: &[Op]) {
        // Transactions that touch no node or directory (the indexer's) do
        // not move the epoch: reads racing them stay cached.
        if !ops.iter().any(|o| touched(o).is_some()) {
            return;
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let mut n = lock(&self.nodes);
        let mut d = lock(&self.dirs);
        if n.len() >= CACHE_MAX {
            n.clear();
        }
        if d.len() >= CACHE_MAX {
            d.clear();
        }
        for op in ops {
            match op {
                Op::PutNode { path, rec } => {
                    n.insert(path.clone(), Some(rec.clone()));
                }
                Op::DelNode { path } => {
                    n.insert(path.clone(), None);
                }
                Op::PutDir { path } => {
                    d.insert(path.clone(), true);
                }
                Op::DelDir { path } => {
                    d.insert(path.clone(), false);
                }
                _ => {}
            }
        }
    }

    pub(super) fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        lock(&self.nodes).clear();
        lock(&self.dirs).clear();
    }
}

/// The paths whose cached node record or directory `op` changes.
pub(super) fn touched(op: &Op) -> Option<&str> {
    match op {
        Op::PutNode { path, .. }
        | Op::DelNode { path }
        | Op::PutDir { path }
        | Op::DelDir { path }
        | Op::Expect { path, .. } => Some(path),
        _ => None,
    }
}
