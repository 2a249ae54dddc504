//! Filesystem semantics without a kernel: the tree, drafts and the commit
//! point, visibility, tenancy. The FUSE adapter (`crate::fuse`) converts
//! arguments and calls these methods; tests call them directly.
//!
//! Lock order: node stripe → `drafts` map → one `Draft` → one `DFile`;
//! `inodes` and `handles` are leaf locks, never held while taking another.

pub mod agent;
mod asof;
mod audit;
pub mod commit;
pub(crate) mod draft;
mod features;
mod flock;
pub mod forget;
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
pub mod transfer;
pub mod ttl;
pub mod versions;

pub use self::draft::{DFile, Draft, Slot};
use self::handles::Handles;
pub(crate) use self::handles::{Control, DraftHandle, Handle, RestoreHandle};
use self::inodes::{Inodes, Key};
pub use self::kcache::Target;
use self::kcache::{CachedReads, Invalidator};
pub use self::metrics::LOG_LINES_DROPPED;
use crate::config::{Access, Tenancy};
use crate::error::{Error, Result};
use crate::locks::lock;
#[allow(unused_imports)]
use crate::schema::time::{now_ns, ns_of, rfc3339, rfc3339_ms, time_of};
use crate::schema::{counters, names, place};
use crate::store::{NodeRec, Op, Status, Store};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

/// Largest file a node may hold (a write past it fails with EFBIG).
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Uncommitted bytes the daemon holds in memory at most, unless set
/// (`ctxfs mount --draft-memory-mb`): writes past it fail with ENOSPC.
pub const DEFAULT_DRAFT_MEMORY: u64 = 1 << 30;
const STRIPES: usize = 256;

/// Who is asking: taken from each FUSE request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The calling thread (0: the daemon's own work, never interrupted).
    pub pid: u32,
}

impl Caller {
    /// Has the caller got a signal it does not block or ignore? A wait on
    /// its behalf then ends with `EINTR`. The kernel waits out a FUSE
    /// request already sent to the daemon even through Ctrl-C (and fuser
    /// answers FUSE_INTERRUPT with ENOSYS), so a long wait looks for the
    /// signal itself, in `/proc/PID/status`.
    pub fn interrupted(&self) -> bool {
        self.pid != 0 && signal_pending(self.pid)
    }

    /// The front a request came through, for `committed_by`: `mcp` or
    /// `memtool` when the calling process is `ctxfs mcp` or `ctxfs memtool`,
    /// else `shell` (any other process on the mount); `daemon` for the
    /// daemon's own work. Attribution, not authority: the uid is what
    /// tenancy checks.
    pub fn front(&self) -> &'static str {
        if self.pid == 0 {
            return "daemon";
        }
        let Ok(cmd) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return "shell";
        };
        let mut args = cmd.split(|b| *b == 0);
        let prog = args.next().unwrap_or_default();
        let prog = prog.rsplit(|b| *b == b'/').next().unwrap_or_default();
        match (prog, args.next()) {
            (b"ctxfs", Some(b"mcp")) => "mcp",
            (b"ctxfs", Some(b"memtool")) => "memtool",
            _ => "shell",
        }
    }

    /// `committed_by` of a version this caller commits through `via`
    /// (its front when `None`).
    pub(crate) fn by(&self, via: Option<&'static str>) -> commit::rules::By {
        commit::rules::By {
            uid: self.uid,
            via: via.unwrap_or_else(|| self.front()),
        }
    }
}

/// A signal pending for thread `pid` (or its process) that it neither
/// blocks nor ignores; SIGKILL (a fatal signal) always counts. A thread
/// that is gone counts too: nobody waits for the answer.
pub fn signal_pending(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = field("SigPnd:") | field("ShdPnd:");
    let kill = 1u64 << (libc::SIGKILL - 1);
    pending & kill != 0 || pending & !field("SigBlk:") & !field("SigIgn:") != 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// The same answer holds for every caller allowed into the account, so
    /// the kernel may cache it (its dentry and attribute caches are shared by
    /// all uids). Answers that depend on the caller (account-level entries,
    /// drafts, PENDING and BROKEN nodes, virtual files) are never cached.
    pub shared: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub name: String,
    pub kind: Kind,
}

