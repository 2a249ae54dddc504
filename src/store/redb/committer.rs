//! The committer thread of the redb backend: it groups the operations of
//! concurrent callers into one batch (with N writers committing at once,
//! one sync is shared by N commits), makes the batch durable in the
//! write-ahead log, applies it to redb without a sync, checkpoints at
//! least every second, and reopens redb by itself after an I/O error
//! (SEMANTICS "Faults").

use super::apply::{apply_record, replay};
use super::{open_db, DbSlot, CHECKPOINT_BYTES, CHECKPOINT_EVERY};
use crate::error::{Error, Result};
use crate::store::wal::{Record, Wal};
use crate::store::Op;
use ::redb::Durability;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// One caller's operations and where its answer goes.
pub(super) struct Job {
    pub(super) ops: Vec<Op>,
    pub(super) durable: bool,
    pub(super) done: mpsc::SyncSender<Result<()>>,
}

/// An error that leaves redb unusable until it is reopened (a failed
/// write to its file: a full disk, an I/O error).
fn is_io_failure(e: &Error) -> bool {
    let r = e.report();
    r.contains("Previous I/O error") || r.contains("(os error")
}

/// The log may grow to this while checkpoints fail (a full disk); past it,
/// commits are refused with `ENOSPC` until a checkpoint succeeds, so a
/// failing store cannot take the space that frees up.
const WAL_LIMIT: u64 = 2 * CHECKPOINT_BYTES;
/// Free bytes the data dir's disk must have before a store broken by an
/// I/O error is reopened (a reopen may repair, and repair writes).
const REOPEN_FREE_BYTES: u64 = 8 << 20;

/// Free bytes on the file system of `dir`, for an unprivileged writer.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a zeroed struct
    // statvfs(3) fills; neither outlives the call.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        Some(st.f_bavail as u64 * st.f_frsize as u64)
    }
}

pub(super) struct Committer {
    slot: Arc<DbSlot>,
    path: std::path::PathBuf,
    wal: Wal,
    seq: u64,
    dirty: bool,
    last_checkpoint: Instant,
    /// The I/O error that broke redb, until it is reopened.
    broken: Option<Error>,
    last_reopen: Instant,
}

impl Committer {
    /// The committer of the database in `slot` (file `path`), with its log
    /// and the last sequence number redb holds.
    pub(super) fn new(slot: Arc<DbSlot>, path: &Path, wal: Wal, seq: u64) -> Committer {
        Committer {
            slot,
            path: path.to_path_buf(),
            wal,
            seq,
            dirty: true,
            last_checkpoint: Instant::now(),
            broken: None,
            last_reopen: Instant::now(),
        }
    }

