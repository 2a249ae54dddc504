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

mod account;
pub mod ann;
pub mod annbench;
pub mod answer;
mod batch;
pub mod bert;
mod change;
mod channels;
mod config;
pub mod embed;
mod follow;
mod fusion;
pub mod lex;
mod past;
mod query;
mod reindex;
pub mod text;
mod toward;
mod worker;

use self::ann::Graph;
use self::batch::{edges_of, Pending, Work};
use self::change::{record_texts, records, set_lex_path, Change};
pub use self::config::{
    ann_params, choose_embedder, default_model_dir, missing_model_note, validate_section,
    IndexConfig,
};
use self::embed::Embedder;
pub use self::past::{PastDoc, PastIndex};
pub use self::reindex::node_texts;
use crate::error::{Error, Result};
use crate::schema::event::OutboxEvent;
use crate::schema::place;
use crate::store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// Events taken from the outbox per indexer step.
const BATCH: usize = 256;
/// Texts per embedder call.
const EMBED_BATCH: usize = 32;
/// Scopes with at most this many records are searched exactly, and an
/// account this small has no graph.
pub(crate) const EXACT_SCOPE: usize = 20_000;
/// Most results a query may ask for.
pub const MAX_K: usize = 1000;
/// Candidates each channel gives a search before fusion: three per result
/// asked, and at least this many. The rules after fusion (a named speaker
/// or day, a message's neighbours) can only lift what is a candidate: on
/// the real dev conversations a `k=10` search found the evidence 0.852 of
/// the time with 30 candidates, 0.859 with 100 (multi-hop 0.736 -> 0.764,
/// temporal 0.794 -> 0.812), for 0.25 ms more with the query's vector
/// cached (BENCHMARKS' journal, "More candidates for the rules after
/// fusion").
pub(crate) const MIN_CANDIDATES: usize = 100;
/// The vector channel's candidates when the graph answers (a scope of more
/// than [`EXACT_SCOPE`] records), at least: the graph is asked for two
/// records a candidate, and its search time grows with what it is asked
/// for, so it keeps the size its benchmarks were measured at.
pub(crate) const MIN_GRAPH_CANDIDATES: usize = 30;

/// Candidates per channel for a search: searched exactly or by BM25, and
/// from the graph.
#[derive(Clone, Copy)]
pub(crate) struct Candidates {
    pub(crate) exact: usize,
    pub(crate) graph: usize,
}

impl Candidates {
    /// For a search of `k` results: three per result, and at least
    /// [`MIN_CANDIDATES`] ([`MIN_GRAPH_CANDIDATES`] from the graph).
    pub(crate) fn of(k: usize) -> Candidates {
        Candidates {
            exact: (k * 3).max(MIN_CANDIDATES),
            graph: (k * 3).max(MIN_GRAPH_CANDIDATES),
        }
    }
}
/// A conversation's message scores this share of its fused score, so a
/// memory holding the same words ranks above the message it came from.
pub const MESSAGE_WEIGHT: f32 = 0.8;
/// The `level` of a search hit that is a conversation's message.
pub const MESSAGE_LEVEL: u8 = 3;
/// A node another ACTIVE node supersedes scores this share of its fused
/// score, so the newer one ranks above it when both match.
pub const SUPERSEDED_WEIGHT: f32 = 0.5;
/// The directories a hierarchical search (`mode=tree`) descends into.
pub const TREE_DIRS: usize = 3;
/// Account indexes held in memory at most (least recently used first out).
pub const MAX_LOADED_ACCOUNTS: usize = 256;
/// The default bound on the loaded indexes' memory, in MiB (`[index]
/// max_loaded_mb`).
pub const MAX_LOADED_MB: usize = 2048;
/// Unloaded indexes' estimated bytes after which the freed memory is handed
/// back to the system (`malloc_trim`).
const TRIM_AFTER_BYTES: usize = 32 << 20;
/// And at most this often.
const TRIM_EVERY: Duration = Duration::from_secs(10);
/// Memory estimates per loaded document and vector (measured at 100,000
/// nodes: docs and postings 2.4 KB a document; a vector 900 B in an
/// account searched exactly, 4.7 KB once it is in an HNSW graph, whose
/// neighbour lists dominate).
const DOC_BYTES: usize = 2_400;
const VEC_BYTES: usize = 900;
const GRAPHED_VEC_BYTES: usize = 4_700;

