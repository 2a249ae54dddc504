//! The indexer thread: woken by commits and `.ctxfs/sync`, it drains the
//! outbox batch by batch; when idle it rebuilds graphs full of tombstones
//! and dumps changed graphs.

use crate::error::Error;
use crate::error::Result;
use crate::index::AccountIndex;

use std::sync::Arc;

use crate::index::BATCH;

use std::time::Duration;

use crate::index::Index;

use std::time::Instant;

use crate::index::LabeledVec;

use crate::index::ann;

use crate::index::rlock;

use crate::index::wlock;

use crate::locks::lock;
use std::sync::atomic::Ordering;
/// The leadership role of the indexer on a shared store.
pub(super) const LEADER_ROLE: &str = "indexer";

impl Index {
    pub fn start(self: &Arc<Self>) -> Result<()> {
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name("ctxfs-index".into())
            .spawn(move || me.run())
            .map_err(|e| Error::store_from("cannot start the indexer", e))?;
        *lock(&self.thread) = Some(h);
        Ok(())
    }

    /// Stop the indexer at its next text batch (the events of the batch
    /// under way stay in the outbox, for the next mount), then write the
    /// graph dumps.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.notify();
        if let Some(h) = lock(&self.thread).take() {
            let t = Instant::now();
            let _ = h.join();
            tracing::info!(
                waited_ms = t.elapsed().as_millis() as u64,
                "indexer stopped"
            );
        }
        self.dump_all();
    }

    /// Something was committed: look at the outbox soon.
    pub fn notify(&self) {
        lock(&self.progress).wake = true;
        self.cv.notify_all();
    }

    pub(super) fn run(self: Arc<Self>) {
        self.running.store(true, Ordering::SeqCst);
        // Load every indexed account up front, so the first search is fast;
        // not from a shared store, whose accounts are many daemons' (each
        // loads those its users touch).
        let up_front = if self.store.shared() {
            Ok(Vec::new())
        } else {
            self.stored_accounts()
        };
        match up_front {
            Ok(accts) => {
                for a in accts {
                    if self.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Err(e) = self.account(&a) {
                        tracing::error!(account = %a, "cannot load index: {e}");
                    }
                }
            }
            Err(e) => tracing::error!("cannot list indexed accounts: {e}"),
        }
        // Lexical search works from here; then the graphs.
        self.ensure_all_vectors();
        // On a shared store one daemon at a time indexes (it allocates the
        // graph labels of every account); the others follow its documents
        // through the change feed (`Index::evict`).
        let mut leading = self.store.leader(LEADER_ROLE);
        if leading {
            self.catch_up_as_leader();
        }
        let mut last_work = Instant::now();
        let mut last_rebuild_check = Instant::now();
        while !self.stop.load(Ordering::SeqCst) {
            // Accounts a search loaded meanwhile get their graphs here.
            self.ensure_all_vectors();
            let scan = {
                let mut p = lock(&self.progress);
                p.started += 1;
                p.wake = false;
                p.started
            };
            let head = match self.store.outbox_head(BATCH * 4) {
                Ok(h) => h,
                Err(e) => {
                    tracing::error!("indexer cannot read the outbox: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            {
                let mut p = lock(&self.progress);
                p.published = (scan, head.first().map(|e| e.seq).unwrap_or(u64::MAX));
            }
            self.cv.notify_all();
            if !leading {
                if self.store.leader(LEADER_ROLE) {
                    // Taken over (the leader died): start from the store's
                    // documents, not what this daemon held of them.
                    leading = true;
                    self.evict_all();
                    self.catch_up_as_leader();
                    continue;
                }
                let p = lock(&self.progress);
                if !p.wake {
                    let _ = self.cv.wait_timeout(p, Duration::from_millis(500));
                }
                continue;
            }
            let (ready, next_retry) = self.select(&head);
            if !ready.is_empty() {
                if let Err(e) = self.process(ready) {
                    tracing::error!("indexer step failed: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                last_work = Instant::now();
                // Under a steady stream of updates the indexer is never idle:
                // rebuild graphs full of tombstones now and then anyway, so
                // memory follows the live vectors, not every version ever.
                if last_rebuild_check.elapsed() >= Duration::from_secs(10) {
                    self.rebuild_tombstoned();
                    last_rebuild_check = Instant::now();
                }
                continue;
            }
            // Idle: maybe rebuild or dump, then wait.
            if last_work.elapsed() >= self.cfg.dump_after {
                self.maintain();
                last_work = Instant::now();
            }
            let wait = next_retry
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(1))
                .min(Duration::from_secs(1));
            let p = lock(&self.progress);
            if !p.wake {
                let _ = self.cv.wait_timeout(p, wait.max(Duration::from_millis(5)));
            }
        }
        self.running.store(false, Ordering::SeqCst);
    }

    /// What the indexer does when it starts to lead: models changed, nodes
    /// the index lacks.
    fn catch_up_as_leader(&self) {
        if let Err(e) = self.reindex_stale_models() {
            tracing::error!("reindex after a model change failed: {e}");
        }
        if let Err(e) = self.index_unindexed() {
            tracing::error!("indexing nodes the index lacks failed: {e}");
        }
    }

    /// Rebuild graphs with many tombstones; dump changed graphs.
    pub(super) fn maintain(&self) {
        self.rebuild_tombstoned();
        self.dump_all();
    }

    /// Free what deleted vectors hold: a graph whose tombstones outnumber
    /// a quarter of its live vectors is rebuilt from the live ones; one
    /// whose account shrank to the exact-search size is dropped (exact
    /// search needs no graph). The tombstones of any size of account go,
    /// not only of large ones, so memory follows the live vectors without
    /// a restart.
    pub(super) fn rebuild_tombstoned(&self) {
        let accts = self.loaded_accounts();
        for ai in accts {
            if ai.ready.load(Ordering::Acquire) {
                self.tidy_graph(&ai, false);
            }
        }
    }

    /// One account's graph against its live vectors: dropped when the
    /// account is back at the exact-search size, rebuilt when tombstones
    /// outnumber a quarter of the live vectors, and (with `grow`) built
    /// when the account passed the exact-search size.
    pub(super) fn tidy_graph(&self, ai: &AccountIndex, grow: bool) {
        let (dead, live, graphed) = {
            let st = rlock(&ai.st);
            (st.dead.len(), st.vecs.len(), st.graphed)
        };
        if graphed && dead > 0 && live <= self.cfg.exact_scope {
            self.drop_graph(ai);
        } else if (dead >= 16 && dead * 4 > live)
            || (grow && !graphed && live > self.cfg.exact_scope)
        {
            self.rebuild(ai);
        }
    }

    /// An account back at the exact-search size: its graph goes, with its
    /// tombstones (exact search over the live vectors answers).
    fn drop_graph(&self, ai: &AccountIndex) {
        *wlock(&ai.graph) = Arc::new(ann::build(&self.cfg.ann, &[]));
        let mut st = wlock(&ai.st);
        st.dead.clear();
        st.graphed = false;
        st.dirty = true;
        tracing::info!(account = %ai.name, vectors = st.vecs.len(), "graph dropped: exact search from here");
    }

    /// Build a new graph from the live vectors and swap it in (also the
    /// first graph of an account that grew past `EXACT_SCOPE` records).
    pub fn rebuild(&self, ai: &AccountIndex) {
        let t0 = Instant::now();
        let items: Vec<LabeledVec> = {
            let st = rlock(&ai.st);
            st.vecs.iter().map(|(l, v)| (*l, v.clone())).collect()
        };
        let g = ann::build(&self.cfg.ann, &items);
        // Only the indexer thread changes vectors, and it is here: nothing
        // changed since the snapshot.
        *wlock(&ai.graph) = Arc::new(g);
        let mut st = wlock(&ai.st);
        st.dead.clear();
        st.graphed = true;
        st.dirty = true;
        tracing::info!(account = %ai.name, vectors = items.len(), ms = t0.elapsed().as_millis() as u64, "graph rebuilt");
    }

    /// Dump every graph changed since its last dump.
    pub(super) fn dump_all(&self) {
        if !self.cfg.dumps {
            return;
        }
        let accts = self.loaded_accounts();
        for ai in accts {
            // Never dump a graph that is not loaded yet over the real one.
            if !ai.ready.load(Ordering::Acquire) {
                continue;
            }
            let (dirty, graphed) = {
                let st = rlock(&ai.st);
                (st.dirty, st.graphed)
            };
            if !dirty {
                continue;
            }
            // No graph (a small account): nothing to dump, and a dump from
            // when it was larger goes (its vectors are in the store).
            if !graphed {
                let dir = self.graph_dir(&ai.name);
                if dir.exists() {
                    if let Err(e) = std::fs::remove_dir_all(&dir) {
                        tracing::error!(account = %ai.name, "cannot remove the old graph dump: {e}");
                        continue;
                    }
                }
                wlock(&ai.st).dirty = false;
                continue;
            }
            let g = rlock(&ai.graph).clone();
            let t0 = Instant::now();
            match ann::dump(&g, &self.graph_dir(&ai.name)) {
                Ok(()) => {
                    wlock(&ai.st).dirty = false;
                    self.stats.dumps.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(account = %ai.name, ms = t0.elapsed().as_millis() as u64, "graph dumped");
                }
                Err(e) => tracing::error!(account = %ai.name, "graph dump failed: {e}"),
            }
        }
    }
}
