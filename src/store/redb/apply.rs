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
                    let key = crate::schema::counters::outbox_key(account);
                    enqueue(
                        &mut outbox,
                        &mut by_node,
                        &mut counters,
                        &key,
                        *seq,
                        node_path,
                        json,
                    )?;
                }
                Op::DoneEvent {
                    seq,
                    node_path,
                    account,
                } => {
                    let key = crate::schema::counters::outbox_key(account);
                    dequeue(
                        &mut outbox,
                        &mut by_node,
                        &mut counters,
                        &key,
                        *seq,
                        node_path,
                    )?;
                }
                Op::UpdateEvent { seq, json } => {
                    if outbox.get(*seq).map_err(se)?.is_some() {
                        outbox.insert(*seq, json.as_slice()).map_err(se)?;
                    }
                }
                // To the dead letters, and back.
                Op::DeadEvent {
                    seq,
                    node_path,
                    account,
                    json,
                } => {
                    let (live, dead) = queue_keys(account);
                    dequeue(
                        &mut outbox,
                        &mut by_node,
                        &mut counters,
                        &live,
                        *seq,
                        node_path,
                    )?;
                    enqueue(
                        &mut dlq,
                        &mut dlq_by_node,
                        &mut counters,
                        &dead,
                        *seq,
                        node_path,
                        json,
                    )?;
                }
                Op::ReviveEvent {
                    seq,
                    node_path,
                    account,
                    json,
                } => {
                    let (live, dead) = queue_keys(account);
                    dequeue(
                        &mut dlq,
                        &mut dlq_by_node,
                        &mut counters,
                        &dead,
                        *seq,
                        node_path,
                    )?;
                    enqueue(
                        &mut outbox,
                        &mut by_node,
                        &mut counters,
                        &live,
                        *seq,
                        node_path,
                        json,
                    )?;
                }
                Op::DropDead {
                    seq,
                    node_path,
                    account,
                } => {
                    let key = crate::schema::counters::dlq_key(account);
                    dequeue(
                        &mut dlq,
                        &mut dlq_by_node,
                        &mut counters,
                        &key,
                        *seq,
                        node_path,
                    )?;
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
                    let rec =
                        crate::store::ScratchRec::appended(old.as_deref(), data, *mode, *mtime_ns)?;
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
                Op::PutVec { model, hash, data }
                | Op::PutVecOf {
                    model, hash, data, ..
                } => {
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

/// An event queue (the outbox or the dead letters): its rows by event id,
/// and its index by node.
type Rows<'t> = ::redb::Table<'t, u64, &'static [u8]>;
type ByNode<'t> = ::redb::Table<'t, (&'static str, u64), ()>;
type Counters<'t> = ::redb::Table<'t, &'static str, i64>;

/// The outbox's and the dead letters' counter keys of `account`.
fn queue_keys(account: &str) -> (String, String) {
    (
        crate::schema::counters::outbox_key(account),
        crate::schema::counters::dlq_key(account),
    )
}

/// Put event `seq` of `node` in a queue; its count (`key`) goes up when
/// the event was not there yet (a replayed log record puts it again).
fn enqueue(
    rows: &mut Rows,
    by_node: &mut ByNode,
    counters: &mut Counters,
    key: &str,
    seq: u64,
    node: &str,
    json: &[u8],
) -> Result<()> {
    if rows.insert(seq, json).map_err(se)?.is_none() {
        add(counters, key, 1)?;
    }
    by_node.insert((node, seq), ()).map_err(se)?;
    Ok(())
}

/// Take event `seq` of `node` out of a queue; its count goes down when it
/// was there.
fn dequeue(
    rows: &mut Rows,
    by_node: &mut ByNode,
    counters: &mut Counters,
    key: &str,
    seq: u64,
    node: &str,
) -> Result<()> {
    if rows.remove(seq).map_err(se)?.is_some() {
        add(counters, key, -1)?;
    }
    by_node.remove((node, seq)).map_err(se)?;
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
