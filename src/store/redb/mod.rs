//! The redb backend. Tables and key encoding are documented in
//! `docs/ARCHITECTURE.md` ("Storage"); `fsck.rs` checks their invariants.
//!
//! Writes go through one committer thread that groups the operations of
//! concurrent callers into one batch: with N writers committing at once, the
//! cost of one sync is shared by N commits. A batch is made durable by the
//! write-ahead log (`wal.rs`), then applied to redb without a sync; a
//! checkpoint (`Immediate` commit, log truncated) runs at least every second.
//! The scans and the rewrite of `ctxfs compact` are in `compact.rs`.

mod compact;
mod migrate;
mod salvage;

pub use self::compact::{read_table, TABLES};
pub use self::salvage::{salvage, Salvaged};

use super::wal::{Record, Wal};
use super::{NodeRec, Op, Store, StoredEvent};
use crate::error::{Error, Result};
use ::redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
const CHECKPOINT_BYTES: u64 = 64 << 20;
/// High-water key of the last log record applied to redb.
const WAL_SEQ: &str = "wal";

/// (parent, name) → postcard `NodeRec` of the current version.
pub(super) const NODES: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("nodes");
/// (parent, name) → () for container directories (accounts, users, agents, projects, categories).
pub(super) const DIRS: TableDefinition<(&str, &str), ()> = TableDefinition::new("dirs");
/// (node id, version) → postcard `NodeRec`: every committed version.
pub(super) const VERSIONS: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("versions");
/// (blob id, chunk index) → bytes. Chunks stay below a power of two (redb pages).
pub(super) const BLOBS: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("blobs");
/// event seq → event JSON (seed 000 OutboxEvent).
pub(super) const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
/// (node path, seq) → (): the events of a node, for `.outbox/`.
pub(super) const OUTBOX_BY_NODE: TableDefinition<(&str, u64), ()> =
    TableDefinition::new("outbox_by_node");
/// event seq → event JSON of a dead letter (retries exhausted).
pub(super) const DLQ: TableDefinition<u64, &[u8]> = TableDefinition::new("dlq");
/// (node path, seq) → (): the dead letters of a node, for `.outbox/dlq/`.
pub(super) const DLQ_BY_NODE: TableDefinition<(&str, u64), ()> =
    TableDefinition::new("dlq_by_node");
/// node path → postcard index document (`crate::index::IxDoc`).
pub(super) const IX_DOCS: TableDefinition<&str, &[u8]> = TableDefinition::new("ix_docs");
/// (model id, xxh3-128 of the text) → little-endian f32 vector.
pub(super) const VECS: TableDefinition<(&str, u128), &[u8]> = TableDefinition::new("vecs");
/// node path → postcard draft (persisted on fsync and at unmount).
pub(super) const DRAFTS: TableDefinition<&str, &[u8]> = TableDefinition::new("drafts");
/// counter name → value (`nodes:{account}:{STATUS}`, `outbox:{account}`).
pub(super) const COUNTERS: TableDefinition<&str, i64> = TableDefinition::new("counters");
/// (parent, name) → postcard `ScratchRec`: files and directories of project scratchpads.
pub(super) const SCRATCH: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("scratch");
/// id name → highest id handed out (`blob`, `node`, `event`).
/// node path → when it expires (ns since the epoch).
pub(super) const EXPIRY: TableDefinition<&str, u64> = TableDefinition::new("expiry");
pub(super) const HIGH_WATER: TableDefinition<&str, u64> = TableDefinition::new("high_water");

/// redb's page cache (its default is 1 GiB).
pub(super) const CACHE_BYTES: usize = 128 << 20;
pub const CHUNK: usize = 64 * 1024 - 256;

pub(super) fn se<E: std::error::Error + Send + Sync + 'static>(e: E) -> Error {
    Error::store_from("redb", e)
}

pub(super) fn decode(bytes: &[u8]) -> Result<NodeRec> {
    postcard::from_bytes(bytes).map_err(|e| Error::store_from("corrupt node record", e))
}

