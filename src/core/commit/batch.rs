//! Many nodes committed by one request: `accounts/{a}/.ctxfs/batch`.
//!
//! A writer writes JSON lines, one node each (`{"node": "users/u/memories/c/s",
//! "content": …, "abstract"?, "overview"?, "relations"?, "meta": {…}}`), and
//! closes the file. Each node goes through the same plan as a four-step
//! commit (checks, redaction, derived summaries, quota, outbox events) and
//! is committed whole or not at all; the nodes that pass are applied in one
//! store transaction, so a batch costs one sync. Reading the file gives the
//! caller's last batch result, a line per node.

use super::plan::{Intent, Outcome, Plan, Refusal};
use crate::config::Access;
use crate::core::draft::{DFile, Draft, Slot};
use crate::core::{Caller, Fs};
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::schema::names::{ABSTRACT, CONTENT, META, OVERVIEW, RELATIONS};
use crate::schema::place::{self, DirPlace};
use crate::schema::time::now_ns;
use crate::store::NodeRec;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Nodes one batch may hold.
pub const MAX_BATCH_NODES: usize = 10_000;
/// Nodes of a batch applied in one transaction (under their locks only).
pub const BATCH_CHUNK: usize = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchNode {
    node: String,
    content: String,
    #[serde(rename = "abstract")]
    abstract_: Option<String>,
    overview: Option<String>,
    relations: Option<Value>,
    meta: Map<String, Value>,
    /// Commit only over this version of the node (0: only where no node
    /// is): a line planned on a version that was replaced or deleted since
    /// is refused, not applied over the newer state.
    if_version: Option<u32>,
}

/// What every node of one batch is planned with.
struct Planning<'a> {
    now: i128,
    redactor: Option<&'a crate::schema::redact::Redactor>,
    /// Who commits a batch's drafts (the drafts committed all or none
    /// carry their own).
    by: Option<super::rules::By>,
    intent: Intent<'a>,
}

/// Why a draft planned among others was not.
enum NotPlanned {
    /// Its status asks for no commit.
    Pending,
    Refused(Refusal),
    Failed(Error),
}

/// Why a line is refused; `current` is the node's version (0: none) when
/// the line was planned on another one (`if_version`).
struct LineError {
    reason: String,
    current: Option<u32>,
}

impl From<String> for LineError {
    fn from(reason: String) -> Self {
        LineError {
            reason,
            current: None,
        }
    }
}

impl From<&str> for LineError {
    fn from(reason: &str) -> Self {
        reason.to_string().into()
    }
}

/// The result of one line.
fn outcome(line: usize, node: &str, r: std::result::Result<u32, LineError>) -> Value {
    match r {
        Ok(v) => json!({"line": line, "node": node, "version": v}),
        Err(LineError {
            reason,
            current: None,
        }) => json!({"line": line, "node": node, "error": reason}),
        Err(LineError {
            reason,
            current: Some(c),
        }) => json!({"line": line, "node": node, "error": reason, "current": c}),
    }
}

