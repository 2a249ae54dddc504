//! What `ctxfs migrate` needs of the redb backend: every stored row as the
//! `Op` that recreates it in another store (PostgreSQL).

use super::{decode, se, RedbStore};
use super::{
    BLOBS, COUNTERS, DIRS, DLQ, DLQ_BY_NODE, EXPIRY, HIGH_WATER, IX_DOCS, NODES, OUTBOX,
    OUTBOX_BY_NODE, SCRATCH, VECS, VERSIONS, WAL_SEQ,
};
use crate::error::Result;
use crate::schema::place;
use crate::store::{Op, Store};
use ::redb::ReadableTable;
use std::collections::HashMap;
use std::sync::Arc;

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// The events of a queue (the outbox or the dead letters): seq, node, JSON.
fn events(
    txn: &::redb::ReadTransaction,
    by_node: ::redb::TableDefinition<(&str, u64), ()>,
    table: ::redb::TableDefinition<u64, &[u8]>,
) -> Result<Vec<(u64, String, Vec<u8>)>> {
    let mut node_of: HashMap<u64, String> = HashMap::new();
    for item in txn.open_table(by_node).map_err(se)?.iter().map_err(se)? {
        let (k, _) = item.map_err(se)?;
        let (node, seq) = k.value();
        node_of.insert(seq, node.to_string());
    }
    let mut out = Vec::new();
    for item in txn.open_table(table).map_err(se)?.iter().map_err(se)? {
        let (k, v) = item.map_err(se)?;
        let seq = k.value();
        let node = node_of.remove(&seq).unwrap_or_default();
        out.push((seq, node, v.value().to_vec()));
    }
    Ok(out)
}

impl RedbStore {
    /// Hand every row (but saved drafts, which belong to this data dir's
    /// daemon) to `f` as the op that recreates it, table by table. Outbox
    /// and dead-letter counters are not copied: recreating the events
    /// counts them. Returns the number of saved drafts left behind.
    pub fn export_ops(&self, f: &mut dyn FnMut(&'static str, Op) -> Result<()>) -> Result<usize> {
        let txn = self.read()?;
        let t = txn.open_table(DIRS).map_err(se)?;
        for item in t.iter().map_err(se)? {
            let (k, _) = item.map_err(se)?;
            let (p, n) = k.value();
            f("dirs", Op::PutDir { path: join(p, n) })?;
        }
        // Blobs carry their account on a shared store: the account of the
        // versions that use them (a blob no version uses is not copied).
        let mut owner: HashMap<u64, String> = HashMap::new();
        for item in txn.open_table(VERSIONS).map_err(se)?.iter().map_err(se)? {
            let (_, v) = item.map_err(se)?;
            let rec = decode(v.value())?;
            for f in &rec.files {
                owner.insert(f.blob, rec.account().to_string());
            }
        }
        let t = txn.open_table(BLOBS).map_err(se)?;
        let mut cur: Option<(u64, Vec<u8>)> = None;
        let emit =
            |id: u64, data: Vec<u8>, f: &mut dyn FnMut(&'static str, Op) -> Result<()>| match owner
                .get(&id)
            {
                Some(account) => f(
                    "blobs",
                    Op::PutBlobOf {
                        account: account.clone(),
                        id,
                        data: Arc::from(data),
                    },
                ),
                None => Ok(()),
            };
        for item in t.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            let (id, _) = k.value();
            match &mut cur {
                Some((cid, data)) if *cid == id => data.extend_from_slice(v.value()),
                _ => {
                    if let Some((cid, data)) = cur.take() {
                        emit(cid, data, f)?;
                    }
                    cur = Some((id, v.value().to_vec()));
                }
            }
        }
        if let Some((id, data)) = cur {
            emit(id, data, f)?;
        }
        let t = txn.open_table(VERSIONS).map_err(se)?;
        for item in t.iter().map_err(se)? {
            let (_, v) = item.map_err(se)?;
            f(
                "versions",
                Op::PutVersion {
                    rec: decode(v.value())?,
                },
            )?;
        }
        let t = txn.open_table(NODES).map_err(se)?;
        for item in t.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            let (p, n) = k.value();
            f(
                "nodes",
                Op::PutNode {
                    path: join(p, n),
                    rec: decode(v.value())?,
                },
            )?;
        }
        for (seq, node_path, json) in events(&txn, OUTBOX_BY_NODE, OUTBOX)? {
            let account = place::account_of(&node_path).to_string();
            f(
                "outbox",
                Op::PutEvent {
                    seq,
                    node_path,
                    account,
                    json,
                },
            )?;
        }
        for (seq, node_path, json) in events(&txn, DLQ_BY_NODE, DLQ)? {
            let account = place::account_of(&node_path).to_string();
            f(
                "dlq",
                Op::DeadEvent {
                    seq,
                    node_path,
                    account,
                    json,
                },
            )?;
        }
        for item in txn.open_table(COUNTERS).map_err(se)?.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            let key = k.value();
            if key.starts_with("outbox:") || key.starts_with("dlq:") {
                continue;
            }
            f(
                "counters",
                Op::Count {
                    key: key.to_string(),
                    delta: v.value(),
                },
            )?;
        }
        for item in txn.open_table(HIGH_WATER).map_err(se)?.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            if k.value() == WAL_SEQ {
                continue;
            }
            f(
                "high_water",
                Op::HighWater {
                    key: k.value().to_string(),
                    value: v.value(),
                },
            )?;
        }
        for item in txn.open_table(IX_DOCS).map_err(se)?.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            f(
                "ix_docs",
                Op::PutIx {
                    path: k.value().to_string(),
                    data: v.value().to_vec(),
                },
            )?;
        }
        for item in txn.open_table(VECS).map_err(se)?.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            let (model, hash) = k.value();
            f(
                "vecs",
                Op::PutVec {
                    model: model.to_string(),
                    hash,
                    data: v.value().to_vec(),
                },
            )?;
        }
        for item in txn.open_table(SCRATCH).map_err(se)?.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            let (p, n) = k.value();
            f(
                "scratch",
                Op::PutScratch {
                    path: join(p, n),
                    data: v.value().to_vec(),
                },
            )?;
        }
        for item in txn.open_table(EXPIRY).map_err(se)?.iter().map_err(se)? {
            let (k, v) = item.map_err(se)?;
            f(
                "expiry",
                Op::PutExpiry {
                    path: k.value().to_string(),
                    at_ns: v.value(),
                },
            )?;
        }
        Ok(self.drafts()?.len())
    }
}