/// The indexed state of one node, as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct IxDoc {
    pub abstract_: String,
    pub model: String,
    pub recs: Vec<IxRec>,
    pub terms: Vec<(String, u32)>,
    pub edges: Vec<Edge>,
    /// A conversation's message: when the conversation it was indexed from
    /// was stored (ns since the epoch). Search shows the message only while
    /// the conversation stored under its name is that one. `None` for nodes,
    /// and for messages indexed before the field existed.
    pub source: Option<u64>,
    /// A conversation's message that ends by asking (`text::asks`): the
    /// message after it, its answer, gains a share of its score
    /// (`toward::toward_neighbours`). `false` for nodes, and for messages
    /// indexed before the field existed.
    pub asks: bool,
    /// A conversation's message that says when (`extract::when::tells_when`):
    /// it weighs more for a query that asks when (`toward::toward_told_when`).
    /// `false` for nodes, and for messages indexed before the field existed.
    pub tells_when: bool,
}

/// An index document as stored before `tells_when`: read, never written.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct IxDocV3 {
    abstract_: String,
    model: String,
    recs: Vec<IxRec>,
    terms: Vec<(String, u32)>,
    edges: Vec<Edge>,
    source: Option<u64>,
    asks: bool,
}

/// An index document as stored before `asks` (postcard has no optional
/// trailing fields): read, never written.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct IxDocV2 {
    abstract_: String,
    model: String,
    recs: Vec<IxRec>,
    terms: Vec<(String, u32)>,
    edges: Vec<Edge>,
    source: Option<u64>,
}

/// An index document as stored before `source`: read, never written.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct IxDocV1 {
    abstract_: String,
    model: String,
    recs: Vec<IxRec>,
    terms: Vec<(String, u32)>,
    edges: Vec<Edge>,
}

impl From<IxDocV1> for IxDocV2 {
    fn from(d: IxDocV1) -> Self {
        IxDocV2 {
            abstract_: d.abstract_,
            model: d.model,
            recs: d.recs,
            terms: d.terms,
            edges: d.edges,
            source: None,
        }
    }
}

impl From<IxDocV2> for IxDocV3 {
    fn from(d: IxDocV2) -> Self {
        IxDocV3 {
            abstract_: d.abstract_,
            model: d.model,
            recs: d.recs,
            terms: d.terms,
            edges: d.edges,
            source: d.source,
            asks: false,
        }
    }
}

