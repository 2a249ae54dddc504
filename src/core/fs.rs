//! `Fs`: the core's state, built from parts that own their locks (ids,
//! scratchpads, the kernel's cache, limits, the daemon's services), and
//! what every operation shares: who may do what at a path, node locks,
//! handles and inodes, the committed node a caller sees.
//!
//! Lock order: node stripe → `drafts` map → one `Draft` → one `DFile`;
//! the inode table (`kernel.inodes`) and `handles` are leaf locks, never
//! held while taking another.

use super::draft::{self, Draft, Slot};
use super::handles::Handle;
use super::handles::Handles;
use super::inodes::Key;
use super::kcache::{self};
use super::metrics;
use super::{asof, ids, quota, scratch, services, shown, ttl, Caller};
use crate::config::{Access, Tenancy};
use crate::core::inbox;
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::schema::place;
#[allow(unused_imports)]
use crate::schema::time::{now_ns, ns_of, rfc3339, rfc3339_ms, time_of};
use crate::schema::{counters, names};
use crate::store::{NodeRec, Op, Status, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub struct Fs {
    pub(super) store: Arc<dyn Store>,
    /// The index, the inbox and the policies the daemon sets at start.
    pub(super) services: services::Services,
    pub(super) tenancy: Tenancy,
    /// Writes before their commit, and the node locks every change takes.
    pub(super) drafts: draft::Drafts,
    pub(super) handles: Handles,
    /// Project scratchpads: open buffers, their lock, `flock`s.
    pub(super) scratch: scratch::Scratchpads,
    /// Node, blob and event ids.
    pub(super) ids: ids::Ids,
    /// What every attribute shows whoever asks: the owner, and the
    /// daemon's start as the time of what has none of its own.
    pub(super) shown: shown::Shown,
    /// What the kernel was told and caches: the inode table, the thread
    /// that drops cache entries after changes, the committed-file inodes
    /// readers hold open through the cache.
    pub(super) kernel: kcache::Kernel,
    /// Requests, refusals and the node counters (`metrics.nodes`).
    pub metrics: metrics::Metrics,
    /// Nodes with an expiry time.
    pub(super) expiry: ttl::Expiry,
    /// Quotas, draft memory, the refusals' log budget.
    pub(super) limits: quota::Limits,
    /// Views of accounts as they stood at a time (`.as-of/`).
    pub(super) as_of: asof::Views,
}

impl Fs {
    pub fn new(store: Arc<dyn Store>, tenancy: Tenancy) -> Result<Arc<Fs>> {
        let fs = Fs {
            ids: ids::Ids::new(store.clone())?,
            store,
            tenancy,
            drafts: draft::Drafts::default(),
            handles: Handles::default(),
            scratch: Default::default(),
            services: Default::default(),
            limits: Default::default(),
            shown: shown::Shown::new(),
            kernel: Default::default(),
            metrics: metrics::Metrics::default(),
            expiry: ttl::Expiry::default(),
            as_of: Default::default(),
        };
        fs.count_bytes_once()?;
        fs.count_inbox_bytes_once()?;
        fs.expiry.load(fs.store.expiries()?);
        for (path, bytes) in fs.store.drafts()? {
            match crate::store::DraftRec::decode(&bytes) {
                Ok(rec) => {
                    let d = Draft::from_rec(rec);
                    let charge = fs.limits.draft_mem.charge_for(place::account_of(&path));
                    for slot in d.files.values() {
                        if let Slot::File(f) = slot {
                            crate::locks::write(f).attach(charge.clone());
                        }
                    }
                    fs.drafts.insert(path, d);
                }
                Err(e) => tracing::error!(%path, error = %e, "persisted draft ignored"),
            }
        }
        Ok(Arc::new(fs))
    }

    /// Data dirs from before byte quotas: count every account's stored bytes
    /// once (later commits and deletes keep the counters current).
    pub(super) fn count_bytes_once(&self) -> Result<()> {
        if self.store.high_water(counters::BYTES_COUNTED)? > 0 {
            return Ok(());
        }
        let mut recs = Vec::new();
        self.store.scan_nodes(&mut |r| {
            recs.push(r);
            Ok(())
        })?;
        let mut by_account: HashMap<String, i64> = HashMap::new();
        for r in &recs {
            let a = place::account_of(&r.path).to_string();
            *by_account.entry(a).or_default() += self.history_bytes(r)? as i64;
        }
        let mut ops: Vec<Op> = by_account
            .into_iter()
            .map(|(a, n)| Op::Count {
                key: counters::bytes_key(&a),
                delta: n - self.store.counter(&counters::bytes_key(&a)).unwrap_or(0),
            })
            .collect();
        ops.push(Op::HighWater {
            key: counters::BYTES_COUNTED.into(),
            value: 1,
        });
        self.store.apply(ops, true)
    }

    /// Data dirs from before conversations counted in byte quotas: count
    /// the conversations every inbox stores, once.
    pub(super) fn count_inbox_bytes_once(&self) -> Result<()> {
        if self.store.high_water(counters::INBOX_BYTES_COUNTED)? > 0 {
            return Ok(());
        }
        let mut ops = Vec::new();
        for a in self.store.list_dirs("")? {
            let mut n = 0i64;
            for u in self.store.list_dirs(&format!("{a}/users"))? {
                let inbox = format!("{a}/users/{u}/{}", names::INBOX);
                for (name, rec) in self.store.list_scratch(&inbox)? {
                    if inbox::is_conversation_path(&format!("{inbox}/{name}")) {
                        if let Ok(r) = crate::store::ScratchRec::decode(&rec) {
                            n += r.data.len() as i64;
                        }
                    }
                }
            }
            let key = counters::inbox_bytes_key(&a);
            let delta = n - self.store.counter(&key)?;
            if delta != 0 {
                ops.push(Op::Count { key, delta });
            }
        }
        ops.push(Op::HighWater {
            key: counters::INBOX_BYTES_COUNTED.into(),
            value: 1,
        });
        self.store.apply(ops, true)
    }

    /// The most uncommitted bytes held in memory (0: the default).
    pub fn set_draft_memory_limit(&self, bytes: u64) {
        self.limits.draft_mem.set_limit(bytes);
    }

    /// The paths (under `accounts/`) whose nodes and conversations are
    /// never indexed.
    /// The views are mounted under `dir` (`DIR/UID`): `.ctxfs/help` says
    /// where each caller's is.
    pub fn set_views(&self, dir: std::path::PathBuf) {
        self.services.set_views(dir);
    }

    pub fn set_unindexed(&self, prefixes: Vec<String>) {
        self.services.set_unindexed(prefixes);
    }

    pub fn set_redaction(&self, policy: crate::config::RedactionPolicy) {
        self.services.set_redaction(policy);
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    // ---- tenancy -------------------------------------------------------

    /// What `caller` may do at `path` (`acme`, `acme/users/ann/…`): the
    /// account's rule, and for a user's or an agent's uid, the part of the
    /// account it is limited to.
    pub(super) fn access_of(&self, caller: Caller, path: &str) -> Access {
        self.tenancy
            .access_at(caller.uid, place::account_of(path), place::in_account(path))
    }

    /// May `caller` read (or with `write`, change) `path` (an account or
    /// anything in it)?
    pub(super) fn gate(&self, caller: Caller, path: &str, write: bool) -> Result<Access> {
        let account = place::account_of(path);
        match self.access_of(caller, path) {
            Access::None => {
                self.metrics.auth_failure(account, "denied");
                Err(Error::AccessDenied)
            }
            Access::Read if write => {
                self.metrics.auth_failure(account, "read_only");
                Err(Error::ReadOnly)
            }
            a => Ok(a),
        }
    }

    /// May `caller` write somewhere in `account` (its writers, and its
    /// users' and agents' uids in their parts)? Each path written is gated
    /// on its own.
    pub(super) fn gate_writes_in(&self, caller: Caller, account: &str) -> Result<()> {
        if self.tenancy.scope(caller.uid, account).is_some() {
            return self.gate(caller, account, false).map(drop);
        }
        self.gate(caller, account, true).map(drop)
    }

    // ---- ids, locks ----------------------------------------------------

    pub(super) fn new_handle(&self, h: Handle) -> u64 {
        self.handles.insert(h)
    }

    pub(super) fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles.get(fh)
    }

    pub(super) fn ino_lookup(&self, key: Key) -> u64 {
        lock(&self.kernel.inodes).lookup(key)
    }

    pub(super) fn key_of(&self, ino: u64) -> Result<Key> {
        lock(&self.kernel.inodes).key(ino).ok_or(Error::NotFound)
    }

    pub fn forget(&self, ino: u64, n: u64) {
        let gone = {
            let mut inodes = lock(&self.kernel.inodes);
            inodes.forget(ino, n);
            inodes.key(ino).is_none()
        };
        if gone {
            self.kernel.cached.forget(ino);
        }
    }

    pub fn inode_count(&self) -> usize {
        lock(&self.kernel.inodes).len()
    }

    pub(super) fn draft(&self, node: &str) -> Option<Arc<Mutex<Draft>>> {
        self.drafts.get(node)
    }

    /// The draft of `node`, created over its committed version when missing.
    pub(super) fn draft_or_new(
        &self,
        node: &str,
        committed: Option<&NodeRec>,
    ) -> Arc<Mutex<Draft>> {
        self.drafts
            .get_or_new(node, committed.map(|r| (r.id, r.version)))
    }

    /// Is a committed node of this status shown to a caller with `access`?
    pub(super) fn shows(status: Status, access: Access) -> bool {
        match status {
            Status::Active | Status::Archived => access >= Access::Read,
            // BROKEN nodes are for writers to inspect and rewrite.
            Status::Broken => access == Access::Write,
        }
    }

    /// The current record of a node, unless it has expired (an expired node
    /// is not found anywhere, even before the sweeper removes it).
    pub(super) fn live_node(&self, node: &str) -> Result<Option<NodeRec>> {
        Ok(self.store.get_node(node)?.filter(|_| !self.expired(node)))
    }

    /// Committed record of a node visible to the caller.
    pub(super) fn visible_node(&self, node: &str, access: Access) -> Result<Option<NodeRec>> {
        Ok(self
            .live_node(node)?
            .filter(|r| Self::shows(r.status, access)))
    }

    /// Periodic upkeep of a shared store (nothing on one's own).
    pub fn maintain_store(&self) -> Result<()> {
        self.store.maintain_shared()
    }

    /// Does this daemon hold `role` on the store (always, on one's own)?
    pub fn leads(&self, role: &str) -> bool {
        self.store.leader(role)
    }

    // ---- persistence of drafts --------------------------------------------

    pub(super) fn persist_draft_op(&self, node: &str, d: &Draft) -> Result<Op> {
        Ok(Op::PutDraft {
            path: node.to_string(),
            data: d.to_rec().encode()?,
        })
    }

    /// Make every draft durable (clean unmount).
    pub fn persist_all_drafts(&self) -> Result<usize> {
        let drafts = self.drafts.snapshot();
        let mut ops = Vec::new();
        for (path, d) in &drafts {
            let _g = self.drafts.stripe(path);
            ops.push(self.persist_draft_op(path, &lock(d))?);
        }
        let n = ops.len();
        self.store.apply(ops, true)?;
        Ok(n)
    }
}
