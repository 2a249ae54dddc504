//! The indexer's step: select the outbox events to process now, embed
//! what the batch needs, plan each event's change, write documents and
//! remove the events in one transaction, then update the in-memory
//! indexes; failures retry with backoff, then go to the dead-letter queue.

use crate::error::Result;
use crate::index::{
    ann, bytes_vec, embed, lex, record_texts, records, rlock, text, vec_bytes, AccountIndex,
    Change, Edge, Index, IxDoc, IxRec, LabeledVec, BATCH, EMBED_BATCH, MESSAGE_LEVEL,
};
use crate::locks::lock;
use crate::schema::event::{self, EventStatus, OutboxEvent};
use crate::schema::place;
use crate::schema::time::now_ms;
use crate::store::{Op, StoredEvent};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use xxhash_rust::xxh3::xxh3_128;

/// One unit of indexing work decoded from an outbox event.
pub(super) enum Work {
    Upsert {
        path: String,
        texts: Vec<(u8, String)>,
        /// The document's abstract when it is not its L0 (a conversation's
        /// message: number, role, time and text); not embedded.
        label: Option<String>,
        /// A message's: when its conversation was stored (`IxDoc::source`).
        source: Option<u64>,
    },
    Relations {
        path: String,
        edges: Vec<Edge>,
    },
    Remove {
        path: String,
    },
    Move {
        from: String,
        to: String,
    },
}

pub(super) struct Pending {
    pub(super) ev: StoredEvent,
    /// The event as decoded; `None` for work that is not an outbox event
    /// (reindexing) and for events the indexer cannot read (dead-lettered).
    pub(super) event: Option<OutboxEvent>,
    pub(super) path: String,
    pub(super) account: String,
    pub(super) work: Work,
}

/// `views`: a message is embedded in its views too (`[index] message_views`).
pub(super) fn parse_event(ev: &StoredEvent, views: bool) -> Option<Pending> {
    let event = OutboxEvent::decode(&ev.json).ok()?;
    let path = event.node()?.to_string();
    let account = place::account_of(&path).to_string();
    let work = work_of(&path, &event.change, views)?;
    // The store files an event under the node's path after the change (a
    // move's under its destination).
    let path = match &work {
        Work::Move { to, .. } => to.clone(),
        _ => path,
    };
    Some(Pending {
        ev: ev.clone(),
        event: Some(event),
        path,
        account,
        work,
    })
}

/// The indexing work of a change to the document at `path`; `views`: a
/// message's views are embedded beside its text.
pub(super) fn work_of(path: &str, change: &event::Change, views: bool) -> Option<Work> {
    let path = path.to_string();
    Some(match change {
        event::Change::UpsertContext { records } => Work::Upsert {
            path: path.clone(),
            texts: records.iter().map(|r| (r.level, r.text.clone())).collect(),
            label: None,
            source: None,
        },
        event::Change::UpsertMessage {
            message,
            role,
            ts,
            text,
            name,
            stored_ns,
            before,
        } => Work::Upsert {
            path: path.clone(),
            texts: std::iter::once((2, text.clone()))
                .chain(
                    if views {
                        text::message_views(text, before.as_deref(), name.as_deref())
                    } else {
                        Vec::new()
                    }
                    .into_iter()
                    .map(|v| (MESSAGE_LEVEL, v)),
                )
                .collect(),
            label: Some(event::message_label(
                *message,
                role,
                name.as_deref(),
                ts.as_deref(),
                text,
            )),
            source: *stored_ns,
        },
        event::Change::UpsertRelation { edges } => Work::Relations {
            path: path.clone(),
            edges: edges_of(edges),
        },
        event::Change::ArchiveContext {}
        | event::Change::DeleteContext {}
        | event::Change::UnindexContext {} => Work::Remove { path: path.clone() },
        event::Change::MoveContext { new_uri } => Work::Move {
            from: path.clone(),
            to: place::node_of_uri(new_uri)?.to_string(),
        },
    })
}