impl From<IxDocV3> for IxDoc {
    fn from(d: IxDocV3) -> Self {
        IxDoc {
            abstract_: d.abstract_,
            model: d.model,
            recs: d.recs,
            terms: d.terms,
            edges: d.edges,
            source: d.source,
            asks: d.asks,
            tells_when: false,
        }
    }
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

/// The vectors some index document still uses: (model, text hash).
pub fn referenced_vectors(store: &dyn Store) -> Result<HashSet<(String, u128)>> {
    let mut out = HashSet::new();
    store.scan_ix("", &mut |path, b| {
        let d = IxDoc::decode(b)?;
        for r in &d.recs {
            if let Some(h) = store.stored_vec_hash(path, r.hash) {
                out.insert((d.model.clone(), h));
            }
        }
        Ok(())
    })?;
    Ok(out)
}

impl IxDoc {
    fn decode(b: &[u8]) -> Result<Self> {
        if let Ok(d) = postcard::from_bytes::<IxDoc>(b) {
            return Ok(d);
        }
        if let Ok(d) = postcard::from_bytes::<IxDocV3>(b) {
            return Ok(d.into());
        }
        if let Ok(d) = postcard::from_bytes::<IxDocV2>(b) {
            return Ok(IxDocV3::from(d).into());
        }
        let d: IxDocV1 =
            postcard::from_bytes(b).map_err(|e| Error::store_from("corrupt index document", e))?;
        Ok(IxDocV3::from(IxDocV2::from(d)).into())
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
    /// Hierarchical (seed 002 `search_children`): the directories first,
    /// by their summaries, then hybrid inside the best of them.
    Tree,
}

#[derive(Debug, Clone)]
pub struct Query {
    pub text: String,
    pub k: usize,
    pub mode: Mode,
    /// Add the strongest one-hop relation targets of the top hits.
    pub expand: bool,
    /// The uid searching (its share of the loaded indexes); `None` for the
    /// daemon's own work.
    pub tenant: Option<u32>,
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
    /// An ACTIVE node that supersedes this one (a `supersedes` relation
    /// of it names this node): `accounts/...` path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// A memory extracted from messages of the searched scope is shown
    /// with the best-ranked of them (the `accounts/...#N` path of the
    /// result right below it) and takes no place of its own among the k.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with: Option<String>,
    /// A message that ends by asking (`IxDoc::asks`): its answer gains a
    /// share of its score.
    #[serde(skip)]
    pub asks: bool,
    /// A message that says when (`IxDoc::tells_when`).
    #[serde(skip)]
    pub tells_when: bool,
}

impl Hit {
    /// A hit on the document at `path` (a store path), before any channel
    /// scored it.
    pub(crate) fn blank(path: &str) -> Hit {
        Hit {
            path: place::mount_path(path),
            uri: place::uri_of(path),
            score: 0.0,
            abstract_: String::new(),
            vector_rank: None,
            vector_score: None,
            lexical_rank: None,
            lexical_score: None,
            level: 2,
            line: 0,
            via: None,
            superseded_by: None,
            with: None,
            asks: false,
            tells_when: false,
        }
    }
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
    /// The graph holds every live vector. An account of at most
    /// `EXACT_SCOPE` records has no graph: its searches are exact, and its
    /// commits cost no graph inserts (the indexer's largest share of CPU
    /// beside the embedder). The graph is built when it grows past that.
    graphed: bool,
    lex: lex::Lex,
    lex_path: Vec<Option<Arc<str>>>,
    /// node → the indexed nodes whose `supersedes` relations name it.
    superseded: HashMap<Arc<str>, Vec<Arc<str>>>,
    /// Bumped by every document put or taken (the directory summaries'
    /// cache is keyed by it).
    generation: u64,
    next_label: usize,
    /// Changed since the last dump.
    dirty: bool,
}

impl State {
    /// Put the document of `path` in place (and its `supersedes` edges).
    fn put_doc(&mut self, path: Arc<str>, doc: Doc) {
        self.generation += 1;
        self.link(&path, &doc.ix, true);
        self.docs.insert(path, doc);
    }

    /// Take the document of `path` out (and its `supersedes` edges).
    fn take_doc(&mut self, path: &str) -> Option<Doc> {
        let (path, doc) = self.docs.remove_entry(path)?;
        self.generation += 1;
        self.link(&path, &doc.ix, false);
        Some(doc)
    }

    fn link(&mut self, path: &Arc<str>, ix: &IxDoc, on: bool) {
        for e in &ix.edges {
            if !e
                .kind
                .eq_ignore_ascii_case(crate::schema::names::SUPERSEDES)
            {
                continue;
            }
            let Some(to) = place::node_of_uri(&e.to) else {
                continue;
            };
            if on {
                let by = self.superseded.entry(Arc::from(to)).or_default();
                if !by.contains(path) {
                    by.push(path.clone());
                }
            } else if let Some(by) = self.superseded.get_mut(to) {
                by.retain(|p| p != path);
                if by.is_empty() {
                    self.superseded.remove(to);
                }
            }
        }
    }