fn encode(rec: &NodeRec) -> Result<Vec<u8>> {
    postcard::to_stdvec(rec).map_err(se)
}

pub(super) fn split_key(path: &str) -> (&str, &str) {
    crate::schema::place::parent_name(path)
}

struct Job {
    ops: Vec<Op>,
    durable: bool,
    done: mpsc::SyncSender<Result<()>>,
}

/// The open database, shared by the readers and the committer. Empty for
/// the moment the committer reopens it after an I/O error.
struct DbSlot(std::sync::RwLock<Option<Arc<Database>>>);

impl DbSlot {
    fn get(&self) -> Result<Arc<Database>> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| Error::store("the store is being reopened after an I/O error"))
    }

    fn set(&self, db: Option<Arc<Database>>) -> Option<Arc<Database>> {
        std::mem::replace(&mut *self.0.write().unwrap_or_else(|p| p.into_inner()), db)
    }
}

/// Open (or create) the database file with every table. Refuses a file
/// another process holds.
fn open_db(path: &Path) -> Result<Database> {
    // redb caches up to 1 GiB by default; the OS page cache holds the
    // file too, so a smaller cache bounds the daemon's RSS at little cost.
    let db = Database::builder()
        .set_cache_size(CACHE_BYTES)
        .create(path)
        .map_err(|e| match e {
            ::redb::DatabaseError::DatabaseAlreadyOpen => Error::store(format!(
                "{} is already open in another process (is a ctxfs daemon serving this data dir?)",
                path.display()
            )),
            e => Error::store_from(format!("cannot open {}", path.display()), e),
        })?;
    // Create every table so readers never meet a missing one; a store that
    // has them all is not written at open (a nearly full disk opens).
    let have = {
        let r = db.begin_read().map_err(se)?;
        let n = r.list_tables().map_err(se)?.count();
        n
    };
    if have >= compact::TABLES.len() {
        return Ok(db);
    }
    let txn = db.begin_write().map_err(se)?;
    {
        txn.open_table(NODES).map_err(se)?;
        txn.open_table(DIRS).map_err(se)?;
        txn.open_table(VERSIONS).map_err(se)?;
        txn.open_table(BLOBS).map_err(se)?;
        txn.open_table(OUTBOX).map_err(se)?;
        txn.open_table(OUTBOX_BY_NODE).map_err(se)?;
        txn.open_table(DRAFTS).map_err(se)?;
        txn.open_table(COUNTERS).map_err(se)?;
        txn.open_table(HIGH_WATER).map_err(se)?;
        txn.open_table(DLQ).map_err(se)?;
        txn.open_table(DLQ_BY_NODE).map_err(se)?;
        txn.open_table(IX_DOCS).map_err(se)?;
        txn.open_table(VECS).map_err(se)?;
        txn.open_table(SCRATCH).map_err(se)?;
        txn.open_table(EXPIRY).map_err(se)?;
    }
    txn.commit().map_err(se)?;
    Ok(db)
}

/// The last log sequence number redb holds.
fn applied_seq(db: &Database) -> Result<u64> {
    let t = db.begin_read().map_err(se)?;
    let hw = t.open_table(HIGH_WATER).map_err(se)?;
    let v = hw.get(WAL_SEQ).map_err(se)?.map(|g| g.value()).unwrap_or(0);
    Ok(v)
}

