//! Reindexing from the committed nodes: after a model change, for nodes
//! never indexed, for given paths, or everything (`ctxfs reindex`).

use super::batch::work_of;
use crate::error::Result;
use crate::index::edges_of;
use crate::index::rlock;
use crate::index::under_any;
use crate::index::AccountIndex;
use crate::index::Edge;
use crate::index::Index;
use crate::index::IxDoc;
use crate::index::Pending;
use crate::index::Texts;
use crate::index::Work;
use crate::index::BATCH;
use crate::locks::lock;
use crate::schema::event;
use crate::schema::place;
use crate::store::NodeRec;
use crate::store::Op;
use crate::store::Status;
use crate::store::Store;
use crate::store::StoredEvent;
use crate::store::MODEL_MARK;
use serde_json::Value;
use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The L0/L1/L2 texts of a committed node (for reindexing from the store).
pub fn node_texts(store: &dyn Store, rec: &NodeRec) -> Result<(Texts, Vec<Edge>)> {
    let mut texts = Vec::new();
    let mut edges = Vec::new();
    for (name, level) in [
        (place::ABSTRACT, 0u8),
        (place::OVERVIEW, 1),
        (place::CONTENT, 2),
    ] {
        if let Some(f) = rec.file(name) {
            let b = store.read_blob(rec.account(), f.blob, f.size)?;
            texts.push((level, String::from_utf8_lossy(&b).into_owned()));
        }
    }
    if let Some(f) = rec.file(place::RELATIONS) {
        let b = store.read_blob(rec.account(), f.blob, f.size)?;
        if let Ok(Value::Array(a)) = serde_json::from_slice::<Value>(&b) {
            edges = edges_of(&a);
        }
    }
    Ok((texts, edges))
}