    /// The indexed node that supersedes `path`, if any.
    fn superseder(&self, path: &str) -> Option<&Arc<str>> {
        self.superseded
            .get(path)?
            .iter()
            .find(|p| &***p != path && self.docs.contains_key(&***p))
    }
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
    /// The graph dump, read beside the documents when the account was
    /// loaded (a shared store answers only once its graph is in): phase two
    /// takes it instead of reading the dump again.
    preloaded: Mutex<Option<(Graph, ann::Vectors)>>,
    /// The directory summary vectors of `Mode::Tree`, and the state they
    /// were computed from: (generation, live vectors).
    summaries: Mutex<Summaries>,
}

/// (generation, live vectors) → directory → summary vector.
type Summaries = Option<((u64, usize), Arc<HashMap<Arc<str>, ann::Vector>>)>;

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
    /// Account indexes loaded from the store (phase one).
    pub loads: AtomicU64,
    /// Account indexes unloaded by the bound on loaded indexes.
    pub unloads: AtomicU64,
    /// Index documents another daemon changed, applied in place.
    pub remote_applied: AtomicU64,
}

pub struct Index {
    store: Arc<dyn Store>,
    dir: PathBuf,
    embedder: Arc<dyn Embedder>,
    /// Why the embedder in use was chosen (shown in `.ctxfs/status`).
    embedder_note: String,
    cfg: IndexConfig,
    accounts: Mutex<HashMap<String, Arc<OnceLock<Arc<AccountIndex>>>>>,
    /// When each loaded account was last used, and by which tenant (the
    /// uid of its last search; `None`: only the daemon's own work): the
    /// bound on loaded indexes is shared among tenants (`evict_least_used`).
    used: Mutex<HashMap<String, (Instant, Option<u32>)>>,
    /// Estimated bytes of indexes unloaded since the last `malloc_trim`.
    untrimmed: AtomicUsize,
    /// When the freed memory was last handed back.
    last_trim: Mutex<Option<Instant>>,
    progress: Mutex<Progress>,
    cv: Condvar,
    stop: AtomicBool,
    running: AtomicBool,
    qcache: Mutex<QueryCache>,
    /// Recent commit → searchable delays, milliseconds.
    lags: Mutex<VecDeque<u64>>,
    pub stats: IndexStats,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Told the summarised directories each indexed batch changed (the
    /// directory summaries written by the LLM go stale with them).
    on_dirs: OnceLock<DirsHook>,
}

/// What [`Index::on_changed_dirs`] installs.
pub type DirsHook = Box<dyn Fn(&[String]) + Send + Sync>;

use crate::locks::{lock, read as rlock, write as wlock};

fn vec_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn bytes_vec(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Is `path` one of `prefixes` or under one?
pub(crate) fn under_any(prefixes: &[String], path: &str) -> bool {
    prefixes.iter().any(|p| in_scope(path, p))
}

/// Is `path` the directory `scope` or under it?
pub(crate) fn in_scope(path: &str, scope: &str) -> bool {
    path.len() == scope.len() && path == scope
        || path.len() > scope.len()
            && path.starts_with(scope)
            && path.as_bytes()[scope.len()] == b'/'
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
            used: Mutex::new(HashMap::new()),
            untrimmed: AtomicUsize::new(0),
            last_trim: Mutex::new(None),
            progress: Mutex::new(Progress::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            running: AtomicBool::new(false),
            qcache: Mutex::new((HashMap::new(), VecDeque::new())),
            lags: Mutex::new(VecDeque::new()),
            stats: IndexStats::default(),
            thread: Mutex::new(None),
            on_dirs: OnceLock::new(),
        }))
    }

    /// Call `f` with the summarised directories (category and owner
    /// space) whose nodes each indexed batch changed, after the batch is
    /// stored. Once per index.
    pub fn on_changed_dirs(&self, f: DirsHook) {
        let _ = self.on_dirs.set(f);
    }

    pub fn embedder(&self) -> &dyn Embedder {
        &*self.embedder
    }

