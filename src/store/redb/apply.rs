//! How the redb backend applies a batch of operations: one write
//! transaction per log record, with the record's sequence number stored in
//! it, and the replay of the records redb does not hold yet.

use super::{
    decode, encode, se, split_key, BLOBS, CHUNK, COUNTERS, DIRS, DLQ, DLQ_BY_NODE, DRAFTS, EXPIRY,
    HIGH_WATER, IX_DOCS, NODES, OUTBOX, OUTBOX_BY_NODE, SCRATCH, VECS, VERSIONS, WAL_SEQ,
};
use crate::error::Result;
use crate::store::wal::Record;
use crate::store::Op;
use ::redb::{Database, Durability, ReadableDatabase, ReadableTable};

/// The last log sequence number redb holds.
pub(super) fn applied_seq(db: &Database) -> Result<u64> {
    let t = db.begin_read().map_err(se)?;
    let hw = t.open_table(HIGH_WATER).map_err(se)?;
    let v = hw.get(WAL_SEQ).map_err(se)?.map(|g| g.value()).unwrap_or(0);
    Ok(v)
}

/// Apply the log records redb does not hold yet; the last sequence number.
pub(super) fn replay(db: &Database, records: &[Record]) -> Result<u64> {
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

/// Apply ops in one redb transaction, recording the log sequence number.
pub(super) fn apply_record(
    db: &Database,
    ops: &[Op],
    seq: u64,
    durability: Durability,
) -> Result<()> {
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
    let mut t = Tables::open(txn)?;
    for op in ops {
        t.apply(op)?;
    }
    Ok(())
}

type Table<'t, K, V> = ::redb::Table<'t, K, V>;
type Counters<'t> = Table<'t, &'static str, i64>;
/// A table of byte values by a (parent, name) path key.
type ByPath<'t> = Table<'t, (&'static str, &'static str), &'static [u8]>;
/// A table of byte values by a whole path.
type ByName<'t> = Table<'t, &'static str, &'static [u8]>;

/// The tables a batch writes, open in its transaction.
struct Tables<'t> {
    nodes: ByPath<'t>,
    dirs: Table<'t, (&'static str, &'static str), ()>,
    versions: Table<'t, (u64, u32), &'static [u8]>,
    blobs: Table<'t, (u64, u32), &'static [u8]>,
    outbox: Queue<'t>,
    dlq: Queue<'t>,
    drafts: ByName<'t>,
    counters: Counters<'t>,
    high_water: Table<'t, &'static str, u64>,
    ix: ByName<'t>,
    vecs: Table<'t, (&'static str, u128), &'static [u8]>,
    scratch: ByPath<'t>,
    expiry: Table<'t, &'static str, u64>,
}

