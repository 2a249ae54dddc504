//! Per-account indexes: loading an account on first use (documents and
//! BM25 postings first, then its graph from the dump, reconciled with the
//! documents), and the vectors held for it.

use crate::error::Result;
use crate::index::AccountIndex;
use crate::schema::place;

use std::sync::Arc;

use std::sync::atomic::AtomicBool;

use crate::index::DOC_BYTES;

use crate::index::Doc;

use crate::index::GRAPHED_VEC_BYTES;

use std::collections::HashMap;

use std::collections::HashSet;

use crate::index::Index;

use std::time::Instant;

use crate::index::IxDoc;

use crate::index::MAX_LOADED_ACCOUNTS;

use std::sync::Mutex;

use crate::index::OnceLock;

use std::path::PathBuf;

use std::sync::RwLock;

use crate::index::State;

use crate::index::TRIM_AFTER_BYTES;

use crate::index::TRIM_EVERY;

use crate::index::VEC_BYTES;

use crate::index::ann;

use crate::index::bytes_vec;

use crate::index::rlock;

use crate::index::set_lex_path;

use crate::index::wlock;

use crate::locks::lock;
use std::sync::atomic::Ordering;
impl Index {
    /// The index of `account`, loaded on first use (for the daemon's own
    /// work: see [`Index::account_for`]).
    pub fn account(&self, account: &str) -> Result<Arc<AccountIndex>> {
        self.account_for(account, None)
    }