/// Apply the log records redb does not hold yet; the last sequence number.
fn replay(db: &Database, records: &[Record]) -> Result<u64> {
    let applied = applied_seq(db)?;
    let mut seq = applied;
    let mut replayed = 0;
    for r in records.iter().filter(|r| r.seq > applied) {
        apply_record(db, &r.ops, r.seq, Durability::None)?;
        seq = r.seq;
        replayed += 1;
    }
    if replayed > 0 {
        tracing::info!(replayed, "write-ahead log replayed into the store");
    }
    Ok(seq)
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

pub struct RedbStore {
    db: Arc<DbSlot>,
    jobs: std::sync::Mutex<Option<mpsc::Sender<Job>>>,
    committer: std::sync::Mutex<Option<thread::JoinHandle<()>>>,
}

impl RedbStore {
    /// Open (or create) the database file. Refuses a file another process holds.
    pub fn open(path: &Path) -> Result<Arc<Self>> {
        let db = Arc::new(open_db(path)?);
        // Replay what the log holds beyond redb's last durable state.
        let wal_path = path.with_extension("wal");
        let (wal, records) = Wal::open(&wal_path)?;
        let seq = replay(&db, &records)?;
        let slot = Arc::new(DbSlot(std::sync::RwLock::new(Some(db))));
        let mut committer = Committer {
            slot: slot.clone(),
            path: path.to_path_buf(),
            wal,
            seq,
            dirty: true,
            last_checkpoint: Instant::now(),
            broken: None,
            last_reopen: Instant::now(),
        };
        committer.checkpoint()?;

        let (tx, rx) = mpsc::channel::<Job>();
        let committer = thread::Builder::new()
            .name("ctxfs-commit".into())
            .spawn(move || committer.run(rx))
            .map_err(se)?;
        Ok(Arc::new(RedbStore {
            db: slot,
            jobs: std::sync::Mutex::new(Some(tx)),
            committer: std::sync::Mutex::new(Some(committer)),
        }))
    }

    /// Stop the committer after the queued jobs; later `apply` calls fail.
    pub fn close(&self) {
        if let Ok(mut j) = self.jobs.lock() {
            j.take();
        }
        if let Some(h) = self.committer.lock().ok().and_then(|mut c| c.take()) {
            let _ = h.join();
        }
    }

    pub(super) fn db(&self) -> Result<Arc<Database>> {
        self.db.get()
    }

    pub(super) fn read(&self) -> Result<::redb::ReadTransaction> {
        self.db.get()?.begin_read().map_err(se)
    }
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        self.close();
    }
}

