//! Semantic search: the indexer that drains the outbox, the per-account
//! indexes (HNSW vectors + BM25 terms), and hybrid queries.
//!
//! Source of truth is the store: every indexed node has an index document
//! (`IxDoc`, in the store's `ix_docs` table) and every vector is kept by
//! (model, content hash) in `vecs`. The in-memory indexes are derived: the
//! BM25 postings are rebuilt from the documents when an account is first
//! used, and the HNSW graph is loaded from its dump in `DATA/index/` and
//! reconciled with the documents (labels missing from the dump are inserted,
//! labels no document holds are tombstoned).
//!
//! Locks: `accounts` map → one account's `st` (never the other way); the
//! graph's own locks are leaves. Only the indexer thread writes.

pub mod ann;
pub mod annbench;
pub mod answer;
pub mod bert;
mod config;
pub mod embed;
pub mod lex;
pub mod text;

use self::ann::Graph;
pub use self::config::{
    ann_params, choose_embedder, default_model_dir, validate_section, IndexConfig,
};
use self::embed::Embedder;
use crate::error::{Error, Result};
use crate::schema::event::{self, EventStatus, OutboxEvent};
use crate::schema::place;
use crate::store::{NodeRec, Op, Status, Store, StoredEvent};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};
use xxhash_rust::xxh3::xxh3_128;

/// Events taken from the outbox per indexer step.
const BATCH: usize = 256;
/// Texts per embedder call.
const EMBED_BATCH: usize = 32;
/// Scopes with at most this many records are searched exactly.
const EXACT_SCOPE: usize = 20_000;
/// Reciprocal rank fusion constant.
const RRF_K: f32 = 60.0;
/// Most results a query may ask for.
pub const MAX_K: usize = 1000;

/// The indexed state of one node, as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct IxDoc {
    pub abstract_: String,
    pub model: String,
    pub recs: Vec<IxRec>,
    pub terms: Vec<(String, u32)>,
    pub edges: Vec<Edge>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IxRec {
    pub label: u64,
    /// 0 = abstract (L0), 1 = overview (L1), 2 = content chunk (L2).
    pub level: u8,
    /// First line of the chunk in `content.md` (L2), else 0.
    pub line: u32,
    pub hash: u128,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Edge {
    pub to: String,
    pub kind: String,
    pub weight: f32,
}

impl IxDoc {
    fn decode(b: &[u8]) -> Result<Self> {
        postcard::from_bytes(b).map_err(|e| Error::store_from("corrupt index document", e))
    }
    fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_default()
    }
}

/// How a query ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Hybrid,
    Vector,
    Lexical,
}