impl Fs {
    /// Commit the nodes of a batch written by `c` into `account`; the result
    /// lines, and how many nodes were refused.
    pub(crate) fn commit_batch(
        &self,
        c: Caller,
        account: &str,
        bytes: &[u8],
        via: &'static str,
    ) -> Result<(Vec<u8>, usize)> {
        self.gate_writes_in(c, account)?;
        let text = std::str::from_utf8(bytes)
            .map_err(|e| Error::Invalid(format!("a batch is UTF-8 JSON lines: {e}")))?;
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| (i + 1, l))
            .collect();
        if lines.len() > MAX_BATCH_NODES {
            return Err(Error::Invalid(format!(
                "a batch holds at most {MAX_BATCH_NODES} nodes, not {}",
                lines.len()
            )));
        }
        // Parse and place every line first.
        let mut results: Vec<Value> = Vec::new();
        let mut todo: Vec<(usize, String, BatchNode)> = Vec::new();
        for (line, l) in lines {
            let parsed = serde_json::from_str::<BatchNode>(l)
                .map_err(|e| format!("not a batch node: {e}"))
                .and_then(|n| {
                    let path = format!("{account}/{}", n.node);
                    let comps = place::split(&path);
                    for c in &comps {
                        place::check_name(c).map_err(|e| e.to_string())?;
                    }
                    match place::classify_dir(&comps) {
                        Ok(DirPlace::Node) => {}
                        _ => {
                            return Err(format!(
                                "{} is not a node place",
                                crate::schema::excerpt(&n.node)
                            ))
                        }
                    }
                    if self.access_of(c, &path) != Access::Write {
                        return Err(format!(
                            "{} is outside what this uid may write (EACCES)",
                            crate::schema::excerpt(&n.node)
                        ));
                    }
                    if todo.iter().any(|(_, p, _)| *p == path) {
                        return Err("the same node twice in one batch".into());
                    }
                    Ok((path, n))
                });
            match parsed {
                Ok((path, n)) => todo.push((line, path, n)),
                Err(e) => results.push(outcome(line, "", Err(e.into()))),
            }
        }
        let now = now_ns();
        let redactor = self.services.redaction().for_account(account);
        let mut done: Vec<(usize, String, u32, Option<u64>)> = Vec::new();
        // In transactions of BATCH_CHUNK nodes, each holding only its
        // nodes' locks: another tenant's commit waits for one chunk at
        // most, not for a 10,000-node batch.
        while !todo.is_empty() {
            let chunk: Vec<(usize, String, BatchNode)> =
                todo.drain(..todo.len().min(BATCH_CHUNK)).collect();
            let guards = self
                .drafts
                .stripes_of(chunk.iter().map(|(_, p, _)| p.as_str()));
            let mut ops = Vec::new();
            let mut planned: Vec<(usize, String, u32, Option<u64>)> = Vec::new();
            // Writes and bytes of the chunk's nodes so far (for the quota;
            // earlier chunks are in the store's counters).
            let mut pending = (0i64, 0i64);
            let ids = self.ids.defer_events();
            for (line, path, n) in chunk {
                let cx = Planning {
                    now,
                    redactor: redactor.as_ref(),
                    by: Some(c.by(Some(via))),
                    intent: Intent::Close,
                };
                let r = self.plan_batch_node(&path, n, &cx, &mut ops, &mut pending);
                match r {
                    Ok((v, expires)) => planned.push((line, path, v, expires)),
                    Err(e) => {
                        self.metrics
                            .nodes
                            .commit_failures
                            .fetch_add(1, Ordering::Relaxed);
                        let node = place::in_account(&path).to_string();
                        results.push(outcome(line, &node, Err(e)));
                    }
                }
            }
            drop(ids);
            if !ops.is_empty() {
                self.store.apply(ops, true)?;
                self.notify_index();
            }
            for (_, path, _, expires) in &planned {
                self.set_expiry(path, *expires);
                // An empty draft (a `mkdir` of the node) is committed over.
                if let Some(d) = self.draft(path) {
                    self.drafts.remove_if_empty(path, &d);
                }
            }
            drop(guards);
            self.invalidate_ancestors(planned.iter().map(|(_, p, _, _)| p.as_str()));
            for (line, path, v, _) in &planned {
                self.invalidate_commit(path, false);
                let node = place::in_account(path);
                results.push(outcome(*line, node, Ok(*v)));
            }
            done.extend(planned);
        }
        self.metrics
            .nodes
            .commits
            .fetch_add(done.len() as u64, Ordering::Relaxed);
        results.sort_by_key(|r| r["line"].as_u64().unwrap_or(0));
        let refused = results.iter().filter(|r| r.get("error").is_some()).count();
        let mut out = Vec::new();
        for r in results {
            out.extend(serde_json::to_vec(&r).unwrap_or_default());
            out.push(b'\n');
        }
        Ok((out, refused))
    }

    /// Commit `drafts` (each a node's path, its current record and the
    /// draft of its next version) in one transaction: every node or none.
    /// Each node must still be at the version its record says (`ESTALE`
    /// otherwise) and hold no uncommitted change (`EBUSY`). The new
    /// versions, in order.
    pub(crate) fn commit_all_or_none(
        &self,
        account: &str,
        drafts: Vec<(String, NodeRec, Draft)>,
        intent: Intent,
    ) -> Result<Vec<u32>> {
        let guards = self
            .drafts
            .stripes_of(drafts.iter().map(|(p, _, _)| p.as_str()));
        let redactor = self.services.redaction().for_account(account);
        // On a shared store another daemon may commit one of the nodes
        // between the reads and the transaction: planned again, as a
        // single commit is.
        let mut attempt = 0;
        let (versions, expiries) = loop {
            let at = Planning {
                now: now_ns(),
                redactor: redactor.as_ref(),
                by: None,
                intent,
            };
            let mut ops = Vec::new();
            let mut versions = Vec::new();
            let mut expiries = Vec::new();
            let mut pending = (0i64, 0i64);
            let ids = self.ids.defer_events();
            for (path, was, draft) in &drafts {
                if self.draft(path).is_some_and(|d| !lock(&d).files.is_empty()) {
                    return Err(Error::Busy(
                        "a node has uncommitted changes; commit or remove them first",
                    ));
                }
                let rec = self.live_node(path)?;
                match &rec {
                    Some(r) if r.id == was.id && r.version == was.version => {}
                    _ => {
                        return Err(Error::Stale(format!(
                            "{} changed meanwhile; nothing was committed, try again",
                            place::in_account(path)
                        )))
                    }
                }
                let planned = self.plan_among(
                    path,
                    (was.id, rec.as_ref(), None),
                    draft,
                    &at,
                    &mut ops,
                    &mut pending,
                );
                let (version, expires) = planned.map_err(|e| match e {
                    NotPlanned::Pending => Error::BadCommit(format!(
                        "{}: its status cannot be committed",
                        place::in_account(path)
                    )),
                    NotPlanned::Refused(r) => {
                        Error::BadCommit(format!("{}: {}", place::in_account(path), r.reason()))
                    }
                    NotPlanned::Failed(e) => e,
                })?;
                versions.push(version);
                expiries.push(expires);
            }
            drop(ids);
            match self.store.apply(ops, true) {
                Err(Error::Conflict(why)) if attempt < 8 => {
                    attempt += 1;
                    tracing::debug!(attempt, %why, "a commit of many nodes planned again");
                }
                Err(e) => return Err(e),
                Ok(()) => break (versions, expiries),
            }
        };
        self.notify_index();
        for ((path, _, _), expires) in drafts.iter().zip(&expiries) {
            self.set_expiry(path, *expires);
        }
        drop(guards);
        self.invalidate_ancestors(drafts.iter().map(|(p, _, _)| p.as_str()));
        for (path, _, _) in &drafts {
            self.invalidate_commit(path, false);
        }
        self.metrics
            .nodes
            .commits
            .fetch_add(drafts.len() as u64, Ordering::Relaxed);
        Ok(versions)
    }

    /// Plan one node of a batch and add its operations to `ops`: its
    /// version and expiry, or why it is refused.
    fn plan_batch_node(
        &self,
        path: &str,
        n: BatchNode,
        cx: &Planning,
        ops: &mut Vec<crate::store::Op>,
        pending: &mut (i64, i64),
    ) -> std::result::Result<(u32, Option<u64>), LineError> {
        if self.draft(path).is_some_and(|d| !lock(&d).files.is_empty()) {
            return Err("the node has uncommitted changes in a draft".into());
        }
        let mut rec = self.store.get_node(path).map_err(|e| e.to_string())?;
        let stale = match &rec {
            Some(_) if self.expired(path) => rec.take(),
            _ => None,
        };
        if let Some(want) = n.if_version {
            let have = rec.as_ref().map_or(0, |r| r.version);
            if let Some(reason) = super::rules::stale_reason(have, want, "this line was planned") {
                return Err(LineError {
                    reason,
                    current: Some(have),
                });
            }
        }
        let mut draft = Draft::new(rec.as_ref().map(|r| (r.id, r.version)));
        draft.by = cx.by;
        let mut put = |name: &str, bytes: Vec<u8>| {
            draft
                .files
                .insert(name.to_string(), Slot::File(DFile::new(bytes, 0o644)));
        };
        put(CONTENT, n.content.into_bytes());
        if let Some(a) = n.abstract_ {
            put(ABSTRACT, a.into_bytes());
        }
        if let Some(o) = n.overview {
            put(OVERVIEW, o.into_bytes());
        }
        if let Some(r) = n.relations {
            put(RELATIONS, serde_json::to_vec(&r).unwrap_or_default());
        }
        put(
            META,
            serde_json::to_vec(&Value::Object(n.meta)).unwrap_or_default(),
        );
        let id = match &rec {
            Some(r) => r.id,
            None => self.ids.node().map_err(|e| e.to_string())?,
        };
        self.plan_among(
            path,
            (id, rec.as_ref(), stale.as_ref()),
            &draft,
            cx,
            ops,
            pending,
        )
        .map_err(|e| match e {
            NotPlanned::Pending => "meta.status must be ACTIVE or ARCHIVED to commit".into(),
            NotPlanned::Refused(Refusal::Invalid(r) | Refusal::TooBig(r)) => r.into(),
            NotPlanned::Refused(Refusal::Stale { reason, current }) => LineError {
                reason,
                current: Some(current),
            },
            NotPlanned::Failed(e) => e.to_string().into(),
        })
    }

    /// Plan `draft` of node `path` (its id, its current record, an expired
    /// record it replaces) among others committed in one transaction: its
    /// operations go to `ops`, its writes and bytes are counted against the
    /// account's quota with `pending`, those planned before it. Its version
    /// and expiry.
    fn plan_among(
        &self,
        path: &str,
        (id, rec, stale): (u64, Option<&NodeRec>, Option<&NodeRec>),
        draft: &Draft,
        cx: &Planning,
        ops: &mut Vec<crate::store::Op>,
        pending: &mut (i64, i64),
    ) -> std::result::Result<(u32, Option<u64>), NotPlanned> {
        let view = self.gather(path, rec, draft).map_err(NotPlanned::Failed)?;
        let plan = match Plan::build(view, cx.intent, cx.now, cx.redactor) {
            Outcome::Commit(p) => *p,
            Outcome::StillPending => return Err(NotPlanned::Pending),
            Outcome::Refused(r) => return Err(NotPlanned::Refused(r)),
        };
        let (version, expires) = (plan.version, plan.expires);
        let node_ops = self
            .commit_ops(path, id, rec, stale, plan, &cx.intent)
            .map_err(NotPlanned::Failed)?;
        let account = place::account_of(path);
        let (w, b) = self.counted(account, &node_ops);
        self.check_pending(account, pending.0 + w, pending.1 + b)
            .map_err(NotPlanned::Failed)?;
        *pending = (pending.0 + w, pending.1 + b);
        ops.extend(node_ops);
        Ok((version, expires))
    }
}

/// `accounts/{a}/.ctxfs/batch` opened for writing: the lines written since
/// the last close (each close commits what it finds and empties it).
pub(crate) struct BatchHandle {
    pub(crate) account: Arc<str>,
    pub(crate) caller: Caller,
    pub(crate) buf: std::sync::Mutex<crate::core::draft::HeldBuf>,
}
