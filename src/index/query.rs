//! Hybrid queries: the query vector (cached), the vector and BM25
//! channels fused by their min-max scaled scores, relation expansion, and
//! the term statistics answers are judged with.

use crate::error::Error;
use crate::error::Result;
use crate::index::channels::{dated_channel, lexical_channel, Dated, LexHit, VecHit};
use crate::index::fusion::message_live;
use crate::index::fusion::weighted;
use crate::index::fusion::Channels;
use crate::index::fusion::{draw, pick_sources, Source};
use crate::index::toward::{
    toward_named_days, toward_named_speaker, toward_neighbours, toward_told_when,
};
use crate::index::AccountIndex;
use crate::index::State;

use std::sync::Arc;

use std::collections::HashMap;

use std::collections::HashSet;

use crate::index::Hit;

use crate::index::Index;

use std::time::Instant;

use crate::index::MAX_K;

use crate::index::MESSAGE_LEVEL;

use crate::index::Mode;

use crate::index::Query;

use crate::index::TREE_DIRS;

use crate::index::ann;

use crate::index::in_scope;

use crate::index::rlock;

use crate::index::text;

use crate::locks::lock;
use crate::schema::event;

use crate::schema::place;

use crate::store::Status;

use std::sync::atomic::Ordering;
impl Index {
    /// The query's vector, from a small cache of recent queries.
    pub(super) fn query_vec(&self, q: &str) -> Result<ann::Vector> {
        if let Some(v) = lock(&self.qcache).0.get(q) {
            return Ok(v.clone());
        }
        self.embed_queries(&[q])?;
        lock(&self.qcache)
            .0
            .get(q)
            .cloned()
            .ok_or_else(|| Error::Unavailable("query embedding failed: no vector".into()))
    }

    /// Embed the queries not cached yet in one batch (one pass of the model
    /// for several short texts costs little more than for one) and cache
    /// them. For the variants a search retries with.
    pub fn embed_queries(&self, qs: &[&str]) -> Result<()> {
        let todo: Vec<&str> = {
            let c = lock(&self.qcache);
            let mut t: Vec<&str> = qs
                .iter()
                .copied()
                .filter(|q| !c.0.contains_key(*q))
                .collect();
            t.dedup();
            t
        };
        if todo.is_empty() {
            return Ok(());
        }
        let vs = self
            .embedder
            .embed(&todo)
            .map_err(|e| Error::Unavailable(format!("query embedding failed: {e}")))?;
        let mut c = lock(&self.qcache);
        for (q, v) in todo.into_iter().zip(vs) {
            if c.0.len() >= 1024 {
                if let Some(old) = c.1.pop_front() {
                    c.0.remove(&old);
                }
            }
            if c.0.insert(q.to_string(), ann::half(&v)).is_none() {
                c.1.push_back(q.to_string());
            }
        }
        Ok(())
    }

