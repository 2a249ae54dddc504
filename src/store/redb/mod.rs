//! The redb backend. Tables and key encoding are documented in
//! `docs/ARCHITECTURE.md` ("Storage"); `fsck.rs` checks their invariants.
//!
//! Here: the tables, opening the file, and the reads. Writes go through one
//! committer thread (`committer.rs`: batches made durable by the
//! write-ahead log, checkpoints, the reopen after an I/O error), which
//! applies them as `apply.rs` says. The scans and the rewrite of `ctxfs
//! compact` are in `compact.rs`, the copy of `ctxfs salvage` in
//! `salvage.rs`.

mod apply;
mod committer;
mod compact;
mod migrate;
mod salvage;

use self::apply::replay;
use self::committer::{Committer, Job};
pub use self::compact::{read_table, TABLES};
pub use self::salvage::{salvage, Salvaged};

use super::wal::Wal;
use super::{NodeRec, Op, Store, StoredEvent};
use crate::error::{Error, Result};
use ::redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

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
        let mut committer = Committer::new(slot.clone(), path, wal, seq);
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
