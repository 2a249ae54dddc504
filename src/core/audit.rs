//! The audit trail of an account (`accounts/{a}/.ctxfs/audit`): one JSON
//! line per commit, delete, move, restore, redaction, review decision and
//! administrative delete, written in the same transaction as what it
//! records, readable by the account's writers and root, append-only (no
//! request can change or remove a line) and bounded: past `MAX_ENTRIES`
//! the oldest lines go, as the daemon's log rotates.

use super::commit::rules::By;
use super::{now_ns, rfc3339_ms, Caller, Fs};
use crate::error::{Error, Result};
use crate::schema::counters;
use crate::store::{Op, ScratchRec};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// Lines an account's trail keeps (about 150 bytes each); small in the
/// unit tests, which exercise the trimming.
pub const MAX_ENTRIES: i64 = if cfg!(test) { 40 } else { 20_000 };
/// The oldest lines are dropped in groups of this many past the bound.
const TRIM: i64 = if cfg!(test) { 10 } else { 500 };

static NEXT: AtomicU64 = AtomicU64::new(0);

/// Lines of each account's trail as this process counts them, so a commit
/// does not read the stored counter (a round trip on PostgreSQL): it is
/// read once per account, and again only when the bound seems reached.
fn counts() -> &'static std::sync::Mutex<std::collections::HashMap<String, i64>> {
    static C: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, i64>>> =
        std::sync::OnceLock::new();
    C.get_or_init(Default::default)
}

/// Where an account's trail is stored (rows of the shared-area table).
pub fn dir_of(account: &str) -> String {
    format!("{account}/.ctxfs/audit")
}

impl Fs {
    /// The ops that append `what` (an object: `op` and its fields) to the
    /// trail of `account`, by `by`, dropping the oldest lines past the
    /// bound.
    pub(in crate::core) fn audit_ops(
        &self,
        account: &str,
        by: By,
        mut what: Value,
    ) -> Result<Vec<Op>> {
        let now = now_ns();
        if let Value::Object(o) = &mut what {
            o.insert("at".into(), json!(rfc3339_ms(now)));
            o.insert("uid".into(), json!(by.uid));
            o.insert("via".into(), json!(by.via));
        }
        let mut line = serde_json::to_vec(&what).map_err(|e| Error::store_from("audit line", e))?;
        line.push(b'\n');
        let dir = dir_of(account);
        // Time order, then unique within this process and among daemons.
        let name = format!(
            "{now:020}-{:08x}-{:08}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let key = counters::audit_key(account);
        let mut ops = vec![
            Op::PutScratch {
                path: format!("{dir}/{name}"),
                data: ScratchRec {
                    dir: false,
                    data: line,
                    mode: 0o444,
                    mtime_ns: now,
                }
                .encode()?,
            },
            Op::Count {
                key: key.clone(),
                delta: 1,
            },
        ];
        let seen = {
            let mut c = crate::locks::lock(counts());
            match c.get_mut(account) {
                Some(n) => {
                    *n += 1;
                    *n
                }
                None => {
                    drop(c);
                    let n = self.store.counter(&key)? + 1;
                    crate::locks::lock(counts()).insert(account.to_string(), n);
                    n
                }
            }
        };
        if seen > MAX_ENTRIES + TRIM {
            let rows = self.store.list_scratch(&dir)?;
            let excess = (rows.len() as i64 - MAX_ENTRIES).max(0);
            for (old, _) in rows.iter().take(excess as usize) {
                ops.push(Op::DelScratch {
                    path: format!("{dir}/{old}"),
                });
            }
            ops.push(Op::Count {
                key,
                delta: -excess,
            });
            crate::locks::lock(counts())
                .insert(account.to_string(), rows.len() as i64 + 1 - excess);
        }
        Ok(ops)
    }

    /// Append one line to the trail of `account` on its own.
    pub(in crate::core) fn audit(&self, account: &str, by: By, what: Value) -> Result<()> {
        let ops = self.audit_ops(account, by, what)?;
        self.store.apply(ops, true)
    }

    /// `accounts/{a}/.ctxfs/audit`: the trail, oldest line first. Writers
    /// of the account and root read it; readers get `EACCES`.
    pub(in crate::core) fn audit_text(&self, c: Caller, account: &str) -> Result<Vec<u8>> {
        if self.gate(c, account, true).is_err() {
            self.gate(c, account, false)?;
            return Err(Error::AccessDenied);
        }
        let mut out = Vec::new();
        for (_, rec) in self.store.list_scratch(&dir_of(account))? {
            if let Ok(r) = ScratchRec::decode(&rec) {
                out.extend(r.data);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Tenancy;
    use crate::store::{RedbStore, Store};
    use std::sync::Arc;

    #[test]
    fn the_trail_keeps_its_newest_lines_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("db.redb")).unwrap();
        let fs = Fs::new(store.clone() as Arc<dyn Store>, Tenancy::Owner(0)).unwrap();
        let by = By {
            uid: 7,
            via: "shell",
        };
        for i in 0..200 {
            fs.audit("trimmed", by, json!({"op": "commit", "i": i}))
                .unwrap();
        }
        let rows = store.list_scratch(&dir_of("trimmed")).unwrap();
        let n = rows.len() as i64;
        assert!((MAX_ENTRIES..=MAX_ENTRIES + TRIM + 1).contains(&n), "{n}");
        assert_eq!(store.counter(&counters::audit_key("trimmed")).unwrap(), n);
        let line = |r: &Vec<u8>| -> Value {
            serde_json::from_slice(&ScratchRec::decode(r).unwrap().data).unwrap()
        };
        // The newest is kept, the oldest gone, in order.
        assert_eq!(line(&rows.last().unwrap().1)["i"], 199);
        assert_eq!(line(&rows[0].1)["i"], 200 - n);
        assert_eq!(line(&rows[0].1)["uid"], 7);
        store.close();
    }
}
