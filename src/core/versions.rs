//! What a write to `NODE/.versions/restore` or `redact` does (and to
//! `.as-of/T/restore`, which restores many nodes the same way): the
//! version read, checked and committed again as the node's next version,
//! or its text replaced by a tombstone. The files themselves are the
//! feature `features/versions.rs`.

use super::commit::{Committed, Intent};
use super::draft::{DFile, Draft, Slot};
use super::Fs;
use super::{Control, RestoreHandle};
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::schema::names::{REDACT, RESTORE};
use crate::schema::place;
use crate::schema::place::{META, NODE_FILES};
use crate::schema::time::time_of;
use crate::store::{NodeRec, Op, Status};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

impl Fs {
    /// A write to `NODE/.versions/restore`: kept until a line is complete
    /// (then applied, its errors reported by this write), else applied at
    /// close. One restore per open: later writes may only add whitespace.
    pub(super) fn restore_write(&self, h: &RestoreHandle, data: &[u8]) -> Result<u32> {
        let line_done = {
            let mut buf = lock(&h.buf);
            if h.applied.load(Ordering::Acquire) {
                if data.iter().all(u8::is_ascii_whitespace) {
                    return Ok(data.len() as u32);
                }
                return Err(Error::Invalid(
                    "one restore per open: the version was already restored".into(),
                ));
            }
            buf.extend_from_slice(data);
            // A version number, or (`.as-of/T/restore`) a path of the account.
            let (limit, what) = match h.what {
                Control::RestoreAsOf { .. } => {
                    (4096, "write one path (e.g. `echo users/alice > restore`)")
                }
                _ => (
                    64,
                    "write one version number (e.g. `echo 3 > .versions/restore`)",
                ),
            };
            if buf.len() > limit {
                return Err(Error::Invalid(what.into()));
            }
            buf.contains(&b'\n')
        };
        if line_done {
            self.restore_apply(h)?;
        }
        Ok(data.len() as u32)
    }

    /// Close of `NODE/.versions/restore`: apply what was written, if not yet.
    pub(super) fn restore_flush(&self, h: &RestoreHandle) -> Result<()> {
        if h.applied.load(Ordering::Acquire) || lock(&h.buf).is_empty() {
            return Ok(());
        }
        self.restore_apply(h)
    }

    fn restore_apply(&self, h: &RestoreHandle) -> Result<()> {
        let data = std::mem::take(&mut *lock(&h.buf));
        h.applied.store(true, Ordering::Release);
        match h.what {
            Control::Redact => self.redact_version(&h.node, &data, h.by),
            Control::Restore => self.restore(&h.node, &data, h.by),
            Control::RestoreAsOf { at } => self.restore_as_of(&h.node, at, &data, h.by),
        }
    }