    /// Block until every event with a sequence number up to `target` is
    /// indexed (or dead-lettered), or the configured timeout passes.
    pub fn sync(&self, target: u64, cancelled: &dyn Fn() -> bool) -> Result<()> {
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
            if cancelled() {
                return Err(Error::Interrupted);
            }
            // Woken by progress, or every 100 ms to see a Ctrl-C.
            p = self
                .cv
                .wait_timeout(p, (deadline - now).min(Duration::from_millis(100)))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// The indexer's part of `.ctxfs/status` for `accounts`; with `full`
    /// (an operator), the daemon-wide counters too.
    pub fn status(&self, accounts: &[String], full: bool) -> Value {
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
        let mut v = json!({
            "running": self.running.load(Ordering::SeqCst),
            "leads": self.store.leader(worker::LEADER_ROLE),
            "embedder": {"kind": self.embedder.kind(), "model": self.embedder.id(),
                         "dim": self.embedder.dim(), "note": self.embedder_note},
            "index_lag_ms": oldest,
            "recent_lag_ms": {"p50": pct(0.5), "p95": pct(0.95), "samples": lags.len()},
            "indexed_nodes": docs,
            "vectors": vectors,
            "message_views": self.cfg.message_views,
            "accounts_loading_vectors": loading,
            "tombstones": tomb,
        });
        if full {
            // Every account's index in memory, against the bound.
            let loaded: Vec<Arc<AccountIndex>> = self.loaded_accounts();
            let bytes: usize = loaded.iter().map(|a| a.approx_bytes()).sum();
            v["loaded_accounts"] = json!(loaded.len());
            v["loaded_mb"] = json!(bytes >> 20);
            v["max_loaded_mb"] = json!(self.cfg.max_loaded_bytes >> 20);
            // Who holds them: the bound's shares (`evict_least_used`).
            let used = lock(&self.used).clone();
            let mut by: BTreeMap<String, (usize, usize)> = BTreeMap::new();
            for a in &loaded {
                let t = match used.get(&a.name).and_then(|u| u.1) {
                    Some(uid) => uid.to_string(),
                    None => "daemon".to_string(),
                };
                let e = by.entry(t).or_default();
                e.0 += 1;
                e.1 += a.approx_bytes();
            }
            v["loaded_by_tenant"] = by
                .iter()
                .map(|(t, (n, b))| (t.clone(), json!({"accounts": n, "mb": b >> 20})))
                .collect::<serde_json::Map<String, Value>>()
                .into();
            for (k, n) in [
                ("events_done", &s.events_done),
                ("embedded", &s.embedded),
                ("embed_cache_hits", &s.embed_cache_hits),
                ("embed_failures", &s.embed_failures),
                ("embed_deferred", &s.deferred),
                ("dead_lettered", &s.dead_lettered),
                ("searches", &s.searches),
                ("graph_dumps", &s.dumps),
                ("index_loads", &s.loads),
                ("index_unloads", &s.unloads),
                ("remote_docs_applied", &s.remote_applied),
            ] {
                v[k] = n.load(Ordering::Relaxed).into();
            }
        }
        v
    }
}

#[cfg(test)]
mod tests;

/// How many of `items` (in result order) make the first `k` sources: an
/// item `attached` is shown with the source right after it (a memory above
/// its message) and is kept or cut with that source.
pub fn cut_after_sources<T>(items: &[T], k: usize, attached: impl Fn(&T) -> bool) -> usize {
    let mut sources = 0;
    let mut group = 0;
    for (i, it) in items.iter().enumerate() {
        if attached(it) {
            continue;
        }
        sources += 1;
        if sources > k {
            return group;
        }
        group = i + 1;
    }
    items.len()
}

#[cfg(test)]
mod cut_tests {
    use super::cut_after_sources;

    #[test]
    fn memories_shown_with_a_message_go_with_it() {
        // m = a memory shown with the message after it, s = a source.
        let r = ['m', 'm', 's', 's', 'm', 's', 's'];
        let at = |k| cut_after_sources(&r, k, |c| *c == 'm');
        assert_eq!(at(1), 3);
        assert_eq!(at(2), 4);
        assert_eq!(at(3), 6, "the third source comes with its memory");
        assert_eq!(at(4), 7);
        assert_eq!(at(9), 7);
        assert_eq!(at(0), 0);
    }
}
