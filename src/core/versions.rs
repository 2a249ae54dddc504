//! `NODE/.versions/`: every committed version of a node, read-only, and a
//! control file that restores one of them as a new commit.
//!
//! ```text
//! NODE/.versions/            reached by path, not listed in NODE (grep -r and cp -r skip it)
//! NODE/.versions/3/          the files of version 3 as committed
//! NODE/.versions/restore     `echo 3 > .versions/restore` commits version 3's files as version N+1
//! NODE/.versions/redact      `echo 3 > .versions/redact` replaces version 3's text by a tombstone
//! ```

use super::commit::{Committed, Intent};
use super::draft::{DFile, Draft, Slot};
use super::inodes::Key;
use super::{Attr, Caller, Fs, Handle, Kind, Opened};
use super::{Control, RestoreHandle};
use crate::config::Access;
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

const RESTORE_HELP: &str = "Write a version number here to commit that version's files again \
as the node's next version:\n  echo 3 > .versions/restore\nThe node must have no uncommitted \
changes (EBUSY otherwise). Versions are the directories beside this file.\n";

const REDACT_HELP: &str = "Write the number of an earlier version here to redact it: its \
files are replaced by a tombstone ([REDACTED]) and its text is deleted from the store (run \
`ctxfs compact` on the unmounted data dir to remove it from the disk too):\n  echo 3 > \
.versions/redact\nThe current version cannot be redacted: commit a version without the \
secret first.\n";

fn arc(s: &str) -> Arc<str> {
    Arc::from(s)
}

impl Fs {
    /// The current record of `node` and the caller's access, for `.versions/`.
    fn versions_of(&self, c: Caller, node: &str) -> Result<(NodeRec, Access)> {
        let access = self.gate(c, node, false)?;
        let rec = self.visible_node(node, access)?.ok_or(Error::NotFound)?;
        Ok((rec, access))
    }

    /// Version `v` of `node` as `c` may see it; with `id`, only of that
    /// node (a node made since at the same path is another).
    fn version_for(&self, c: Caller, node: &str, id: Option<u64>, v: u32) -> Result<NodeRec> {
        let (cur, access) = self.versions_of(c, node)?;
        if id.is_some_and(|id| id != cur.id) {
            return Err(Error::NotFound);
        }
        let rec = if v == cur.version {
            cur
        } else {
            self.store
                .get_version(cur.account(), cur.id, v)?
                .ok_or(Error::NotFound)?
        };
        if !Self::shows(rec.status, access) {
            return Err(Error::NotFound);
        }
        Ok(rec)
    }

    pub(super) fn versions_attr(&self, c: Caller, key: &Key, ino: u64) -> Result<Attr> {
        match key {
            Key::Versions(node) => {
                let (rec, _) = self.versions_of(c, node)?;
                Ok(self.dir_attr(ino, 0o555, time_of(rec.updated_ns), false))
            }
            Key::VersionDir { node, id, version } => {
                let rec = self.version_for(c, node, Some(*id), *version)?;
                Ok(self.dir_attr(ino, 0o555, time_of(rec.updated_ns), false))
            }
            Key::VersionFile {
                node,
                name,
                id,
                version,
            } => {
                let rec = self.version_for(c, node, Some(*id), *version)?;
                let f = rec.file(name).ok_or(Error::NotFound)?;
                let size = if &**name == META {
                    self.version_meta(node, &rec)?.len() as u64
                } else {
                    f.size
                };
                Ok(self.file_attr(ino, size, 0o444, time_of(f.mtime_ns), false))
            }
            Key::Restore(node) => {
                self.versions_of(c, node)?;
                let size = RESTORE_HELP.len() as u64;
                Ok(self.file_attr(ino, size, 0o644, self.started, false))
            }
            Key::Redact(node) => {
                self.versions_of(c, node)?;
                let size = REDACT_HELP.len() as u64;
                Ok(self.file_attr(ino, size, 0o644, self.started, false))
            }
            _ => Err(Error::NotFound),
        }
    }

    /// A name inside `.versions/` or one of its version directories.
    pub(super) fn versions_child(&self, c: Caller, parent: &Key, name: &str) -> Result<Key> {
        match parent {
            Key::Versions(node) => {
                if name == RESTORE {
                    self.versions_of(c, node)?;
                    return Ok(Key::Restore(node.clone()));
                }
                if name == REDACT {
                    self.versions_of(c, node)?;
                    return Ok(Key::Redact(node.clone()));
                }
                let v: u32 = name.parse().map_err(|_| Error::NotFound)?;
                if name != v.to_string() {
                    return Err(Error::NotFound);
                }
                let rec = self.version_for(c, node, None, v)?;
                Ok(Key::VersionDir {
                    node: node.clone(),
                    id: rec.id,
                    version: v,
                })
            }
            Key::VersionDir { node, id, version } => {
                let rec = self.version_for(c, node, Some(*id), *version)?;
                rec.file(name).ok_or(Error::NotFound)?;
                Ok(Key::VersionFile {
                    node: node.clone(),
                    name: arc(name),
                    id: *id,
                    version: *version,
                })
            }
            _ => Err(Error::NotDir),
        }
    }

