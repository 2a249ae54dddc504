//! What the kernel caches, and how ctxfs keeps it honest: the invalidation
//! thread that drops dentries and pages after changes, and the committed
//! inodes readers hold open through the cache while a writer edits them.

use crate::core::inodes::{Inodes, Key};
use crate::core::Fs;
use crate::locks::lock;
use crate::schema::place;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::{mpsc, Condvar, Mutex};
use std::time::Duration;

/// A kernel cache entry to drop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The dentry `name` in directory inode `parent`.
    Entry { parent: u64, name: String },
    /// The cached attributes and pages (for a directory: its listing) of an inode.
    Inode(u64),
    /// The dentry of `name` in directory `parent`, on views only
    /// (`core::view`): there a node's names the version current when it was
    /// looked up, so every commit drops it. The main mount keeps its own
    /// (its node directory is the same inode across versions), and its
    /// kernel drops it itself after a change made through it.
    ViewEntry { parent: u64, name: String },
    /// A directory's cached listing, on views only: a change made through
    /// the main mount updates the main mount's own listing there.
    ViewListing(u64),
}

/// The kernel's side: the inode table, the thread that drops cache
/// entries, and the committed inodes readers hold open through the cache.
#[derive(Default)]
pub(super) struct Kernel {
    /// The inode numbers given to the kernel and what each names.
    pub(super) inodes: Mutex<Inodes>,
    pub(super) inval: Invalidator,
    pub(super) cached: CachedReads,
}

type Inval = (Vec<Target>, Option<mpsc::SyncSender<()>>);

/// Kernel dentries to drop (parent inode, name) and inodes whose cache to
/// drop, sent to the invalidation thread; with a reply channel, the sender
/// waits until it is done. Notifying from inside a request that holds the
/// directory's lock in the kernel would deadlock, hence the thread.
#[derive(Default)]
pub(super) struct Invalidator {
    tx: Mutex<Option<mpsc::Sender<Inval>>>,
}

impl Invalidator {
    /// Start the thread that runs `f` (the FUSE notifier) on each target.
    pub(super) fn start(&self, f: impl Fn(&Target) + Send + 'static) {
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
            Ok(_) => *lock(&self.tx) = Some(tx),
            Err(e) => tracing::error!(error = %e, "no invalidation thread; caching stays off"),
        }
    }

    /// Send invalidations; with `wait`, return once they are done.
    pub(super) fn send(&self, targets: Vec<Target>, wait: bool) {
        if targets.is_empty() {
            return;
        }
        let Some(tx) = lock(&self.tx).clone() else {
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
}

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
pub(super) struct CachedReads {
    state: Mutex<Cached>,
    /// Signalled when the last cached read of an inode closes.
    closed: Condvar,
}

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

impl CachedReads {
    /// A reader opens committed-file inode `ino` as handle `fh`: false if
    /// the inode is tainted (serve it with direct I/O), else the open is
    /// counted until `release`.
    pub(super) fn open(&self, ino: u64, fh: u64) -> bool {
        let mut c = lock(&self.state);
        if c.tainted.contains(&ino) {
            return false;
        }
        *c.open.entry(ino).or_default() += 1;
        c.by_fh.insert(fh, ino);
        true
    }

    pub(super) fn release(&self, fh: u64) {
        let mut c = lock(&self.state);
        if let Some(ino) = c.by_fh.remove(&fh) {
            if let Some(n) = c.open.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    c.open.remove(&ino);
                    self.closed.notify_all();
                }
            }
        }
    }

    pub(super) fn is_tainted(&self, ino: u64) -> bool {
        lock(&self.state).tainted.contains(&ino)
    }

    /// A writer opens committed-file inode `ino` for writing: taint it,
    /// then wait for the cached readers already in it to finish.
    pub(super) fn taint(&self, ino: u64) {
        let mut c = lock(&self.state);
        c.tainted.insert(ino);
        let (_c, waited) = self
            .closed
            .wait_timeout_while(c, READER_WAIT, |c| c.open.contains_key(&ino))
            .unwrap_or_else(|e| e.into_inner());
        if waited.timed_out() {
            tracing::debug!(ino, "a reader still holds the file open through the cache");
        }
    }

    /// The kernel forgot inode `ino`: a new inode number starts untainted.
    pub(super) fn forget(&self, ino: u64) {
        lock(&self.state).tainted.remove(&ino);
    }
}

impl Fs {
    /// Install the function that drops kernel cache entries (the FUSE
    /// notifier), on its own thread.
    pub fn set_invalidator(&self, f: impl Fn(&Target) + Send + 'static) {
        self.kernel.inval.start(f);
    }