    /// Hierarchical search (seed 002 `search_children`): the directories
    /// under `scope` (a node's parent, a conversation's inbox) ranked by
    /// their summary vector, the mean of their children's abstract
    /// vectors; then a hybrid search of each of the best `TREE_DIRS`, its
    /// hits weighted by its closeness to the query against the best
    /// directory's. Hybrid over the whole scope when there is no directory
    /// to rank (a node's scope) or the vectors are not there.
    fn search_tree(&self, scope: &str, q: &Query, asked: &str) -> Result<Vec<Hit>> {
        let flat = Query {
            mode: Mode::Hybrid,
            ..q.clone()
        };
        let account = place::account_of(scope);
        let ai = self.account_for(account, q.tenant)?;
        if !ai.ready.load(Ordering::Acquire) {
            return self.search_in(scope, &flat, asked, false);
        }
        let Ok(qv) = self.query_vec(&q.text) else {
            return self.search_in(scope, &flat, asked, false);
        };
        let sums = ai.summaries();
        let mut dirs: Vec<(f32, &Arc<str>)> = sums
            .iter()
            .filter(|(d, _)| in_scope(d, scope))
            .map(|(d, v)| (ann::dot(&qv, v), d))
            .collect();
        if dirs.len() <= 1 {
            return self.search_in(scope, &flat, asked, false);
        }
        dirs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        let best = dirs[0].0.max(f32::EPSILON);
        let mut out = Vec::new();
        for (sim, d) in dirs.into_iter().take(TREE_DIRS) {
            for mut h in self.search_in(d, &flat, asked, true)? {
                h.score *= (sim / best).max(0.0);
                // Ranked by score across directories: no grouping here.
                h.with = None;
                out.push(h);
            }
        }
        out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.path.cmp(&b.path)));
        out.truncate(q.k.clamp(1, MAX_K));
        Ok(out)
    }

    /// The best ACTIVE nodes under `scope` (a path under `accounts/`).
    pub fn search(&self, scope: &str, q: &Query) -> Result<Vec<Hit>> {
        self.search_as(scope, q, &q.text)
    }

    /// [`Index::search`] of `q`, asked as `asked` (the words whose speaker
    /// a message search favours, before the user's own name was made
    /// neutral).
    pub(super) fn search_as(&self, scope: &str, q: &Query, asked: &str) -> Result<Vec<Hit>> {
        self.stats.searches.fetch_add(1, Ordering::Relaxed);
        let neutral = text::owner_neutral(scope, &q.text).map(|text| Query { text, ..q.clone() });
        let q = neutral.as_ref().unwrap_or(q);
        if q.mode == Mode::Tree {
            return self.search_tree(scope, q, asked);
        }
        self.search_in(scope, q, asked, false)
    }

    /// The best ACTIVE nodes under `scope`, or with `direct` only those
    /// whose directory is `scope` (its children, and a conversation's
    /// messages when `scope` is its inbox): the query's vector, the two
    /// channels, their fusion, one result per source, relations. `asked`
    /// is the query as asked, before the user's own name was made neutral
    /// (it says whose words a message search favours).
    fn search_in(&self, scope: &str, q: &Query, asked: &str, direct: bool) -> Result<Vec<Hit>> {
        let account = place::account_of(scope);
        let k = q.k.clamp(1, MAX_K);
        let ai = self.account_for(account, q.tenant)?;
        let qv = self.query_vector(&ai, q)?;
        // Candidates per channel before fusion; records fetched per node candidate.
        let cands = super::Candidates::of(k);
        let cand = cands.exact;
        let whole = scope == account && !direct;
        // Is the document at `p` one this search may return?
        let inside = |p: &str| {
            if direct {
                dir_of(p) == scope
            } else {
                whole || in_scope(p, scope)
            }
        };
        let graph = rlock(&ai.graph).clone();
        let st = rlock(&ai.st);
        let vec_hits = match &qv {
            Some(qv) => self.vector_channel(&st, &graph, qv, scope, whole, cands, &inside),
            None => Vec::new(),
        };
        let qterms = text::terms(&q.text);
        let lex_hits = if q.mode == Mode::Vector {
            Vec::new()
        } else {
            lexical_channel(&st, &qterms, cand, &inside)
        };
        // A query that names a day or a month: the messages said near it
        // are candidates too, however far down the channels rank them.
        let days = crate::extract::when::named_days(asked);
        let dated = if days.is_empty() {
            Dated::default()
        } else {
            dated_channel(
                &st,
                &days,
                qv.as_deref(),
                &qterms,
                q.mode,
                scope,
                whole,
                cand,
                &inside,
            )
        };
        let mut hits = self.fused(&st, q.mode, &vec_hits, &lex_hits, &dated);
        toward_named_speaker(&mut hits, asked);
        toward_named_days(&mut hits, &days);
        toward_told_when(&mut hits, asked);
        toward_neighbours(&mut hits);
        let out = self.one_per_source(&st, account, hits, k)?;
        if q.expand {
            return self.with_relations(&st, out, scope, whole);
        }
        Ok(out)
    }

    /// The query's vector, when the mode asks for one and it can be had.
    /// Hybrid degrades to the lexical channel when the query cannot be
    /// embedded (embedding server down) or the graph is still loading
    /// after a mount; vector-only fails then.
    fn query_vector(&self, ai: &AccountIndex, q: &Query) -> Result<Option<ann::Vector>> {
        let vectors = ai.ready.load(Ordering::Acquire);
        if !vectors && q.mode == Mode::Vector {
            return Err(Error::Unavailable(
                "the vector index of this account is still loading; retry in a few seconds or use mode=lexical"
                    .into(),
            ));
        }
        let t_embed = Instant::now();
        let qv = match q.mode {
            Mode::Lexical | Mode::Tree => None,
            Mode::Hybrid if !vectors => None,
            Mode::Vector => Some(self.query_vec(&q.text)?),
            Mode::Hybrid => match self.query_vec(&q.text) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!("{e}; answering from the lexical channel only");
                    None
                }
            },
        };
        let embed_us = t_embed.elapsed().as_micros() as u64;
        self.stats.last_embed_us.store(embed_us, Ordering::Relaxed);
        Ok(qv)
    }

    /// The two channels' candidates as one ranking, best first: each
    /// document's fused score (`fusion.rs`), its level and line, abstract
    /// and superseder.
    ///
    /// The candidates of a named day (`dated`) join each channel's list
    /// after its own, and the channels are then scaled from 0
    /// ([`Channels::scaled_from_zero`]), so one found by that search alone,
    /// below a channel's weakest, still counts.
    fn fused(
        &self,
        st: &State,
        mode: Mode,
        vec_hits: &[VecHit],
        lex_hits: &[LexHit],
        dated: &Dated,
    ) -> Vec<Hit> {
        let vec_seen: HashSet<&Arc<str>> = vec_hits.iter().map(|h| &h.0).collect();
        let lex_seen: HashSet<&Arc<str>> = lex_hits.iter().map(|h| &h.0).collect();
        let vec_hits: Vec<&VecHit> = vec_hits
            .iter()
            .chain(dated.vector.iter().filter(|h| !vec_seen.contains(&h.0)))
            .collect();
        let lex_hits: Vec<&LexHit> = lex_hits
            .iter()
            .chain(dated.lexical.iter().filter(|h| !lex_seen.contains(&h.0)))
            .collect();
        let mut channels = Channels::of(
            mode,
            self.vector_weight(),
            vec_hits.iter().map(|h| h.1),
            lex_hits.iter().map(|h| h.1),
        );
        if !(dated.vector.is_empty() && dated.lexical.is_empty()) {
            channels = channels.scaled_from_zero();
        }
        let mut by: HashMap<Arc<str>, Hit> = HashMap::new();
        for (r, (p, s, i)) in vec_hits.iter().map(|h| (&h.0, &h.1, &h.2)).enumerate() {
            let h = by.entry(p.clone()).or_insert_with(|| Hit::blank(p));
            h.vector_rank = Some(r + 1);
            h.vector_score = Some(*s);
            if let Some(rec) = st.docs.get(p).and_then(|d| d.ix.recs.get(*i as usize)) {
                h.level = rec.level;
                h.line = rec.line;
            }
        }
        for (r, (p, s)) in lex_hits.iter().map(|h| (&h.0, &h.1)).enumerate() {
            let h = by.entry(p.clone()).or_insert_with(|| Hit::blank(p));
            h.lexical_rank = Some(r + 1);
            h.lexical_score = Some(*s);
        }
        let mut hits: Vec<Hit> = by
            .into_iter()
            .map(|(p, mut h)| {
                let message = p.contains('#');
                let superseder = st.superseder(&p);
                h.score = weighted(
                    channels.score(h.vector_score, h.lexical_score),
                    message,
                    superseder.is_some(),
                );
                if message {
                    h.level = MESSAGE_LEVEL;
                }
                if let Some(by) = superseder {
                    h.superseded_by = Some(crate::schema::place::mount_path(by));
                }
                if let Some(d) = st.docs.get(&p) {
                    h.abstract_ = d.ix.abstract_.clone();
                    h.asks = d.ix.asks;
                    h.tells_when = d.ix.tells_when;
                    if h.line == 0 && h.level != MESSAGE_LEVEL {
                        h.line =
                            d.ix.recs
                                .iter()
                                .find(|r| r.level == 2)
                                .map(|r| r.line)
                                .unwrap_or(0);
                    }
                }
                h
            })
            .collect();
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.path.cmp(&b.path)));
        hits
    }

    /// The top `k` sources of a ranking: only what is ACTIVE now, and
    /// messages of conversations still stored (the index may lag a delete
    /// by a moment). One result per source: where messages are among the
    /// results, a memory extracted from messages of this scope still stored
    /// takes no place of its own; it is shown right above the best-ranked
    /// of its messages placed, or not at all. So the messages placed are
    /// the candidates' messages in their own order, and memories add to
    /// them (BENCHMARKS, "Memory from real conversations"). A memory whose
    /// conversations are all gone is a source of its own.
    fn one_per_source(
        &self,
        st: &State,
        account: &str,
        hits: Vec<Hit>,
        k: usize,
    ) -> Result<Vec<Hit>> {
        // Conversations looked up so far (several messages of one are
        // common): when the one stored under the name was stored.
        let mut stored: HashMap<String, Option<u64>> = HashMap::new();
        let any_message = hits.iter().any(|h| h.level == MESSAGE_LEVEL);
        let paths: Vec<&str> = hits.iter().map(|h| h.path.as_str()).collect();
        let (placed, drawn) = pick_sources(&paths, k, |i| -> Result<Source> {
            let node = crate::schema::place::store_path(paths[i]);
            if let Some((conv, _)) = event::message_of(node) {
                return Ok(if self.message_live_now(st, &mut stored, conv, node)? {
                    Source::Message
                } else {
                    Source::Gone
                });
            }
            let Some(rec) = self.store.get_node(node)? else {
                return Ok(Source::Gone);
            };
            if rec.status != Status::Active {
                return Ok(Source::Gone);
            }
            let cited = if any_message {
                self.cited_messages(account, &rec)
            } else {
                HashSet::new()
            };
            let mut live = false;
            for p in &cited {
                let node = crate::schema::place::store_path(p);
                if let Some((conv, _)) = event::message_of(node) {
                    if self.message_live_now(st, &mut stored, conv, node)? {
                        live = true;
                        break;
                    }
                }
            }
            Ok(if live {
                Source::Memory(cited)
            } else {
                Source::Own
            })
        })?;
        let mut slots: Vec<Option<Hit>> = hits.into_iter().map(Some).collect();
        let mut take = |i: usize| slots[i].take().expect("each place is taken once");
        let out: Vec<Hit> = placed.into_iter().map(&mut take).collect();
        let drawn: Vec<(Hit, HashSet<String>)> =
            drawn.into_iter().map(|(i, c)| (take(i), c)).collect();
        Ok(draw(out, drawn))
    }

    /// Is message `node` of conversation `conv` stored under its name now,
    /// and indexed from that conversation (not one deleted before it)?
    /// `stored` keeps the conversations looked up.
    fn message_live_now(
        &self,
        st: &State,
        stored: &mut HashMap<String, Option<u64>>,
        conv: &str,
        node: &str,
    ) -> Result<bool> {
        let now = match stored.get(conv) {
            Some(&s) => s,
            None => {
                let s = match self.store.get_scratch(conv)? {
                    Some(b) => Some(crate::store::ScratchRec::decode(&b)?.time_ns()),
                    None => None,
                };
                stored.insert(conv.to_string(), s);
                s
            }
        };
        // A message indexed before the index kept `source` is judged by
        // the name alone.
        let from = st.docs.get(node).and_then(|d| d.ix.source);
        Ok(message_live(now, from))
    }

    /// `out` and, after it, up to three related ACTIVE nodes of each result
    /// in the scope (its heaviest relations), each scored below the result
    /// it is related to and saying so (`via`).
    fn with_relations(
        &self,
        st: &State,
        mut out: Vec<Hit>,
        scope: &str,
        whole: bool,
    ) -> Result<Vec<Hit>> {
        let mut extra = Vec::new();
        for h in &out {
            let node = crate::schema::place::store_path(&h.path);
            let Some(d) = st.docs.get(node) else { continue };
            let mut edges = d.ix.edges.clone();
            edges.sort_by(|a, b| b.weight.total_cmp(&a.weight));
            for e in edges.iter().take(3) {
                let Some(to) = place::node_of_uri(&e.to) else {
                    continue;
                };
                if !(whole || in_scope(to, scope))
                    || out.iter().chain(extra.iter()).any(|x: &Hit| x.uri == e.to)
                {
                    continue;
                }
                if !self
                    .store
                    .get_node(to)?
                    .is_some_and(|r| r.status == Status::Active)
                {
                    continue;
                }
                let mut x = Hit::blank(&Arc::from(to));
                x.score = h.score * e.weight.clamp(0.0, 1.0) * 0.5;
                x.abstract_ = st
                    .docs
                    .get(to)
                    .map(|d| d.ix.abstract_.clone())
                    .unwrap_or_default();
                x.via = Some(format!("{}<-{}", e.kind, h.path));
                extra.push(x);
            }
        }
        out.extend(extra);
        Ok(out)
    }

    /// The search paths (`accounts/A/users/U/inbox/NAME.json#N`) of the
    /// messages the current version of an extracted memory cites (its
    /// `.meta.json` `provenance` and `sources`); empty for a memory not
    /// extracted from a conversation, or whose metadata cannot be read.
    fn cited_messages(&self, account: &str, rec: &crate::store::NodeRec) -> HashSet<String> {
        let mut out = HashSet::new();
        let Ok(Some(bytes)) = self.store.read_file(rec, place::META) else {
            return out;
        };
        let Ok(meta) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            return out;
        };
        // `sources` holds the version's own provenance first.
        let sources = match &meta["sources"] {
            serde_json::Value::Array(a) => a.iter().collect(),
            _ => vec![&meta["provenance"]],
        };
        for p in sources {
            let Some(inbox) = p["inbox"].as_str() else {
                continue;
            };
            for n in p["messages"].as_array().into_iter().flatten() {
                if let Some(n) = n.as_u64() {
                    out.insert(crate::schema::place::mount_path(&format!(
                        "{account}/{inbox}#{n}"
                    )));
                }
            }
        }
        out
    }

    /// The weight of each of `terms` in `account` (BM25 idf).
    pub fn idf(&self, account: &str, terms: &[String]) -> Result<Vec<f32>> {
        let ai = self.account(account)?;
        let st = rlock(&ai.st);
        Ok(terms.iter().map(|t| st.lex.idf(t)).collect())
    }

    /// Which of `terms` (sorted) the indexed node at `path` holds (its
    /// abstract, overview and content, as BM25 counts them).
    pub fn holds(&self, path: &str, terms: &[String]) -> Result<Vec<bool>> {
        let account = place::account_of(path);
        let ai = self.account(account)?;
        let st = rlock(&ai.st);
        Ok(match st.docs.get(path) {
            Some(d) => terms
                .iter()
                .map(|t| {
                    d.ix.terms
                        .binary_search_by(|(x, _)| x.as_str().cmp(t))
                        .is_ok()
                })
                .collect(),
            None => vec![false; terms.len()],
        })
    }

    /// `text` with each word the account's index does not know replaced by
    /// the nearest indexed term; `None` when nothing changed.
    pub fn respell(&self, account: &str, text: &str) -> Result<Option<String>> {
        let ai = self.account(account)?;
        let st = rlock(&ai.st);
        let mut changed = false;
        let out: Vec<String> = text::words(text)
            .into_iter()
            .map(|w| {
                let t = text::terms(&w);
                match t.first().and_then(|t| st.lex.nearest(t)) {
                    Some(n) if t.len() == 1 => {
                        changed = true;
                        n
                    }
                    _ => w,
                }
            })
            .collect();
        Ok(changed.then(|| out.join(" ")))
    }
}