pub(super) fn edges_of(v: &[Value]) -> Vec<Edge> {
    v.iter()
        .filter_map(|e| {
            Some(Edge {
                to: e["to_uri"].as_str()?.to_string(),
                kind: e["relation_type"].as_str().unwrap_or("related").to_string(),
                weight: e["weight"].as_f64().unwrap_or(1.0) as f32,
            })
        })
        .collect()
}

/// The vectors a batch's texts need, by text hash.
#[derive(Default)]
struct Vectors {
    /// At hand: from the embedding cache, or embedded now.
    have: HashMap<u128, ann::Vector>,
    /// Still to embed.
    need: HashMap<u128, String>,
    /// The nodes whose rows store a new vector (once per text, or once per
    /// scope of an encrypted store: its rows are keyed per scope).
    owners: HashMap<u128, Vec<String>>,
    /// Tokens each account asks of the embedder in this batch, and for
    /// which texts (its daily budget).
    asks: HashMap<String, (u64, Vec<u128>)>,
    /// Embeddings that failed, with why.
    failed: HashMap<u128, String>,
}

/// A batch's planned changes, in order.
#[derive(Default)]
struct Planned {
    changes: Vec<(Arc<AccountIndex>, Change)>,
    /// Directories whose stored summary the changes make stale.
    dirs: std::collections::BTreeSet<String>,
    /// When each done event was created.
    done_lags: Vec<SystemTime>,
}

impl Index {
    /// Events to process now, in order; an event waiting for a retry holds
    /// back the later events of its node.
    pub(super) fn select(&self, head: &[StoredEvent]) -> (Vec<Pending>, Option<Instant>) {
        let now = now_ms();
        let mut blocked: HashSet<String> = HashSet::new();
        let mut out = Vec::new();
        let mut next: Option<Instant> = None;
        for ev in head {
            let Some(p) = parse_event(ev, self.cfg.message_views) else {
                // Not something the indexer understands: dead-letter it.
                out.push(Pending {
                    ev: ev.clone(),
                    event: None,
                    path: String::new(),
                    account: String::new(),
                    work: Work::Remove {
                        path: String::new(),
                    },
                });
                continue;
            };
            // A move touches its source and its destination.
            let mut touched = vec![p.path.clone()];
            if let Work::Move { from, .. } = &p.work {
                touched.push(from.clone());
            }
            if touched.iter().any(|t| blocked.contains(t)) {
                continue;
            }
            let at = p.event.as_ref().and_then(|e| e.next_retry_ms).unwrap_or(0);
            if at > now {
                let t = Instant::now() + Duration::from_millis(at - now);
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
                blocked.extend(touched);
                continue;
            }
            out.push(p);
            if out.len() >= BATCH {
                break;
            }
        }
        (out, next)
    }

    /// Embed what the batch needs, then apply it: store first (one
    /// transaction), memory after.
    pub(super) fn process(&self, batch: Vec<Pending>) -> Result<()> {
        let model = self.embedder.id().to_string();
        let mut ops: Vec<Op> = Vec::new();
        let mut vecs = self.cached_vectors(&batch, &model)?;
        self.spend_budgets(&mut vecs, &mut ops)?;
        if !self.embed_needed(&mut vecs, &model, &mut ops) {
            // Stopping: apply nothing; the events stay in the outbox and are
            // indexed after the next mount.
            tracing::info!(
                events = batch.len(),
                "indexer stopped inside a batch; its events wait for the next mount"
            );
            return Ok(());
        }
        let planned = self.plan_batch(batch, &vecs, &model, &mut ops)?;
        self.store.apply(ops, false)?;
        if let (Some(f), false) = (self.on_dirs.get(), planned.dirs.is_empty()) {
            f(&planned.dirs.into_iter().collect::<Vec<_>>());
        }
        let n_done = planned.changes.len() as u64;
        self.publish(planned.changes);
        self.stats.events_done.fetch_add(n_done, Ordering::Relaxed);
        self.record_lags(planned.done_lags);
        Ok(())
    }