impl Index {
    /// The index paths (`{conversation}#{i}`) of every message of every
    /// conversation stored in the users' inboxes.
    fn message_paths(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for a in self.store.list_dirs("")? {
            for u in self.store.list_dirs(&format!("{a}/users"))? {
                let inbox = format!("{a}/users/{u}/{}", crate::schema::names::INBOX);
                for (name, _) in self.store.list_scratch(&inbox)? {
                    if !crate::extract::is_conversation_name(&name) {
                        continue;
                    }
                    let conv = format!("{inbox}/{name}");
                    for (i, _) in self.message_changes(&conv)? {
                        out.push(event::message_path(&conv, i));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Is the committed node to be indexed: not under an unindexed prefix,
    /// and not `"searchable": false` in its `.meta.json`?
    fn searchable(&self, rec: &NodeRec) -> Result<bool> {
        if under_any(&self.cfg.unindexed, &rec.path) {
            return Ok(false);
        }
        let Some(f) = rec.file(place::META) else {
            return Ok(true);
        };
        let b = self.store.read_blob(rec.account(), f.blob, f.size)?;
        Ok(serde_json::from_slice::<Value>(&b)
            .ok()
            .and_then(|v| v.get("searchable").and_then(Value::as_bool))
            != Some(false))
    }

    /// The index events of the conversation stored at `conv` (none when it
    /// is gone, unreadable or unindexed), redacted as when it was stored.
    fn message_changes(&self, conv: &str) -> Result<Vec<(usize, event::Change)>> {
        let Some(b) = self.store.get_scratch(conv)? else {
            return Ok(Vec::new());
        };
        let rec = crate::store::ScratchRec::decode(&b)?;
        let name = conv.rsplit('/').next().unwrap_or("");
        let Ok(c) = crate::extract::parse(name, &rec.data) else {
            return Ok(Vec::new());
        };
        if under_any(&self.cfg.unindexed, conv) {
            return Ok(Vec::new());
        }
        let account = place::account_of(conv);
        let r = self.cfg.redaction.for_account(account);
        Ok(crate::extract::message_changes(
            &c,
            r.as_ref(),
            rec.time_ns(),
        ))
    }

    /// Re-embed the documents whose vectors came from another model. The
    /// check reads every document of the store, so the store keeps a mark
    /// (`MODEL_MARK`) once a check finds every document of this model: the
    /// next start with the model skips it. An indexer of another model
    /// clears the mark before it writes a document; the mark is set again
    /// only by a check that finds nothing to do (after a model change, the
    /// start after the reindex).
    pub fn reindex_stale_models(&self) -> Result<usize> {
        let model = self.embedder.id().to_string();
        let mark = self
            .store
            .get_scratch(MODEL_MARK)?
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        if mark.as_deref() == Some(model.as_str()) {
            return Ok(0);
        }
        if mark.is_some() {
            self.set_model_mark(None)?;
        }
        let mut stale: Vec<String> = Vec::new();
        self.store.scan_ix("", &mut |path, b| {
            let d = IxDoc::decode(b)?;
            if d.model != model && !d.recs.is_empty() {
                stale.push(path.to_string());
            }
            Ok(())
        })?;
        if stale.is_empty() {
            self.set_model_mark(Some(&model))?;
            return Ok(0);
        }
        tracing::info!(
            nodes = stale.len(),
            model,
            "embedding model changed: reindexing"
        );
        let n = stale.len();
        self.reindex_paths(stale, &mut |_, _| {})?;
        Ok(n)
    }

    /// Record (or clear) the model every index document was made with.
    pub(super) fn set_model_mark(&self, model: Option<&str>) -> Result<()> {
        let op = match model {
            Some(m) => Op::PutScratch {
                path: MODEL_MARK.to_string(),
                data: m.as_bytes().to_vec(),
            },
            None => Op::DelScratch {
                path: MODEL_MARK.to_string(),
            },
        };
        self.store.apply(vec![op], true)
    }

    /// ACTIVE nodes with no index document (an interrupted `ctxfs reindex`,
    /// an index dir deleted by hand): index them from the store. Cheap when
    /// the counts agree: a counter per account against its count of node
    /// documents, both read at once, and no account loaded.
    pub fn index_unindexed(&self) -> Result<usize> {
        let mut short = HashSet::new();
        // Account directories (a commit creates its account's).
        let accounts = self.store.list_dirs("")?;
        let keys: Vec<String> = accounts
            .iter()
            .map(|a| crate::schema::counters::nodes_key(a, crate::schema::Status::Active))
            .collect();
        let active = self.store.counters(&keys)?;
        // Node documents only: conversation messages are documents too.
        let docs = self.store.ix_node_counts()?;
        for (a, active) in accounts.into_iter().zip(active) {
            if docs.get(&a).copied().unwrap_or(0) < active.max(0) as usize {
                short.insert(a);
            }
        }
        if short.is_empty() {
            return Ok(0);
        }
        let mut missing = Vec::new();
        self.store.scan_nodes(&mut |r| {
            let a = place::account_of(&r.path);
            if r.status == Status::Active && short.contains(a) {
                missing.push(r.path);
            }
            Ok(())
        })?;
        let accounts: HashMap<String, Arc<AccountIndex>> = short
            .iter()
            .map(|a| Ok((a.clone(), self.account(a)?)))
            .collect::<Result<_>>()?;
        missing.retain(|p| {
            let a = place::account_of(p);
            accounts
                .get(a)
                .is_some_and(|ai| !rlock(&ai.st).docs.contains_key(p.as_str()))
        });
        let n = missing.len();
        if n > 0 {
            tracing::warn!(
                nodes = n,
                "ACTIVE nodes without an index document: indexing them"
            );
            self.reindex_paths(missing, &mut |_, _| {})?;
        }
        Ok(n)
    }

    /// Index the current state of the given nodes from the store (ACTIVE:
    /// upsert; anything else or gone: remove).
    pub fn reindex_paths(
        &self,
        paths: Vec<String>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<()> {
        let total = paths.len();
        let mut done = 0;
        for part in paths.chunks(BATCH) {
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let mut batch = Vec::new();
            for path in part {
                // Work that is not an outbox event: sequence number 0.
                let direct = |work: Work| Pending {
                    ev: StoredEvent {
                        seq: 0,
                        json: Vec::new(),
                    },
                    event: None,
                    path: path.clone(),
                    account: place::account_of(path).to_string(),
                    work,
                };
                if let Some((conv, i)) = event::message_of(path) {
                    let found = self
                        .message_changes(conv)?
                        .into_iter()
                        .find(|(m, _)| *m == i as usize);
                    match found.and_then(|(_, c)| work_of(path, &c, self.cfg.message_views)) {
                        Some(w) => batch.push(direct(w)),
                        None => batch.push(direct(Work::Remove { path: path.clone() })),
                    }
                    continue;
                }
                match self.store.get_node(path)? {
                    Some(rec) if rec.status == Status::Active && self.searchable(&rec)? => {
                        let (texts, edges) = node_texts(&*self.store, &rec)?;
                        batch.push(direct(Work::Upsert {
                            path: path.clone(),
                            texts,
                            label: None,
                            source: None,
                        }));
                        batch.push(direct(Work::Relations {
                            path: path.clone(),
                            edges,
                        }));
                    }
                    _ => batch.push(direct(Work::Remove { path: path.clone() })),
                }
            }
            // Sequence number 0 is never a stored event: the outbox
            // bookkeeping of `process` is a no-op for this work.
            self.process(batch)?;
            done += part.len();
            progress(done, total);
        }
        Ok(())
    }

    /// Rebuild every index from the store: documents, vectors (from the
    /// cache when the model already embedded a text) and graphs.
    pub fn reindex_all(&self, progress: &mut dyn FnMut(usize, usize)) -> Result<usize> {
        // Forget what is indexed (and that it was checked).
        self.set_model_mark(None)?;
        let mut ops = Vec::new();
        self.store.scan_ix("", &mut |path, _| {
            ops.push(Op::DelIx {
                path: path.to_string(),
            });
            Ok(())
        })?;
        self.store.apply(ops, false)?;
        lock(&self.accounts).clear();
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir_all(e.path());
        }
        let mut paths = Vec::new();
        self.store.scan_nodes(&mut |rec| {
            if rec.status == Status::Active {
                paths.push(rec.path);
            }
            Ok(())
        })?;
        paths.extend(self.message_paths()?);
        paths.sort();
        let n = paths.len();
        self.reindex_paths(paths, progress)?;
        self.dump_all();
        Ok(n)
    }
}