    /// Send invalidations. With `wait`, return once done: only call it so
    /// when holding no lock a FUSE request may need.
    pub(super) fn send_inval(&self, targets: Vec<Target>, wait: bool) {
        self.kernel.inval.send(targets, wait);
    }

    pub(super) fn dir_ino(&self, dir: &str) -> Option<u64> {
        lock(&self.kernel.inodes).peek(&Key::Dir(Arc::from(dir)))
    }

    pub(super) fn scratch_ino(&self, path: &str) -> Option<u64> {
        lock(&self.kernel.inodes).peek(&crate::core::scratch::key(path))
    }

    /// Every inode the kernel may cache (after missed remote changes).
    pub(super) fn all_inode_targets(&self) -> Vec<Target> {
        lock(&self.kernel.inodes)
            .all()
            .into_iter()
            .map(Target::Inode)
            .collect()
    }

    /// What views hold of every node they have walked to (after missed
    /// remote changes: any of them may have a newer version).
    pub(super) fn all_view_node_targets(&self) -> Vec<Target> {
        use crate::core::features::version_place;
        let nodes: std::collections::BTreeSet<String> = {
            let inodes = lock(&self.kernel.inodes);
            inodes
                .all()
                .into_iter()
                .filter_map(|ino| match inodes.key(ino) {
                    Some(Key::Virtual(v)) if matches!(version_place(&v), Some((_, _, None))) => {
                        Some(v.dir.to_string())
                    }
                    _ => None,
                })
                .collect()
        };
        nodes.iter().flat_map(|n| self.view_targets(n)).collect()
    }

    /// Dentries of `names` in directory `dir` (if the kernel knows `dir`).
    pub(super) fn entry_targets(&self, dir: &str, names: &[&str]) -> Vec<Target> {
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
    pub(super) fn listing_targets(&self, dirs: &[&str]) -> Vec<Target> {
        dirs.iter()
            .filter_map(|d| self.dir_ino(d))
            .map(Target::Inode)
            .collect()
    }

    pub(super) fn invalidate(&self, dir: &str, names: &[&str], wait: bool) {
        self.send_inval(self.entry_targets(dir, names), wait);
    }

    /// After a commit of `node`: its files' dentries, its listing and its
    /// parent's (a new node appears there), and what views hold of it.
    pub(super) fn invalidate_commit(&self, node: &str, wait: bool) {
        let mut t = self.entry_targets(node, &place::NODE_FILES);
        t.extend(self.listing_targets(&[node, place::parent_name(node).0]));
        t.extend(self.view_targets(node));
        self.send_inval(t, wait);
    }

    /// What views hold of `path` (a node or a directory) that a change
    /// through the main mount made stale: its entry in its parent, and the
    /// listings of the directories above it (up to `accounts/`: a commit
    /// may be the first in a directory the view has listed without it).
    pub(super) fn view_targets(&self, path: &str) -> Vec<Target> {
        let mut t = Vec::new();
        if self.services.views().is_none() {
            return t;
        }
        let (parent, name) = place::parent_name(path);
        let parent_ino = if parent.is_empty() {
            lock(&self.kernel.inodes).peek(&Key::Accounts)
        } else {
            self.dir_ino(parent)
        };
        if let Some(parent) = parent_ino {
            let name = name.to_string();
            t.push(Target::ViewEntry { parent, name });
        }
        let mut d = path;
        while let Some((up, _)) = d.rsplit_once('/') {
            t.extend(self.dir_ino(up).map(Target::ViewListing));
            d = up;
        }
        t.extend(
            lock(&self.kernel.inodes)
                .peek(&Key::Accounts)
                .map(Target::ViewListing),
        );
        t
    }

    /// After `path` was made, moved or removed through the main mount:
    /// what views hold of it ([`Fs::view_targets`]).
    pub(super) fn invalidate_views(&self, path: &str) {
        self.send_inval(self.view_targets(path), false);
    }

    /// After version `version` of node `id` changed in place (a
    /// redaction): its directory and files as views and `.as-of/` cache them.
    pub(super) fn invalidate_version(&self, node: &str, id: u64, version: u32) {
        use crate::core::features::{version_file_key, version_key};
        let t: Vec<Target> = {
            let inodes = lock(&self.kernel.inodes);
            place::NODE_FILES
                .iter()
                .map(|n| version_file_key(node, id, version, n))
                .chain([version_key(node, id, version)])
                .filter_map(|k| inodes.peek(&k))
                .map(Target::Inode)
                .collect()
        };
        self.send_inval(t, false);
    }

    /// After a batch: the listings of every directory above its nodes, up
    /// to the account (a batch may make containers nobody made with
    /// `mkdir`, such as a new agent: the kernel may hold its parent's
    /// listing without them).
    pub(super) fn invalidate_ancestors<'a>(&self, nodes: impl Iterator<Item = &'a str>) {
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
}