#[derive(Debug, Clone)]
pub struct Query {
    pub text: String,
    pub k: usize,
    pub mode: Mode,
    /// Add the strongest one-hop relation targets of the top hits.
    pub expand: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Hit {
    pub path: String,
    pub uri: String,
    pub score: f32,
    #[serde(rename = "abstract")]
    pub abstract_: String,
    /// Rank (1-based) and similarity in the vector channel.
    pub vector_rank: Option<usize>,
    pub vector_score: Option<f32>,
    /// Rank and BM25 score in the lexical channel.
    pub lexical_rank: Option<usize>,
    pub lexical_score: Option<f32>,
    /// Best-matching record: level and first line in `content.md`.
    pub level: u8,
    pub line: u32,
    /// For relation expansions: `relation_type<-source path`.
    pub via: Option<String>,
}

/// Recent query vectors, oldest first in the queue.
type QueryCache = (HashMap<String, ann::Vector>, VecDeque<String>);
/// (level, text) of a node: 0 abstract, 1 overview, 2 content.
pub type Texts = Vec<(u8, String)>;
/// A vector and its graph label.
type LabeledVec = (usize, ann::Vector);

struct Doc {
    ix: IxDoc,
    lex_id: u32,
}

#[derive(Default)]
struct State {
    docs: BTreeMap<Arc<str>, Doc>,
    /// label → (doc path, record index).
    slots: HashMap<usize, (Arc<str>, u16)>,
    /// Live vectors by label.
    vecs: ann::Vectors,
    /// Labels in the graph that no document holds any more.
    dead: HashSet<usize>,
    lex: lex::Lex,
    lex_path: Vec<Option<Arc<str>>>,
    next_label: usize,
    /// Changed since the last dump.
    dirty: bool,
}

pub struct AccountIndex {
    name: String,
    graph: RwLock<Arc<Graph>>,
    st: RwLock<State>,
    /// The graph and the vectors are loaded (phase two of a load). Until
    /// then searches answer from BM25 alone.
    ready: AtomicBool,
    /// Held by the one thread that loads the vectors.
    loading: Mutex<()>,
}

#[derive(Default)]
struct Progress {
    /// Scans started by the indexer.
    started: u64,
    /// (scan id, lowest pending sequence number it saw or u64::MAX).
    published: (u64, u64),
    /// Something new to do (commit, sync, retry).
    wake: bool,
}

#[derive(Default)]
pub struct IndexStats {
    pub events_done: AtomicU64,
    pub embedded: AtomicU64,
    pub embed_cache_hits: AtomicU64,
    pub embed_failures: AtomicU64,
    /// Events put off to the next day by an embedding-token quota.
    pub deferred: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub searches: AtomicU64,
    /// Query embedding time of the last search (microseconds).
    pub last_embed_us: AtomicU64,
    pub dumps: AtomicU64,
}

pub struct Index {
    store: Arc<dyn Store>,
    dir: PathBuf,
    embedder: Arc<dyn Embedder>,
    /// Why the embedder in use was chosen (shown in `.ctxfs/status`).
    embedder_note: String,
    cfg: IndexConfig,
    accounts: Mutex<HashMap<String, Arc<OnceLock<Arc<AccountIndex>>>>>,
    progress: Mutex<Progress>,
    cv: Condvar,
    stop: AtomicBool,
    running: AtomicBool,
    qcache: Mutex<QueryCache>,
    /// Recent commit → searchable delays, milliseconds.
    lags: Mutex<VecDeque<u64>>,
    pub stats: IndexStats,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

use crate::schema::time::now_ms;

use crate::locks::{lock, read as rlock, write as wlock};

fn vec_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn bytes_vec(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn in_scope(path: &str, scope: &str) -> bool {
    path.len() == scope.len() && path == scope
        || path.len() > scope.len()
            && path.starts_with(scope)
            && path.as_bytes()[scope.len()] == b'/'
}

/// One unit of indexing work decoded from an outbox event.
enum Work {
    Upsert {
        path: String,
        texts: Vec<(u8, String)>,
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

struct Pending {
    ev: StoredEvent,
    /// The event as decoded; `None` for work that is not an outbox event
    /// (reindexing) and for events the indexer cannot read (dead-lettered).
    event: Option<OutboxEvent>,
    path: String,
    account: String,
    work: Work,
}

fn parse_event(ev: &StoredEvent) -> Option<Pending> {
    let event = OutboxEvent::decode(&ev.json).ok()?;
    let path = event.node()?.to_string();
    let account = path.split('/').next()?.to_string();
    let work = match &event.change {
        event::Change::UpsertContext { records } => Work::Upsert {
            path: path.clone(),
            texts: records.iter().map(|r| (r.level, r.text.clone())).collect(),
        },
        event::Change::UpsertRelation { edges } => Work::Relations {
            path: path.clone(),
            edges: edges_of(edges),
        },
        event::Change::ArchiveContext {} | event::Change::DeleteContext {} => {
            Work::Remove { path: path.clone() }
        }
        event::Change::MoveContext { new_uri } => Work::Move {
            from: path.clone(),
            to: place::node_of_uri(new_uri)?.to_string(),
        },
    };
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

fn edges_of(v: &[Value]) -> Vec<Edge> {
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
            let b = store.read_blob(f.blob, f.size)?;
            texts.push((level, String::from_utf8_lossy(&b).into_owned()));
        }
    }
    if let Some(f) = rec.file(place::RELATIONS) {
        let b = store.read_blob(f.blob, f.size)?;
        if let Ok(Value::Array(a)) = serde_json::from_slice::<Value>(&b) {
            edges = edges_of(&a);
        }
    }
    Ok((texts, edges))
}

impl Index {
    pub fn new(
        store: Arc<dyn Store>,
        dir: &Path,
        embedder: Arc<dyn Embedder>,
        embedder_note: String,
        cfg: IndexConfig,
    ) -> Result<Arc<Self>> {
        cfg.ann.validate().map_err(Error::Invalid)?;
        tracing::info!(
            model = embedder.id(),
            m = cfg.ann.m,
            ef_construction = cfg.ann.ef_construction,
            ef_search = cfg.ann.ef_search,
            "vector index parameters"
        );
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::store_from(format!("cannot create {}", dir.display()), e))?;
        Ok(Arc::new(Index {
            store,
            dir: dir.to_path_buf(),
            embedder,
            embedder_note,
            cfg,
            accounts: Mutex::new(HashMap::new()),
            progress: Mutex::new(Progress::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            running: AtomicBool::new(false),
            qcache: Mutex::new((HashMap::new(), VecDeque::new())),
            lags: Mutex::new(VecDeque::new()),
            stats: IndexStats::default(),
            thread: Mutex::new(None),
        }))
    }

    pub fn embedder(&self) -> &dyn Embedder {
        &*self.embedder
    }

    // ---- accounts ------------------------------------------------------------

    /// The index of `account`, loaded on first use.
    pub fn account(&self, account: &str) -> Result<Arc<AccountIndex>> {
        let cell = lock(&self.accounts)
            .entry(account.to_string())
            .or_default()
            .clone();
        if let Some(a) = cell.get() {
            return Ok(a.clone());
        }
        let mut err = None;
        let a = cell.get_or_init(|| match self.load_account(account) {
            Ok(a) => Arc::new(a),
            Err(e) => {
                err = Some(e);
                Arc::new(self.empty_account(account))
            }
        });
        if let Some(e) = err {
            // Do not keep a half-loaded index: the next use tries again.
            lock(&self.accounts).remove(account);
            return Err(e);
        }
        Ok(a.clone())
    }

    fn empty_account(&self, account: &str) -> AccountIndex {
        AccountIndex {
            name: account.to_string(),
            graph: RwLock::new(Arc::new(ann::new_graph(&self.cfg.ann, 1024))),
            st: RwLock::new(State::default()),
            ready: AtomicBool::new(true),
            loading: Mutex::new(()),
        }
    }

    /// Load the account's graph and vectors unless done (phase two). Only
    /// the indexer thread (or an offline command) calls this: it is the
    /// only writer of graphs, so nothing changes the graph meanwhile.
    fn ensure_vectors(&self, ai: &AccountIndex) -> Result<()> {
        if ai.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let _g = lock(&ai.loading);
        if ai.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        self.load_vectors(ai)?;
        ai.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Every account whose index is loaded (phase one at least).
    fn loaded_accounts(&self) -> Vec<Arc<AccountIndex>> {
        lock(&self.accounts)
            .values()
            .filter_map(|c| c.get().cloned())
            .collect()
    }

    /// Phase two for every account loaded so far.
    fn ensure_all_vectors(&self) {
        let accts = self.loaded_accounts();
        for ai in accts {
            if let Err(e) = self.ensure_vectors(&ai) {
                tracing::error!(account = %ai.name, "cannot load vectors: {e}");
            }
        }
    }

    fn graph_dir(&self, account: &str) -> PathBuf {
        self.dir.join(account)
    }

    /// Build an account's in-memory index from its stored documents and its
    /// graph dump.
    /// Phase one of a load: the documents and BM25 postings (enough to
    /// answer lexically). The graph comes in `load_vectors`.
    fn load_account(&self, account: &str) -> Result<AccountIndex> {
        let t0 = Instant::now();
        let mut st = State::default();
        let prefix = format!("{account}/");
        let mut max_label =
            self.store
                .high_water(&crate::schema::counters::label_key(account))? as usize;
        self.store.scan_ix(&prefix, &mut |path, bytes| {
            let ix = IxDoc::decode(bytes)?;
            let path: Arc<str> = Arc::from(path);
            for (i, r) in ix.recs.iter().enumerate() {
                st.slots.insert(r.label as usize, (path.clone(), i as u16));
                max_label = max_label.max(r.label as usize);
            }
            let lex_id = st.lex.add(&ix.terms);
            set_lex_path(&mut st.lex_path, lex_id, Some(path.clone()));
            st.docs.insert(path, Doc { ix, lex_id });
            Ok(())
        })?;
        st.next_label = max_label + 1;
        tracing::info!(
            account,
            docs = st.docs.len(),
            ms = t0.elapsed().as_millis() as u64,
            "index documents loaded (lexical search ready)"
        );
        Ok(AccountIndex {
            name: account.to_string(),
            graph: RwLock::new(Arc::new(ann::new_graph(&self.cfg.ann, 1024))),
            st: RwLock::new(st),
            ready: AtomicBool::new(false),
            loading: Mutex::new(()),
        })
    }

    /// Phase two: the graph from its dump, reconciled with the documents.
    fn load_vectors(&self, ai: &AccountIndex) -> Result<()> {
        let t0 = Instant::now();
        let account = ai.name.as_str();
        let dim = self.embedder.dim();
        // Only this thread changes the account's state (see `ensure_vectors`):
        // reading it under a read lock while the graph loads is consistent,
        // and searches keep their read access meanwhile.
        let st = rlock(&ai.st);
        let slots = &st.slots;
        let (graph, mut vecs) = match ann::load(&self.graph_dir(account), dim) {
            Some(x) => x,
            None => (ann::new_graph(&self.cfg.ann, slots.len()), HashMap::new()),
        };
        let loaded = vecs.len();
        // Labels in the dump that no document holds: tombstones.
        let dead: HashSet<usize> = vecs
            .keys()
            .filter(|l| !slots.contains_key(l))
            .copied()
            .collect();
        vecs.retain(|l, _| slots.contains_key(l));
        // Labels documents hold that the dump lacks: insert from the store.
        let mut missing = Vec::new();
        let model = self.embedder.id().to_string();
        for (label, (path, i)) in slots {
            if vecs.contains_key(label) {
                continue;
            }
            let Some(doc) = st.docs.get(path) else {
                continue;
            };
            if doc.ix.model != model {
                continue;
            }
            let r = &doc.ix.recs[*i as usize];
            if let Some(b) = self.store.get_vec(&model, r.hash)? {
                let v = bytes_vec(&b);
                if v.len() == dim {
                    missing.push((*label, ann::half(&v)));
                }
            }
        }
        drop(st);
        ann::insert(&graph, &missing);
        for (l, v) in missing.iter() {
            vecs.insert(*l, v.clone());
        }
        {
            let mut st = wlock(&ai.st);
            st.dirty = !missing.is_empty() || !dead.is_empty();
            st.dead = dead;
            st.vecs = vecs;
            *wlock(&ai.graph) = Arc::new(graph);
            tracing::info!(
                account,
                docs = st.docs.len(),
                vectors = st.vecs.len(),
                from_dump = loaded,
                inserted = missing.len(),
                tombstones = st.dead.len(),
                ms = t0.elapsed().as_millis() as u64,
                "index loaded"
            );
        }
        Ok(())
    }

    fn stored_accounts(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        self.store.scan_ix("", &mut |path, _| {
            let a = path.split('/').next().unwrap_or("");
            if out.last().map(String::as_str) != Some(a) {
                out.push(a.to_string());
            }
            Ok(())
        })?;
        out.dedup();
        Ok(out)
    }

    // ---- the indexer thread ----------------------------------------------------

    pub fn start(self: &Arc<Self>) -> Result<()> {
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name("ctxfs-index".into())
            .spawn(move || me.run())
            .map_err(|e| Error::store_from("cannot start the indexer", e))?;
        *lock(&self.thread) = Some(h);
        Ok(())
    }

    /// Stop the indexer and write the graph dumps.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.notify();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
        self.dump_all();
    }

    /// Something was committed: look at the outbox soon.
    pub fn notify(&self) {
        lock(&self.progress).wake = true;
        self.cv.notify_all();
    }

    fn run(self: Arc<Self>) {
        self.running.store(true, Ordering::SeqCst);
        // Load every indexed account up front, so the first search is fast.
        match self.stored_accounts() {
            Ok(accts) => {
                for a in accts {
                    if let Err(e) = self.account(&a) {
                        tracing::error!(account = %a, "cannot load index: {e}");
                    }
                }
            }
            Err(e) => tracing::error!("cannot list indexed accounts: {e}"),
        }
        // Lexical search works from here; then the graphs.
        self.ensure_all_vectors();
        if let Err(e) = self.reindex_stale_models(None) {
            tracing::error!("reindex after a model change failed: {e}");
        }
        if let Err(e) = self.index_unindexed() {
            tracing::error!("indexing nodes the index lacks failed: {e}");
        }
        let mut last_work = Instant::now();
        let mut last_rebuild_check = Instant::now();
        while !self.stop.load(Ordering::SeqCst) {
            // Accounts a search loaded meanwhile get their graphs here.
            self.ensure_all_vectors();
            let scan = {
                let mut p = lock(&self.progress);
                p.started += 1;
                p.wake = false;
                p.started
            };
            let head = match self.store.outbox_head(BATCH * 4) {
                Ok(h) => h,
                Err(e) => {
                    tracing::error!("indexer cannot read the outbox: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            {
                let mut p = lock(&self.progress);
                p.published = (scan, head.first().map(|e| e.seq).unwrap_or(u64::MAX));
            }
            self.cv.notify_all();
            let (ready, next_retry) = self.select(&head);
            if !ready.is_empty() {
                if let Err(e) = self.process(ready) {
                    tracing::error!("indexer step failed: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                last_work = Instant::now();
                // Under a steady stream of updates the indexer is never idle:
                // rebuild graphs full of tombstones now and then anyway, so
                // memory follows the live vectors, not every version ever.
                if last_rebuild_check.elapsed() >= Duration::from_secs(10) {
                    self.rebuild_tombstoned();
                    last_rebuild_check = Instant::now();
                }
                continue;
            }
            // Idle: maybe rebuild or dump, then wait.
            if last_work.elapsed() >= self.cfg.dump_after {
                self.maintain();
                last_work = Instant::now();
            }
            let wait = next_retry
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(1))
                .min(Duration::from_secs(1));
            let p = lock(&self.progress);
            if !p.wake {
                let _ = self.cv.wait_timeout(p, wait.max(Duration::from_millis(5)));
            }
        }
        self.running.store(false, Ordering::SeqCst);
    }

    /// Events to process now, in order; an event waiting for a retry holds
    /// back the later events of its node.
    fn select(&self, head: &[StoredEvent]) -> (Vec<Pending>, Option<Instant>) {
        let now = now_ms();
        let mut blocked: HashSet<String> = HashSet::new();
        let mut out = Vec::new();
        let mut next: Option<Instant> = None;
        for ev in head {
            let Some(p) = parse_event(ev) else {
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
    fn process(&self, batch: Vec<Pending>) -> Result<()> {
        let model = self.embedder.id().to_string();
        // Texts to embed, by hash, from every upsert of the batch.
        let mut need: HashMap<u128, String> = HashMap::new();
        let mut have: HashMap<u128, ann::Vector> = HashMap::new();
        // Tokens each account asks of the embedder in this batch (quota).
        let mut asks: HashMap<String, (u64, Vec<u128>)> = HashMap::new();
        for p in &batch {
            if let Work::Upsert { texts, .. } = &p.work {
                for (h, t) in record_texts(texts) {
                    if have.contains_key(&h) || need.contains_key(&h) {
                        continue;
                    }
                    match self.store.get_vec(&model, h)? {
                        Some(b) if b.len() == self.embedder.dim() * 4 => {
                            self.stats.embed_cache_hits.fetch_add(1, Ordering::Relaxed);
                            have.insert(h, ann::half(&bytes_vec(&b)));
                        }
                        _ => {
                            let a = asks.entry(p.account.clone()).or_default();
                            a.0 += crate::schema::counters::tokens_of(&t);
                            a.1.push(h);
                            need.insert(h, t);
                        }
                    }
                }
            }
        }
        let mut ops: Vec<Op> = Vec::new();
        // An account over its daily embedding budget waits for the next UTC
        // day: its texts are not embedded and its events are deferred.
        let day = crate::schema::time::day_of(crate::schema::time::now_ns());
        let mut deferred: HashSet<String> = HashSet::new();
        for (account, (tokens, hashes)) in &asks {
            let key = crate::schema::counters::tokens_key(account, day);
            if let Some(&max) = self.cfg.embed_tokens_per_day.get(account) {
                let used = self.store.counter(&key)?.max(0) as u64;
                if used + tokens > max {
                    deferred.insert(account.clone());
                    for h in hashes {
                        need.remove(h);
                    }
                    continue;
                }
            }
            ops.push(Op::Count {
                key,
                delta: *tokens as i64,
            });
        }
        let mut failed: HashMap<u128, String> = HashMap::new();
        let mut todo: Vec<(u128, String)> = need.into_iter().collect();
        todo.sort_by_key(|(_, t)| t.len());
        let texts: Vec<&str> = todo.iter().map(|(_, t)| t.as_str()).collect();
        let results = embed::embed_batches(&*self.embedder, &texts, EMBED_BATCH);
        for (part, r) in todo.chunks(EMBED_BATCH).zip(results) {
            match r {
                Ok(vs) => {
                    for ((h, _), v) in part.iter().zip(vs) {
                        ops.push(Op::PutVec {
                            model: model.clone(),
                            hash: *h,
                            data: vec_bytes(&v),
                        });
                        have.insert(*h, ann::half(&v));
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
                        failed.insert(*h, e.clone());
                    }
                }
            }
        }

        // Apply in order, per account.
        let mut changes: Vec<(Arc<AccountIndex>, Change)> = Vec::new();
        let mut blocked: HashSet<String> = HashSet::new();
        let mut done_lags = Vec::new();
        let mut label_hw: HashMap<String, usize> = HashMap::new();
        for p in batch {
            if p.path.is_empty() {
                self.dead_letter(&mut ops, &p, "not an index event");
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
                .any(|(h, _)| !have.contains_key(h) && !failed.contains_key(h))
            {
                self.defer_to_tomorrow(&mut ops, &p);
                blocked.insert(p.path.clone());
                continue;
            }
            let err = recs.iter().find_map(|(h, _)| failed.get(h).cloned());
            if let Some(e) = err {
                self.retry_later(&mut ops, &p, &e);
                blocked.insert(p.path.clone());
                continue;
            }
            let change = self.plan(&ai, &p, &have, &model, &mut label_hw, &changes)?;
            change.ops(&mut ops);
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
                done_lags.push(c);
            }
            changes.push((ai, change));
        }
        for (a, l) in label_hw {
            ops.push(Op::HighWater {
                key: crate::schema::counters::label_key(&a),
                value: l as u64,
            });
        }
        let n_done = changes.len() as u64;
        self.store.apply(ops, false)?;
        // Memory: the graph inserts (on the rayon pool, outside the state
        // lock) and the state changes (BM25, slots) at the same time; the
        // batch counts as done when both are. A search in between may see a
        // node in one and not yet in the other, as for any node still being
        // indexed.
        let mut inserts: HashMap<String, (Arc<AccountIndex>, Vec<LabeledVec>)> = HashMap::new();
        for (ai, c) in &changes {
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
        self.stats.events_done.fetch_add(n_done, Ordering::Relaxed);
        let now = SystemTime::now();
        let mut lags = lock(&self.lags);
        for c in done_lags {
            let ms = now
                .duration_since(c)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            lags.push_back(ms);
            if lags.len() > 1000 {
                lags.pop_front();
            }
        }
        Ok(())
    }

    /// The account's embedding budget of today is spent: try again at the
    /// start of the next UTC day, without counting a failed try.
    fn defer_to_tomorrow(&self, ops: &mut Vec<Op>, p: &Pending) {
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

    fn retry_later(&self, ops: &mut Vec<Op>, p: &Pending, err: &str) {
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
    fn dead_letter(&self, ops: &mut Vec<Op>, p: &Pending, why: &str) {
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
        let account = path.split('/').next().unwrap_or("").to_string();
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
    fn plan(
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
            Work::Upsert { path, texts } => {
                let old = cur_doc(path);
                let next = label_hw
                    .entry(ai.name.clone())
                    .or_insert_with(|| rlock(&ai.st).next_label);
                let mut doc = IxDoc {
                    model: model.to_string(),
                    edges: old.as_ref().map(|d| d.edges.clone()).unwrap_or_default(),
                    ..Default::default()
                };
                let mut all = String::new();
                for (level, t) in texts {
                    all.push_str(t);
                    all.push('\n');
                    if *level == 0 {
                        doc.abstract_ = text::one_line(t);
                    }
                }
                if doc.abstract_.is_empty() {
                    let c = texts.iter().find(|t| t.0 == 2).map(|t| t.1.as_str());
                    let first = c.unwrap_or("").lines().find(|l| !l.trim().is_empty());
                    doc.abstract_ = first
                        .unwrap_or("")
                        .trim_start_matches('#')
                        .trim()
                        .chars()
                        .take(100)
                        .collect();
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
                Some(d) => Change::Move {
                    from: from.clone(),
                    to: to.clone(),
                    doc: d,
                },
                None => Change::None,
            },
        })
    }

    // ---- maintenance -----------------------------------------------------------

    /// Rebuild graphs with many tombstones; dump changed graphs.
    fn maintain(&self) {
        self.rebuild_tombstoned();
        self.dump_all();
    }

    /// Rebuild the graphs whose tombstones outnumber a quarter of the live vectors.
    fn rebuild_tombstoned(&self) {
        let accts = self.loaded_accounts();
        for ai in accts {
            if !ai.ready.load(Ordering::Acquire) {
                continue;
            }
            let (dead, live) = {
                let st = rlock(&ai.st);
                (st.dead.len(), st.vecs.len())
            };
            if dead > 1000 && dead * 4 > live {
                self.rebuild(&ai);
            }
        }
    }

    /// Build a new graph from the live vectors and swap it in.
    pub fn rebuild(&self, ai: &AccountIndex) {
        let t0 = Instant::now();
        let items: Vec<LabeledVec> = {
            let st = rlock(&ai.st);
            st.vecs.iter().map(|(l, v)| (*l, v.clone())).collect()
        };
        let g = ann::build(&self.cfg.ann, &items);
        // Only the indexer thread changes vectors, and it is here: nothing
        // changed since the snapshot.
        *wlock(&ai.graph) = Arc::new(g);
        let mut st = wlock(&ai.st);
        st.dead.clear();
        st.dirty = true;
        tracing::info!(account = %ai.name, vectors = items.len(), ms = t0.elapsed().as_millis() as u64, "graph rebuilt");
    }

    /// Dump every graph changed since its last dump.
    fn dump_all(&self) {
        let accts = self.loaded_accounts();
        for ai in accts {
            // Never dump a graph that is not loaded yet over the real one.
            if !ai.ready.load(Ordering::Acquire) || !rlock(&ai.st).dirty {
                continue;
            }
            let g = rlock(&ai.graph).clone();
            let t0 = Instant::now();
            match ann::dump(&g, &self.graph_dir(&ai.name)) {
                Ok(()) => {
                    wlock(&ai.st).dirty = false;
                    self.stats.dumps.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(account = %ai.name, ms = t0.elapsed().as_millis() as u64, "graph dumped");
                }
                Err(e) => tracing::error!(account = %ai.name, "graph dump failed: {e}"),
            }
        }
    }

    /// Re-embed the documents of accounts whose vectors came from another
    /// model (or of `only`, all of them).
    pub fn reindex_stale_models(&self, only: Option<&str>) -> Result<usize> {
        let model = self.embedder.id().to_string();
        let mut stale: Vec<String> = Vec::new();
        self.store.scan_ix("", &mut |path, b| {
            let d = IxDoc::decode(b)?;
            if d.model != model && !d.recs.is_empty() {
                stale.push(path.to_string());
            }
            Ok(())
        })?;
        if let Some(a) = only {
            stale.retain(|p| p.split('/').next() == Some(a));
        }
        if stale.is_empty() {
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

    /// ACTIVE nodes with no index document (an interrupted `ctxfs reindex`,
    /// an index dir deleted by hand): index them from the store. Cheap when
    /// the counts agree: one counter per account.
    pub fn index_unindexed(&self) -> Result<usize> {
        let mut short = HashSet::new();
        // Account directories (a commit creates its account's).
        for a in self.store.list_dirs("")? {
            let active = self
                .store
                .counter(&crate::schema::counters::nodes_key(
                    &a,
                    crate::schema::Status::Active,
                ))?
                .max(0) as usize;
            let docs = rlock(&self.account(&a)?.st).docs.len();
            if docs < active {
                short.insert(a);
            }
        }
        if short.is_empty() {
            return Ok(0);
        }
        let mut missing = Vec::new();
        self.store.scan_nodes(&mut |r| {
            let a = r.path.split('/').next().unwrap_or("");
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
            let a = p.split('/').next().unwrap_or("");
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
                    account: path.split('/').next().unwrap_or("").to_string(),
                    work,
                };
                match self.store.get_node(path)? {
                    Some(rec) if rec.status == Status::Active => {
                        let (texts, edges) = node_texts(&*self.store, &rec)?;
                        batch.push(direct(Work::Upsert {
                            path: path.clone(),
                            texts,
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
        // Forget what is indexed.
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
        paths.sort();
        let n = paths.len();
        self.reindex_paths(paths, progress)?;
        self.dump_all();
        Ok(n)
    }

    // ---- sync and status --------------------------------------------------------

    /// Block until every event with a sequence number up to `target` is
    /// indexed (or dead-lettered), or the configured timeout passes.
    pub fn sync(&self, target: u64) -> Result<()> {
        let deadline = Instant::now() + self.cfg.sync_timeout;
        let mut p = lock(&self.progress);
        let s0 = p.started;
        p.wake = true;
        self.cv.notify_all();
        loop {
            if p.published.0 > s0 && p.published.1 > target {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline || !self.running.load(Ordering::SeqCst) && p.published.0 > s0 {
                return Err(Error::TimedOut);
            }
            p = self
                .cv
                .wait_timeout(p, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    pub fn status(&self, accounts: &[String]) -> Value {
        let mut lags: Vec<u64> = lock(&self.lags).iter().copied().collect();
        lags.sort_unstable();
        let pct = |q: f64| -> Value {
            if lags.is_empty() {
                Value::Null
            } else {
                lags[((lags.len() - 1) as f64 * q).round() as usize].into()
            }
        };
        // Age of the oldest pending event.
        let oldest = self
            .store
            .outbox_head(1)
            .ok()
            .and_then(|h| h.into_iter().next())
            .and_then(|e| OutboxEvent::decode(&e.json).ok())
            .and_then(|e| humantime::parse_rfc3339_weak(&e.created_at).ok())
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut docs = 0;
        let mut vectors = 0;
        let mut tomb = 0;
        let mut loading = 0;
        for a in accounts {
            if let Some(ai) = lock(&self.accounts).get(a).and_then(|c| c.get().cloned()) {
                loading += !ai.ready.load(Ordering::Acquire) as usize;
                let st = rlock(&ai.st);
                docs += st.docs.len();
                vectors += st.vecs.len();
                tomb += st.dead.len();
            }
        }
        let s = &self.stats;
        json!({
            "running": self.running.load(Ordering::SeqCst),
            "embedder": {"kind": self.embedder.kind(), "model": self.embedder.id(),
                         "dim": self.embedder.dim(), "note": self.embedder_note},
            "index_lag_ms": oldest,
            "recent_lag_ms": {"p50": pct(0.5), "p95": pct(0.95), "samples": lags.len()},
            "indexed_nodes": docs,
            "vectors": vectors,
            "accounts_loading_vectors": loading,
            "tombstones": tomb,
            "events_done": s.events_done.load(Ordering::Relaxed),
            "embedded": s.embedded.load(Ordering::Relaxed),
            "embed_cache_hits": s.embed_cache_hits.load(Ordering::Relaxed),
            "embed_failures": s.embed_failures.load(Ordering::Relaxed),
            "embed_deferred": s.deferred.load(Ordering::Relaxed),
            "dead_lettered": s.dead_lettered.load(Ordering::Relaxed),
            "searches": s.searches.load(Ordering::Relaxed),
            "graph_dumps": s.dumps.load(Ordering::Relaxed),
        })
    }

    // ---- queries -------------------------------------------------------------

    /// The query's vector, from a small cache of recent queries.
    fn query_vec(&self, q: &str) -> Result<ann::Vector> {
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

    /// The best ACTIVE nodes under `scope` (a path under `accounts/`).
    pub fn search(&self, scope: &str, q: &Query) -> Result<Vec<Hit>> {
        self.stats.searches.fetch_add(1, Ordering::Relaxed);
        let account = scope.split('/').next().unwrap_or("");
        let k = q.k.clamp(1, MAX_K);
        let ai = self.account(account)?;
        // Hybrid degrades to the lexical channel when the query cannot be
        // embedded (embedding server down) or the graph is still loading
        // after a mount; vector-only fails then.
        let vectors = ai.ready.load(Ordering::Acquire);
        if !vectors && q.mode == Mode::Vector {
            return Err(Error::Unavailable(
                "the vector index of this account is still loading; retry in a few seconds or use mode=lexical"
                    .into(),
            ));
        }
        let t_embed = Instant::now();
        let qv = match q.mode {
            Mode::Lexical => None,
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
        let qterms = text::terms(&q.text);
        // Candidates per channel before fusion; records fetched per node candidate.
        let cand = (k * 3).max(30);
        let whole = scope == account;
        let graph = rlock(&ai.graph).clone();
        let st = rlock(&ai.st);

        // Vector channel: best record per node.
        let mut vec_hits: Vec<(Arc<str>, f32, u16)> = Vec::new();
        if let Some(qv) = &qv {
            let scoped_recs: Option<Vec<usize>> = if whole {
                None
            } else {
                let start: Arc<str> = Arc::from(scope);
                let mut labels = Vec::new();
                for (p, d) in st.docs.range(start..) {
                    if !in_scope(p, scope) {
                        if p.as_ref() > scope && !p.starts_with(scope) {
                            break;
                        }
                        continue;
                    }
                    labels.extend(d.ix.recs.iter().map(|r| r.label as usize));
                    if labels.len() > EXACT_SCOPE {
                        break;
                    }
                }
                (labels.len() <= EXACT_SCOPE).then_some(labels)
            };
            let raw = match scoped_recs {
                Some(labels) => ann::exact(
                    qv,
                    cand * 2,
                    labels
                        .iter()
                        .filter_map(|l| st.vecs.get(l).map(|v| (*l, &v[..]))),
                ),
                None if whole && st.dead.len() * 10 <= st.vecs.len() => {
                    // Few tombstones: an unfiltered search for a little more,
                    // filtered after (hnsw_rs's filtered search is slower).
                    let extra = st.dead.len().min(cand * 2);
                    ann::search(&graph, &self.cfg.ann, qv, cand * 2 + extra, None)
                }
                None => {
                    let keep = |l: usize| {
                        !st.dead.contains(&l)
                            && st
                                .slots
                                .get(&l)
                                .is_some_and(|(p, _)| whole || in_scope(p, scope))
                    };
                    ann::search(&graph, &self.cfg.ann, qv, cand * 2, Some(&keep))
                }
            };
            let mut seen: HashSet<Arc<str>> = HashSet::new();
            for (l, s) in raw {
                if let Some((p, i)) = st.slots.get(&l) {
                    if !st.dead.contains(&l) && seen.insert(p.clone()) {
                        vec_hits.push((p.clone(), s, *i));
                        if vec_hits.len() >= cand {
                            break;
                        }
                    }
                }
            }
        }

        // Lexical channel.
        let mut lex_hits: Vec<(Arc<str>, f32)> = Vec::new();
        if q.mode != Mode::Vector {
            let keep = |d: u32| {
                st.lex_path
                    .get(d as usize)
                    .and_then(|p| p.as_ref())
                    .is_some_and(|p| whole || in_scope(p, scope))
            };
            for (d, s) in st.lex.search(&qterms, cand, &keep) {
                if let Some(Some(p)) = st.lex_path.get(d as usize) {
                    lex_hits.push((p.clone(), s));
                }
            }
        }

        // Fusion.
        let mut by: HashMap<Arc<str>, Hit> = HashMap::new();
        let blank = |p: &Arc<str>| Hit {
            path: format!("accounts/{p}"),
            uri: place::uri_of(p),
            score: 0.0,
            abstract_: String::new(),
            vector_rank: None,
            vector_score: None,
            lexical_rank: None,
            lexical_score: None,
            level: 2,
            line: 0,
            via: None,
        };
        for (r, (p, s, i)) in vec_hits.iter().enumerate() {
            let h = by.entry(p.clone()).or_insert_with(|| blank(p));
            h.vector_rank = Some(r + 1);
            h.vector_score = Some(*s);
            if let Some(rec) = st.docs.get(p).and_then(|d| d.ix.recs.get(*i as usize)) {
                h.level = rec.level;
                h.line = rec.line;
            }
        }
        for (r, (p, s)) in lex_hits.iter().enumerate() {
            let h = by.entry(p.clone()).or_insert_with(|| blank(p));
            h.lexical_rank = Some(r + 1);
            h.lexical_score = Some(*s);
        }
        // The hashing fallback matches words as BM25 does, less well: it
        // gets a smaller say (SciFact: hybrid 0.56 nDCG@10 at weight 1
        // against BM25's 0.69).
        let wv = self
            .cfg
            .vector_weight
            .unwrap_or(if self.embedder.kind() == "hash" {
                0.25
            } else {
                1.0
            });
        let norm = (wv + 1.0) / (RRF_K + 1.0);
        let mut hits: Vec<Hit> = by
            .into_iter()
            .map(|(p, mut h)| {
                h.score = match q.mode {
                    Mode::Vector => h.vector_score.unwrap_or(0.0),
                    Mode::Lexical => h.lexical_score.unwrap_or(0.0),
                    Mode::Hybrid => {
                        let f =
                            |r: Option<usize>| r.map(|r| 1.0 / (RRF_K + r as f32)).unwrap_or(0.0);
                        (wv * f(h.vector_rank) + f(h.lexical_rank)) / norm
                    }
                };
                if let Some(d) = st.docs.get(&p) {
                    h.abstract_ = d.ix.abstract_.clone();
                    if h.line == 0 {
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

        // Only what is ACTIVE now (the index may lag a delete by a moment).
        let mut out: Vec<Hit> = Vec::new();
        for h in hits {
            if out.len() >= k {
                break;
            }
            let node = &h.path["accounts/".len()..];
            if self
                .store
                .get_node(node)?
                .is_some_and(|r| r.status == Status::Active)
            {
                out.push(h);
            }
        }
        if q.expand {
            let mut extra = Vec::new();
            for h in &out {
                let node = &h.path["accounts/".len()..];
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
                    let mut x = blank(&Arc::from(to));
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
        }
        Ok(out)
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
        let account = path.split('/').next().unwrap_or("");
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

    /// The live vectors of an account by label, as the store keeps them
    /// (f32, before the rounding to half precision; benchmarks).
    pub fn live_vectors(&self, account: &str) -> Result<Vec<(usize, Vec<f32>)>> {
        let ai = self.account(account)?;
        self.ensure_vectors(&ai)?;
        let st = rlock(&ai.st);
        let model = self.embedder.id();
        let mut out = Vec::with_capacity(st.vecs.len());
        for l in st.vecs.keys() {
            let Some((path, i)) = st.slots.get(l) else {
                continue;
            };
            let Some(doc) = st.docs.get(path) else {
                continue;
            };
            if let Some(b) = self.store.get_vec(model, doc.ix.recs[*i as usize].hash)? {
                out.push((*l, bytes_vec(&b)));
            }
        }
        out.sort_by_key(|x| x.0);
        Ok(out)
    }
}

fn set_lex_path(v: &mut Vec<Option<Arc<str>>>, id: u32, p: Option<Arc<str>>) {
    let i = id as usize;
    if v.len() <= i {
        v.resize(i + 1, None);
    }
    v[i] = p;
}

/// (level, first line, text) of every record an upsert makes: L0, L1, and
/// the chunks of L2. An overview the daemon derived from a content of one
/// chunk is made of that chunk's own lines: it gets no record of its own,
/// as its vector would only repeat the chunk's (and cost as much to embed).
fn records(texts: &[(u8, String)]) -> Vec<(u8, u32, String)> {
    let content = texts.iter().find(|(l, _)| *l == 2).map(|(_, t)| t.as_str());
    let chunks = content.map(text::chunks).unwrap_or_default();
    let mut out = Vec::new();
    for (level, t) in texts {
        if *level == 2 {
            for c in &chunks {
                out.push((2, c.line, c.text.clone()));
            }
        } else if !t.trim().is_empty() {
            let t = t.trim();
            if *level == 1
                && chunks.len() == 1
                && content.is_some_and(|c| crate::schema::derive::derive_overview(c).trim() == t)
            {
                continue;
            }
            out.push((*level, 0, t.to_string()));
        }
    }
    out
}

fn record_texts(texts: &[(u8, String)]) -> Vec<(u128, String)> {
    records(texts)
        .into_iter()
        .map(|(_, _, t)| (xxh3_128(t.as_bytes()), t))
        .collect()
}

/// A change to one account's index, planned before the store transaction
/// and applied to memory after it.
enum Change {
    None,
    Put {
        path: String,
        doc: IxDoc,
        vecs: Vec<LabeledVec>,
    },
    Del {
        path: String,
    },
    Move {
        from: String,
        to: String,
        doc: IxDoc,
    },
}

impl Change {
    /// The document at `path` after this change, if it touches `path`.
    fn doc_after(&self, path: &str) -> Option<Option<IxDoc>> {
        match self {
            Change::Put { path: p, doc, .. } if p == path => Some(Some(doc.clone())),
            Change::Del { path: p } if p == path => Some(None),
            Change::Move { from, .. } if from == path => Some(None),
            Change::Move { to, doc, .. } if to == path => Some(Some(doc.clone())),
            _ => None,
        }
    }

    fn ops(&self, ops: &mut Vec<Op>) {
        match self {
            Change::None => {}
            Change::Put { path, doc, .. } => ops.push(Op::PutIx {
                path: path.clone(),
                data: doc.encode(),
            }),
            Change::Del { path } => ops.push(Op::DelIx { path: path.clone() }),
            Change::Move { from, to, doc } => {
                ops.push(Op::DelIx { path: from.clone() });
                ops.push(Op::PutIx {
                    path: to.clone(),
                    data: doc.encode(),
                });
            }
        }
    }

    fn apply(self, ai: &AccountIndex) {
        match self {
            Change::None => {}
            Change::Put { path, doc, vecs } => {
                // The vectors are already in the graph (`process`).
                let mut st = wlock(&ai.st);
                // Labels the new document keeps (a relations-only change)
                // stay live.
                let keep: HashSet<usize> = doc.recs.iter().map(|r| r.label as usize).collect();
                remove_doc(&mut st, &path, &keep);
                let path: Arc<str> = Arc::from(path);
                for (i, r) in doc.recs.iter().enumerate() {
                    st.slots.insert(r.label as usize, (path.clone(), i as u16));
                    st.next_label = st.next_label.max(r.label as usize + 1);
                }
                for (l, v) in vecs {
                    st.vecs.insert(l, v);
                }
                let lex_id = st.lex.add(&doc.terms);
                set_lex_path(&mut st.lex_path, lex_id, Some(path.clone()));
                st.docs.insert(path, Doc { ix: doc, lex_id });
                st.dirty = true;
            }
            Change::Del { path } => {
                let mut st = wlock(&ai.st);
                remove_doc(&mut st, &path, &HashSet::new());
                st.dirty = true;
            }
            Change::Move { from, to, doc } => {
                let mut st = wlock(&ai.st);
                let Some(old) = st.docs.remove(from.as_str()) else {
                    return;
                };
                let to: Arc<str> = Arc::from(to);
                for (i, r) in doc.recs.iter().enumerate() {
                    st.slots.insert(r.label as usize, (to.clone(), i as u16));
                }
                set_lex_path(&mut st.lex_path, old.lex_id, Some(to.clone()));
                st.docs.insert(
                    to,
                    Doc {
                        ix: doc,
                        lex_id: old.lex_id,
                    },
                );
            }
        }
    }
}

/// Forget the document at `path`; its vectors become tombstones, except
/// the labels in `keep`.
fn remove_doc(st: &mut State, path: &str, keep: &HashSet<usize>) {
    let Some(old) = st.docs.remove(path) else {
        return;
    };
    for r in &old.ix.recs {
        let l = r.label as usize;
        if keep.contains(&l) {
            continue;
        }
        st.slots.remove(&l);
        if st.vecs.remove(&l).is_some() {
            st.dead.insert(l);
        }
    }
    st.lex.remove(old.lex_id, &old.ix.terms);
    set_lex_path(&mut st.lex_path, old.lex_id, None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RedbStore;

    #[test]
    fn derived_overview_of_one_chunk_has_no_record() {
        let one = "First line of a note.\nSecond line.\n".to_string();
        let derived = crate::schema::derive::derive_overview(&one);
        let levels = |texts: &[(u8, String)]| -> Vec<u8> {
            records(texts).into_iter().map(|(l, _, _)| l).collect()
        };
        let t = [(0, "A note".into()), (1, derived), (2, one.clone())];
        assert_eq!(levels(&t), [0, 2]);
        // An overview the writer wrote is a record.
        let t = [(1, "What this note covers".into()), (2, one)];
        assert_eq!(levels(&t), [1, 2]);
        // A long content: the derived overview spans chunks, and stays.
        let long = "A line of some length that fills the chunk.\n".repeat(60);
        let t = [
            (1, crate::schema::derive::derive_overview(&long)),
            (2, long),
        ];
        let l = levels(&t);
        assert!(l[0] == 1 && l.len() > 2, "{l:?}");
    }

    struct T {
        _dir: tempfile::TempDir,
        store: Arc<RedbStore>,
        ix: Arc<Index>,
        seq: u64,
    }

    impl T {
        fn new() -> T {
            let dir = tempfile::tempdir().unwrap();
            let store = RedbStore::open(&dir.path().join("db.redb")).unwrap();
            let ix = Index::new(
                store.clone() as Arc<dyn Store>,
                &dir.path().join("index"),
                Arc::new(embed::HashEmbedder::new(64)),
                "test".into(),
                IndexConfig::default(),
            )
            .unwrap();
            ix.start().unwrap();
            T {
                _dir: dir,
                store,
                ix,
                seq: 0,
            }
        }

        /// Store the node as ACTIVE (or remove it) with its event, then sync.
        fn event(&mut self, etype: &str, path: &str, payload: Value, active: Option<&str>) {
            self.seq += 1;
            let mut ops = vec![Op::PutEvent {
                seq: self.seq,
                node_path: path.into(),
                account: "a".into(),
                json: serde_json::to_vec(&json!({
                    "event_id": format!("{:016x}", self.seq), "event_type": etype,
                    "uri": place::uri_of(path), "payload": payload, "retry_count": 0,
                    "status": "PENDING", "created_at": "2026-01-01T00:00:00.000Z",
                }))
                .unwrap(),
            }];
            match active {
                Some(p) => ops.push(Op::PutNode {
                    path: p.into(),
                    rec: NodeRec {
                        id: self.seq,
                        path: p.into(),
                        status: Status::Active,
                        version: 1,
                        created_at: String::new(),
                        updated_at: String::new(),
                        updated_ns: 0,
                        files: Vec::new(),
                    },
                }),
                None => ops.push(Op::DelNode { path: path.into() }),
            }
            self.store.apply(ops, true).unwrap();
            self.ix.notify();
            self.ix.sync(self.seq).unwrap();
        }

        fn upsert(&mut self, path: &str, text: &str) {
            let recs = json!({"records": event::records(path, &[(2, text.to_string())])});
            self.event("UPSERT_CONTEXT", path, recs, Some(path));
        }

        fn hits(&self, q: &str) -> Vec<String> {
            let q = Query {
                text: q.into(),
                k: 10,
                mode: Mode::Hybrid,
                expand: false,
            };
            self.ix
                .search("a", &q)
                .unwrap()
                .into_iter()
                .map(|h| h.path)
                .collect()
        }
    }

    #[test]
    fn follows_events_and_survives_rebuild_and_reload() {
        let mut t = T::new();
        for i in 0..40 {
            t.upsert(
                &format!("a/users/u/memories/c/n{i}"),
                &format!("note {i} about widget{i}"),
            );
        }
        assert_eq!(t.hits("widget7")[0], "accounts/a/users/u/memories/c/n7");
        // Update, move, delete.
        t.upsert("a/users/u/memories/c/n7", "now about gadgets");
        assert!(!t
            .hits("widget7")
            .contains(&"accounts/a/users/u/memories/c/n7".to_string()));
        t.event(
            "MOVE_CONTEXT",
            "a/users/u/memories/c/n8",
            json!({"new_uri": "ctx://a/users/u/memories/d/n8"}),
            Some("a/users/u/memories/d/n8"),
        );
        t.store
            .apply(
                vec![Op::DelNode {
                    path: "a/users/u/memories/c/n8".into(),
                }],
                true,
            )
            .unwrap();
        assert_eq!(t.hits("widget8")[0], "accounts/a/users/u/memories/d/n8");
        for i in 10..40 {
            t.event(
                "DELETE_CONTEXT",
                &format!("a/users/u/memories/c/n{i}"),
                json!({}),
                None,
            );
        }
        assert!(!t.hits("widget20").iter().any(|p| p.ends_with("/c/n20")));
        let ai = t.ix.account("a").unwrap();
        assert_eq!(rlock(&ai.st).dead.len(), 31);
        // Rebuild: tombstones gone, results unchanged.
        t.ix.rebuild(&ai);
        assert_eq!(rlock(&ai.st).dead.len(), 0);
        assert_eq!(t.hits("widget8")[0], "accounts/a/users/u/memories/d/n8");
        assert_eq!(t.hits("gadgets")[0], "accounts/a/users/u/memories/c/n7");
        // Reload from the store and the dump: same answers.
        t.ix.shutdown();
        let ix2 = Index::new(
            t.store.clone() as Arc<dyn Store>,
            &t._dir.path().join("index"),
            Arc::new(embed::HashEmbedder::new(64)),
            "test".into(),
            IndexConfig::default(),
        )
        .unwrap();
        t.ix = ix2;
        let ai = t.ix.account("a").unwrap();
        // Phase one: documents, lexical answers, no vectors yet.
        assert_eq!(rlock(&ai.st).docs.len(), 10);
        assert!(!ai.ready.load(Ordering::Acquire));
        assert_eq!(t.hits("widget3")[0], "accounts/a/users/u/memories/c/n3");
        // Phase two (the indexer thread's job): the graph from its dump.
        t.ix.ensure_vectors(&ai).unwrap();
        assert_eq!(rlock(&ai.st).vecs.len(), 10);
        assert_eq!(t.hits("widget3")[0], "accounts/a/users/u/memories/c/n3");
        assert_eq!(t.hits("gadgets")[0], "accounts/a/users/u/memories/c/n7");
        // Every label of every document has a live vector.
        let st = rlock(&ai.st);
        for d in st.docs.values() {
            for r in &d.ix.recs {
                assert!(st.vecs.contains_key(&(r.label as usize)));
            }
        }
    }
}
