//! A node moved (`mv` of a node directory): one new version at the new
//! path, its `.meta.json` and `.relations.json` rewritten for it, with
//! its draft, expiry, inodes and kernel entries following in one step.

use crate::core::commit;
use crate::core::Caller;
use crate::core::Fs;
use crate::error::Error;
use crate::error::Result;
use crate::locks::lock;
use crate::schema::counters;
use crate::schema::event::Change;
use crate::schema::place;
use crate::schema::place::META;
use crate::schema::time::now_ns;
use crate::schema::time::rfc3339;
use crate::store::NodeRec;
use crate::store::Op;
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::core::ops::blob_bytes;

impl Fs {
    pub(in crate::core) fn move_node(
        &self,
        c: Caller,
        src: &str,
        dst: &str,
        noreplace: bool,
    ) -> Result<()> {
        let _g = self.drafts.lock_two(src, dst);
        let rec = self.live_node(src)?;
        let draft = self.draft(src);
        if rec.is_none() && draft.is_none() {
            return Err(Error::NotFound);
        }
        if src == dst {
            return Ok(());
        }
        if self.live_node(dst)?.is_some() || self.draft(dst).is_some() {
            return Err(if noreplace {
                Error::Exists
            } else {
                Error::NotEmpty
            });
        }
        let mut ops = vec![Op::DelDraft {
            path: src.to_string(),
        }];
        // An expired node at the target goes now, in the same transaction.
        if let Some(stale) = self.store.get_node(dst)? {
            ops.extend(self.remove_ops(dst, &stale)?);
        }
        let expiry = self.expiry_at(src);
        let new_base = match &rec {
            Some(rec) => {
                let version = self.moved_node_ops(c, src, dst, rec, expiry, &mut ops)?;
                Some((rec.id, version))
            }
            None => {
                ops.extend(self.container_ops(dst));
                None
            }
        };
        self.store.apply(ops, true)?;
        self.notify_index();
        if rec.is_some() {
            self.set_expiry(src, None);
            self.set_expiry(dst, expiry);
        }
        self.drafts.rename(src, dst, new_base);
        // The kernel moves its dentry of `src` to `dst` when this returns:
        // the inodes of it and everything below follow at once; the
        // entries are dropped after.
        lock(&self.kernel.inodes).rename_tree(src, dst);
        // The kernel moved its dentry to an inode named by the old path.
        for path in [src, dst] {
            let (parent, name) = place::parent_name(path);
            self.invalidate(parent, &[name], false);
            self.invalidate_views(path);
        }
        self.metrics.nodes.moves.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The ops that move committed node `rec` from `src` to `dst` as a new
    /// version (its `.meta.json` and `.relations.json` rewritten for the
    /// new path, the event, the audit line, quota and expiry); the version.
    fn moved_node_ops(
        &self,
        c: Caller,
        src: &str,
        dst: &str,
        rec: &NodeRec,
        expiry: Option<u64>,
        ops: &mut Vec<Op>,
    ) -> Result<u32> {
        let now = now_ns();
        let version = rec.version + 1;
        let files = self.moved_files(c, rec, dst, version, now, ops)?;
        let new = NodeRec {
            path: dst.to_string(),
            version,
            updated_at: rfc3339(now),
            updated_ns: now,
            files,
            ..rec.clone()
        };
        let seq = self.ids.event()?;
        let account = place::account_of(dst).to_string();
        ops.extend(self.container_ops(dst));
        ops.extend([
            Op::DelNode {
                path: src.to_string(),
            },
            Op::PutNode {
                path: dst.to_string(),
                rec: new.clone(),
            },
            Op::PutVersion { rec: new },
            Op::PutEvent {
                seq,
                node_path: dst.to_string(),
                account,
                json: self.event(
                    seq,
                    src,
                    Change::MoveContext {
                        new_uri: place::uri_of(dst),
                    },
                ),
            },
            Op::HighWater {
                key: counters::EVENT_ID.into(),
                value: seq,
            },
        ]);
        ops.extend(self.audit_ops(
            place::account_of(dst),
            c.by(Some("move")),
            serde_json::json!({
                "op": "move",
                "from": place::in_account(src),
                "to": place::in_account(dst),
                "version": version,
            }),
        )?);
        let new_bytes = blob_bytes(ops);
        self.check_write_quota(place::account_of(dst), new_bytes)?;
        ops.extend(self.write_quota_ops(dst, new_bytes)?);
        if let Some(at) = expiry {
            ops.push(Op::DelExpiry {
                path: src.to_string(),
            });
            ops.push(Op::PutExpiry {
                path: dst.to_string(),
                at_ns: at,
            });
        }
        Ok(version)
    }

    /// A moved version's files: `.meta.json` and `.relations.json`
    /// rewritten for `dst` (their blobs put by `ops`), the others kept.
    fn moved_files(
        &self,
        c: Caller,
        rec: &NodeRec,
        dst: &str,
        version: u32,
        now: i128,
        ops: &mut Vec<Op>,
    ) -> Result<Vec<crate::store::FileRec>> {
        let mut files = Vec::new();
        for f in &rec.files {
            let rewritten = match f.name.as_str() {
                META => {
                    let bytes = self.store.read_blob(rec.account(), f.blob, f.size)?;
                    let obj = match serde_json::from_slice::<Value>(&bytes) {
                        Ok(Value::Object(o)) => o,
                        _ => serde_json::Map::new(),
                    };
                    Some(commit::rules::render_meta(
                        obj,
                        &commit::rules::Derived {
                            node: dst,
                            status: rec.status,
                            version,
                            created_at: &rec.created_at,
                            updated_at: &rfc3339(now),
                            by: Some(c.by(Some("move"))),
                        },
                    ))
                }
                place::RELATIONS => {
                    let bytes = self.store.read_blob(rec.account(), f.blob, f.size)?;
                    commit::rules::rebase_relations(&bytes, dst)
                }
                _ => None,
            };
            match rewritten {
                Some(bytes) => {
                    let id = self.ids.blob()?;
                    files.push(crate::store::FileRec {
                        name: f.name.clone(),
                        blob: id,
                        size: bytes.len() as u64,
                        mtime_ns: now,
                        mode: f.mode,
                    });
                    ops.push(Op::PutBlobOf {
                        account: place::account_of(dst).to_string(),
                        id,
                        data: Arc::from(bytes),
                    });
                    ops.push(Op::HighWater {
                        key: counters::BLOB_ID.into(),
                        value: id,
                    });
                }
                None => files.push(f.clone()),
            }
        }
        Ok(files)
    }
}