    /// Redact version `data` of `node`: its files become a tombstone
    /// (`[REDACTED]`, and a `.meta.json` saying so), the blobs no other
    /// version uses are deleted in the same transaction, and the account's
    /// stored bytes follow. The current version is refused (commit one
    /// without the secret first); redacting twice changes nothing.
    fn redact_version(&self, node: &str, data: &[u8], by: super::commit::rules::By) -> Result<()> {
        let v = version_number(data, REDACT)?;
        let _g = self.drafts.stripe(node);
        let cur = self.live_node(node)?.ok_or(Error::NotFound)?;
        if v == cur.version {
            return Err(Error::Invalid(format!(
                "version {v} is the current one: commit a version without the secret first, then redact {v}"
            )));
        }
        let old = self
            .store
            .get_version(cur.account(), cur.id, v)?
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "the node has no version {v} (its versions are 1 to {})",
                    cur.version
                ))
            })?;
        if old.file(META).is_some_and(|f| {
            self.store
                .read_blob(old.account(), f.blob, f.size)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|m| m["redacted_version"] == true)
        }) {
            return Ok(());
        }
        // Blobs another version (or the current record) still uses stay.
        let mut used = std::collections::HashSet::new();
        used.extend(cur.files.iter().map(|f| f.blob));
        for other in 1..cur.version {
            if other == v {
                continue;
            }
            if let Some(r) = self.store.get_version(cur.account(), cur.id, other)? {
                used.extend(r.files.iter().map(|f| f.blob));
            }
        }
        let now = crate::schema::time::now_ns();
        let mut ops = Vec::new();
        let mut freed: i64 = 0;
        let mut files = Vec::new();
        let mut max_blob = 0;
        for f in &old.files {
            if !used.contains(&f.blob) {
                ops.push(Op::DelBlob { id: f.blob });
                freed += f.size as i64;
            }
            let bytes: Vec<u8> = if f.name == META {
                let mut m = serde_json::to_vec_pretty(&serde_json::json!({
                    "status": old.status.as_str(),
                    "version": v,
                    "redacted_version": true,
                    "redacted_at": crate::schema::time::rfc3339(now),
                }))
                .map_err(|e| Error::store_from("rendering .meta.json", e))?;
                m.push(b'\n');
                m
            } else {
                format!("{}\n", crate::schema::redact::REDACTED).into_bytes()
            };
            let blob = self.ids.blob()?;
            max_blob = max_blob.max(blob);
            freed -= bytes.len() as i64;
            files.push(crate::store::FileRec {
                name: f.name.clone(),
                blob,
                size: bytes.len() as u64,
                mtime_ns: now,
                mode: f.mode,
            });
            ops.push(Op::PutBlobOf {
                account: cur.account().to_string(),
                id: blob,
                data: Arc::from(bytes),
            });
        }
        ops.push(Op::PutVersion {
            rec: NodeRec { files, ..old },
        });
        ops.push(Op::Count {
            key: crate::schema::counters::bytes_key(place::account_of(node)),
            delta: -freed,
        });
        ops.push(Op::HighWater {
            key: crate::schema::counters::BLOB_ID.into(),
            value: max_blob,
        });
        ops.extend(self.audit_ops(
            place::account_of(node),
            by,
            serde_json::json!({
                "op": "redact",
                "node": place::in_account(node),
                "version": v,
            }),
        )?);
        self.store.apply(ops, true)?;
        self.as_of.forget_account(place::account_of(node));
        self.invalidate_version(node, cur.id, v);
        tracing::info!(node, version = v, "version redacted");
        Ok(())
    }

    /// Restore the version named by `data` of `node`: commit its files as
    /// the next version. Refused with EBUSY while the node has uncommitted
    /// changes.
    fn restore(&self, node: &str, data: &[u8], by: super::commit::rules::By) -> Result<()> {
        let v = version_number(data, RESTORE)?;
        let done = {
            let _g = self.drafts.stripe(node);
            let cur = self.live_node(node)?.ok_or(Error::NotFound)?;
            if let Some(d) = self.draft(node) {
                if !lock(&d).files.is_empty() {
                    return Err(Error::Busy(
                        "the node has uncommitted changes; commit or remove them before a restore",
                    ));
                }
            }
            let old = if v == cur.version {
                cur.clone()
            } else {
                self.store
                    .get_version(cur.account(), cur.id, v)?
                    .ok_or_else(|| {
                        Error::Invalid(format!(
                            "the node has no version {v} (its versions are 1 to {})",
                            cur.version
                        ))
                    })?
            };
            if old.status == Status::Broken {
                return Err(Error::Invalid(format!(
                    "version {v} is BROKEN; only ACTIVE and ARCHIVED versions can be restored"
                )));
            }
            let draft = self.restore_draft(&cur, &old, by)?;
            self.commit_as(node, &Arc::new(Mutex::new(draft)), Intent::Restore, None)?
        };
        if let Committed::Version(_) = done {
            self.invalidate_commit(node, true);
        }
        tracing::info!(node, version = v, "version restored");
        Ok(())
    }
}

impl Fs {
    /// The draft that commits `old` (an earlier version of the node whose
    /// current record is `cur`) again as the node's next version: its files,
    /// a file it did not have removed, its status of then and
    /// `"restored_from"` in `.meta.json`.
    pub(super) fn restore_draft(
        &self,
        cur: &NodeRec,
        old: &NodeRec,
        by: super::commit::rules::By,
    ) -> Result<Draft> {
        let mut draft = Draft::new(Some((cur.id, cur.version)));
        for name in NODE_FILES {
            match old.file(name) {
                Some(f) => {
                    let mut bytes = self.store.read_blob(old.account(), f.blob, f.size)?;
                    if name == META {
                        bytes = restored_meta(&bytes, old.status, old.version)?;
                    }
                    let file = DFile::new(bytes, f.mode);
                    crate::locks::write(&file).mtime = time_of(f.mtime_ns);
                    draft.files.insert(name.to_string(), Slot::File(file));
                }
                None if cur.file(name).is_some() => {
                    draft.files.insert(name.to_string(), Slot::Whiteout);
                }
                None => {}
            }
        }
        draft.by = Some(by);
        Ok(draft)
    }
}

/// The version number written to `.versions/{file}`.
fn version_number(data: &[u8], file: &str) -> Result<u32> {
    let text = String::from_utf8_lossy(data);
    let want = text.trim().trim_start_matches('v');
    want.parse().map_err(|_| {
        Error::Invalid(format!(
            "{} is not a version number (write e.g. `echo 3 > .versions/{file}`)",
            crate::schema::excerpt(text.trim())
        ))
    })
}

/// An old `.meta.json` made into a commit request: its status again, and
/// where it came from. The daemon fills in version and times at commit.
fn restored_meta(bytes: &[u8], status: Status, v: u32) -> Result<Vec<u8>> {
    let mut obj = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(o)) => o,
        _ => serde_json::Map::new(),
    };
    obj.insert("status".into(), Value::String(status.as_str().into()));
    obj.insert("restored_from".into(), Value::from(v));
    serde_json::to_vec(&Value::Object(obj))
        .map_err(|e| Error::store_from("rendering .meta.json", e))
}
