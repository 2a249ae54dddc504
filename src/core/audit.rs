//! The audit trail of an account (`accounts/{a}/.ctxfs/audit`): one JSON
//! line per commit, delete, move, restore, redaction, review decision,
//! administrative delete, scratchpad write, removal, rename and truncation,
//! activity-log append and conversation removal, written in the same
//! transaction as what it records, readable by the account's writers and
//! root, append-only (no request can change or remove a line) and bounded
//! per writer: each uid's lines are kept in two shares of their own, its
//! routine lines (commits, scratchpad writes, log appends) and the lines
//! that record what was removed or replaced (everything else); past
//! `MAX_ENTRIES` a share drops its own oldest lines. So no writer's volume
//! can push out the record of another's actions, or of its own deletes.

use super::commit::rules::By;
use super::{Caller, Fs};
use crate::error::{Error, Result};
use crate::schema::counters;
use crate::schema::time::now_ns;
use crate::schema::time::rfc3339_ms;
use crate::store::{Op, ScratchRec};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Lines each share of an account's trail keeps (about 150 bytes each);
/// small in the unit tests, which exercise the trimming.
pub const MAX_ENTRIES: i64 = if cfg!(test) { 40 } else { 20_000 };
/// The oldest lines are dropped in groups of this many past the bound.
const TRIM: i64 = if cfg!(test) { 10 } else { 500 };

static NEXT: AtomicU64 = AtomicU64::new(0);

/// (account, share) → (lines as this process counts them, the share's row
/// name). A commit does not read the stored counter (a round trip on
/// PostgreSQL): it is read once per share, and again only when the bound
/// seems reached.
type Counts = HashMap<(String, String), (i64, String)>;

fn counts() -> &'static std::sync::Mutex<Counts> {
    static C: std::sync::OnceLock<std::sync::Mutex<Counts>> = std::sync::OnceLock::new();
    C.get_or_init(Default::default)
}

/// Where an account's trail was stored before it had shares (lines read,
/// never written).
pub fn dir_of(account: &str) -> String {
    format!("{account}/.ctxfs/audit")
}

/// The rows naming each share of an account's trail.
pub fn shares_of(account: &str) -> String {
    format!("{account}/.ctxfs/audit-shares")
}

/// Lines of the kinds a writer makes in volume; every other kind records
/// what was removed or replaced, and is kept in a share of its own.
fn routine(op: &str) -> bool {
    matches!(op, "commit" | "scratch-write" | "log-append")
}

impl Fs {
    /// The ops that append `what` (an object: `op` and its fields) to the
    /// trail of `account`, by `by`, dropping the oldest lines of its share
    /// past the bound.
    pub(in crate::core) fn audit_ops(
        &self,
        account: &str,
        by: By,
        mut what: Value,
    ) -> Result<Vec<Op>> {
        let now = now_ns();
        let kind = if routine(what["op"].as_str().unwrap_or("")) {
            "r"
        } else {
            "k"
        };
        if let Value::Object(o) = &mut what {
            o.insert("at".into(), json!(rfc3339_ms(now)));
            o.insert("uid".into(), json!(by.uid));
            o.insert("via".into(), json!(by.via));
        }
        let mut line = serde_json::to_vec(&what).map_err(|e| Error::store_from("audit line", e))?;
        line.push(b'\n');
        let share = format!("{kind}{}", by.uid);
        let mut ops = Vec::new();
        let ck = (account.to_string(), share.clone());
        let known = crate::locks::lock(counts()).get_mut(&ck).map(|e| {
            e.0 += 1;
            e.clone()
        });
        let (seen, row) = match known {
            Some(known) => known,
            None => {
                // The share's row is named by a digest (keyed on an
                // encrypted store: row names are not sealed, and the uid is
                // the trail's to tell).
                let row = self.store.digest_name(account, share.as_bytes())?[..16].to_string();
                ops.push(Op::PutScratch {
                    path: format!("{}/{row}", shares_of(account)),
                    data: Vec::new(),
                });
                let n = self
                    .store
                    .counter(&counters::audit_share_key(account, &row))?
                    + 1;
                crate::locks::lock(counts()).insert(ck.clone(), (n, row.clone()));
                (n, row)
            }
        };
        let dir = format!("{}/{row}", dir_of(account));
        // Time order, then unique within this process and among daemons.
        let name = format!(
            "{now:020}-{:08x}-{:08}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let key = counters::audit_share_key(account, &row);
        ops.push(Op::PutScratch {
            path: format!("{dir}/{name}"),
            data: ScratchRec {
                dir: false,
                data: line,
                mode: 0o444,
                mtime_ns: now,
            }
            .encode()?,
        });
        ops.push(Op::Count {
            key: key.clone(),
            delta: 1,
        });
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
            crate::locks::lock(counts()).insert(ck, (rows.len() as i64 + 1 - excess, row));
        }
        Ok(ops)
    }