    /// The vectors the batch's texts have in the embedding cache (read
    /// once for the whole batch: one round trip on a shared store, not one
    /// per text), and what the others need.
    fn cached_vectors(&self, batch: &[Pending], model: &str) -> Result<Vectors> {
        let mut v = Vectors::default();
        let mut stored: HashSet<(Option<String>, u128)> = HashSet::new();
        let texts_of: Vec<Vec<(u128, String)>> = batch
            .iter()
            .map(|p| match &p.work {
                Work::Upsert { texts, .. } => record_texts(texts),
                _ => Vec::new(),
            })
            .collect();
        let mut asked: Vec<(&str, u128)> = Vec::new();
        let mut places = Vec::new();
        let mut seen = HashSet::new();
        for (p, texts) in batch.iter().zip(&texts_of) {
            for (h, _) in texts {
                let place = (self.store.vec_scope(&p.path), *h);
                if seen.insert(place.clone()) {
                    asked.push((p.path.as_str(), *h));
                    places.push(place);
                }
            }
        }
        let found = self.store.get_vecs_of(model, &asked)?;
        let cached: HashMap<(Option<String>, u128), Vec<u8>> = places
            .into_iter()
            .zip(found)
            .filter_map(|(place, b)| Some((place, b?)))
            .collect();
        for (p, texts) in batch.iter().zip(texts_of) {
            for (h, t) in texts {
                let place = (self.store.vec_scope(&p.path), h);
                if stored.contains(&place) {
                    continue;
                }
                if v.need.contains_key(&h) {
                    v.owners.entry(h).or_default().push(p.path.clone());
                    stored.insert(place);
                    continue;
                }
                match cached.get(&place) {
                    Some(b) if b.len() == self.embedder.dim() * 4 => {
                        self.stats.embed_cache_hits.fetch_add(1, Ordering::Relaxed);
                        v.have.insert(h, ann::half(&bytes_vec(b)));
                    }
                    _ => {
                        let a = v.asks.entry(p.account.clone()).or_default();
                        a.0 += crate::schema::counters::tokens_of(&t);
                        a.1.push(h);
                        v.owners.entry(h).or_default().push(p.path.clone());
                        v.need.insert(h, t);
                    }
                }
                stored.insert(place);
            }
        }
        Ok(v)
    }

    /// Count what each account asks of the embedder against its daily
    /// budget: an account over it waits for the next UTC day (its texts
    /// are not embedded and its events are deferred).
    fn spend_budgets(&self, v: &mut Vectors, ops: &mut Vec<Op>) -> Result<()> {
        let day = crate::schema::time::day_of(crate::schema::time::now_ns());
        for (account, (tokens, hashes)) in &v.asks {
            let key = crate::schema::counters::tokens_key(account, day);
            if let Some(&max) = self.cfg.embed_tokens_per_day.get(account) {
                let used = self.store.counter(&key)?.max(0) as u64;
                if used + tokens > max {
                    for h in hashes {
                        v.need.remove(h);
                    }
                    continue;
                }
            }
            ops.push(Op::Count {
                key,
                delta: *tokens as i64,
            });
        }
        Ok(())
    }

