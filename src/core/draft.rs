//! A draft is the uncommitted overlay of one node: files written, replaced or
//! deleted since its last commit. Writers of the account see the committed
//! version with the overlay on top; readers never see it.

use crate::core::types::STRIPES;
use crate::schema::time::now_ns;
use crate::schema::time::ns_of;
use crate::schema::time::time_of;
use crate::store::{DraftFileRec, DraftRec};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// Up to `size` bytes of `data` from `offset`.
pub fn slice_at(data: &[u8], offset: u64, size: u32) -> Vec<u8> {
    let start = (offset as usize).min(data.len());
    let end = start.saturating_add(size as usize).min(data.len());
    data[start..end].to_vec()
}

pub struct DFile {
    pub data: Vec<u8>,
    pub mtime: SystemTime,
    pub mode: u16,
    /// Open writable handles: such a file stays in the draft after a commit,
    /// so bytes written through them later are not lost.
    pub writers: AtomicUsize,
    /// The counters of draft memory this file's bytes are charged to, and
    /// how many are charged now (given back when the file is dropped).
    charge: Option<Charge>,
    charged: u64,
}

/// Bytes of uncommitted files held in the daemon's memory (drafts and open
/// scratchpad files): in all, and per account.
pub(crate) struct DraftMemory {
    total: Arc<AtomicU64>,
    by_account: std::sync::Mutex<std::collections::HashMap<String, Arc<AtomicU64>>>,
    /// The most it may hold (`ctxfs mount --draft-memory-mb`).
    limit: AtomicU64,
}

impl Default for DraftMemory {
    fn default() -> Self {
        DraftMemory {
            total: Arc::default(),
            by_account: Default::default(),
            limit: AtomicU64::new(super::DEFAULT_DRAFT_MEMORY),
        }
    }
}

/// Where a file's bytes are counted.
#[derive(Clone)]
pub(crate) struct Charge {
    account: Arc<AtomicU64>,
    total: Arc<AtomicU64>,
}

impl Charge {
    /// What is counted here went from `from` bytes to `to`.
    fn shift(&self, from: u64, to: u64) {
        if to >= from {
            self.account.fetch_add(to - from, Ordering::Relaxed);
            self.total.fetch_add(to - from, Ordering::Relaxed);
        } else {
            self.account.fetch_sub(from - to, Ordering::Relaxed);
            self.total.fetch_sub(from - to, Ordering::Relaxed);
        }
    }
}

impl DraftMemory {
    pub(crate) fn charge_for(&self, account: &str) -> Charge {
        let account = crate::locks::lock(&self.by_account)
            .entry(account.to_string())
            .or_default()
            .clone();
        Charge {
            account,
            total: self.total.clone(),
        }
    }

    /// The most uncommitted bytes held in memory (0: the default).
    pub(crate) fn set_limit(&self, bytes: u64) {
        let bytes = if bytes == 0 {
            super::DEFAULT_DRAFT_MEMORY
        } else {
            bytes
        };
        self.limit.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub(crate) fn of_account(&self, account: &str) -> u64 {
        crate::locks::lock(&self.by_account)
            .get(account)
            .map_or(0, |a| a.load(Ordering::Relaxed))
    }
}

/// Bytes a handle buffers until its close (a batch, a conversation being
/// written), counted in the daemon's draft memory and the account's
/// uncommitted bytes like a draft file's, and given back when taken or
/// dropped.
pub(crate) struct HeldBuf {
    data: Vec<u8>,
    charge: Charge,
    charged: u64,
}

impl HeldBuf {
    pub(crate) fn new(charge: Charge) -> HeldBuf {
        HeldBuf {
            data: Vec::new(),
            charge,
            charged: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.data.len()
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.data
    }

    /// Write `data` at `offset` (growing with zeros); the caller checked
    /// the growth against the limits.
    pub(crate) fn write_at(&mut self, offset: usize, data: &[u8]) {
        let end = offset + data.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[offset..end].copy_from_slice(data);
        self.recharge();
    }

    /// The bytes, leaving the buffer empty (and its charge given back).
    pub(crate) fn take(&mut self) -> Vec<u8> {
        let out = std::mem::take(&mut self.data);
        self.recharge();
        out
    }

    fn recharge(&mut self) {
        let now = self.data.len() as u64;
        let c = &self.charge;
        c.shift(self.charged, now);
        self.charged = now;
    }
}

impl Drop for HeldBuf {
    fn drop(&mut self) {
        self.charge.shift(self.charged, 0);
    }
}

impl Drop for DFile {
    fn drop(&mut self) {
        if let Some(c) = &self.charge {
            c.shift(self.charged, 0);
        }
    }
}

impl DFile {
    /// Write `data` at `start` (growing the file with zeros), as `pwrite` does.
    pub fn write_at(&mut self, start: u64, data: &[u8]) -> crate::error::Result<u32> {
        use crate::error::Error;
        let end = start.checked_add(data.len() as u64).ok_or(Error::TooBig)?;
        if end > super::MAX_FILE_BYTES {
            return Err(Error::TooBig);
        }
        let (start, end) = (start as usize, end as usize);
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[start..end].copy_from_slice(data);
        self.mtime = SystemTime::now();
        self.recharge();
        Ok(data.len() as u32)
    }