/// A directory's entries as one caller saw them at offset 0.
pub(crate) struct Listing {
    /// Sorted by their cookie (see [`cookie`]).
    entries: Vec<(u64, DirEntry)>,
    shared: bool,
}

/// The readdir offset of the entry after `name`: a function of the name
/// alone, so a continuation resumes after the last name returned whatever
/// snapshot of the directory it meets (another lister's, a rebuilt one):
/// every entry present for the whole listing is returned exactly once.
/// `.` and `..` come first, then node files in protocol order (`.meta.json`
/// after the other four, so copies write it last), then every other name in
/// the order of its 58-bit hash. Two names of one directory sharing a hash
/// (odds about 1 in 10^8 for 100,000 entries) could hide one of them from a
/// listing cut between them.
pub(crate) fn cookie(name: &str) -> u64 {
    match name {
        "." => 1,
        ".." => 2,
        _ => {
            let rank = names::NODE_FILES
                .iter()
                .position(|n| *n == name)
                .unwrap_or(names::NODE_FILES.len()) as u64;
            let h = xxhash_rust::xxh3::xxh3_64(name.as_bytes()) >> 6;
            16 + ((rank << 58) | h)
        }
    }
}

/// One readdir reply's worth of entries, each with the offset of the next.
#[derive(Debug)]
pub struct DirBatch {
    pub entries: Vec<(u64, DirEntry)>,
    /// The listing is the same for every caller: the kernel may keep it.
    /// Otherwise the adapter drops the kernel's copy at the end of a reading.
    pub shared: bool,
}

/// How the kernel may cache an open file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// Bytes change under this handle (drafts, generated files): bypass the page cache.
    pub direct_io: bool,
    /// The bytes of this inode never change (a committed version): keep the
    /// cache.
    pub keep_cache: bool,
    /// Nothing happens at close (read-only handles): the kernel may skip FLUSH.
    pub no_flush: bool,
}

/// Attribute changes of `setattr`.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub size: Option<u64>,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
}

#[derive(Default)]
pub struct Stats {
    pub commits: AtomicU64,
    pub commit_failures: AtomicU64,
    pub deletes: AtomicU64,
    pub moves: AtomicU64,
    pub repairs: AtomicU64,
    /// Nodes removed by the TTL sweeper.
    pub expired: AtomicU64,
}

