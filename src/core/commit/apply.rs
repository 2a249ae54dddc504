//! The commit, carried out: gather the node's view under its stripe, let
//! [`Plan::build`] decide, then turn the plan into one store transaction
//! (blobs, record, version, counters, quota, expiry, outbox events) and
//! clean up the draft once it is durable.

use super::plan::{Content, Intent, Outcome, Plan, Refusal, View};
use crate::core::draft::{DFile, Draft, Slot};
use crate::core::Fs;
use crate::error::{Error, Result};
use crate::locks::{lock, read};
use crate::schema::counters;
use crate::schema::event::{Change, OutboxEvent};
use crate::schema::names::{ABSTRACT, CONTENT, META, NODE_FILES, OVERVIEW};
use crate::schema::place;
use crate::schema::time::{now_ns, ns_of, rfc3339_ms};
use crate::store::{FileRec, NodeRec, Op};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};

/// Outcome of a commit request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    Version(u32),
    /// No status or `PENDING`: the node stays a draft.
    StillPending,
}

impl Fs {
    /// Commit the draft of `node` (a writer's close of `.meta.json`);
    /// `closing` is the file whose close commits (its own open reference
    /// does not keep it in the draft).
    pub fn commit(&self, node: &str, closing: Option<&Arc<RwLock<DFile>>>) -> Result<Committed> {
        let done = {
            let _g = self.drafts.stripe(node);
            match self.draft(node) {
                Some(d) => self.commit_as(node, &d, Intent::Close, closing)?,
                None => Committed::StillPending,
            }
        };
        if let Committed::Version(_) = done {
            // Readers must meet the new version as soon as close returns.
            self.invalidate_commit(node, true);
        }
        Ok(done)
    }

    /// Commit `draft` of `node` for `intent`. The caller holds the node's stripe.
    pub(crate) fn commit_as(
        &self,
        node: &str,
        draft: &Arc<Mutex<Draft>>,
        intent: Intent,
        closing: Option<&Arc<RwLock<DFile>>>,
    ) -> Result<Committed> {
        // On a shared store another daemon may commit the node between our
        // read and our transaction: the transaction then fails its
        // compare-and-set and the commit is planned again on what is there
        // now, as a local commit would have been (SEMANTICS, "Several hosts").
        let mut attempt = 0;
        loop {
            match self.commit_once(node, draft, intent, closing) {
                Err(Error::Conflict(why)) if attempt < 8 => {
                    attempt += 1;
                    tracing::debug!(node, attempt, %why, "commit planned again");
                }
                r => return r,
            }
        }
    }

    fn commit_once(
        &self,
        node: &str,
        draft: &Arc<Mutex<Draft>>,
        intent: Intent,
        closing: Option<&Arc<RwLock<DFile>>>,
    ) -> Result<Committed> {
        let mut rec = self.store.get_node(node)?;
        // An expired node is gone already: this commit starts a new node
        // there and removes the old one in the same transaction.
        let stale = match &rec {
            Some(_) if self.expired(node) => rec.take(),
            _ => None,
        };
        let mut d = lock(draft);
        let view = self.gather(node, rec.as_ref(), &d)?;
        let now = now_ns();
        let redactor = match intent {
            Intent::Broken(_) => None,
            _ => self
                .services
                .redaction()
                .for_account(place::account_of(node)),
        };
        let plan = match Plan::build(view, intent, now, redactor.as_ref()) {
            Outcome::Commit(p) => *p,
            Outcome::StillPending => return Ok(Committed::StillPending),
            Outcome::Refused(r) => {
                self.metrics
                    .nodes
                    .commit_failures
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(suppressed) = self.limits.log_budget.take(place::account_of(node)) {
                    tracing::info!(node, reason = %r.reason(), suppressed, "commit refused");
                }
                d.error = Some(r.reason().to_string());
                return Err(match r {
                    Refusal::Invalid(r) => Error::BadCommit(r),
                    Refusal::TooBig(r) => Error::NodeTooBig(r),
                    Refusal::Stale { reason, .. } => Error::Stale(reason),
                });
            }
        };
        let version = plan.version;
        let id = match &rec {
            Some(r) => r.id,
            None => self.ids.node()?,
        };
        let expires = plan.expires;
        // On a shared store the events' ids are taken in the transaction.
        let ids = self.ids.defer_events();
        let ops = self.commit_ops(node, id, rec.as_ref(), stale.as_ref(), plan, &intent);
        drop(ids);
        let ops = match ops {
            Ok(ops) => ops,
            Err(e) => {
                if matches!(e, Error::Quota(_)) {
                    self.metrics
                        .nodes
                        .commit_failures
                        .fetch_add(1, Ordering::Relaxed);
                    d.error = Some(e.to_string());
                }
                return Err(e);
            }
        };
        self.store.apply(ops, true)?;
        self.notify_index();
        self.set_expiry(node, expires);

        // The version is durable: the node files leave the draft, except those
        // still open for writing (later bytes start the next edit).
        d.files.retain(|name, slot| {
            !NODE_FILES.contains(&name.as_str())
                || matches!(slot, Slot::File(f) if {
                    let own = closing.is_some_and(|c| Arc::ptr_eq(c, f)) as usize;
                    read(f).writers.load(Ordering::Relaxed) > own
                })
        });
        d.error = None;
        d.base = Some((id, version));
        let empty = d.files.is_empty();
        drop(d);
        if empty {
            self.drafts.remove_if_empty(node, draft);
        }
        self.metrics.nodes.commits.fetch_add(1, Ordering::Relaxed);
        Ok(Committed::Version(version))
    }