    /// Embed what is needed, storing each new vector for its owners; what
    /// failed, by text. False when the indexer is stopping.
    fn embed_needed(&self, v: &mut Vectors, model: &str, ops: &mut Vec<Op>) -> bool {
        let mut todo: Vec<(u128, String)> = std::mem::take(&mut v.need).into_iter().collect();
        todo.sort_by_key(|(_, t)| t.len());
        let texts: Vec<&str> = todo.iter().map(|(_, t)| t.as_str()).collect();
        let results = embed::embed_batches(&self.embedder, &texts, EMBED_BATCH, &self.stop);
        if self.stop.load(Ordering::SeqCst) {
            return false;
        }
        for (part, r) in todo.chunks(EMBED_BATCH).zip(results) {
            match r {
                Ok(vs) => {
                    for ((h, _), vec) in part.iter().zip(vs) {
                        let data = vec_bytes(&vec);
                        for owner in v.owners.remove(h).unwrap_or_default() {
                            ops.push(Op::PutVecOf {
                                owner,
                                model: model.to_string(),
                                hash: *h,
                                data: data.clone(),
                            });
                        }
                        v.have.insert(*h, ann::half(&vec));
                    }
                    self.stats
                        .embedded
                        .fetch_add(part.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats
                        .embed_failures
                        .fetch_add(part.len() as u64, Ordering::Relaxed);
                    tracing::warn!("embedding failed: {e}");
                    for (h, _) in part {
                        v.failed.insert(*h, e.clone());
                    }
                }
            }
        }
        true
    }

    /// Each event's change, in order, per account, with the ops that store
    /// it and remove the event; an event whose texts have no vector is
    /// deferred (a spent budget) or retried (a failed embedding), and the
    /// later events of its node wait behind it.
    fn plan_batch(
        &self,
        batch: Vec<Pending>,
        v: &Vectors,
        model: &str,
        ops: &mut Vec<Op>,
    ) -> Result<Planned> {
        let mut out = Planned::default();
        let mut blocked: HashSet<String> = HashSet::new();
        let mut label_hw: HashMap<String, usize> = HashMap::new();
        for p in batch {
            if p.path.is_empty() {
                self.dead_letter(ops, &p, "not an index event");
                continue;
            }
            if blocked.contains(&p.path) {
                continue;
            }
            let ai = self.account(&p.account)?;
            self.ensure_vectors(&ai)?;
            let recs = match &p.work {
                Work::Upsert { texts, .. } => record_texts(texts),
                _ => Vec::new(),
            };
            // Only a spent budget leaves a text neither embedded nor failed.
            if recs
                .iter()
                .any(|(h, _)| !v.have.contains_key(h) && !v.failed.contains_key(h))
            {
                self.defer_to_tomorrow(ops, &p);
                blocked.insert(p.path.clone());
                continue;
            }
            let err = recs.iter().find_map(|(h, _)| v.failed.get(h).cloned());
            if let Some(e) = err {
                self.retry_later(ops, &p, &e);
                blocked.insert(p.path.clone());
                continue;
            }
            let change = self.plan(&ai, &p, &v.have, model, &mut label_hw, &out.changes)?;
            change.ops(ops);
            // A summary the LLM wrote of the node's directories held its
            // old text: it goes with the change (deletes forget).
            out.dirs.extend(place::summarized_dirs_of(&p.path));
            if let Work::Move { from, .. } = &p.work {
                out.dirs.extend(place::summarized_dirs_of(from));
            }
            ops.push(Op::DoneEvent {
                seq: p.ev.seq,
                node_path: p.path.clone(),
                account: p.account.clone(),
            });
            if let Some(c) = p
                .event
                .as_ref()
                .and_then(|e| humantime::parse_rfc3339_weak(&e.created_at).ok())
            {
                out.done_lags.push(c);
            }
            out.changes.push((ai, change));
        }
        for (a, l) in label_hw {
            ops.push(Op::HighWater {
                key: crate::schema::counters::label_key(&a),
                value: l as u64,
            });
        }
        for d in &out.dirs {
            ops.push(Op::DelScratch {
                path: format!("{d}/{}", crate::schema::names::SUMMARY_ROW),
            });
        }
        Ok(out)
    }

    /// The stored changes into memory: the graph inserts (on the rayon
    /// pool, outside the state lock) and the state changes (BM25, slots)
    /// at the same time; the batch counts as done when both are. A search
    /// in between may see a node in one and not yet in the other, as for
    /// any node still being indexed. An account that grew past the exact
    /// size gets its graph now.
    fn publish(&self, changes: Vec<(Arc<AccountIndex>, Change)>) {
        let touched: HashMap<String, Arc<AccountIndex>> = changes
            .iter()
            .map(|(ai, _)| (ai.name.clone(), ai.clone()))
            .collect();
        let mut inserts: HashMap<String, (Arc<AccountIndex>, Vec<LabeledVec>)> = HashMap::new();
        for (ai, c) in &changes {
            // Only the indexer thread (this one) changes `graphed`.
            if !rlock(&ai.st).graphed {
                continue;
            }
            if let Change::Put { vecs, .. } = c {
                inserts
                    .entry(ai.name.clone())
                    .or_insert_with(|| (ai.clone(), Vec::new()))
                    .1
                    .extend(vecs.iter().cloned());
            }
        }
        std::thread::scope(|s| {
            if !inserts.is_empty() {
                s.spawn(move || {
                    for (ai, vecs) in inserts.into_values() {
                        let g = rlock(&ai.graph).clone();
                        ann::insert(&g, &vecs);
                    }
                });
            }
            for (ai, c) in changes {
                c.apply(&ai);
            }
        });
        for ai in touched.into_values() {
            let grown = {
                let st = rlock(&ai.st);
                !st.graphed && st.vecs.len() > self.cfg.exact_scope
            };
            if grown {
                self.rebuild(&ai);
            }
        }
    }

    /// How long each done event waited, from its creation (the last 1,000).
    fn record_lags(&self, created: Vec<SystemTime>) {
        let now = SystemTime::now();
        let mut lags = lock(&self.lags);
        for c in created {
            let ms = now
                .duration_since(c)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            lags.push_back(ms);
            if lags.len() > 1000 {
                lags.pop_front();
            }
        }
    }

    /// The account's embedding budget of today is spent: try again at the
    /// start of the next UTC day, without counting a failed try.
    pub(super) fn defer_to_tomorrow(&self, ops: &mut Vec<Op>, p: &Pending) {
        let Some(mut e) = p.event.clone() else { return };
        let next = crate::schema::time::next_day_ns(crate::schema::time::now_ns());
        e.status = EventStatus::Deferred;
        e.last_error = Some(format!(
            "embedding budget (embed_tokens_per_day) of account {} is spent for today; deferred to {}",
            p.account,
            crate::schema::time::rfc3339(next)
        ));
        e.next_retry_ms = Some((next / 1_000_000) as u64);
        self.stats.deferred.fetch_add(1, Ordering::Relaxed);
        ops.push(Op::UpdateEvent {
            seq: p.ev.seq,
            json: e.encode(),
        });
    }

    pub(super) fn retry_later(&self, ops: &mut Vec<Op>, p: &Pending, err: &str) {
        let Some(mut e) = p.event.clone() else { return };
        e.retry_count += 1;
        let tries = e.retry_count;
        e.last_error = Some(err.to_string());
        if tries >= self.cfg.max_retries {
            e.status = EventStatus::Dead;
            self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(event = p.ev.seq, node = %p.path, "dead letter after {tries} tries: {err}");
            ops.push(Op::DeadEvent {
                seq: p.ev.seq,
                node_path: p.path.clone(),
                account: p.account.clone(),
                json: e.encode(),
            });
            return;
        }
        let delay = self
            .cfg
            .backoff
            .saturating_mul(1 << (tries - 1).min(16))
            .min(Duration::from_secs(60));
        e.status = EventStatus::Failed;
        e.next_retry_ms = Some(now_ms() + delay.as_millis() as u64);
        ops.push(Op::UpdateEvent {
            seq: p.ev.seq,
            json: e.encode(),
        });
    }

    /// An event the indexer cannot use goes to the dead-letter queue as it
    /// is, marked dead when it is an event at all.
    pub(super) fn dead_letter(&self, ops: &mut Vec<Op>, p: &Pending, why: &str) {
        let (json, uri_path) = match p.event.clone() {
            Some(mut e) => {
                e.status = EventStatus::Dead;
                e.last_error = Some(why.to_string());
                let path = e.node().unwrap_or("").to_string();
                (e.encode(), path)
            }
            None => {
                // Not an event of ours: marked when it is a JSON object, and
                // filed under its URI when it names one.
                let mut j: Value = serde_json::from_slice(&p.ev.json).unwrap_or(Value::Null);
                if j.is_object() {
                    j["status"] = "DEAD".into();
                    j["last_error"] = why.into();
                }
                let path = j["uri"]
                    .as_str()
                    .and_then(place::node_of_uri)
                    .unwrap_or("")
                    .to_string();
                let json = match j {
                    Value::Null => p.ev.json.clone(),
                    j => serde_json::to_vec(&j).unwrap_or_else(|_| p.ev.json.clone()),
                };
                (json, path)
            }
        };
        let path = if p.path.is_empty() {
            uri_path
        } else {
            p.path.clone()
        };
        let account = place::account_of(&path).to_string();
        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
        ops.push(Op::DeadEvent {
            seq: p.ev.seq,
            node_path: path,
            account,
            json,
        });
    }

    /// What one event changes, given the documents as they will be after the
    /// earlier changes of the same batch.
    pub(super) fn plan(
        &self,
        ai: &AccountIndex,
        p: &Pending,
        have: &HashMap<u128, ann::Vector>,
        model: &str,
        label_hw: &mut HashMap<String, usize>,
        earlier: &[(Arc<AccountIndex>, Change)],
    ) -> Result<Change> {
        // The current document of a path: from an earlier change of this
        // batch, else memory.
        let current = |path: &str| -> Option<Option<IxDoc>> {
            for (a, c) in earlier.iter().rev() {
                if a.name == ai.name {
                    if let Some(d) = c.doc_after(path) {
                        return Some(d);
                    }
                }
            }
            None
        };
        let cur_doc = |path: &str| -> Option<IxDoc> {
            match current(path) {
                Some(d) => d,
                None => rlock(&ai.st).docs.get(path).map(|d| d.ix.clone()),
            }
        };
        Ok(match &p.work {
            Work::Upsert {
                path,
                texts,
                label,
                source,
            } => {
                let old = cur_doc(path);
                let next = label_hw
                    .entry(ai.name.clone())
                    .or_insert_with(|| rlock(&ai.st).next_label);
                let mut doc = IxDoc {
                    model: model.to_string(),
                    edges: old.as_ref().map(|d| d.edges.clone()).unwrap_or_default(),
                    source: *source,
                    ..Default::default()
                };
                let mut all = String::new();
                // A message's views are embedded, not counted as words.
                for (level, t) in texts.iter().filter(|(l, _)| *l != MESSAGE_LEVEL) {
                    all.push_str(t);
                    all.push('\n');
                    if *level == 0 {
                        doc.abstract_ = text::one_line(t);
                    }
                }
                if let Some(l) = label {
                    doc.abstract_ = l.clone();
                    doc.asks = texts.iter().any(|(l, t)| *l == 2 && text::asks(t));
                    doc.tells_when = texts
                        .iter()
                        .any(|(l, t)| *l == 2 && crate::extract::when::tells_when(t));
                }
                if doc.abstract_.is_empty() {
                    let c = texts.iter().find(|t| t.0 == 2).map(|t| t.1.as_str());
                    doc.abstract_ = text::first_line(c.unwrap_or(""));
                }
                doc.terms = lex::counts(&text::terms(&all));
                let mut vecs = Vec::new();
                for (level, line, t) in records(texts) {
                    let h = xxh3_128(t.as_bytes());
                    let Some(v) = have.get(&h) else { continue };
                    let label = *next;
                    *next += 1;
                    doc.recs.push(IxRec {
                        label: label as u64,
                        level,
                        line,
                        hash: h,
                    });
                    vecs.push((label, v.clone()));
                }
                Change::Put {
                    path: path.clone(),
                    doc,
                    vecs,
                }
            }
            Work::Relations { path, edges } => match cur_doc(path) {
                Some(mut d) => {
                    d.edges = edges.clone();
                    Change::Put {
                        path: path.clone(),
                        doc: d,
                        vecs: Vec::new(),
                    }
                }
                None => Change::None,
            },
            Work::Remove { path } => match cur_doc(path) {
                Some(_) => Change::Del { path: path.clone() },
                None => Change::None,
            },
            Work::Move { from, to } => match cur_doc(from) {
                Some(d) => {
                    // An encrypted store keys embeddings per scope: a node
                    // moved to another user takes its embeddings along.
                    let mut copies = Vec::new();
                    if self.store.vec_scope(from) != self.store.vec_scope(to) {
                        for r in &d.recs {
                            if let Some(b) = self.store.get_vec_of(from, &d.model, r.hash)? {
                                copies.push(Op::PutVecOf {
                                    owner: to.clone(),
                                    model: d.model.clone(),
                                    hash: r.hash,
                                    data: b,
                                });
                            }
                        }
                    }
                    Change::Move {
                        from: from.clone(),
                        to: to.clone(),
                        doc: d,
                        copies,
                    }
                }
                None => Change::None,
            },
        })
    }
}
