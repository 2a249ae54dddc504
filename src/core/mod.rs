//! Filesystem semantics without a kernel: the tree, drafts and the commit
//! point, visibility, tenancy. The FUSE adapter (`crate::fuse`) converts
//! arguments and calls these methods; tests call them directly.
//!
//! Lock order: node stripe → `drafts` map → one `Draft` → one `DFile`;
//! `inodes` and `handles` are leaf locks, never held while taking another.

pub mod agent;
pub mod commit;
pub(crate) mod draft;
pub mod inodes;
pub mod metrics;
pub mod ops;
pub mod quota;
pub mod repair;
pub mod scratch;
pub mod search;
pub mod transfer;
pub mod ttl;
pub mod versions;

pub use self::draft::{DFile, Draft, Slot};
use self::inodes::{Inodes, Key};
use crate::config::{Access, Tenancy};
use crate::error::{Error, Result};
use crate::locks::lock;
#[allow(unused_imports)]
use crate::schema::time::{now_ns, ns_of, rfc3339, rfc3339_ms, time_of};
use crate::schema::{counters, names, place};
use crate::store::{NodeRec, Op, Status, Store};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime};

/// Largest file a node may hold (a write past it fails with EFBIG).
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
const STRIPES: usize = 256;

/// Who is asking: taken from each FUSE request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
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
    entries: Vec<DirEntry>,
    shared: bool,
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

pub(crate) enum Handle {
    /// Immutable bytes: a committed version or a generated file.
    Data(Arc<[u8]>),
    Draft(DraftHandle),
    /// A file of a project's shared area.
    Scratch(scratch::ScratchHandle),
    /// `NODE/.versions/restore` opened for writing.
    Restore(Arc<str>),
}

pub(crate) struct DraftHandle {
    node: Arc<str>,
    name: String,
    file: Arc<RwLock<DFile>>,
    append: bool,
    writable: bool,
    dirty: AtomicBool,
}

impl Drop for DraftHandle {
    fn drop(&mut self) {
        if self.writable {
            if let Ok(f) = self.file.read() {
                f.writers.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
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
    tenancy: Tenancy,
    inodes: Mutex<Inodes>,
    drafts: Mutex<HashMap<String, Arc<Mutex<Draft>>>>,
    stripes: Vec<Mutex<()>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Listings being read, by (directory inode, uid): see [`Fs::readdir`].
    listings: Mutex<HashMap<(u64, u32), Arc<Listing>>>,
    /// Open files of project scratchpads, by path: one buffer per file.
    scratch_open: Mutex<HashMap<String, Arc<RwLock<DFile>>>>,
    /// Serialises structural changes of scratchpads.
    scratch_lock: Mutex<()>,
    next_fh: AtomicU64,
    next_blob: AtomicU64,
    next_node: AtomicU64,
    next_event: AtomicU64,
    started: SystemTime,
    /// Owner shown on every file: attributes must not depend on the caller.
    owner: (u32, u32),
    /// Kernel dentries to drop (parent inode, name), sent to the invalidation
    /// thread; with a reply channel, the sender waits until it is done.
    inval: Mutex<Option<mpsc::Sender<Inval>>>,
    /// Which committed-file inodes readers hold open through the kernel's
    /// cache, and which a writer has opened for writing (see [`Cached`]).
    cached: Mutex<Cached>,
    /// Signalled when the last cached read of an inode closes.
    cached_closed: Condvar,
    pub stats: Stats,
    pub metrics: metrics::Metrics,
    /// Nodes with an expiry time (ns since the epoch), as in the store.
    expiry: RwLock<HashMap<String, u64>>,
    /// Quotas by account, once the daemon has set them (none: unlimited).
    quotas: std::sync::OnceLock<std::collections::BTreeMap<String, crate::config::Quota>>,
    /// Recent searches by account (the searches-per-minute quota).
    searches: Mutex<HashMap<String, std::collections::VecDeque<std::time::Instant>>>,
}

type Inval = (Vec<Target>, Option<mpsc::SyncSender<()>>);

/// The kernel shares an inode's size and page cache between everyone who
/// opens it. A committed file's inode is opened by readers (served from the
/// kernel's cache) and, when a writer edits the file, by the writer too: its
/// `O_TRUNC` sets the shared size to 0 and its writes move it, so a reader
/// reading at that moment would see an empty or zero-padded file. Hence:
/// once a writer opens a committed inode for writing it is *tainted*, and
/// readers open it with direct I/O and get uncached attributes until the
/// kernel forgets it; and the writer's open waits (up to
/// [`READER_WAIT`]) for the readers that opened it through the cache
/// before to close it.
#[derive(Default)]
struct Cached {
    tainted: HashSet<u64>,
    /// Open cached reads by inode, and the inode of each such handle.
    open: HashMap<u64, usize>,
    by_fh: HashMap<u64, u64>,
}

/// How long a writer's open of a committed file waits for the readers
/// that hold it open through the kernel's cache.
const READER_WAIT: Duration = Duration::from_millis(500);

impl Fs {
    /// A reader opens committed-file inode `ino` as handle `fh`: false if
    /// the inode is tainted (serve it with direct I/O), else the open is
    /// counted until `release`.
    fn open_cached(&self, ino: u64, fh: u64) -> bool {
        let mut c = lock(&self.cached);
        if c.tainted.contains(&ino) {
            return false;
        }
        *c.open.entry(ino).or_default() += 1;
        c.by_fh.insert(fh, ino);
        true
    }

    fn release_cached(&self, fh: u64) {
        let mut c = lock(&self.cached);
        if let Some(ino) = c.by_fh.remove(&fh) {
            if let Some(n) = c.open.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    c.open.remove(&ino);
                    self.cached_closed.notify_all();
                }
            }
        }
    }

    fn is_tainted(&self, ino: u64) -> bool {
        lock(&self.cached).tainted.contains(&ino)
    }

    /// A writer opens committed-file inode `ino` for writing: taint it,
    /// then wait for the cached readers already in it to finish.
    fn taint(&self, ino: u64) {
        let mut c = lock(&self.cached);
        c.tainted.insert(ino);
        let (_c, waited) = self
            .cached_closed
            .wait_timeout_while(c, READER_WAIT, |c| c.open.contains_key(&ino))
            .unwrap_or_else(|e| e.into_inner());
        if waited.timed_out() {
            tracing::debug!(ino, "a reader still holds the file open through the cache");
        }
    }
}

/// A kernel cache entry to drop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The dentry `name` in directory inode `parent`.
    Entry { parent: u64, name: String },
    /// The cached attributes and pages (for a directory: its listing) of an inode.
    Inode(u64),
}