    /// The index of `account`, loaded on first use on behalf of `tenant`
    /// (the uid searching): the load counts in that tenant's share.
    pub(super) fn account_for(
        &self,
        account: &str,
        tenant: Option<u32>,
    ) -> Result<Arc<AccountIndex>> {
        {
            let mut used = lock(&self.used);
            let u = used
                .entry(account.to_string())
                .or_insert((Instant::now(), tenant));
            u.0 = Instant::now();
            if tenant.is_some() {
                u.1 = tenant;
            }
        }
        let cell = lock(&self.accounts)
            .entry(account.to_string())
            .or_default()
            .clone();
        if let Some(a) = cell.get() {
            return Ok(a.clone());
        }
        let mut err = None;
        // A search's load is done below the searches' CPU priority: one
        // tenant loading index after index must not slow another's
        // searches of an index already loaded (BENCHMARKS, "Shares and fairness").
        let load = || match tenant {
            Some(_) => at_low_priority(|| self.load_account_and_graph(account)),
            None => self.load_account_and_graph(account),
        };
        let a = cell.get_or_init(|| match load() {
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
        self.evict_least_used(account);
        // Several daemons: an account is loaded again whenever another
        // daemon's indexer changes it, and an answer from BM25 alone (while
        // the graph loads) would differ from the indexing daemon's. Load
        // the graph before answering, so every daemon answers alike.
        if self.store.shared() {
            self.ensure_vectors(a)?;
        }
        Ok(a.clone())
    }

    /// Memory follows the accounts in use, not the size of the store: past
    /// [`MAX_LOADED_ACCOUNTS`] accounts, or past `max_loaded_bytes` of
    /// estimated memory, accounts leave memory (their next use loads them
    /// again from the store). `keep`, the account in use, stays whatever
    /// its size. The bound is shared among tenants (each loaded account
    /// belongs to the uid that last searched it; the daemon's own work is
    /// one more tenant): with N tenants holding indexes, each has a share
    /// of 1/N of the accounts and of the bytes, and only a tenant over its
    /// share loses indexes, its least recently used first. So a tenant
    /// loading many indexes evicts its own, never another's within its
    /// share (`victim`).
    pub(super) fn evict_least_used(&self, keep: &str) {
        let mut accounts = lock(&self.accounts);
        let mut used = lock(&self.used);
        used.retain(|a, _| accounts.contains_key(a));
        let size = |c: &Arc<OnceLock<Arc<AccountIndex>>>| c.get().map_or(0, |a| a.approx_bytes());
        let mut held: Vec<Held> = accounts
            .iter()
            .map(|(a, c)| {
                let (at, tenant) = used.get(a).copied().unwrap_or((Instant::now(), None));
                Held {
                    account: a.clone(),
                    at,
                    tenant,
                    bytes: size(c),
                }
            })
            .collect();
        let mut freed = 0;
        let mut gone = Vec::new();
        while let Some(i) = victim(&held, keep, MAX_LOADED_ACCOUNTS, self.cfg.max_loaded_bytes) {
            let h = held.swap_remove(i);
            gone.extend(accounts.remove(&h.account));
            used.remove(&h.account);
            freed += h.bytes;
            self.stats.unloads.fetch_add(1, Ordering::Relaxed);
            // Debug: a tenant cycling through its accounts unloads one per
            // search (`index_unloads` in the status counts them).
            tracing::debug!(
                account = %h.account, tenant = ?h.tenant,
                "index unloaded (its tenant is over its share of the bound)"
            );
        }
        drop(used);
        drop(accounts);
        // Freeing a large index (its documents, postings and graph: many
        // small allocations) takes tens of milliseconds: never under the
        // locks every search takes first, and not on the searcher's
        // thread; at low priority, like its load.
        if !gone.is_empty() {
            if let Err(e) = std::thread::Builder::new()
                .name("ctxfs-unload".into())
                .spawn(move || {
                    lower_priority();
                    drop(gone)
                })
            {
                tracing::debug!("no thread to free unloaded indexes ({e}): freed here");
            }
        }
        // The allocator keeps freed pages for reuse; hand them back, so the
        // bound bounds the process's memory, not only its heap. Not after
        // every small unload: `malloc_trim` walks the whole heap holding
        // the allocator's locks (10-30 ms on a 370 MB heap), and at hundreds
        // of unloads a second (one tenant cycling through 260 empty
        // accounts) it stalled every other tenant's search by up to 270 ms
        // (BENCHMARKS journal, "Shares of the loaded-index bound"): only once 32 MB
        // were unloaded, and at most every 10 s (freed memory the
        // allocator keeps is reused by the next loads meanwhile).
        let pending = self.untrimmed.fetch_add(freed, Ordering::Relaxed) + freed;
        if freed > 0 && pending >= TRIM_AFTER_BYTES {
            let mut last = lock(&self.last_trim);
            if last.is_none_or(|t| t.elapsed() >= TRIM_EVERY) {
                *last = Some(Instant::now());
                drop(last);
                self.untrimmed.store(0, Ordering::Relaxed);
                #[cfg(all(target_os = "linux", target_env = "gnu"))]
                // SAFETY: malloc_trim only releases free memory of the allocator.
                unsafe {
                    libc::malloc_trim(0);
                }
            }
        }
    }

    /// Drop `account`'s index from memory: the next use loads it again from
    /// the store (another daemon changed its documents). Only an index this
    /// daemon does not write: the indexer keeps its own current.
    pub fn evict(&self, account: &str) {
        if lock(&self.accounts).remove(account).is_some() {
            tracing::debug!(account, "index evicted: changed on another daemon");
        }
    }

    /// Drop every account's index from memory.
    pub fn evict_all(&self) {
        lock(&self.accounts).clear();
        lock(&self.used).clear();
    }

    /// Phase one of a load; on a shared store, whose first answer waits for
    /// the graph (see `account`), the graph's dump is read at the same time
    /// on a thread of its own: the documents come from the database, the
    /// dump from the local disk.
    fn load_account_and_graph(&self, account: &str) -> Result<AccountIndex> {
        if !(self.store.shared() && self.cfg.dumps) {
            return self.load_account(account);
        }
        let dir = self.graph_dir(account);
        let dim = self.embedder.dim();
        let (ai, dump) = std::thread::scope(|s| {
            let dump = s.spawn(|| ann::load(&dir, dim));
            let ai = self.load_account(account);
            (ai, dump.join().ok().flatten())
        });
        let ai = ai?;
        *lock(&ai.preloaded) = dump;
        Ok(ai)
    }

    pub(super) fn empty_account(&self, account: &str) -> AccountIndex {
        AccountIndex {
            name: account.to_string(),
            graph: RwLock::new(Arc::new(ann::new_graph(&self.cfg.ann, 1024))),
            st: RwLock::new(State::default()),
            ready: AtomicBool::new(true),
            loading: Mutex::new(()),
            preloaded: Mutex::new(None),
            summaries: Mutex::new(None),
        }
    }

    /// Load the account's graph and vectors unless done (phase two). Only
    /// the indexer thread (or an offline command) calls this: it is the
    /// only writer of graphs, so nothing changes the graph meanwhile.
    pub(super) fn ensure_vectors(&self, ai: &AccountIndex) -> Result<()> {
        if ai.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let _g = lock(&ai.loading);
        if ai.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        // Background work: below the searches' CPU priority.
        at_low_priority(|| self.load_vectors(ai))?;
        ai.ready.store(true, Ordering::Release);
        // Its vectors and graph are most of its memory: within the bound?
        self.evict_least_used(&ai.name);
        Ok(())
    }

    /// Every account whose index is loaded (phase one at least).
    pub(super) fn loaded_accounts(&self) -> Vec<Arc<AccountIndex>> {
        lock(&self.accounts)
            .values()
            .filter_map(|c| c.get().cloned())
            .collect()
    }

    /// Phase two for every account loaded so far.
    pub(super) fn ensure_all_vectors(&self) {
        let accts = self.loaded_accounts();
        for ai in accts {
            if let Err(e) = self.ensure_vectors(&ai) {
                tracing::error!(account = %ai.name, "cannot load vectors: {e}");
            }
        }
    }

    pub(super) fn graph_dir(&self, account: &str) -> PathBuf {
        self.dir.join(account)
    }

    /// Build an account's in-memory index from its stored documents and its
    /// graph dump.
    /// Phase one of a load: the documents and BM25 postings (enough to
    /// answer lexically). The graph comes in `load_vectors`.
    pub(super) fn load_account(&self, account: &str) -> Result<AccountIndex> {
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
            st.put_doc(path, Doc { ix, lex_id });
            Ok(())
        })?;
        st.next_label = max_label + 1;
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
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
            preloaded: Mutex::new(None),
            summaries: Mutex::new(None),
        })
    }

    /// Phase two: the graph from its dump, reconciled with the documents.
    pub(super) fn load_vectors(&self, ai: &AccountIndex) -> Result<()> {
        let t0 = Instant::now();
        let account = ai.name.as_str();
        let dim = self.embedder.dim();
        // Only this thread changes the account's state (see `ensure_vectors`):
        // reading it under a read lock while the graph loads is consistent,
        // and searches keep their read access meanwhile.
        let st = rlock(&ai.st);
        let slots = &st.slots;
        let preloaded = lock(&ai.preloaded).take();
        let dump = match preloaded {
            Some(d) => Some(d),
            None if self.cfg.dumps => ann::load(&self.graph_dir(account), dim),
            None => None,
        };
        let (graph, mut vecs) = match dump {
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
        let mut wanted: Vec<(usize, &str, u128)> = Vec::new();
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
            wanted.push((*label, &**path, doc.ix.recs[*i as usize].hash));
        }
        // Read from the store in chunks: one round trip each on a store
        // across the network, not one a vector.
        for chunk in wanted.chunks(VECTOR_READS) {
            let asks: Vec<(&str, u128)> = chunk.iter().map(|(_, p, h)| (*p, *h)).collect();
            for ((label, _, _), b) in chunk.iter().zip(self.store.get_vecs_of(&model, &asks)?) {
                let Some(b) = b else { continue };
                let v = bytes_vec(&b);
                if v.len() == dim {
                    missing.push((*label, ann::half(&v)));
                }
            }
        }
        drop(st);
        // A small account needs no graph (its searches are exact): a dump
        // left from when it was larger is dropped at the next dump.
        let graphed = vecs.len() + missing.len() > self.cfg.exact_scope;
        let (graph, dead) = if graphed {
            ann::insert(&graph, &missing);
            (graph, dead)
        } else {
            (ann::new_graph(&self.cfg.ann, 1024), HashSet::new())
        };
        for (l, v) in missing.iter() {
            vecs.insert(*l, v.clone());
        }
        {
            let mut st = wlock(&ai.st);
            st.dirty = !missing.is_empty() || !dead.is_empty() || (loaded > 0 && !graphed);
            st.dead = dead;
            st.vecs = vecs;
            st.graphed = graphed;
            *wlock(&ai.graph) = Arc::new(graph);
            tracing::info!(
                account,
                docs = st.docs.len(),
                vectors = st.vecs.len(),
                from_dump = loaded,
                inserted = missing.len(),
                tombstones = st.dead.len(),
                graph = graphed,
                ms = t0.elapsed().as_millis() as u64,
                "index loaded"
            );
        }
        Ok(())
    }

    pub(super) fn stored_accounts(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        self.store.scan_ix("", &mut |path, _| {
            let a = place::account_of(path);
            if out.last().map(String::as_str) != Some(a) {
                out.push(a.to_string());
            }
            Ok(())
        })?;
        out.dedup();
        Ok(out)
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
            if let Some(b) = self
                .store
                .get_vec_of(path, model, doc.ix.recs[*i as usize].hash)?
            {
                out.push((*l, bytes_vec(&b)));
            }
        }
        out.sort_by_key(|x| x.0);
        Ok(out)
    }
}

