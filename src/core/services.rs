//! What the daemon attaches to the core once it runs: the search index,
//! the inbox's extraction service, the redaction policy and the prefixes
//! never indexed. Each is set once at start; until then (and in tests that
//! set none) the core works without it.

use super::inbox::Inbox;
use super::search::SyncWaiters;
use crate::config::RedactionPolicy;
use crate::index::Index;
use std::sync::{Arc, OnceLock};

#[derive(Default)]
pub(crate) struct Services {
    index: OnceLock<Arc<Index>>,
    /// Memory extraction from conversations (with `[llm]` in the config).
    inbox: OnceLock<Arc<Inbox>>,
    /// Secrets replaced at commit; the built-in policy until one is set.
    redaction: OnceLock<RedactionPolicy>,
    /// Paths never indexed (the accounts' `unindexed` prefixes).
    unindexed: OnceLock<Vec<String>>,
    /// Reads of `.ctxfs/sync` waiting now.
    pub(super) sync_waiters: SyncWaiters,
    /// Where each uid's view is mounted (`--views DIR`: `DIR/UID`).
    views: OnceLock<std::path::PathBuf>,
}

impl Services {
    pub(super) fn set_index(&self, index: Arc<Index>) {
        let _ = self.index.set(index);
    }

    pub(crate) fn index(&self) -> Option<&Arc<Index>> {
        self.index.get()
    }

    pub(super) fn set_inbox(&self, inbox: Arc<Inbox>) {
        let _ = self.inbox.set(inbox);
    }

    pub(crate) fn inbox(&self) -> Option<&Arc<Inbox>> {
        self.inbox.get()
    }

    pub(super) fn set_redaction(&self, policy: RedactionPolicy) {
        let _ = self.redaction.set(policy);
    }

    pub(super) fn redaction(&self) -> &RedactionPolicy {
        self.redaction.get_or_init(Default::default)
    }

    pub(super) fn set_views(&self, dir: std::path::PathBuf) {
        let _ = self.views.set(dir);
    }

    /// The directory of the views, when the daemon mounted them.
    pub(crate) fn views(&self) -> Option<&std::path::Path> {
        self.views.get().map(|p| p.as_path())
    }

    pub(super) fn set_unindexed(&self, prefixes: Vec<String>) {
        let _ = self.unindexed.set(prefixes);
    }

    /// Is `path` under one of the unindexed prefixes?
    pub(crate) fn is_unindexed(&self, path: &str) -> bool {
        self.unindexed
            .get()
            .is_some_and(|v| crate::index::under_any(v, path))
    }
}
