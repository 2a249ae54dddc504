//! The stored invariants a shared store can be checked for through the
//! `Store` trait alone (`ctxfs fsck --store URL`): the numbers are those of
//! `docs/SEMANTICS.md` ("Stored invariants"); the redb checker (`fsck.rs`)
//! also reads the tables behind the trait.

use super::{NodeRec, Status, Store, Violation};
use crate::error::Result;
use crate::schema::counters;
use crate::schema::names::{CONTENT, META};
use crate::schema::place;
use std::collections::HashSet;

/// Node records whose stored rows one step of the check reads at once.
const CHECK_NODES: usize = 500;
/// Blobs the check reads at once.
const CHECK_BLOBS: usize = 1000;

/// A blob the check reads: which file of which version, and whether its
/// text is the current `.meta.json` of a committed node (invariant 4).
struct BlobAsk<'a> {
    rec: &'a NodeRec,
    version: u32,
    name: String,
    blob: u64,
    size: u64,
    meta: bool,
}

pub fn check(store: &dyn Store) -> Result<Vec<Violation>> {
    let mut v = Vec::new();
    let mut recs = Vec::new();
    store.scan_nodes(&mut |r| {
        recs.push(r);
        Ok(())
    })?;
    let mut ids = HashSet::new();
    let (mut max_node, mut max_blob) = (0, 0);
    // A chunk of records at a time, each read batched: a few round trips a
    // chunk on a store across the network, not one a record.
    for chunk in recs.chunks(CHECK_NODES) {
        let paths: Vec<&str> = chunk.iter().map(|r| r.path.as_str()).collect();
        let at_path = store.get_nodes(&paths)?;
        let mut asks = Vec::new();
        for rec in chunk {
            asks.extend((1..=rec.version).map(|n| (rec.account(), rec.id, n)));
        }
        let mut versions = store.get_versions(&asks)?.into_iter();
        // The blobs to read: every file of every stored version.
        let mut blobs: Vec<BlobAsk> = Vec::new();
        for (rec, at) in chunk.iter().zip(&at_path) {
            let mut bad = |invariant: u8, what: String| v.push(Violation { invariant, what });
            // 1: the row at its path is this record.
            if at.as_ref() != Some(rec) {
                bad(
                    1,
                    format!("{}: the record is not the one stored at its path", rec.path),
                );
            }
            let stored: Vec<Option<NodeRec>> =
                versions.by_ref().take(rec.version as usize).collect();
            // 2: its version is stored, and is it.
            if rec.version == 0 || stored.last().and_then(Option::as_ref) != Some(rec) {
                bad(
                    2,
                    format!(
                        "{}: version {} is not stored as the current record",
                        rec.path, rec.version
                    ),
                );
            }
            // 3: ids are unique.
            if !ids.insert(rec.id) {
                bad(3, format!("{}: node id {} is used twice", rec.path, rec.id));
            }
            max_node = max_node.max(rec.id);
            // 4: committed nodes hold content.md and a .meta.json that agrees
            // (the meta's text is checked when its blob is read, below).
            let committed = matches!(rec.status, Status::Active | Status::Archived);
            if committed {
                if rec.file(CONTENT).is_none() {
                    bad(4, format!("{}: no {CONTENT}", rec.path));
                }
                if rec.file(META).is_none() {
                    bad(4, format!("{}: no {META}", rec.path));
                }
            }
            // 5: every file of every version has its blob, of its size. A
            // version redacted away keeps no row; none missing is I2's.
            for (n, ver) in (1..).zip(&stored) {
                let Some(ver) = ver else { continue };
                for f in &ver.files {
                    max_blob = max_blob.max(f.blob);
                    blobs.push(BlobAsk {
                        rec,
                        version: n,
                        name: f.name.clone(),
                        blob: f.blob,
                        size: f.size,
                        meta: committed && n == rec.version && f.name == META,
                    });
                }
            }
        }
        for part in blobs.chunks(CHECK_BLOBS) {
            let asks: Vec<(&str, u64, u64)> = part
                .iter()
                .map(|b| (b.rec.account(), b.blob, b.size))
                .collect();
            for (b, read) in part.iter().zip(store.read_blobs(&asks)?) {
                let rec = b.rec;
                match read {
                    Err(e) => v.push(Violation {
                        invariant: 5,
                        what: format!("{} v{} {}: {e}", rec.path, b.version, b.name),
                    }),
                    Ok(bytes) if b.meta => {
                        let meta: serde_json::Value =
                            serde_json::from_slice(&bytes).unwrap_or_default();
                        if meta.get("version").and_then(|x| x.as_u64()) != Some(rec.version as u64)
                        {
                            v.push(Violation {
                                invariant: 4,
                                what: format!("{}: {META} names another version", rec.path),
                            });
                        }
                    }
                    Ok(_) => {}
                }
            }
        }
    }
    // 8 (in part): node counts per account and status.
    let mut counted: std::collections::BTreeMap<String, i64> = Default::default();
    for rec in &recs {
        let account = place::account_of(&rec.path);
        *counted
            .entry(counters::nodes_key(account, rec.status))
            .or_default() += 1;
    }
    for (key, n) in &counted {
        let stored = store.counter(key)?;
        if stored != *n {
            v.push(Violation {
                invariant: 8,
                what: format!("counter {key} is {stored}, a recount gives {n}"),
            });
        }
    }
    // 11: the high-water marks cover every id in use.
    for (key, max) in [(counters::NODE_ID, max_node), (counters::BLOB_ID, max_blob)] {
        if store.high_water(key)? < max {
            v.push(Violation {
                invariant: 11,
                what: format!("high-water mark {key} is below id {max}"),
            });
        }
    }
    // 12: every expiry names a current node.
    for (path, _) in store.expiries()? {
        if store.get_node(&path)?.is_none() {
            v.push(Violation {
                invariant: 12,
                what: format!("expiry of {path}, which is no node"),
            });
        }
    }
    Ok(v)
}
