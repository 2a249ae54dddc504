//! The stored invariants a shared store can be checked for through the
//! `Store` trait alone (`ctxfs fsck --store URL`): the numbers are those of
//! `docs/SEMANTICS.md` ("Stored invariants"); the redb checker (`fsck.rs`)
//! also reads the tables behind the trait.

use super::{Status, Store, Violation};
use crate::error::Result;
use crate::schema::counters;
use crate::schema::names::{CONTENT, META};
use std::collections::HashSet;

pub fn check(store: &dyn Store) -> Result<Vec<Violation>> {
    let mut v = Vec::new();
    let mut recs = Vec::new();
    store.scan_nodes(&mut |r| {
        recs.push(r);
        Ok(())
    })?;
    let mut ids = HashSet::new();
    let (mut max_node, mut max_blob) = (0, 0);
    for rec in &recs {
        let mut bad = |invariant: u8, what: String| v.push(Violation { invariant, what });
        // 1: the row at its path is this record.
        if store.get_node(&rec.path)?.as_ref() != Some(rec) {
            bad(
                1,
                format!("{}: the record is not the one stored at its path", rec.path),
            );
        }
        // 2: its version is stored, and is it.
        if rec.version == 0
            || store
                .get_version(rec.account(), rec.id, rec.version)?
                .as_ref()
                != Some(rec)
        {
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
        // 4: committed nodes hold content.md and a .meta.json that agrees.
        if matches!(rec.status, Status::Active | Status::Archived) {
            if rec.file(CONTENT).is_none() {
                bad(4, format!("{}: no {CONTENT}", rec.path));
            }
            match rec.file(META) {
                None => bad(4, format!("{}: no {META}", rec.path)),
                Some(f) => match store.read_blob(rec.account(), f.blob, f.size) {
                    Ok(b) => {
                        let meta: serde_json::Value =
                            serde_json::from_slice(&b).unwrap_or_default();
                        if meta.get("version").and_then(|x| x.as_u64()) != Some(rec.version as u64)
                        {
                            bad(4, format!("{}: {META} names another version", rec.path));
                        }
                    }
                    Err(e) => bad(5, format!("{}: {META}: {e}", rec.path)),
                },
            }
        }
        // 5: every file of every version has its blob, of its size.
        for n in 1..=rec.version {
            let Some(ver) = store.get_version(rec.account(), rec.id, n)? else {
                continue; // a version redacted away keeps its row; none missing is I2's
            };
            for f in &ver.files {
                max_blob = max_blob.max(f.blob);
                if let Err(e) = store.read_blob(rec.account(), f.blob, f.size) {
                    bad(5, format!("{} v{n} {}: {e}", rec.path, f.name));
                }
            }
        }
    }
    // 8 (in part): node counts per account and status.
    let mut counted: std::collections::BTreeMap<String, i64> = Default::default();
    for rec in &recs {
        let account = rec.path.split('/').next().unwrap_or("");
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