    /// Count this file's bytes in `c` from now on (once).
    pub(crate) fn attach(&mut self, c: Charge) {
        if self.charge.is_none() {
            self.charge = Some(c);
            self.charged = 0;
            self.recharge();
        }
    }

    /// Bring the charged count to the file's size (after it changed).
    pub fn recharge(&mut self) {
        let Some(c) = &self.charge else { return };
        let now = self.data.len() as u64;
        c.shift(self.charged, now);
        self.charged = now;
    }

    /// Apply `setattr`'s size, mode and mtime (size checked against the file limit).
    pub fn set_attr(&mut self, sa: &super::SetAttr) -> crate::error::Result<()> {
        if let Some(size) = sa.size {
            if size > super::MAX_FILE_BYTES {
                return Err(crate::error::Error::TooBig);
            }
            self.data.resize(size as usize, 0);
            self.mtime = SystemTime::now();
            self.recharge();
        }
        if let Some(m) = sa.mode {
            self.mode = (m & 0o7777) as u16;
        }
        if let Some(t) = sa.mtime {
            self.mtime = t;
        }
        Ok(())
    }

    /// Up to `size` bytes from `offset`, as `pread` does.
    pub fn read_at(&self, offset: u64, size: u32) -> Vec<u8> {
        slice_at(&self.data, offset, size)
    }

    pub fn new(data: Vec<u8>, mode: u16) -> Arc<RwLock<DFile>> {
        Arc::new(RwLock::new(DFile {
            data,
            mtime: SystemTime::now(),
            mode,
            writers: AtomicUsize::new(0),
            charge: None,
            charged: 0,
        }))
    }
}

#[derive(Clone)]
pub enum Slot {
    File(Arc<RwLock<DFile>>),
    /// The committed file of this name is deleted in the draft.
    Whiteout,
}

pub struct Draft {
    /// (node id, version) the draft started from; `None` for a new node (PENDING).
    pub base: Option<(u64, u32)>,
    pub files: BTreeMap<String, Slot>,
    pub modified_ns: i128,
    /// Why the last commit was refused (shown as `.commit-error`).
    pub error: Option<String>,
    /// Who commits it next (set by the path that commits).
    pub by: Option<super::commit::rules::By>,
}

impl Draft {
    pub fn new(base: Option<(u64, u32)>) -> Draft {
        Draft {
            base,
            files: BTreeMap::new(),
            modified_ns: now_ns(),
            error: None,
            by: None,
        }
    }

    pub fn touch(&mut self) {
        self.modified_ns = now_ns();
    }

    /// When the draft last changed: its own changes or a write to one of its files.
    pub fn last_modified_ns(&self) -> i128 {
        let newest_file = self
            .files
            .values()
            .filter_map(|s| match s {
                Slot::File(f) => Some(ns_of(crate::locks::read(f).mtime)),
                Slot::Whiteout => None,
            })
            .max()
            .unwrap_or(0);
        self.modified_ns.max(newest_file)
    }

    pub fn to_rec(&self) -> DraftRec {
        DraftRec {
            base: self.base,
            modified_ns: self.last_modified_ns(),
            files: self
                .files
                .iter()
                .map(|(name, slot)| match slot {
                    Slot::File(f) => {
                        let f = crate::locks::read(f);
                        DraftFileRec {
                            name: name.clone(),
                            data: Some(f.data.clone()),
                            mtime_ns: ns_of(f.mtime),
                            mode: f.mode,
                        }
                    }
                    Slot::Whiteout => DraftFileRec {
                        name: name.clone(),
                        data: None,
                        mtime_ns: 0,
                        mode: 0,
                    },
                })
                .collect(),
        }
    }