impl<'t> Tables<'t> {
    fn open(txn: &'t ::redb::WriteTransaction) -> Result<Tables<'t>> {
        Ok(Tables {
            nodes: txn.open_table(NODES).map_err(se)?,
            dirs: txn.open_table(DIRS).map_err(se)?,
            versions: txn.open_table(VERSIONS).map_err(se)?,
            blobs: txn.open_table(BLOBS).map_err(se)?,
            outbox: Queue {
                rows: txn.open_table(OUTBOX).map_err(se)?,
                by_node: txn.open_table(OUTBOX_BY_NODE).map_err(se)?,
            },
            dlq: Queue {
                rows: txn.open_table(DLQ).map_err(se)?,
                by_node: txn.open_table(DLQ_BY_NODE).map_err(se)?,
            },
            drafts: txn.open_table(DRAFTS).map_err(se)?,
            counters: txn.open_table(COUNTERS).map_err(se)?,
            high_water: txn.open_table(HIGH_WATER).map_err(se)?,
            ix: txn.open_table(IX_DOCS).map_err(se)?,
            vecs: txn.open_table(VECS).map_err(se)?,
            scratch: txn.open_table(SCRATCH).map_err(se)?,
            expiry: txn.open_table(EXPIRY).map_err(se)?,
        })
    }

    fn apply(&mut self, op: &Op) -> Result<()> {
        use crate::schema::counters::{dlq_key, outbox_key};
        let c = &mut self.counters;
        match op {
            // One daemon: the core's node locks make every commit see the
            // version it was planned on (and the log replays batches that
            // held then), so there is nothing to check.
            Op::Expect { .. } => {}
            Op::PutNode { path, rec } => {
                let rec = encode(rec)?;
                self.nodes
                    .insert(split_key(path), rec.as_slice())
                    .map_err(se)?;
            }
            Op::DelNode { path } => drop(self.nodes.remove(split_key(path)).map_err(se)?),
            Op::PutDir { path } => drop(self.dirs.insert(split_key(path), ()).map_err(se)?),
            Op::DelDir { path } => drop(self.dirs.remove(split_key(path)).map_err(se)?),
            Op::PutVersion { rec } => {
                let key = (rec.id, rec.version);
                self.versions
                    .insert(key, encode(rec)?.as_slice())
                    .map_err(se)?;
            }
            Op::DropHistory { node_id } => self.drop_history(*node_id)?,
            Op::DelBlob { id } => self.del_blob(*id)?,
            Op::PutBlob { id, data } | Op::PutBlobOf { id, data, .. } => {
                if data.is_empty() {
                    self.blobs.insert((*id, 0), &[][..]).map_err(se)?;
                }
                for (i, chunk) in data.chunks(CHUNK).enumerate() {
                    self.blobs.insert((*id, i as u32), chunk).map_err(se)?;
                }
            }
            Op::PutEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                self.outbox
                    .put(c, &outbox_key(account), *seq, node_path, json)?;
            }
            Op::DoneEvent {
                seq,
                node_path,
                account,
            } => {
                self.outbox.take(c, &outbox_key(account), *seq, node_path)?;
            }
            Op::UpdateEvent { seq, json } => {
                if self.outbox.rows.get(*seq).map_err(se)?.is_some() {
                    self.outbox.rows.insert(*seq, json.as_slice()).map_err(se)?;
                }
            }
            // To the dead letters, and back.
            Op::DeadEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                self.outbox.take(c, &outbox_key(account), *seq, node_path)?;
                self.dlq.put(c, &dlq_key(account), *seq, node_path, json)?;
            }
            Op::ReviveEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                self.dlq.take(c, &dlq_key(account), *seq, node_path)?;
                self.outbox
                    .put(c, &outbox_key(account), *seq, node_path, json)?;
            }
            Op::DropDead {
                seq,
                node_path,
                account,
            } => {
                self.dlq.take(c, &dlq_key(account), *seq, node_path)?;
            }
            Op::PutScratch { path, data } => {
                self.scratch
                    .insert(split_key(path), data.as_slice())
                    .map_err(se)?;
            }
            Op::DelScratch { path } => drop(self.scratch.remove(split_key(path)).map_err(se)?),
            Op::AppendLog {
                path,
                data,
                mode,
                mtime_ns,
            } => {
                let old = self
                    .scratch
                    .get(split_key(path))
                    .map_err(se)?
                    .map(|g| g.value().to_vec());
                let rec =
                    crate::store::ScratchRec::appended(old.as_deref(), data, *mode, *mtime_ns)?;
                self.scratch
                    .insert(split_key(path), rec.as_slice())
                    .map_err(se)?;
            }
            Op::PutExpiry { path, at_ns } => {
                drop(self.expiry.insert(path.as_str(), *at_ns).map_err(se)?)
            }
            Op::DelExpiry { path } => drop(self.expiry.remove(path.as_str()).map_err(se)?),
            Op::PutIx { path, data } => {
                drop(self.ix.insert(path.as_str(), data.as_slice()).map_err(se)?)
            }
            Op::DelIx { path } => drop(self.ix.remove(path.as_str()).map_err(se)?),
            Op::PutVec { model, hash, data }
            | Op::PutVecOf {
                model, hash, data, ..
            } => {
                self.vecs
                    .insert((model.as_str(), *hash), data.as_slice())
                    .map_err(se)?;
            }
            Op::DelVec { model, hash } => {
                drop(self.vecs.remove((model.as_str(), *hash)).map_err(se)?)
            }
            Op::PutDraft { path, data } => {
                self.drafts
                    .insert(path.as_str(), data.as_slice())
                    .map_err(se)?;
            }
            Op::DelDraft { path } => drop(self.drafts.remove(path.as_str()).map_err(se)?),
            Op::Count { key, delta } => add(c, key, *delta)?,
            Op::HighWater { key, value } => {
                let key: &str = key;
                let cur = self
                    .high_water
                    .get(key)
                    .map_err(se)?
                    .map(|g| g.value())
                    .unwrap_or(0);
                if *value > cur {
                    self.high_water.insert(key, *value).map_err(se)?;
                }
            }
        }
        Ok(())
    }

    /// Every version of node `id`, and the blobs they hold.
    fn drop_history(&mut self, id: u64) -> Result<()> {
        let mut blob_ids = Vec::new();
        let mut keys = Vec::new();
        for item in self.versions.range((id, 0)..=(id, u32::MAX)).map_err(se)? {
            let (k, v) = item.map_err(se)?;
            keys.push(k.value());
            blob_ids.extend(decode(v.value())?.files.iter().map(|f| f.blob));
        }
        for k in keys {
            self.versions.remove(k).map_err(se)?;
        }
        blob_ids.sort_unstable();
        blob_ids.dedup();
        for id in blob_ids {
            self.del_blob(id)?;
        }
        Ok(())
    }

    /// Every chunk of blob `id`.
    fn del_blob(&mut self, id: u64) -> Result<()> {
        let chunks: Vec<(u64, u32)> = self
            .blobs
            .range((id, 0)..=(id, u32::MAX))
            .map_err(se)?
            .map(|r| r.map(|(k, _)| k.value()).map_err(se))
            .collect::<Result<_>>()?;
        for k in chunks {
            self.blobs.remove(k).map_err(se)?;
        }
        Ok(())
    }
}