    /// The node as the commit sees it: the committed record overlaid with
    /// the draft, the kept summary texts, and the committed summary marks.
    pub(super) fn gather<'a>(
        &self,
        node: &'a str,
        rec: Option<&'a NodeRec>,
        d: &Draft,
    ) -> Result<View<'a>> {
        let mut files = Vec::new();
        let mut kept_text = Vec::new();
        for name in NODE_FILES {
            let c = match d.files.get(name) {
                Some(Slot::File(f)) => {
                    let f = read(f);
                    Some(Content::New(f.data.clone(), ns_of(f.mtime), f.mode))
                }
                Some(Slot::Whiteout) => None,
                None => rec.and_then(|r| r.file(name)).cloned().map(Content::Keep),
            };
            if let Some(Content::Keep(f)) = &c {
                if matches!(name, ABSTRACT | OVERVIEW | CONTENT) {
                    let b = self
                        .store
                        .read_blob(place::account_of(node), f.blob, f.size)?;
                    kept_text.push((name, String::from_utf8_lossy(&b).into_owned()));
                }
            }
            if let Some(c) = c {
                files.push((name, c));
            }
        }
        let derived_before = match rec.and_then(|r| r.file(META)) {
            Some(f) => {
                let b = self
                    .store
                    .read_blob(place::account_of(node), f.blob, f.size)?;
                serde_json::from_slice::<Value>(&b)
                    .ok()
                    .and_then(|v| v.get("derived").cloned())
                    .and_then(|v| serde_json::from_value(v).ok())
                    .unwrap_or_default()
            }
            None => Vec::new(),
        };
        Ok(View {
            node,
            committed: rec,
            files,
            kept_text,
            derived_before,
            by: d.by,
        })
    }

    /// The store operations of `plan`: new blobs, the record and its
    /// version, counters, containers, quota, expiry and outbox events.
    pub(super) fn commit_ops(
        &self,
        node: &str,
        id: u64,
        rec: Option<&NodeRec>,
        stale: Option<&NodeRec>,
        plan: Plan,
        intent: &Intent,
    ) -> Result<Vec<Op>> {
        let account = place::account_of(node).to_string();
        let mut ops = Vec::new();
        // Who did it, in the account's audit trail, in this transaction.
        let by = plan.by.unwrap_or(super::rules::By {
            uid: 0,
            via: "daemon",
        });
        ops.extend(self.audit_ops(
            &account,
            by,
            serde_json::json!({
                "op": "commit",
                "node": place::in_account(node),
                "version": plan.version,
                "status": plan.status.as_str(),
            }),
        )?);
        if self.store.shared() {
            ops.push(Op::Expect {
                path: node.to_string(),
                version: rec.or(stale).map(|r| r.version),
            });
        }
        let (files, blob_ops, max_blob) = new_files(&account, plan.files, || self.ids.blob())?;
        ops.extend(blob_ops);
        let new = NodeRec {
            id,
            path: node.to_string(),
            status: plan.status,
            version: plan.version,
            created_at: plan.created_at,
            updated_at: plan.updated_at,
            updated_ns: plan.updated_ns,
            files,
        };
        if let Some(old) = rec {
            ops.push(Op::Count {
                key: counters::nodes_key(&account, old.status),
                delta: -1,
            });
        }
        ops.push(Op::Count {
            key: counters::nodes_key(&account, plan.status),
            delta: 1,
        });
        ops.extend(self.container_ops(node));
        if let Some(old) = stale {
            ops.extend(self.remove_ops(node, old)?);
        }
        let new_bytes = blob_bytes(&ops);
        if !matches!(intent, Intent::Broken(_)) {
            self.check_write_quota(&account, new_bytes)?;
        }
        ops.extend(self.write_quota_ops(node, new_bytes)?);
        // An expired node (`stale`) took its expiry with it (`remove_ops`).
        let expiring = stale.is_none() && self.expiry_at(node).is_some();
        ops.extend(expiry_op(node, plan.expires, expiring));
        let mut max_seq = 0;
        let unindexed = self.services.is_unindexed(node);
        for change in plan.events {
            let change = match change {
                Change::UpsertContext { .. } if unindexed => Change::UnindexContext {},
                c => c,
            };
            let seq = self.ids.event()?;
            max_seq = seq;
            ops.push(Op::PutEvent {
                seq,
                node_path: node.to_string(),
                account: account.clone(),
                json: OutboxEvent::new(seq, node, change, rfc3339_ms(now_ns())).encode(),
            });
        }
        ops.extend(record_ops(new, max_seq, max_blob));
        Ok(ops)
    }
}