pub struct Fs {
    store: Arc<dyn Store>,
    /// The search index, once the daemon has started it.
    index: std::sync::OnceLock<Arc<crate::index::Index>>,
    /// Secrets replaced at commit; the built-in policy until the daemon sets one.
    redaction: std::sync::OnceLock<crate::config::RedactionPolicy>,
    /// Paths never indexed (the accounts' `unindexed` prefixes).
    unindexed: std::sync::OnceLock<Vec<String>>,
    tenancy: Tenancy,
    inodes: Mutex<Inodes>,
    drafts: draft::Drafts,
    stripes: Vec<Mutex<()>>,
    handles: Handles,
    /// Listings being read, by (directory inode, uid): see [`Fs::readdir`].
    listings: Mutex<HashMap<(u64, u32), Arc<Listing>>>,
    /// Open files of project scratchpads, by path: one buffer per file.
    scratch_open: Mutex<HashMap<String, Arc<RwLock<DFile>>>>,
    /// Serialises structural changes of scratchpads.
    scratch_lock: Mutex<()>,
    /// Activity logs open here: how many bytes of the shared buffer are in
    /// the store (the rest are appended at the next close or fsync).
    log_synced: Mutex<HashMap<String, usize>>,
    /// `flock` locks, taken by the daemon on a shared store.
    flocks: flock::Flocks,
    next_blob: AtomicU64,
    next_node: AtomicU64,
    next_event: AtomicU64,
    /// On a shared store: blocks of node and blob ids taken from it (next, end).
    id_blocks: Mutex<HashMap<&'static str, (u64, u64)>>,
    started: SystemTime,
    /// Owner shown on every file: attributes must not depend on the caller.
    owner: (u32, u32),
    /// Drops kernel cache entries after changes (its own thread).
    inval: Invalidator,
    /// Committed-file inodes readers hold open through the kernel's cache.
    cached: CachedReads,
    pub stats: Stats,
    pub metrics: metrics::Metrics,
    /// Nodes with an expiry time.
    expiry: ttl::Expiry,
    /// Quotas by account and the searches they count.
    quotas: quota::Quotas,
    /// Reads of `.ctxfs/sync` waiting now.
    sync_waiters: search::SyncWaiters,
    /// Log lines per account for refusals a client causes at will.
    log_budget: metrics::LogBudget,
    /// The last batch result of each (account, uid), for `.ctxfs/batch`.
    batch_results: handles::LastResults,
    /// Memory extraction from conversations (with `[llm]` in the config).
    inbox: std::sync::OnceLock<Arc<inbox::Inbox>>,
    /// Views of accounts as they stood at a time (`.as-of/`).
    as_of: asof::Views,
    /// Bytes of uncommitted files in memory, and their limit.
    draft_mem: draft::DraftMemory,
    draft_limit: AtomicU64,
}