    pub(super) fn run(mut self, rx: mpsc::Receiver<Job>) {
        loop {
            match rx.recv_timeout(CHECKPOINT_EVERY) {
                Ok(first) => {
                    let mut batch = vec![first];
                    // Everything that queued while the previous batch was
                    // syncing rides in this one.
                    while batch.len() < 512 {
                        match rx.try_recv() {
                            Ok(j) => batch.push(j),
                            Err(_) => break,
                        }
                    }
                    let result = self.batch(&mut batch);
                    if let Err(e) = &result {
                        tracing::error!(error = %e.report(), jobs = batch.len(), "store batch failed");
                    }
                    for j in batch {
                        let _ = j.done.send(result.clone());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if self.broken.is_some() {
                self.reopen();
                continue;
            }
            let due = self.last_checkpoint.elapsed() >= CHECKPOINT_EVERY
                || self.wal.bytes() >= CHECKPOINT_BYTES;
            if self.dirty && due {
                if let Err(e) = self.checkpoint() {
                    tracing::error!(error = %e.report(), "checkpoint failed; the log keeps the changes");
                }
            }
        }
        if self.broken.is_none() {
            if let Err(e) = self.checkpoint() {
                tracing::error!(error = %e.report(), "final checkpoint failed; the log keeps the changes");
            }
        }
    }

    /// Note an error of redb; one that leaves it unusable breaks the store
    /// until [`Committer::reopen`] succeeds.
    fn failed(&mut self, e: Error) -> Error {
        if self.broken.is_none() && is_io_failure(&e) {
            tracing::error!(error = %e.report(), "the store failed to write; commits are refused until it is reopened, which is tried every second once the disk has room");
            self.broken = Some(e.clone());
        }
        e
    }

    fn batch(&mut self, batch: &mut [Job]) -> Result<()> {
        if let Some(e) = &self.broken {
            let e = e.clone();
            if !self.reopen() {
                return Err(e);
            }
        }
        if self.wal.bytes() >= WAL_LIMIT {
            // Checkpoints fail: take nothing more until one succeeds.
            if let Err(e) = self.checkpoint() {
                return Err(Error::Store {
                    what: format!(
                        "the write-ahead log holds {} MiB that the store cannot take ({}); \
                         commits wait for room on the data dir's disk",
                        self.wal.bytes() >> 20,
                        e.report()
                    ),
                    source: None,
                    no_space: true,
                });
            }
        }
        let durable = batch.iter().any(|j| j.durable);
        let ops: Vec<Op> = batch
            .iter_mut()
            .flat_map(|j| std::mem::take(&mut j.ops))
            .collect();
        let rec = Record {
            seq: self.seq + 1,
            ops,
        };
        let before = self.wal.bytes();
        if let Err(e) = self.wal.append(&rec, durable) {
            // A partial frame must not stay in front of the next record.
            let _ = self.wal.rewind(before);
            return Err(e);
        }
        let db = self.slot.get()?;
        if let Err(e) = apply_record(&db, &rec.ops, rec.seq, Durability::None) {
            // Not applied: the log must not replay it either.
            let _ = self.wal.rewind(before);
            return Err(self.failed(e));
        }
        self.seq = rec.seq;
        self.dirty = true;
        Ok(())
    }

    /// Make redb durable up to the last applied record, then drop the log.
    pub(super) fn checkpoint(&mut self) -> Result<()> {
        if self.dirty {
            let db = self.slot.get()?;
            if let Err(e) = apply_record(&db, &[], self.seq, Durability::Immediate) {
                return Err(self.failed(e));
            }
            self.wal.truncate()?;
            self.dirty = false;
        }
        self.last_checkpoint = Instant::now();
        Ok(())
    }

    /// Close redb and open it again after an I/O error (at most once a
    /// second, and only once the disk has room): it comes back at its
    /// last durable state, and the log's records since are applied again.
    /// A reader meets an error (EIO) for the moment it is closed.
    fn reopen(&mut self) -> bool {
        if self.last_reopen.elapsed() < CHECKPOINT_EVERY {
            return false;
        }
        self.last_reopen = Instant::now();
        let dir = self.path.parent().unwrap_or(Path::new("."));
        if free_bytes(dir).is_some_and(|f| f < REOPEN_FREE_BYTES) {
            return false;
        }
        let Some(old) = self.slot.set(None) else {
            return false;
        };
        // Readers hold the old handle for a moment at most.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut old = Some(old);
        while let Some(db) = old.take() {
            match Arc::try_unwrap(db) {
                Ok(db) => drop(db),
                Err(db) if Instant::now() < deadline => {
                    old = Some(db);
                    thread::sleep(Duration::from_millis(5));
                }
                Err(db) => {
                    tracing::warn!("readers hold the failed store; its reopen waits");
                    self.slot.set(Some(db));
                    return false;
                }
            }
        }
        let result = open_db(&self.path).and_then(|db| {
            let records = self.wal.records()?;
            let seq = replay(&db, &records)?;
            apply_record(&db, &[], seq, Durability::Immediate)?;
            Ok((db, seq))
        });
        match result {
            Ok((db, seq)) => {
                self.slot.set(Some(Arc::new(db)));
                self.seq = seq;
                if let Err(e) = self.wal.truncate() {
                    tracing::warn!(error = %e.report(), "the log could not be cut after the reopen; it replays again at the next start");
                    self.dirty = true;
                } else {
                    self.dirty = false;
                }
                self.broken = None;
                tracing::info!("the store was reopened after an I/O error; commits resume");
                true
            }
            Err(e) => {
                tracing::error!(error = %e.report(), "reopening the store failed; tried again in a second");
                false
            }
        }
    }
}