/// An event queue (the outbox or the dead letters): its rows by event id,
/// and its index by node.
struct Queue<'t> {
    rows: Table<'t, u64, &'static [u8]>,
    by_node: Table<'t, (&'static str, u64), ()>,
}

impl Queue<'_> {
    /// Put event `seq` of `node` in; its count (`key`) goes up when the
    /// event was not there yet (a replayed log record puts it again).
    fn put(
        &mut self,
        counters: &mut Counters,
        key: &str,
        seq: u64,
        node: &str,
        json: &[u8],
    ) -> Result<()> {
        if self.rows.insert(seq, json).map_err(se)?.is_none() {
            add(counters, key, 1)?;
        }
        self.by_node.insert((node, seq), ()).map_err(se)?;
        Ok(())
    }

    /// Take event `seq` of `node` out; its count goes down when it was
    /// there.
    fn take(&mut self, counters: &mut Counters, key: &str, seq: u64, node: &str) -> Result<()> {
        if self.rows.remove(seq).map_err(se)?.is_some() {
            add(counters, key, -1)?;
        }
        self.by_node.remove((node, seq)).map_err(se)?;
        Ok(())
    }
}

fn add(t: &mut Counters, key: &str, delta: i64) -> Result<()> {
    let cur = t.get(key).map_err(se)?.map(|g| g.value()).unwrap_or(0);
    let new = cur + delta;
    if new == 0 {
        t.remove(key).map_err(se)?;
    } else {
        t.insert(key, new).map_err(se)?;
    }
    Ok(())
}
