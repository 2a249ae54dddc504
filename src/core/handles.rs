//! Open files: what each file handle serves, and the table of handles.

use super::draft::DFile;
use super::scratch;
use crate::error::{Error, Result};
use crate::locks::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

pub(crate) enum Handle {
    /// Immutable bytes: a committed version or a generated file.
    Data(Arc<[u8]>),
    Draft(DraftHandle),
    /// A file of a project's shared area.
    Scratch(scratch::ScratchHandle),
    /// A one-line control file opened for writing (`.versions/restore`, …).
    Restore(RestoreHandle),
    /// `accounts/{a}/.ctxfs/batch` opened for writing.
    Batch(super::commit::BatchHandle),
    /// A conversation (or a review decision) being written to an inbox.
    Inbox(super::inbox::InboxHandle),
}

pub(crate) struct DraftHandle {
    pub(super) node: Arc<str>,
    pub(super) name: String,
    pub(super) file: Arc<RwLock<DFile>>,
    pub(super) append: bool,
    pub(super) writable: bool,
    pub(super) dirty: AtomicBool,
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

/// What a one-line control file does with its line.
#[derive(Debug, Clone)]
pub(crate) enum Control {
    /// `NODE/.versions/restore`: a version number, committed again.
    Restore,
    /// `NODE/.versions/redact`: a version number, made a tombstone.
    Redact,
    /// `accounts/{a}/.as-of/{T}/restore`: a path in the account, whose
    /// nodes are committed again as they were at `at` (ns).
    RestoreAsOf { at: i128 },
}

/// A one-line control file opened for writing (`.versions/restore`,
/// `.versions/redact`, `.as-of/T/restore`): the line may come in several
/// writes; it is applied once, when a write completes it or at close.
pub(crate) struct RestoreHandle {
    /// The node (or, for `RestoreAsOf`, the account) it acts on.
    pub(super) node: Arc<str>,
    /// Who restores (or redacts): `committed_by` of the new version.
    pub(super) by: super::commit::rules::By,
    pub(super) what: Control,
    pub(super) buf: Mutex<Vec<u8>>,
    pub(super) applied: AtomicBool,
}

impl RestoreHandle {
    pub(super) fn new(
        node: Arc<str>,
        what: Control,
        by: super::commit::rules::By,
    ) -> RestoreHandle {
        RestoreHandle {
            node,
            by,
            what,
            buf: Mutex::new(Vec::new()),
            applied: AtomicBool::new(false),
        }
    }
}

/// The last result of a control file (`.ctxfs/batch`, `.as-of/T/restore`)
/// for each (account, uid), for the writer to read back; bounded (cleared
/// whole past 4,096 writers).
#[derive(Default)]
pub(crate) struct LastResults(Mutex<HashMap<Writer, Arc<[u8]>>>);

/// (account, uid).
type Writer = (String, u32);

impl LastResults {
    pub(crate) fn keep(&self, account: &str, uid: u32, result: Vec<u8>) {
        let mut r = lock(&self.0);
        if r.len() >= 4096 {
            r.clear();
        }
        r.insert((account.to_string(), uid), Arc::from(result));
    }

    pub(crate) fn get(&self, account: &str, uid: u32) -> Option<Arc<[u8]>> {
        lock(&self.0).get(&(account.to_string(), uid)).cloned()
    }
}

/// What callers hold between requests: open handles by number (numbers
/// are never reused), the listings being read, the last batch results.
pub(super) struct Handles {
    next: AtomicU64,
    map: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Listings being read, by (directory inode, uid): see [`Fs::readdir`].
    pub(super) listings: Mutex<HashMap<(u64, u32), Arc<super::Listing>>>,
    /// The last batch result of each (account, uid), for `.ctxfs/batch`.
    pub(super) batch_results: LastResults,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            next: AtomicU64::new(1),
            map: Mutex::new(HashMap::new()),
            listings: Mutex::new(HashMap::new()),
            batch_results: LastResults::default(),
        }
    }
}

impl Handles {
    pub(super) fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.map).insert(fh, Arc::new(h));
        fh
    }

    pub(super) fn get(&self, fh: u64) -> Result<Arc<Handle>> {
        lock(&self.map).get(&fh).cloned().ok_or(Error::BadHandle)
    }

    pub(super) fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        lock(&self.map).remove(&fh)
    }
}
