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
        macro_rules! copy {
            ($($def:expr),* $(,)?) => {$({
                let s = src.open_table($def).map_err(se)?;
                let mut d = dst.open_table($def).map_err(se)?;
                for item in s.iter().map_err(se)? {
                    let (k, v) = item.map_err(se)?;
                    d.insert(k.value(), v.value()).map_err(se)?;
                    rows += 1;
                }
            })*};
        }
        copy!(
            NODES,
            DIRS,
            VERSIONS,
            BLOBS,
            OUTBOX,
            OUTBOX_BY_NODE,
            DRAFTS,
            COUNTERS,
            HIGH_WATER,
            DLQ,
            DLQ_BY_NODE,
            IX_DOCS,
            VECS,
            SCRATCH,
            EXPIRY,
        );
        dst.commit().map_err(se)?;
        Ok(rows)
    }
}
