//! What `ctxfs salvage` needs of the redb backend: every row that can still
//! be read from a damaged store file, and every intact record of its
//! write-ahead log, written into a new store file. The damaged files are
//! only read (a store that needs repair is repaired on a copy).

use super::apply::{applied_seq, apply_record};
use super::compact::{copy_table, TABLES};
use super::{open_db, se, CACHE_BYTES};
use crate::error::{Error, Result};
use crate::store::fsck::guarded;
use ::redb::{Database, Durability, ReadableDatabase};
use std::path::Path;

/// What a salvage read and what it could not.
#[derive(Debug, Default)]
pub struct Salvaged {
    /// Rows copied, by table.
    pub rows: Vec<(&'static str, u64)>,
    /// What could not be read: a table cut short, an unreadable store.
    pub lost: Vec<String>,
    /// Log records applied on top of the copied rows.
    pub records: usize,
    /// Sequence numbers of log records missing between intact ones (their
    /// commits are lost).
    pub missing_seqs: Vec<u64>,
}

/// Copy what can be read of the store `src` (and its log) into a new store
/// file `dst`.
pub fn salvage(src: &Path, dst: &Path) -> Result<Salvaged> {
    let mut out = Salvaged::default();
    let new = open_db(dst)?;
    // The source, read-only; one not closed cleanly is repaired on a copy.
    let copy = dst.with_extension("redb.source");
    let opened: std::result::Result<Box<dyn ReadableDatabase>, String> = match guarded(|| {
        ::redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .open_read_only(src)
    }) {
        Ok(Ok(db)) => Ok(Box::new(db)),
        Ok(Err(::redb::DatabaseError::RepairAborted)) => {
            std::fs::copy(src, &copy).map_err(|e| {
                Error::store_from(
                    format!("copying {} to {}", src.display(), copy.display()),
                    e,
                )
            })?;
            match guarded(|| {
                Database::builder()
                    .set_cache_size(CACHE_BYTES)
                    .create(&copy)
            }) {
                Ok(Ok(db)) => Ok(Box::new(db)),
                Ok(Err(e)) => Err(e.to_string()),
                Err(p) => Err(p),
            }
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(p) => Err(p),
    };
    match opened {
        Ok(db) => {
            let txn = db.begin_read().map_err(se)?;
            let w = new.begin_write().map_err(se)?;
            for table in TABLES {
                match guarded(|| copy_table(&txn, &w, table)) {
                    Ok(Ok(n)) => out.rows.push((table, n)),
                    Ok(Err(e)) => out.lost.push(format!("table {table}: {}", e.report())),
                    Err(p) => out.lost.push(format!("table {table}: corrupt ({p})")),
                }
            }
            w.commit().map_err(se)?;
        }
        Err(e) => out.lost.push(format!(
            "the store file {} cannot be opened ({e}): only the log is salvaged",
            src.display()
        )),
    }
    let _ = std::fs::remove_file(&copy);
    // Then every intact log record the copy does not hold, in order.
    let sc = crate::store::wal::read(&src.with_extension("wal"))?;
    let mut records: Vec<_> = sc.records.into_iter().chain(sc.after_damage).collect();
    records.sort_by_key(|r| r.seq);
    records.dedup_by_key(|r| r.seq);
    let start = applied_seq(&new)?;
    // Records follow each other by one; a gap between intact ones is a
    // lost commit. (With no readable high-water mark, the log's first
    // intact record is where counting starts.)
    let mut seq = match records.iter().find(|r| r.seq > start) {
        Some(first) if start == 0 => first.seq - 1,
        _ => start,
    };
    for r in records.iter().filter(|r| r.seq > start) {
        out.missing_seqs.extend(seq + 1..r.seq);
        apply_record(&new, &r.ops, r.seq, Durability::None)?;
        seq = r.seq;
        out.records += 1;
    }
    apply_record(&new, &[], seq, Durability::Immediate)?;
    Ok(out)
}