impl Fs {
    pub fn new(store: Arc<dyn Store>, tenancy: Tenancy) -> Result<Arc<Fs>> {
        let fs = Fs {
            next_blob: AtomicU64::new(store.high_water(counters::BLOB_ID)? + 1),
            next_node: AtomicU64::new(store.high_water(counters::NODE_ID)? + 1),
            next_event: AtomicU64::new(store.high_water(counters::EVENT_ID)? + 1),
            id_blocks: Mutex::new(HashMap::new()),
            store,
            tenancy,
            inodes: Mutex::new(Inodes::new()),
            drafts: draft::Drafts::default(),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            handles: Handles::default(),
            listings: Mutex::new(HashMap::new()),
            scratch_open: Mutex::new(HashMap::new()),
            scratch_lock: Mutex::new(()),
            log_synced: Mutex::new(HashMap::new()),
            flocks: Default::default(),
            started: SystemTime::now(),
            // SAFETY: geteuid(2) and getegid(2) have no preconditions and cannot fail.
            owner: unsafe { (libc::geteuid(), libc::getegid()) },
            inval: Invalidator::default(),
            cached: CachedReads::default(),
            stats: Stats::default(),
            metrics: metrics::Metrics::default(),
            index: std::sync::OnceLock::new(),
            redaction: std::sync::OnceLock::new(),
            unindexed: std::sync::OnceLock::new(),
            expiry: ttl::Expiry::default(),
            quotas: quota::Quotas::default(),
            sync_waiters: search::SyncWaiters::default(),
            log_budget: metrics::LogBudget::default(),
            batch_results: Default::default(),
            inbox: std::sync::OnceLock::new(),
            as_of: Default::default(),
            draft_mem: draft::DraftMemory::default(),
            draft_limit: AtomicU64::new(DEFAULT_DRAFT_MEMORY),
        };
        fs.count_bytes_once()?;
        fs.count_inbox_bytes_once()?;
        fs.expiry.load(fs.store.expiries()?);
        for (path, bytes) in fs.store.drafts()? {
            match crate::store::DraftRec::decode(&bytes) {
                Ok(rec) => {
                    let d = Draft::from_rec(rec);
                    let charge = fs.draft_mem.charge_for(Self::account_of(&path));
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
    fn count_bytes_once(&self) -> Result<()> {
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
            let a = Self::account_of(&r.path).to_string();
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
    fn count_inbox_bytes_once(&self) -> Result<()> {
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
        let bytes = if bytes == 0 {
            DEFAULT_DRAFT_MEMORY
        } else {
            bytes
        };
        self.draft_limit.store(bytes, Ordering::Relaxed);
    }

    /// The paths (under `accounts/`) whose nodes and conversations are
    /// never indexed.
    pub fn set_unindexed(&self, prefixes: Vec<String>) {
        let _ = self.unindexed.set(prefixes);
    }

    /// Is `path` under one of the unindexed prefixes?
    pub(crate) fn is_unindexed(&self, path: &str) -> bool {
        self.unindexed
            .get()
            .is_some_and(|v| crate::index::under_any(v, path))
    }

    pub fn set_redaction(&self, policy: crate::config::RedactionPolicy) {
        let _ = self.redaction.set(policy);
    }

    fn redaction(&self) -> &crate::config::RedactionPolicy {
        self.redaction.get_or_init(Default::default)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    // ---- tenancy -------------------------------------------------------

    /// What `caller` may do at `path` (`acme`, `acme/users/ann/…`): the
    /// account's rule, and for a user's or an agent's uid, the part of the
    /// account it is limited to.
    fn access_of(&self, caller: Caller, path: &str) -> Access {
        self.tenancy
            .access_at(caller.uid, Self::account_of(path), Self::in_account(path))
    }

    /// May `caller` read (or with `write`, change) `path` (an account or
    /// anything in it)?
    fn gate(&self, caller: Caller, path: &str, write: bool) -> Result<Access> {
        let account = Self::account_of(path);
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
    fn gate_writes_in(&self, caller: Caller, account: &str) -> Result<()> {
        if self.tenancy.scope(caller.uid, account).is_some() {
            return self.gate(caller, account, false).map(drop);
        }
        self.gate(caller, account, true).map(drop)
    }

    // ---- ids, locks ----------------------------------------------------

    fn stripe(&self, node: &str) -> MutexGuard<'_, ()> {
        lock(&self.stripes[stripe_of(node)])
    }

    /// The stripes of all `nodes`, each once, taken in ascending order (no
    /// deadlock with another taker of several).
    fn stripes_of<'a>(&self, nodes: impl Iterator<Item = &'a str>) -> Vec<MutexGuard<'_, ()>> {
        let mut ids: Vec<usize> = nodes.map(stripe_of).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().map(|i| lock(&self.stripes[i])).collect()
    }

    fn new_handle(&self, h: Handle) -> u64 {
        self.handles.insert(h)
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles.get(fh)
    }

    fn ino_lookup(&self, key: Key) -> u64 {
        lock(&self.inodes).lookup(key)
    }

    fn key_of(&self, ino: u64) -> Result<Key> {
        lock(&self.inodes).key(ino).ok_or(Error::NotFound)
    }

    pub fn forget(&self, ino: u64, n: u64) {
        let gone = {
            let mut inodes = lock(&self.inodes);
            inodes.forget(ino, n);
            inodes.key(ino).is_none()
        };
        if gone {
            self.cached.forget(ino);
        }
    }

    pub fn inode_count(&self) -> usize {
        lock(&self.inodes).len()
    }

    fn draft(&self, node: &str) -> Option<Arc<Mutex<Draft>>> {
        self.drafts.get(node)
    }

    /// The draft of `node`, created over its committed version when missing.
    fn draft_or_new(&self, node: &str, committed: Option<&NodeRec>) -> Arc<Mutex<Draft>> {
        self.drafts
            .get_or_new(node, committed.map(|r| (r.id, r.version)))
    }

    /// Is a committed node of this status shown to a caller with `access`?
    fn shows(status: Status, access: Access) -> bool {
        match status {
            Status::Active | Status::Archived => access >= Access::Read,
            // BROKEN nodes are for writers to inspect and rewrite.
            Status::Broken => access == Access::Write,
        }
    }

    /// The current record of a node, unless it has expired (an expired node
    /// is not found anywhere, even before the sweeper removes it).
    fn live_node(&self, node: &str) -> Result<Option<NodeRec>> {
        Ok(self.store.get_node(node)?.filter(|_| !self.expired(node)))
    }

    /// Committed record of a node visible to the caller.
    fn visible_node(&self, node: &str, access: Access) -> Result<Option<NodeRec>> {
        Ok(self
            .live_node(node)?
            .filter(|r| Self::shows(r.status, access)))
    }

    /// Account of a node or directory path.
    fn account_of(path: &str) -> &str {
        path.split('/').next().unwrap_or("")
    }

    /// `path` under its account (`users/u/…` of `acme/users/u/…`).
    fn in_account(path: &str) -> &str {
        path.split_once('/').map_or("", |(_, r)| r)
    }

    // ---- status ----------------------------------------------------------

    /// `.ctxfs/status`: what the caller's accounts hold.
    ///
    /// Every figure is scoped to what the caller may see: committed nodes of
    /// its accounts; BROKEN nodes, drafts (PENDING) and uncommitted edits
    /// only of the accounts it may write; daemon-wide activity (commits,
    /// refusals, inodes, the indexer's counters) only for uid 0.
    pub fn status_json(&self, caller: Caller) -> Result<Vec<u8>> {
        let accounts = self.accounts_visible(caller)?;
        let writable: Vec<&String> = accounts
            .iter()
            .filter(|a| self.access_of(caller, a) == Access::Write)
            .collect();
        let admin = caller.uid == 0;
        let mut counts = serde_json::Map::new();
        let mut outbox = 0i64;
        for st in Status::all() {
            let mut n = 0;
            for a in &accounts {
                if Self::shows(st, self.access_of(caller, a)) {
                    n += self
                        .store
                        .counter(&crate::schema::counters::nodes_key(a, st))?;
                }
            }
            counts.insert(st.as_str().into(), n.into());
        }
        for a in &accounts {
            outbox += self
                .store
                .counter(&crate::schema::counters::outbox_key(a))?;
        }
        let (mut pending, mut edits) = (0, 0);
        for (path, d) in self.drafts.snapshot().iter() {
            if writable.iter().any(|a| *a == Self::account_of(path)) {
                if lock(d).base.is_none() {
                    pending += 1;
                } else {
                    edits += 1;
                }
            }
        }
        counts.insert("PENDING".into(), pending.into());
        let (dead, indexer) = self.index_status(&accounts, admin)?;
        let mut v = serde_json::json!({
            "nodes": counts,
            "uncommitted_edits": edits,
            "outbox_depth": outbox,
            "dead_letters": dead,
            "index_lag_ms": indexer["index_lag_ms"].clone(),
            "indexer": indexer,
            "uptime_s": self.started.elapsed().map(|d| d.as_secs()).unwrap_or(0),
            "version": env!("CARGO_PKG_VERSION"),
        });
        if self.tenancy.knows(caller.uid) {
            v["inbox"] = self.inbox_status();
        } else {
            // A uid in no account learns nothing of the others' activity.
            v["index_lag_ms"] = serde_json::Value::Null;
            v["indexer"] = serde_json::json!({});
        }
        if admin {
            v["commits"] = self.stats.commits.load(Ordering::Relaxed).into();
            v["commit_failures"] = self.stats.commit_failures.load(Ordering::Relaxed).into();
            v["inodes"] = self.inode_count().into();
            v["log_lines_dropped"] = metrics::LOG_LINES_DROPPED.load(Ordering::Relaxed).into();
            v["encrypted"] = self.store.sealed().into();
            if let Some(n) = self.store.data_keys() {
                v["data_keys"] = n.into();
            }
        }
        let mut out =
            serde_json::to_vec_pretty(&v).map_err(|e| Error::store_from("rendering status", e))?;
        out.push(b'\n');
        Ok(out)
    }

    fn accounts_visible(&self, caller: Caller) -> Result<Vec<String>> {
        let mut all = self.all_accounts()?;
        all.retain(|a| self.access_of(caller, a) != Access::None);
        Ok(all)
    }

    // ---- kernel cache invalidation -----------------------------------------

    /// Install the function that drops kernel cache entries (the FUSE
    /// notifier), on its own thread.
    pub fn set_invalidator(&self, f: impl Fn(&Target) + Send + 'static) {
        self.inval.start(f);
    }

    /// Send invalidations. With `wait`, return once done: only call it so
    /// when holding no lock a FUSE request may need.
    fn send_inval(&self, targets: Vec<Target>, wait: bool) {
        self.inval.send(targets, wait);
    }

    fn dir_ino(&self, dir: &str) -> Option<u64> {
        lock(&self.inodes).peek(&Key::Dir(Arc::from(dir)))
    }

    fn scratch_ino(&self, path: &str) -> Option<u64> {
        lock(&self.inodes).peek(&Key::Scratch(Arc::from(path)))
    }

    /// Every inode the kernel may cache (after missed remote changes).
    fn all_inode_targets(&self) -> Vec<Target> {
        lock(&self.inodes)
            .all()
            .into_iter()
            .map(Target::Inode)
            .collect()
    }

    /// Periodic upkeep of a shared store (nothing on one's own).
    pub fn maintain_store(&self) -> Result<()> {
        self.store.maintain_shared()
    }

    /// Does this daemon hold `role` on the store (always, on one's own)?
    pub fn leads(&self, role: &str) -> bool {
        self.store.leader(role)
    }

    /// Dentries of `names` in directory `dir` (if the kernel knows `dir`).
    fn entry_targets(&self, dir: &str, names: &[&str]) -> Vec<Target> {
        match self.dir_ino(dir) {
            Some(parent) => names
                .iter()
                .map(|n| Target::Entry {
                    parent,
                    name: n.to_string(),
                })
                .collect(),
            None => Vec::new(),
        }
    }

    /// Cached attributes and listings of directories `dirs`.
    fn listing_targets(&self, dirs: &[&str]) -> Vec<Target> {
        dirs.iter()
            .filter_map(|d| self.dir_ino(d))
            .map(Target::Inode)
            .collect()
    }

    fn invalidate(&self, dir: &str, names: &[&str], wait: bool) {
        self.send_inval(self.entry_targets(dir, names), wait);
    }

    /// After a commit of `node`: its files' dentries, its listing and its
    /// parent's (a new node appears there).
    fn invalidate_commit(&self, node: &str, wait: bool) {
        let mut t = self.entry_targets(node, &place::NODE_FILES);
        t.extend(self.listing_targets(&[node, place::parent_name(node).0]));
        self.send_inval(t, wait);
    }

    /// After a batch: the listings of every directory above its nodes, up
    /// to the account (a batch may make containers nobody made with
    /// `mkdir`, such as a new agent: the kernel may hold its parent's
    /// listing without them).
    fn invalidate_ancestors<'a>(&self, nodes: impl Iterator<Item = &'a str>) {
        let mut dirs = std::collections::BTreeSet::new();
        for n in nodes {
            let mut d = n;
            while let Some((parent, _)) = d.rsplit_once('/') {
                if !dirs.insert(parent) {
                    break;
                }
                d = parent;
            }
        }
        let dirs: Vec<&str> = dirs.into_iter().collect();
        // Batches commit at a close or from a background thread: no
        // directory lock is held, so waiting cannot deadlock.
        self.send_inval(self.listing_targets(&dirs), true);
    }

    // ---- persistence of drafts --------------------------------------------

    fn persist_draft_op(&self, node: &str, d: &Draft) -> Result<Op> {
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
            let _g = self.stripe(path);
            ops.push(self.persist_draft_op(path, &lock(d))?);
        }
        let n = ops.len();
        self.store.apply(ops, true)?;
        Ok(n)
    }
}

pub(crate) fn stripe_of(node: &str) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.hash(&mut h);
    (h.finish() as usize) % STRIPES
}
