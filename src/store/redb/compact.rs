//! What `ctxfs compact` needs of the redb backend: the keys of the dead
//! letters and of the stored vectors, and a rewrite of every live row into a
//! fresh database file.

use super::{se, RedbStore, CACHE_BYTES};
use super::{
    BLOBS, COUNTERS, DIRS, DLQ, DLQ_BY_NODE, DRAFTS, EXPIRY, HIGH_WATER, IX_DOCS, NODES, OUTBOX,
    OUTBOX_BY_NODE, SCRATCH, VECS, VERSIONS,
};
use crate::error::{Error, Result};
use ::redb::{Database, Durability, ReadableTable};
use std::path::Path;

impl RedbStore {
    /// Every dead letter: (node path, event seq).
    pub fn dead_letters(&self) -> Result<Vec<(String, u64)>> {
        let t = self.read()?.open_table(DLQ_BY_NODE).map_err(se)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(se)? {
            let (k, _) = item.map_err(se)?;
            let (node, seq) = k.value();
            out.push((node.to_string(), seq));
        }
        Ok(out)
    }

    /// Every stored vector key (model, text hash).
    pub fn vector_keys(&self) -> Result<Vec<(String, u128)>> {
        let t = self.read()?.open_table(VECS).map_err(se)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(se)? {
            let (k, _) = item.map_err(se)?;
            let (m, h) = k.value();
            out.push((m.to_string(), h));
        }
        Ok(out)
    }

    /// Write every live row into a new database file at `dest` (no freed
    /// page of this file comes along), for `ctxfs compact`. The store must
    /// be closed for writes (its committer stopped) and its log empty.
    pub fn rewrite_into(&self, dest: &Path) -> Result<u64> {
        let new = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(dest)
            .map_err(|e| Error::store_from(format!("cannot create {}", dest.display()), e))?;
        let src = self.read()?;
        let mut dst = new.begin_write().map_err(se)?;
        dst.set_durability(Durability::Immediate).map_err(se)?;
        let mut rows = 0u64;
        for table in TABLES {
            rows += copy_table(&src, &dst, table)?;
        }
        dst.commit().map_err(se)?;
        Ok(rows)
    }
}

/// Every table, by name, for the copies of compact and salvage.
pub const TABLES: &[&str] = &[
    "nodes",
    "dirs",
    "versions",
    "blobs",
    "outbox",
    "outbox_by_node",
    "drafts",
    "counters",
    "high_water",
    "dlq",
    "dlq_by_node",
    "ix_docs",
    "vecs",
    "scratch",
    "expiry",
];

/// Copy every row of table `name` from `src` into `dst`; the rows copied.
/// An error stops the copy of this table; the rows before it are in `dst`.
pub(super) fn copy_table(
    src: &::redb::ReadTransaction,
    dst: &::redb::WriteTransaction,
    name: &str,
) -> Result<u64> {
    visit_table(src, Some(dst), name)
}

/// Read every row of table `name` (fsck: is all of it readable?).
pub fn read_table(src: &::redb::ReadTransaction, name: &str) -> Result<u64> {
    visit_table(src, None, name)
}

fn visit_table(
    src: &::redb::ReadTransaction,
    dst: Option<&::redb::WriteTransaction>,
    name: &str,
) -> Result<u64> {
    let mut rows = 0u64;
    macro_rules! copy {
        ($def:expr) => {{
            let s = src.open_table($def).map_err(se)?;
            let mut d = match dst {
                Some(w) => Some(w.open_table($def).map_err(se)?),
                None => None,
            };
            for item in s.iter().map_err(se)? {
                let (k, v) = item.map_err(se)?;
                if let Some(d) = d.as_mut() {
                    d.insert(k.value(), v.value()).map_err(se)?;
                }
                rows += 1;
            }
        }};
    }
    match name {
        "nodes" => copy!(NODES),
        "dirs" => copy!(DIRS),
        "versions" => copy!(VERSIONS),
        "blobs" => copy!(BLOBS),
        "outbox" => copy!(OUTBOX),
        "outbox_by_node" => copy!(OUTBOX_BY_NODE),
        "drafts" => copy!(DRAFTS),
        "counters" => copy!(COUNTERS),
        "high_water" => copy!(HIGH_WATER),
        "dlq" => copy!(DLQ),
        "dlq_by_node" => copy!(DLQ_BY_NODE),
        "ix_docs" => copy!(IX_DOCS),
        "vecs" => copy!(VECS),
        "scratch" => copy!(SCRATCH),
        "expiry" => copy!(EXPIRY),
        other => return Err(Error::store(format!("no table {other}"))),
    }
    Ok(rows)
}