/// Vectors an account's load asks the store for at once.
const VECTOR_READS: usize = 1000;

impl AccountIndex {
    /// An estimate of the memory this index holds: its documents (with
    /// their BM25 postings) and its vectors (with the graph's copy and
    /// neighbour lists once it has a graph).
    pub(super) fn approx_bytes(&self) -> usize {
        let st = rlock(&self.st);
        let per_vec = if st.graphed {
            GRAPHED_VEC_BYTES
        } else {
            VEC_BYTES
        };
        st.docs.len() * DOC_BYTES + st.vecs.len() * per_vec
    }
}

/// A loaded account index, as the bound sees it.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub account: String,
    /// Its last use.
    pub at: Instant,
    /// The uid that last searched it (`None`: the daemon's own work).
    pub tenant: Option<u32>,
    pub bytes: usize,
}

/// The index to unload next (an index into `held`), or `None` when `held`
/// is within `max_accounts` and `max_bytes`, or nothing may go. Never
/// `keep`. The tenants holding indexes share the bound equally; only an
/// index of a tenant over its share in the measure the bound is exceeded
/// in (accounts or bytes) may go, the least recently used of those first.
/// A tenant within its share loses nothing: when the account in use alone
/// is over its tenant's share, the bound is exceeded by it until that
/// tenant's next load.
pub(super) fn victim(
    held: &[Held],
    keep: &str,
    max_accounts: usize,
    max_bytes: usize,
) -> Option<usize> {
    let bytes: usize = held.iter().map(|h| h.bytes).sum();
    let (many, large) = (held.len() > max_accounts, bytes > max_bytes);
    if !many && !large {
        return None;
    }
    let mut per: HashMap<Option<u32>, (usize, usize)> = HashMap::new();
    for h in held {
        let e = per.entry(h.tenant).or_default();
        e.0 += 1;
        e.1 += h.bytes;
    }
    let n = per.len().max(1);
    let (share_accounts, share_bytes) = (max_accounts / n, max_bytes / n);
    // Over its share in the measure the bound is exceeded in: a tenant
    // with one large index is not unloaded because another loads many
    // small ones.
    let over = |t: &Option<u32>| {
        let (a, b) = per[t];
        (many && a > share_accounts) || (large && b > share_bytes)
    };
    held.iter()
        .enumerate()
        .filter(|(_, h)| h.account != keep && over(&h.tenant))
        .min_by_key(|(_, h)| h.at)
        .map(|(i, _)| i)
}