struct Committer {
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
    fn run(mut self, rx: mpsc::Receiver<Job>) {
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
    fn checkpoint(&mut self) -> Result<()> {
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

/// Apply ops in one redb transaction, recording the log sequence number.
fn apply_record(db: &Database, ops: &[Op], seq: u64, durability: Durability) -> Result<()> {
    let mut txn = db.begin_write().map_err(se)?;
    txn.set_durability(durability).map_err(se)?;
    apply_ops(&txn, ops)?;
    {
        let mut hw = txn.open_table(HIGH_WATER).map_err(se)?;
        hw.insert(WAL_SEQ, seq).map_err(se)?;
    }
    txn.commit().map_err(se)
}

fn apply_ops(txn: &::redb::WriteTransaction, ops: &[Op]) -> Result<()> {
    {
        let mut nodes = txn.open_table(NODES).map_err(se)?;
        let mut dirs = txn.open_table(DIRS).map_err(se)?;
        let mut versions = txn.open_table(VERSIONS).map_err(se)?;
        let mut blobs = txn.open_table(BLOBS).map_err(se)?;
        let mut outbox = txn.open_table(OUTBOX).map_err(se)?;
        let mut by_node = txn.open_table(OUTBOX_BY_NODE).map_err(se)?;
        let mut drafts = txn.open_table(DRAFTS).map_err(se)?;
        let mut counters = txn.open_table(COUNTERS).map_err(se)?;
        let mut hw = txn.open_table(HIGH_WATER).map_err(se)?;
        let mut dlq = txn.open_table(DLQ).map_err(se)?;
        let mut dlq_by_node = txn.open_table(DLQ_BY_NODE).map_err(se)?;
        let mut ix = txn.open_table(IX_DOCS).map_err(se)?;
        let mut vecs = txn.open_table(VECS).map_err(se)?;
        let mut scratch = txn.open_table(SCRATCH).map_err(se)?;
        let mut expiry = txn.open_table(EXPIRY).map_err(se)?;
        for op in ops {
            match op {
                // One daemon: the core's node locks make every commit see
                // the version it was planned on (and the log replays
                // batches that held then), so there is nothing to check.
                Op::Expect { .. } => {}
                Op::PutNode { path, rec } => {
                    nodes
                        .insert(split_key(path), encode(rec)?.as_slice())
                        .map_err(se)?;
                }
                Op::DelNode { path } => {
                    nodes.remove(split_key(path)).map_err(se)?;
                }
                Op::PutDir { path } => {
                    dirs.insert(split_key(path), ()).map_err(se)?;
                }
                Op::DelDir { path } => {
                    dirs.remove(split_key(path)).map_err(se)?;
                }
                Op::PutVersion { rec } => {
                    versions
                        .insert((rec.id, rec.version), encode(rec)?.as_slice())
                        .map_err(se)?;
                }
                Op::DropHistory { node_id } => {
                    let mut blob_ids = Vec::new();
                    let mut keys = Vec::new();
                    for item in versions
                        .range((*node_id, 0)..=(*node_id, u32::MAX))
                        .map_err(se)?
                    {
                        let (k, v) = item.map_err(se)?;
                        keys.push(k.value());
                        blob_ids.extend(decode(v.value())?.files.iter().map(|f| f.blob));
                    }
                    for k in keys {
                        versions.remove(k).map_err(se)?;
                    }
                    blob_ids.sort_unstable();
                    blob_ids.dedup();
                    for id in blob_ids {
                        let chunks: Vec<(u64, u32)> = blobs
                            .range((id, 0)..=(id, u32::MAX))
                            .map_err(se)?
                            .map(|r| r.map(|(k, _)| k.value()).map_err(se))
                            .collect::<Result<_>>()?;
                        for k in chunks {
                            blobs.remove(k).map_err(se)?;
                        }
                    }
                }
                Op::DelBlob { id } => {
                    let chunks: Vec<(u64, u32)> = blobs
                        .range((*id, 0)..=(*id, u32::MAX))
                        .map_err(se)?
                        .map(|r| r.map(|(k, _)| k.value()).map_err(se))
                        .collect::<Result<_>>()?;
                    for k in chunks {
                        blobs.remove(k).map_err(se)?;
                    }
                }
                Op::PutBlob { id, data } | Op::PutBlobOf { id, data, .. } => {
                    if data.is_empty() {
                        blobs.insert((*id, 0), &[][..]).map_err(se)?;
                    }
                    for (i, chunk) in data.chunks(CHUNK).enumerate() {
                        blobs.insert((*id, i as u32), chunk).map_err(se)?;
                    }
                }
                Op::PutEvent {
                    seq,
                    node_path,
                    account,
                    json,
                } => {
                    let fresh = outbox.insert(*seq, json.as_slice()).map_err(se)?.is_none();
                    by_node.insert((node_path.as_str(), *seq), ()).map_err(se)?;
                    if fresh {
                        add(
                            &mut counters,
                            &crate::schema::counters::outbox_key(account),
                            1,
                        )?;
                    }
                }
                Op::DoneEvent {
                    seq,
                    node_path,
                    account,
                } => {
                    if outbox.remove(*seq).map_err(se)?.is_some() {
                        add(
                            &mut counters,
                            &crate::schema::counters::outbox_key(account),
                            -1,
                        )?;
                    }
                    by_node.remove((node_path.as_str(), *seq)).map_err(se)?;
                }
                Op::UpdateEvent { seq, json } => {
                    if outbox.get(*seq).map_err(se)?.is_some() {
                        outbox.insert(*seq, json.as_slice()).map_err(se)?;
                    }
                }
                Op::DeadEvent {
                    seq,
                    node_path,
                    account,
                    json,
                } => {
                    if outbox.remove(*seq).map_err(se)?.is_some() {
                        add(
                            &mut counters,
                            &crate::schema::counters::outbox_key(account),
                            -1,
                        )?;
                    }
                    by_node.remove((node_path.as_str(), *seq)).map_err(se)?;
                    if dlq.insert(*seq, json.as_slice()).map_err(se)?.is_none() {
                        add(&mut counters, &crate::schema::counters::dlq_key(account), 1)?;
                    }
                    dlq_by_node
                        .insert((node_path.as_str(), *seq), ())
                        .map_err(se)?;
                }
                Op::ReviveEvent {
                    seq,
                    node_path,
                    account,
                    json,
                } => {
                    if dlq.remove(*seq).map_err(se)?.is_some() {
                        add(
                            &mut counters,
                            &crate::schema::counters::dlq_key(account),
                            -1,
                        )?;
                    }
                    dlq_by_node.remove((node_path.as_str(), *seq)).map_err(se)?;
                    if outbox.insert(*seq, json.as_slice()).map_err(se)?.is_none() {
                        add(
                            &mut counters,
                            &crate::schema::counters::outbox_key(account),
                            1,
                        )?;
                    }
                    by_node.insert((node_path.as_str(), *seq), ()).map_err(se)?;
                }
                Op::DropDead {
                    seq,
                    node_path,
                    account,
                } => {
                    if dlq.remove(*seq).map_err(se)?.is_some() {
                        add(
                            &mut counters,
                            &crate::schema::counters::dlq_key(account),
                            -1,
                        )?;
                    }
                    dlq_by_node.remove((node_path.as_str(), *seq)).map_err(se)?;
                }
                Op::PutScratch { path, data } => {
                    scratch
                        .insert(split_key(path), data.as_slice())
                        .map_err(se)?;
                }
                Op::DelScratch { path } => {
                    scratch.remove(split_key(path)).map_err(se)?;
                }
                Op::AppendLog {
                    path,
                    data,
                    mode,
                    mtime_ns,
                } => {
                    let old = scratch
                        .get(split_key(path))
                        .map_err(se)?
                        .map(|g| g.value().to_vec());
                    let rec = super::ScratchRec::appended(old.as_deref(), data, *mode, *mtime_ns)?;
                    scratch
                        .insert(split_key(path), rec.as_slice())
                        .map_err(se)?;
                }
                Op::PutExpiry { path, at_ns } => {
                    expiry.insert(path.as_str(), *at_ns).map_err(se)?;
                }
                Op::DelExpiry { path } => {
                    expiry.remove(path.as_str()).map_err(se)?;
                }
                Op::PutIx { path, data } => {
                    ix.insert(path.as_str(), data.as_slice()).map_err(se)?;
                }
                Op::DelIx { path } => {
                    ix.remove(path.as_str()).map_err(se)?;
                }
                Op::PutVec { model, hash, data } => {
                    vecs.insert((model.as_str(), *hash), data.as_slice())
                        .map_err(se)?;
                }
                Op::DelVec { model, hash } => {
                    vecs.remove((model.as_str(), *hash)).map_err(se)?;
                }
                Op::PutDraft { path, data } => {
                    drafts.insert(path.as_str(), data.as_slice()).map_err(se)?;
                }
                Op::DelDraft { path } => {
                    drafts.remove(path.as_str()).map_err(se)?;
                }
                Op::Count { key, delta } => add(&mut counters, key, *delta)?,
                Op::HighWater { key, value } => {
                    let key: &str = key;
                    let cur = hw.get(key).map_err(se)?.map(|g| g.value()).unwrap_or(0);
                    if *value > cur {
                        hw.insert(key, *value).map_err(se)?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn add(t: &mut ::redb::Table<&str, i64>, key: &str, delta: i64) -> Result<()> {
    let cur = t.get(key).map_err(se)?.map(|g| g.value()).unwrap_or(0);
    let new = cur + delta;
    if new == 0 {
        t.remove(key).map_err(se)?;
    } else {
        t.insert(key, new).map_err(se)?;
    }
    Ok(())
}

/// Range bounds for the direct children of `parent` in a (parent, name) table.
/// Names are ASCII without DEL, so `"\u{7f}"` bounds them all.
fn children(parent: &str) -> std::ops::Range<(&str, &str)> {
    (parent, "")..(parent, "\u{7f}")
}

impl Store for RedbStore {
    fn get_node(&self, path: &str) -> Result<Option<NodeRec>> {
        let t = self.read()?.open_table(NODES).map_err(se)?;
        match t.get(split_key(path)).map_err(se)? {
            Some(g) => Ok(Some(decode(g.value())?)),
            None => Ok(None),
        }
    }

    fn get_version(&self, _account: &str, node_id: u64, version: u32) -> Result<Option<NodeRec>> {
        let t = self.read()?.open_table(VERSIONS).map_err(se)?;
        match t.get((node_id, version)).map_err(se)? {
            Some(g) => Ok(Some(decode(g.value())?)),
            None => Ok(None),
        }
    }

    fn list_nodes(&self, parent: &str) -> Result<Vec<(String, NodeRec)>> {
        let t = self.read()?.open_table(NODES).map_err(se)?;
        let mut out = Vec::new();
        for item in t.range(children(parent)).map_err(se)? {
            let (k, v) = item.map_err(se)?;
            out.push((k.value().1.to_string(), decode(v.value())?));
        }
        Ok(out)
    }

    fn has_children(&self, parent: &str) -> Result<bool> {
        let txn = self.read()?;
        let nodes = txn.open_table(NODES).map_err(se)?;
        if nodes.range(children(parent)).map_err(se)?.next().is_some() {
            return Ok(true);
        }
        let dirs = txn.open_table(DIRS).map_err(se)?;
        Ok(dirs.range(children(parent)).map_err(se)?.next().is_some())
    }

    fn dir_exists(&self, path: &str) -> Result<bool> {
        let t = self.read()?.open_table(DIRS).map_err(se)?;
        Ok(t.get(split_key(path)).map_err(se)?.is_some())
    }

    fn list_dirs(&self, parent: &str) -> Result<Vec<String>> {
        let t = self.read()?.open_table(DIRS).map_err(se)?;
        let mut out = Vec::new();
        for item in t.range(children(parent)).map_err(se)? {
            let (k, _) = item.map_err(se)?;
            out.push(k.value().1.to_string());
        }
        Ok(out)
    }

    fn read_blob(&self, _account: &str, id: u64, size: u64) -> Result<Vec<u8>> {
        let t = self.read()?.open_table(BLOBS).map_err(se)?;
        let mut out = Vec::with_capacity(size as usize);
        for item in t.range((id, 0)..=(id, u32::MAX)).map_err(se)? {
            let (_, v) = item.map_err(se)?;
            out.extend_from_slice(v.value());
        }
        if out.len() as u64 != size {
            return Err(Error::store(format!(
                "blob {id} has {} bytes, its record says {size}",
                out.len()
            )));
        }
        Ok(out)
    }

    fn node_events(&self, node_path: &str) -> Result<Vec<StoredEvent>> {
        let txn = self.read()?;
        let idx = txn.open_table(OUTBOX_BY_NODE).map_err(se)?;
        let ev = txn.open_table(OUTBOX).map_err(se)?;
        let mut out = Vec::new();
        for item in idx
            .range((node_path, 0)..=(node_path, u64::MAX))
            .map_err(se)?
        {
            let (k, _) = item.map_err(se)?;
            let seq = k.value().1;
            if let Some(g) = ev.get(seq).map_err(se)? {
                out.push(StoredEvent {
                    seq,
                    json: g.value().to_vec(),
                });
            }
        }
        Ok(out)
    }

    fn outbox_head(&self, limit: usize) -> Result<Vec<StoredEvent>> {
        let t = self.read()?.open_table(OUTBOX).map_err(se)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(se)?.take(limit) {
            let (k, v) = item.map_err(se)?;
            out.push(StoredEvent {
                seq: k.value(),
                json: v.value().to_vec(),
            });
        }
        Ok(out)
    }

    fn dead_events(&self, node_path: &str) -> Result<Vec<StoredEvent>> {
        let txn = self.read()?;
        let idx = txn.open_table(DLQ_BY_NODE).map_err(se)?;
        let ev = txn.open_table(DLQ).map_err(se)?;
        let mut out = Vec::new();
        for item in idx
            .range((node_path, 0)..=(node_path, u64::MAX))
            .map_err(se)?
        {
            let seq = item.map_err(se)?.0.value().1;
            if let Some(g) = ev.get(seq).map_err(se)? {
                out.push(StoredEvent {
                    seq,
                    json: g.value().to_vec(),
                });
            }
        }
        Ok(out)
    }

    fn get_scratch(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let t = self.read()?.open_table(SCRATCH).map_err(se)?;
        Ok(t.get(split_key(path))
            .map_err(se)?
            .map(|g| g.value().to_vec()))
    }

    fn list_scratch(&self, parent: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let t = self.read()?.open_table(SCRATCH).map_err(se)?;
        let mut out = Vec::new();
        for item in t.range((parent, "")..(parent, "\u{10ffff}")).map_err(se)? {
            let (k, v) = item.map_err(se)?;
            out.push((k.value().1.to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    fn get_ix(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let t = self.read()?.open_table(IX_DOCS).map_err(se)?;
        Ok(t.get(path).map_err(se)?.map(|g| g.value().to_vec()))
    }

    fn scan_ix(&self, prefix: &str, f: &mut dyn FnMut(&str, &[u8]) -> Result<()>) -> Result<()> {
        let t = self.read()?.open_table(IX_DOCS).map_err(se)?;
        for item in t.range(prefix..).map_err(se)? {
            let (k, v) = item.map_err(se)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            f(k.value(), v.value())?;
        }
        Ok(())
    }

    fn get_vec(&self, model: &str, hash: u128) -> Result<Option<Vec<u8>>> {
        let t = self.read()?.open_table(VECS).map_err(se)?;
        Ok(t.get((model, hash))
            .map_err(se)?
            .map(|g| g.value().to_vec()))
    }

    fn expiries(&self) -> Result<Vec<(String, u64)>> {
        let t = self.read()?;
        let table = t.open_table(EXPIRY).map_err(se)?;
        let mut out = Vec::new();
        for item in table.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            out.push((k.value().to_string(), v.value()));
        }
        Ok(out)
    }

    fn scan_nodes(&self, f: &mut dyn FnMut(NodeRec) -> Result<()>) -> Result<()> {
        let t = self.read()?.open_table(NODES).map_err(se)?;
        for item in t.iter().map_err(se)? {
            let (_, v) = item.map_err(se)?;
            f(decode(v.value())?)?;
        }
        Ok(())
    }

    fn drafts(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let t = self.read()?.open_table(DRAFTS).map_err(se)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    fn counter(&self, key: &str) -> Result<i64> {
        let t = self.read()?.open_table(COUNTERS).map_err(se)?;
        Ok(t.get(key).map_err(se)?.map(|g| g.value()).unwrap_or(0))
    }

    fn high_water(&self, key: &str) -> Result<u64> {
        let t = self.read()?.open_table(HIGH_WATER).map_err(se)?;
        Ok(t.get(key).map_err(se)?.map(|g| g.value()).unwrap_or(0))
    }

    fn apply(&self, ops: Vec<Op>, durable: bool) -> Result<()> {
        let (done, wait) = mpsc::sync_channel(1);
        {
            let jobs = crate::locks::lock(&self.jobs);
            let tx = jobs
                .as_ref()
                .ok_or_else(|| Error::store("store is closed"))?;
            tx.send(Job { ops, durable, done })
                .map_err(|_| Error::store("committer thread is gone"))?;
        }
        wait.recv()
            .map_err(|_| Error::store("committer thread is gone"))?
    }
}