    pub fn from_rec(rec: DraftRec) -> Draft {
        Draft {
            base: rec.base,
            modified_ns: rec.modified_ns,
            error: None,
            by: None,
            files: rec
                .files
                .into_iter()
                .map(|f| {
                    let slot = match f.data {
                        Some(data) => {
                            let file = DFile::new(data, f.mode);
                            if let Ok(mut g) = file.write() {
                                g.mtime = time_of(f.mtime_ns);
                            }
                            Slot::File(file)
                        }
                        None => Slot::Whiteout,
                    };
                    (f.name, slot)
                })
                .collect(),
        }
    }
}

/// The drafts of the daemon by node path, and the node locks a change
/// takes (stripes: a node's path hashed to one of `STRIPES` mutexes).
/// Lock order: a node's stripe → this map → one `Draft` → one `DFile`.
pub(crate) struct Drafts {
    map: std::sync::Mutex<std::collections::HashMap<String, SharedDraft>>,
    stripes: Vec<std::sync::Mutex<()>>,
}

/// The stripe a node's path hashes to.
pub(crate) fn stripe_of(node: &str) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.hash(&mut h);
    (h.finish() as usize) % STRIPES
}

impl Default for Drafts {
    fn default() -> Drafts {
        Drafts {
            map: Default::default(),
            stripes: (0..STRIPES).map(|_| std::sync::Mutex::new(())).collect(),
        }
    }
}

pub(crate) type SharedDraft = Arc<std::sync::Mutex<Draft>>;

impl Drafts {
    /// The lock of `node`: every change of a node's files or status holds it.
    pub(crate) fn stripe(&self, node: &str) -> std::sync::MutexGuard<'_, ()> {
        crate::locks::lock(&self.stripes[stripe_of(node)])
    }

    /// The stripes of all `nodes`, each once, taken in ascending order (no
    /// deadlock with another taker of several).
    pub(crate) fn stripes_of<'a>(
        &self,
        nodes: impl Iterator<Item = &'a str>,
    ) -> Vec<std::sync::MutexGuard<'_, ()>> {
        let mut ids: Vec<usize> = nodes.map(stripe_of).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|i| crate::locks::lock(&self.stripes[i]))
            .collect()
    }

    /// The locks of two nodes (one when they share a stripe), in order.
    pub(crate) fn lock_two(
        &self,
        a: &str,
        b: &str,
    ) -> (
        std::sync::MutexGuard<'_, ()>,
        Option<std::sync::MutexGuard<'_, ()>>,
    ) {
        let (i, j) = (stripe_of(a), stripe_of(b));
        if i == j {
            (crate::locks::lock(&self.stripes[i]), None)
        } else {
            let (lo, hi) = (i.min(j), i.max(j));
            let g1 = crate::locks::lock(&self.stripes[lo]);
            let g2 = crate::locks::lock(&self.stripes[hi]);
            (g1, Some(g2))
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, SharedDraft>> {
        crate::locks::lock(&self.map)
    }

    pub(crate) fn get(&self, node: &str) -> Option<SharedDraft> {
        self.map().get(node).cloned()
    }

    /// The draft of `node`, created over `base` (id, version) when missing.
    pub(crate) fn get_or_new(&self, node: &str, base: Option<(u64, u32)>) -> SharedDraft {
        self.map()
            .entry(node.to_string())
            .or_insert_with(|| Arc::new(std::sync::Mutex::new(Draft::new(base))))
            .clone()
    }

    pub(crate) fn insert(&self, node: String, d: Draft) {
        self.map().insert(node, Arc::new(std::sync::Mutex::new(d)));
    }

    pub(crate) fn remove(&self, node: &str) -> Option<SharedDraft> {
        self.map().remove(node)
    }

    /// Drop `draft` of `node` if it is still the node's draft and empty.
    pub(crate) fn remove_if_empty(&self, node: &str, draft: &SharedDraft) {
        let mut m = self.map();
        if let Some(cur) = m.get(node) {
            if Arc::ptr_eq(cur, draft) && crate::locks::lock(cur).files.is_empty() {
                m.remove(node);
            }
        }
    }

    /// Move the draft of `src` to `dst`, with a new base when given.
    pub(crate) fn rename(&self, src: &str, dst: &str, base: Option<(u64, u32)>) {
        let mut m = self.map();
        if let Some(d) = m.remove(src) {
            if base.is_some() {
                crate::locks::lock(&d).base = base;
            }
            m.insert(dst.to_string(), d);
        }
    }

    /// The nodes with a draft under directory `prefix` (ending in `/`).
    pub(crate) fn nodes_under(&self, prefix: &str) -> Vec<String> {
        self.map()
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Every draft, outside the map's lock.
    pub(crate) fn snapshot(&self) -> Vec<(String, SharedDraft)> {
        self.map()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}