/// The nice value of index loads: searches of loaded indexes (nice 0) get
/// about ten times their CPU share when both want a core.
pub const LOAD_NICE: i32 = 10;

/// Put the calling thread at nice [`LOAD_NICE`] (never above the priority
/// it had).
fn lower_priority() {
    // SAFETY: gettid, getpriority and setpriority take and return integers;
    // a failure only leaves this thread at the priority it had.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        libc::setpriority(libc::PRIO_PROCESS, tid, now.max(LOAD_NICE));
    }
}

/// Run `f` on a thread of its own at nice [`LOAD_NICE`] and wait for it
/// (Linux keeps a nice value per thread; a new thread leaves the caller's,
/// a FUSE worker or the indexer, as it was). Where no thread can be had,
/// `f` runs here.
pub(super) fn at_low_priority<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let job = Mutex::new(Some(f));
    let run = || lock(&job).take().map(|f| f());
    let done = std::thread::scope(|s| {
        let spawned = std::thread::Builder::new()
            .name("ctxfs-load".into())
            .spawn_scoped(s, || {
                lower_priority();
                run()
            });
        match spawned {
            Ok(h) => match h.join() {
                Ok(v) => v,
                Err(p) => std::panic::resume_unwind(p),
            },
            Err(e) => {
                tracing::warn!("no thread for an index load ({e}): loading at normal priority");
                None
            }
        }
    });
    match done {
        Some(v) => v,
        // The thread could not start: the job is still here.
        None => run().expect("an index load runs once"),
    }
}