    /// The entries of `.versions/` (oldest first, then `restore`) or of one version.
    pub(super) fn versions_list(&self, c: Caller, key: &Key) -> Result<Vec<(Key, String, Kind)>> {
        let mut out = Vec::new();
        match key {
            Key::Versions(node) => {
                let (cur, access) = self.versions_of(c, node)?;
                for v in 1..=cur.version {
                    let rec = if v == cur.version {
                        Some(cur.clone())
                    } else {
                        self.store.get_version(cur.account(), cur.id, v)?
                    };
                    if rec.is_some_and(|r| Self::shows(r.status, access)) {
                        let k = Key::VersionDir {
                            node: node.clone(),
                            id: cur.id,
                            version: v,
                        };
                        out.push((k, v.to_string(), Kind::Dir));
                    }
                }
                out.push((Key::Restore(node.clone()), RESTORE.into(), Kind::File));
                out.push((Key::Redact(node.clone()), REDACT.into(), Kind::File));
            }
            Key::VersionDir { node, id, version } => {
                let rec = self.version_for(c, node, Some(*id), *version)?;
                for name in NODE_FILES {
                    if rec.file(name).is_some() {
                        let k = Key::VersionFile {
                            node: node.clone(),
                            name: arc(name),
                            id: *id,
                            version: *version,
                        };
                        out.push((k, name.to_string(), Kind::File));
                    }
                }
            }
            _ => return Err(Error::NotDir),
        }
        Ok(out)
    }

    pub(super) fn versions_open(&self, c: Caller, key: &Key, write: bool) -> Result<Opened> {
        let data = match key {
            Key::VersionFile {
                node,
                name,
                id,
                version,
            } => {
                if write {
                    self.gate(c, node, true)?;
                    return Err(Error::NotPermitted(
                        "old versions are read-only; restore one with `echo N > .versions/restore`",
                    ));
                }
                let rec = self.version_for(c, node, Some(*id), *version)?;
                if &**name == META {
                    self.version_meta(node, &rec)?
                } else {
                    let f = rec.file(name).ok_or(Error::NotFound)?;
                    self.store.read_blob(rec.account(), f.blob, f.size)?
                }
            }
            Key::Restore(node) | Key::Redact(node) => {
                let redact = matches!(key, Key::Redact(_));
                self.versions_of(c, node)?;
                if write {
                    self.gate(c, node, true)?;
                    let (what, via) = if redact {
                        (Control::Redact, "redact")
                    } else {
                        (Control::Restore, "restore")
                    };
                    let fh = self.new_handle(Handle::Restore(RestoreHandle::new(
                        node.clone(),
                        what,
                        c.by(Some(via)),
                    )));
                    return Ok(Opened {
                        fh,
                        direct_io: true,
                        keep_cache: false,
                        no_flush: false,
                    });
                }
                if redact {
                    REDACT_HELP.as_bytes().to_vec()
                } else {
                    RESTORE_HELP.as_bytes().to_vec()
                }
            }
            _ => return Err(Error::IsDir),
        };
        // A version's bytes never change under its inode, except the
        // `.meta.json` of the current version, which gains `superseded_by`
        // when the next one is committed: read afresh every time.
        let meta = matches!(key, Key::VersionFile { name, .. } if &**name == META);
        let fh = self.new_handle(Handle::Data(Arc::from(data)));
        Ok(Opened {
            fh,
            direct_io: meta,
            keep_cache: matches!(key, Key::VersionFile { .. }) && !meta,
            no_flush: true,
        })
    }

    /// The `.meta.json` of version `rec` as `.versions/N/` shows it: as
    /// committed, and for a version that is no longer the current one,
    /// which version superseded it (`superseded_by`) and, unless it says
    /// so itself, when it stopped holding (`valid_until`: the next
    /// version's `valid_from`, else that version's commit time).
    fn version_meta(&self, node: &str, rec: &NodeRec) -> Result<Vec<u8>> {
        let bytes = self.store.read_file(rec, META)?.ok_or(Error::NotFound)?;
        let next = match self
            .store
            .get_version(rec.account(), rec.id, rec.version + 1)?
        {
            Some(n) => n,
            None => match self.store.get_node(node)? {
                Some(cur) if cur.id == rec.id && cur.version == rec.version + 1 => cur,
                _ => return Ok(bytes),
            },
        };
        let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&bytes) else {
            return Ok(bytes);
        };
        obj.insert("superseded_by".into(), Value::from(rec.version + 1));
        if !obj.contains_key("valid_until") {
            let from = self
                .store
                .read_file(&next, META)?
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|m| m["valid_from"].as_str().map(str::to_string));
            let until = from.unwrap_or_else(|| crate::schema::time::rfc3339(next.updated_ns));
            obj.insert("valid_until".into(), Value::String(until));
        }
        let mut out = serde_json::to_vec_pretty(&Value::Object(obj))
            .map_err(|e| Error::store_from("rendering .meta.json", e))?;
        out.push(b'\n');
        Ok(out)
    }

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
        let _g = self.stripe(node);
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
        tracing::info!(node, version = v, "version redacted");
        Ok(())
    }

    /// Restore the version named by `data` of `node`: commit its files as
    /// the next version. Refused with EBUSY while the node has uncommitted
    /// changes.
    fn restore(&self, node: &str, data: &[u8], by: super::commit::rules::By) -> Result<()> {
        let v = version_number(data, RESTORE)?;
        let done = {
            let _g = self.stripe(node);
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