/// The directory of an indexed document: a node's parent, a message's
/// inbox.
fn dir_of(path: &str) -> &str {
    let node = path.split_once('#').map_or(path, |(c, _)| c);
    node.rsplit_once('/').map_or("", |(d, _)| d)
}

impl AccountIndex {
    /// The summary vector of every directory that holds indexed documents
    /// (computed again after the documents or vectors changed).
    fn summaries(&self) -> Arc<HashMap<Arc<str>, ann::Vector>> {
        let st = rlock(&self.st);
        let key = (st.generation, st.vecs.len());
        let mut cache = lock(&self.summaries);
        if let Some((k, s)) = cache.as_ref() {
            if *k == key {
                return s.clone();
            }
        }
        let mut sums: HashMap<&str, (Vec<f32>, u32)> = HashMap::new();
        for (path, d) in &st.docs {
            let dir = dir_of(path);
            if dir.is_empty() {
                continue;
            }
            // The abstract's vector, else the first record's.
            let rec =
                d.ix.recs
                    .iter()
                    .find(|r| r.level == 0)
                    .or(d.ix.recs.first());
            let Some(v) = rec.and_then(|r| st.vecs.get(&(r.label as usize))) else {
                continue;
            };
            let e = sums.entry(dir).or_insert_with(|| (vec![0.0; v.len()], 0));
            if e.0.len() != v.len() {
                continue;
            }
            for (s, x) in e.0.iter_mut().zip(v.iter()) {
                *s += half::f16::from_bits(*x).to_f32();
            }
            e.1 += 1;
        }
        let out: HashMap<Arc<str>, ann::Vector> = sums
            .into_iter()
            .map(|(d, (s, _))| {
                let n = s
                    .iter()
                    .map(|x| x * x)
                    .sum::<f32>()
                    .sqrt()
                    .max(f32::EPSILON);
                let unit: Vec<f32> = s.iter().map(|x| x / n).collect();
                (Arc::from(d), ann::half(&unit))
            })
            .collect();
        let out = Arc::new(out);
        *cache = Some((key, out.clone()));
        out
    }
}

/// The range of one channel's scores over its candidates, to put them on
/// a common 0..=1 scale before fusion.
impl Index {
    /// The vector channel's weight in the fusion (BM25's is 1): the
    /// configured one, else 1, or 0.25 for the hashing fallback, which
    /// matches words as BM25 does, less well (SciFact: hybrid 0.56 nDCG@10
    /// at weight 1 against BM25's 0.69).
    pub(super) fn vector_weight(&self) -> f32 {
        self.cfg
            .vector_weight
            .unwrap_or(if self.embedder.kind() == "hash" {
                0.25
            } else {
                1.0
            })
    }
}
