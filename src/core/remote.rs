//! Changes other daemons made to a shared store (the change feed, see
//! `store::Store::watch`), applied to what this daemon and its kernel
//! cache: dentries, attributes and pages of the nodes, directories and
//! scratchpad entries that changed, the expiry times it checks on every
//! lookup, and the search index documents that changed (applied in place).
//! Runs on the feed's task, never on a FUSE thread: invalidations are queued
//! to the invalidation thread.

use super::kcache::Target;
use super::Fs;
use crate::schema::place;
use crate::store::{ChangeKind, RemoteChange};

impl Fs {
    /// Apply a batch of other daemons' changes, in commit order.
    pub fn remote_changes(&self, changes: Vec<RemoteChange>) {
        let mut targets = Vec::new();
        let mut docs = Vec::new();
        // Expiry times first: a node that expires must never be cached by
        // the kernel, so the lookups its invalidation causes must know.
        let expiry = changes
            .iter()
            .any(|c| matches!(c.kind, ChangeKind::Expiry | ChangeKind::Reset));
        if expiry {
            match self.store.expiries() {
                Ok(all) => self.expiry.replace(all),
                Err(e) => tracing::warn!("change feed: cannot reload expiry times: {e}"),
            }
        }
        for c in &changes {
            match c.kind {
                ChangeKind::Node => {
                    let (parent, name) = place::parent_name(&c.path);
                    targets.extend(self.entry_targets(&c.path, &place::NODE_FILES));
                    targets.extend(self.entry_targets(parent, &[name]));
                    targets.extend(self.listing_targets(&[c.path.as_str(), parent]));
                    if let Some(ino) = self.dir_ino(&c.path) {
                        targets.push(Target::Inode(ino));
                    }
                    targets.extend(self.view_targets(&c.path));
                }
                ChangeKind::Dir | ChangeKind::Scratch => {
                    let (parent, name) = place::parent_name(&c.path);
                    targets.extend(self.entry_targets(parent, &[name]));
                    targets.extend(self.listing_targets(&[c.path.as_str(), parent]));
                    if let Some(ino) = self.scratch_ino(&c.path) {
                        targets.push(Target::Inode(ino));
                    }
                    if c.kind == ChangeKind::Dir {
                        targets.extend(self.view_targets(&c.path));
                    }
                }
                ChangeKind::Ix => docs.push(c.path.clone()),
                ChangeKind::Expiry => {}
                ChangeKind::Reset => {
                    tracing::warn!("change feed: changes were missed; dropping every cache");
                    targets.extend(self.all_inode_targets());
                    // A view's node entry names a version: walk them anew.
                    targets.extend(self.all_view_node_targets());
                    if let Some(ix) = self.services.index() {
                        ix.evict_all();
                    }
                }
            }
        }
        if let Some(ix) = self.services.index() {
            // The documents another daemon's indexer changed, in place: no
            // reload of the account (SEMANTICS "Several hosts").
            ix.apply_remote(&docs);
        }
        tracing::debug!(
            changes = changes.len(),
            invalidations = targets.len(),
            "remote changes"
        );
        self.send_inval(targets, false);
    }
}