impl Fs {
    pub fn new(store: Arc<dyn Store>, tenancy: Tenancy) -> Result<Arc<Fs>> {
        let fs = Fs {
            next_blob: AtomicU64::new(store.high_water(counters::BLOB_ID)? + 1),
            next_node: AtomicU64::new(store.high_water(counters::NODE_ID)? + 1),
            next_event: AtomicU64::new(store.high_water(counters::EVENT_ID)? + 1),
            store,
            tenancy,
            inodes: Mutex::new(Inodes::new()),
            drafts: Mutex::new(HashMap::new()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            handles: Mutex::new(HashMap::new()),
            listings: Mutex::new(HashMap::new()),
            scratch_open: Mutex::new(HashMap::new()),
            scratch_lock: Mutex::new(()),
            next_fh: AtomicU64::new(1),
            started: SystemTime::now(),
            owner: unsafe { (libc::geteuid(), libc::getegid()) },
            inval: Mutex::new(None),
            cached: Mutex::new(Cached::default()),
            cached_closed: Condvar::new(),
            stats: Stats::default(),
            metrics: metrics::Metrics::default(),
            index: std::sync::OnceLock::new(),
            redaction: std::sync::OnceLock::new(),
            expiry: RwLock::new(HashMap::new()),
            quotas: std::sync::OnceLock::new(),
            searches: Mutex::new(HashMap::new()),
        };
        fs.count_bytes_once()?;
        crate::locks::write(&fs.expiry).extend(fs.store.expiries()?);
        for (path, bytes) in fs.store.drafts()? {
            match crate::store::DraftRec::decode(&bytes) {
                Ok(rec) => {
                    lock(&fs.drafts).insert(path, Arc::new(Mutex::new(Draft::from_rec(rec))));
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
                key: quota::bytes_key(&a),
                delta: n - self.store.counter(&quota::bytes_key(&a)).unwrap_or(0),
            })
            .collect();
        ops.push(Op::HighWater {
            key: counters::BYTES_COUNTED.into(),
            value: 1,
        });
        self.store.apply(ops, true)
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

    fn access_of(&self, caller: Caller, account: &str) -> Access {
        self.tenancy.access(caller.uid, account)
    }

    /// May `caller` read (or with `write`, change) `account`?
    fn gate(&self, caller: Caller, account: &str, write: bool) -> Result<Access> {
        match self.access_of(caller, account) {
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

    // ---- ids, locks ----------------------------------------------------

    fn stripe(&self, node: &str) -> MutexGuard<'_, ()> {
        lock(&self.stripes[stripe_of(node)])
    }

    fn blob_id(&self) -> u64 {
        self.next_blob.fetch_add(1, Ordering::Relaxed)
    }

    fn new_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, Arc::new(h));
        fh
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        lock(&self.handles)
            .get(&fh)
            .cloned()
            .ok_or(Error::BadHandle)
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
            lock(&self.cached).tainted.remove(&ino);
        }
    }

    pub fn inode_count(&self) -> usize {
        lock(&self.inodes).len()
    }

    fn draft(&self, node: &str) -> Option<Arc<Mutex<Draft>>> {
        lock(&self.drafts).get(node).cloned()
    }

    /// The draft of `node`, created over its committed version when missing.
    fn draft_or_new(&self, node: &str, committed: Option<&NodeRec>) -> Arc<Mutex<Draft>> {
        lock(&self.drafts)
            .entry(node.to_string())
            .or_insert_with(|| {
                Arc::new(Mutex::new(Draft::new(committed.map(|r| (r.id, r.version)))))
            })
            .clone()
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

    // ---- status ----------------------------------------------------------

    /// `.ctxfs/status`: what the caller's accounts hold.
    pub fn status_json(&self, caller: Caller) -> Result<Vec<u8>> {
        let accounts = self.accounts_visible(caller)?;
        let mut counts = serde_json::Map::new();
        let mut outbox = 0i64;
        for st in Status::all() {
            let mut n = 0;
            for a in &accounts {
                n += self
                    .store
                    .counter(&crate::schema::counters::nodes_key(a, st))?;
            }
            counts.insert(st.as_str().into(), n.into());
        }
        for a in &accounts {
            outbox += self
                .store
                .counter(&crate::schema::counters::outbox_key(a))?;
        }
        let (mut pending, mut edits) = (0, 0);
        for (path, d) in lock(&self.drafts).iter() {
            if accounts.iter().any(|a| a == Self::account_of(path)) {
                if lock(d).base.is_none() {
                    pending += 1;
                } else {
                    edits += 1;
                }
            }
        }
        counts.insert("PENDING".into(), pending.into());
        let (dead, indexer) = self.index_status(&accounts)?;
        let v = serde_json::json!({
            "nodes": counts,
            "uncommitted_edits": edits,
            "outbox_depth": outbox,
            "dead_letters": dead,
            "index_lag_ms": indexer["index_lag_ms"].clone(),
            "indexer": indexer,
            "commits": self.stats.commits.load(Ordering::Relaxed),
            "commit_failures": self.stats.commit_failures.load(Ordering::Relaxed),
            "inodes": self.inode_count(),
            "uptime_s": self.started.elapsed().map(|d| d.as_secs()).unwrap_or(0),
            "version": env!("CARGO_PKG_VERSION"),
        });
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
    /// notifier). It runs on its own thread: notifying from inside a request
    /// that holds the directory's lock in the kernel would deadlock.
    pub fn set_invalidator(&self, f: impl Fn(&Target) + Send + 'static) {
        let (tx, rx) = mpsc::channel::<Inval>();
        let spawned = std::thread::Builder::new()
            .name("ctxfs-inval".into())
            .spawn(move || {
                for (targets, done) in rx {
                    for t in &targets {
                        f(t);
                    }
                    if let Some(d) = done {
                        let _ = d.send(());
                    }
                }
            });
        match spawned {
            Ok(_) => *lock(&self.inval) = Some(tx),
            Err(e) => tracing::error!(error = %e, "no invalidation thread; caching stays off"),
        }
    }

    fn dir_ino(&self, dir: &str) -> Option<u64> {
        lock(&self.inodes).peek(&Key::Dir(Arc::from(dir)))
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

    /// Send invalidations. With `wait`, return once done: only call it so
    /// when holding no lock a FUSE request may need.
    fn send_inval(&self, targets: Vec<Target>, wait: bool) {
        if targets.is_empty() {
            return;
        }
        let Some(tx) = lock(&self.inval).clone() else {
            return;
        };
        tracing::trace!(n = targets.len(), wait, "invalidate");
        if wait {
            let (done, waited) = mpsc::sync_channel(1);
            if tx.send((targets, Some(done))).is_ok() {
                let _ = waited.recv_timeout(Duration::from_secs(5));
            }
        } else {
            let _ = tx.send((targets, None));
        }
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

    // ---- persistence of drafts --------------------------------------------

    fn persist_draft_op(&self, node: &str, d: &Draft) -> Result<Op> {
        Ok(Op::PutDraft {
            path: node.to_string(),
            data: d.to_rec().encode()?,
        })
    }

    /// Make every draft durable (clean unmount).
    pub fn persist_all_drafts(&self) -> Result<usize> {
        let drafts: Vec<(String, Arc<Mutex<Draft>>)> = lock(&self.drafts)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
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

fn stripe_of(node: &str) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.hash(&mut h);
    (h.finish() as usize) % STRIPES
}