/// The files of a new version and the blobs it writes (ids from `blob`),
/// with the highest id taken (0: none). A file written with no mode gets
/// `0644`; a file kept is the committed version's, blob and all.
fn new_files(
    account: &str,
    planned: Vec<(&'static str, Content)>,
    mut blob: impl FnMut() -> Result<u64>,
) -> Result<(Vec<FileRec>, Vec<Op>, u64)> {
    let (mut files, mut ops, mut max_blob) = (Vec::new(), Vec::new(), 0);
    for (name, c) in planned {
        match c {
            Content::Keep(fr) => files.push(fr),
            Content::New(bytes, mtime_ns, mode) => {
                let id = blob()?;
                max_blob = max_blob.max(id);
                files.push(FileRec {
                    name: name.to_string(),
                    blob: id,
                    size: bytes.len() as u64,
                    mtime_ns,
                    mode: if mode == 0 { 0o644 } else { mode },
                });
                ops.push(Op::PutBlobOf {
                    account: account.to_string(),
                    id,
                    data: Arc::from(bytes),
                });
            }
        }
    }
    Ok((files, ops, max_blob))
}

/// What a commit does to `node`'s expiry: the plan's time, else none
/// where the node had one (`expiring`).
fn expiry_op(node: &str, expires: Option<u64>, expiring: bool) -> Option<Op> {
    let path = node.to_string();
    match expires {
        Some(at_ns) => Some(Op::PutExpiry { path, at_ns }),
        None if expiring => Some(Op::DelExpiry { path }),
        None => None,
    }
}

/// The new record as the node and as its version, the draft gone, and
/// the id counters raised to what the commit took.
fn record_ops(new: NodeRec, max_seq: u64, max_blob: u64) -> [Op; 6] {
    let (path, id) = (new.path.clone(), new.id);
    [
        Op::PutNode {
            path: path.clone(),
            rec: new.clone(),
        },
        Op::PutVersion { rec: new },
        Op::DelDraft { path },
        Op::HighWater {
            key: counters::NODE_ID.into(),
            value: id,
        },
        Op::HighWater {
            key: counters::EVENT_ID.into(),
            value: max_seq,
        },
        Op::HighWater {
            key: counters::BLOB_ID.into(),
            value: max_blob,
        },
    ]
}

/// Bytes of the new blobs among `ops` (what a change adds to the store).
pub(crate) fn blob_bytes(ops: &[Op]) -> u64 {
    ops.iter()
        .map(|o| match o {
            Op::PutBlob { data, .. } | Op::PutBlobOf { data, .. } => data.len() as u64,
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_versions_files_and_blobs() {
        let kept = FileRec {
            name: CONTENT.into(),
            blob: 3,
            size: 5,
            mtime_ns: 1,
            mode: 0o600,
        };
        let mut next = 10;
        let (files, ops, max) = new_files(
            "acme",
            vec![
                (CONTENT, Content::Keep(kept.clone())),
                (ABSTRACT, Content::New(b"ab".to_vec(), 7, 0)),
                (META, Content::New(b"{}".to_vec(), 8, 0o640)),
            ],
            || {
                next += 1;
                Ok(next)
            },
        )
        .unwrap();
        assert_eq!(files[0], kept, "a kept file is the committed one");
        let got: Vec<(&str, u64, u16)> = files.iter().map(|f| (&*f.name, f.blob, f.mode)).collect();
        assert_eq!(
            got,
            [
                (CONTENT, 3, 0o600),
                (ABSTRACT, 11, 0o644),
                (META, 12, 0o640)
            ]
        );
        assert_eq!((ops.len(), max, blob_bytes(&ops)), (2, 12, 4));
        let (files, ops, max) = new_files("acme", vec![], || unreachable!()).unwrap();
        assert!(files.is_empty() && ops.is_empty() && max == 0);
    }

    #[test]
    fn what_a_commit_does_to_an_expiry() {
        let put = |at| {
            Some(Op::PutExpiry {
                path: "n".into(),
                at_ns: at,
            })
        };
        let del = Some(Op::DelExpiry { path: "n".into() });
        // (the plan's expiry, the node has one) -> the op
        let table = [
            (Some(5), false, put(5)),
            (Some(5), true, put(5)),
            (None, true, del),
            (None, false, None),
        ];
        for (expires, expiring, want) in table {
            let got = expiry_op("n", expires, expiring);
            assert_eq!(
                format!("{got:?}"),
                format!("{want:?}"),
                "{expires:?} {expiring}"
            );
        }
    }
}