    /// Append one line to the trail of `account` on its own.
    pub(in crate::core) fn audit(&self, account: &str, by: By, what: Value) -> Result<()> {
        let ops = self.audit_ops(account, by, what)?;
        self.store.apply(ops, true)
    }

    /// `accounts/{a}/.ctxfs/audit`: the trail, every share merged, oldest
    /// line first. Writers of the account and root read it; readers get
    /// `EACCES`.
    pub(in crate::core) fn audit_text(&self, c: Caller, account: &str) -> Result<Vec<u8>> {
        if self.gate(c, account, true).is_err() {
            self.gate(c, account, false)?;
            return Err(Error::AccessDenied);
        }
        let dir = dir_of(account);
        // Lines written before the shares, then each share's.
        let mut rows = self.store.list_scratch(&dir)?;
        for (share, _) in self.store.list_scratch(&shares_of(account))? {
            rows.extend(self.store.list_scratch(&format!("{dir}/{share}"))?);
        }
        // Row names begin with the time: one order over every share.
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::new();
        for (_, rec) in rows {
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
    fn each_writers_share_keeps_its_newest_lines_and_no_one_elses_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("db.redb")).unwrap();
        let fs = Fs::new(store.clone() as Arc<dyn Store>, Tenancy::Owner(0)).unwrap();
        let (a, b) = (
            By {
                uid: 7,
                via: "shell",
            },
            By {
                uid: 8,
                via: "shell",
            },
        );
        // Another writer's delete and commit, then one writer's volume.
        fs.audit("trimmed", b, json!({"op": "delete", "node": "n"}))
            .unwrap();
        fs.audit("trimmed", b, json!({"op": "commit", "node": "n"}))
            .unwrap();
        fs.audit("trimmed", a, json!({"op": "delete", "node": "m"}))
            .unwrap();
        for i in 0..200 {
            fs.audit("trimmed", a, json!({"op": "log-append", "i": i}))
                .unwrap();
        }
        let text = String::from_utf8(
            fs.audit_text(
                Caller {
                    uid: 0,
                    gid: 0,
                    pid: 0,
                },
                "trimmed",
            )
            .unwrap(),
        )
        .unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Every line of uid 8, and uid 7's own delete, are still there.
        assert_eq!(lines.iter().filter(|l| l["uid"] == 8).count(), 2);
        assert!(lines.iter().any(|l| l["uid"] == 7 && l["op"] == "delete"));
        // uid 7's appends: the newest kept, the oldest gone, in order.
        let appends: Vec<&Value> = lines.iter().filter(|l| l["op"] == "log-append").collect();
        let n = appends.len() as i64;
        assert!((MAX_ENTRIES..=MAX_ENTRIES + TRIM + 1).contains(&n), "{n}");
        assert_eq!(appends.last().unwrap()["i"], 199);
        assert_eq!(appends[0]["i"], 200 - n);
        // Oldest line first, over every share.
        assert_eq!(lines[0]["uid"], 8);
        assert_eq!(lines[0]["op"], "delete");
        let total: i64 = store
            .list_scratch(&shares_of("trimmed"))
            .unwrap()
            .iter()
            .map(|(r, _)| {
                store
                    .counter(&counters::audit_share_key("trimmed", r))
                    .unwrap()
            })
            .sum();
        assert_eq!(total, lines.len() as i64);
        store.close();
    }
}
