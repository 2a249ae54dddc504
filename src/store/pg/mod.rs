//! The PostgreSQL backend: one namespace served by any number of daemons on
//! any hosts (CONTRACT §9). The tables mirror redb's (docs/ARCHITECTURE.md,
//! "Storage"), each row keyed by path also carrying its `account`; every
//! `apply` is one transaction. What several daemons need beyond the `Store`
//! of one:
//!
//! - **ids** come from `high_water` rows updated in place (`alloc`: node
//!   and blob ids, in blocks) and from a sequence (event ids, taken inside
//!   the commit's transaction), so no two daemons hand out the same id;
//! - **a compare-and-set** (`Op::Expect`) locks the node row and checks the
//!   version a commit was planned on;
//! - **a change feed**: every transaction that changes what a daemon may
//!   have cached (nodes, directories, scratchpad entries, index documents,
//!   expiry) adds rows to `changes` (a monotonic `seq`) and `NOTIFY`s; each
//!   daemon `LISTEN`s, reads what is past its cursor (so a daemon that
//!   reconnects catches up instead of trusting that it missed nothing) and
//!   hands other daemons' changes to the core (`watch`);
//! - **leadership**: the indexer, the TTL sweeper and the pruning of old
//!   feed rows run on one daemon at a time, the holder of a session-level
//!   advisory lock, which PostgreSQL releases when that daemon's connection
//!   dies;
//! - **drafts** stay on the daemon that holds them: they go to a local redb
//!   file in the data dir, never to the shared database.
//!
//! Files: the store and its reads here; one transaction's statements in
//! `apply.rs`; the change feed in `feed.rs`; the cache in `cache.rs`; the
//! session of advisory locks in `session.rs`; tables in `schema.rs`.
//!
//! The FUSE threads stay synchronous: each call runs on this store's own
//! tokio runtime (`block_on`), bounded by a timeout, so an unreachable
//! database is `EIO` after at most [`OP_TIMEOUT`], never a hang.

use super::{NodeRec, Op, RemoteChange, Store, StoredEvent};
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::schema::place;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::future::Future;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

mod apply;
mod cache;
mod feed;
mod schema;
mod session;

use self::cache::{touched, Cache, CACHE_MAX};
use self::feed::Feed;
use self::session::{lock_key, Session};

/// Longest a store call may take before it fails with `EIO`.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// The channel of the change feed's notifications.
pub(super) const CHANNEL: &str = "ctxfs_changes";
/// Feed rows older than this are pruned (by the leader).
pub(super) const FEED_KEEP: &str = "1 hour";

pub(crate) fn pe(e: tokio_postgres::Error) -> Error {
    // A refused connection or a dropped one: say which database.
    Error::store_from("postgres", e)
}

fn decode(bytes: &[u8]) -> Result<NodeRec> {
    postcard::from_bytes(bytes).map_err(|e| Error::store_from("corrupt node record", e))
}

fn encode(rec: &NodeRec) -> Result<Vec<u8>> {
    postcard::to_stdvec(rec).map_err(|e| Error::store_from("encoding", e))
}

fn split(path: &str) -> (&str, &str) {
    crate::schema::place::parent_name(path)
}

/// A blob whose stored length is not the one its record says (absent: 0).
fn blob_size_error(account: &str, id: u64, len: usize, size: u64) -> Error {
    Error::store(format!(
        "blob {id} of {account} has {len} bytes, its record says {size}"
    ))
}

/// The answers of a query over `UNNEST(…) WITH ORDINALITY`, whose rows are
/// (ordinal, bytes): each in the place it was asked, `None` where no row.
fn by_ordinal<T>(
    n: usize,
    rows: Vec<tokio_postgres::Row>,
    mut f: impl FnMut(Vec<u8>) -> Result<T>,
) -> Result<Vec<Option<T>>> {
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for r in rows {
        let at = r.get::<_, i64>(0) as usize;
        if let Some(slot) = at.checked_sub(1).and_then(|k| out.get_mut(k)) {
            *slot = Some(f(r.get(1))?);
        }
    }
    Ok(out)
}

fn i(v: u64) -> i64 {
    v as i64
}

/// A URL with its password hidden, for messages.
pub fn shown_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

pub struct PgStore {
    rt: tokio::runtime::Runtime,
    pool: Pool,
    pg: tokio_postgres::Config,
    url: String,
    /// Who made a change (this daemon): its own changes are not fed back.
    origin: String,
    /// Drafts of this daemon.
    local: Arc<super::RedbStore>,
    /// The drafts the local file holds (made durable by an `fsync` or an
    /// unmount): a commit's removal of its draft touches the file only
    /// when there is one, not with a disk flush of its own every time.
    local_drafts: Mutex<std::collections::HashSet<String>>,
    feed: Arc<Feed>,
    /// The session of this daemon's advisory locks (roles and `flock`s).
    session: Mutex<Option<Session>>,
    last_try: Mutex<std::collections::HashMap<String, Instant>>,
    stop: Arc<AtomicBool>,
    pruned: AtomicU64,
    cache: Arc<Cache>,
    /// The transactions this daemon started: each adds to the counter
    /// shard this picks (`schema::COUNTER_SHARDS`).
    transactions: std::sync::atomic::AtomicU32,
}

impl PgStore {
    /// Connect to `url`, create or migrate the schema, and open the local
    /// draft file in `data`. A schema newer than this binary is refused.
    pub fn open(url: &str, data: &Path) -> Result<Arc<Self>> {
        let mut pg = tokio_postgres::Config::from_str(url)
            .map_err(|e| Error::store(format!("bad store URL {}: {e}", shown_url(url))))?;
        if pg.get_password().is_none() {
            if let Ok(p) = std::env::var("PGPASSWORD") {
                pg.password(p);
            }
        }
        pg.connect_timeout(Duration::from_secs(5));
        pg.keepalives_idle(Duration::from_secs(10));
        pg.application_name("ctxfs");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ctxfs-pg")
            .enable_all()
            .build()
            .map_err(|e| Error::store_from("cannot start the PostgreSQL runtime", e))?;
        let mgr = Manager::from_config(
            pg.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(16)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(OP_TIMEOUT))
            .create_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| Error::store_from("cannot make the PostgreSQL pool", e))?;
        std::fs::create_dir_all(data)
            .map_err(|e| Error::store_from(format!("cannot create {}", data.display()), e))?;
        let local = super::RedbStore::open(&data.join("drafts.redb"))?;
        let local_drafts = local.drafts()?.into_iter().map(|(p, _)| p).collect();
        let origin = format!(
            "{}:{}:{:x}",
            hostname(),
            std::process::id(),
            crate::schema::time::now_ns() as u64
        );
        let s = PgStore {
            rt,
            pool,
            pg,
            url: shown_url(url),
            origin,
            local,
            local_drafts: Mutex::new(local_drafts),
            feed: Arc::new(Feed::default()),
            session: Mutex::new(None),
            last_try: Mutex::new(Default::default()),
            stop: Arc::new(AtomicBool::new(false)),
            pruned: AtomicU64::new(0),
            cache: Arc::new(Cache::default()),
            // Daemons start at different shards, so two daemons' first
            // transactions do not meet on one row.
            transactions: std::sync::atomic::AtomicU32::new(std::process::id()),
        };
        let url_shown = s.url.clone();
        s.run(async {
            let mut c = s.pool.get().await.map_err(|e| {
                Error::store(format!("cannot reach PostgreSQL at {url_shown}: {e}"))
            })?;
            schema::migrate(&mut c).await
        })?;
        Ok(Arc::new(s))
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Run `fut` on this store's runtime, failing with `EIO` after
    /// [`OP_TIMEOUT`].
    fn run<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        self.rt.block_on(async {
            match tokio::time::timeout(OP_TIMEOUT, fut).await {
                Ok(r) => r,
                Err(_) => Err(Error::store(format!(
                    "PostgreSQL at {} did not answer within {}s",
                    self.url,
                    OP_TIMEOUT.as_secs()
                ))),
            }
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Client> {
        self.pool
            .get()
            .await
            .map_err(|e| Error::store(format!("PostgreSQL at {}: {e}", self.url)))
    }

    fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        self.run(async {
            let c = self.client().await?;
            let st = c.prepare_cached(sql).await.map_err(pe)?;
            c.query(&st, params).await.map_err(pe)
        })
    }

    /// One event id from the sequence (a commit's own events take theirs
    /// inside its transaction: `apply::transact`). Only one at a time:
    /// values taken together need not be consecutive.
    fn alloc_events(&self, n: u64) -> Result<u64> {
        if n != 1 {
            return Err(Error::store(format!(
                "{n} consecutive event ids asked of a shared store: they come one at a time"
            )));
        }
        let rows = self.query("SELECT nextval('ctxfs_event_ids')", &[])?;
        rows.first()
            .map(|r| r.get::<_, i64>(0) as u64)
            .ok_or_else(|| Error::store("allocating an event id returned no row"))
    }

    /// Rows of `(seq, json)` as stored events.
    fn events(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<StoredEvent>> {
        Ok(self
            .query(sql, params)?
            .iter()
            .map(|r| StoredEvent {
                seq: r.get::<_, i64>(0) as u64,
                json: r.get(1),
            })
            .collect())
    }

    fn bytes_opt(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<Vec<u8>>> {
        Ok(self
            .query(sql, params)?
            .first()
            .map(|r| r.get::<_, Vec<u8>>(0)))
    }

    /// Does the database hold any ctxfs data yet (a node, a directory)?
    pub fn holds_data(&self) -> Result<bool> {
        Ok(!self
            .query(
                "SELECT 1 FROM dirs /* daemon-wide */ UNION ALL SELECT 1 FROM nodes /* daemon-wide */ LIMIT 1",
                &[],
            )?
            .is_empty())
    }

    /// Stop the feed (unmount).
    pub fn close(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.local.close();
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into())
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Store for PgStore {
    fn get_node(&self, path: &str) -> Result<Option<NodeRec>> {
        if let Some(r) = lock(&self.cache.nodes).get(path) {
            return Ok(r.clone());
        }
        let epoch = self.cache.epoch.load(Ordering::SeqCst);
        let (p, n) = split(path);
        let rec = match self.bytes_opt(
            "SELECT rec FROM nodes WHERE account = $1 AND parent = $2 AND name = $3",
            &[&place::account_of(path), &p, &n],
        )? {
            Some(b) => Some(decode(&b)?),
            None => None,
        };
        let mut c = lock(&self.cache.nodes);
        if self.cache.epoch.load(Ordering::SeqCst) == epoch {
            if c.len() >= CACHE_MAX {
                c.clear();
            }
            c.insert(path.to_string(), rec.clone());
        }
        Ok(rec)
    }

    fn get_version(&self, account: &str, node_id: u64, version: u32) -> Result<Option<NodeRec>> {
        match self.bytes_opt(
            "SELECT rec FROM versions WHERE account = $1 AND node_id = $2 AND version = $3",
            &[&account, &i(node_id), &(version as i32)],
        )? {
            Some(b) => Ok(Some(decode(&b)?)),
            None => Ok(None),
        }
    }

    fn list_nodes(&self, parent: &str) -> Result<Vec<(String, NodeRec)>> {
        if parent.is_empty() {
            return Ok(Vec::new()); // accounts are directories, not nodes
        }
        self.query(
            "SELECT name, rec FROM nodes WHERE account = $1 AND parent = $2 ORDER BY name",
            &[&place::account_of(parent), &parent],
        )?
        .iter()
        .map(|r| Ok((r.get::<_, String>(0), decode(&r.get::<_, Vec<u8>>(1))?)))
        .collect()
    }

    fn has_children(&self, parent: &str) -> Result<bool> {
        if parent.is_empty() {
            // The list of accounts: the one read above every account.
            return Ok(!self
                .query(
                    "SELECT 1 FROM dirs WHERE parent = '' /* daemon-wide */ LIMIT 1",
                    &[],
                )?
                .is_empty());
        }
        Ok(!self
            .query(
                "SELECT 1 FROM nodes WHERE account = $1 AND parent = $2 \
                 UNION ALL SELECT 1 FROM dirs WHERE account = $1 AND parent = $2 LIMIT 1",
                &[&place::account_of(parent), &parent],
            )?
            .is_empty())
    }

    fn dir_exists(&self, path: &str) -> Result<bool> {
        if let Some(&d) = lock(&self.cache.dirs).get(path) {
            return Ok(d);
        }
        let epoch = self.cache.epoch.load(Ordering::SeqCst);
        let (p, n) = split(path);
        let there = !self
            .query(
                "SELECT 1 FROM dirs WHERE account = $1 AND parent = $2 AND name = $3",
                &[&place::account_of(path), &p, &n],
            )?
            .is_empty();
        let mut c = lock(&self.cache.dirs);
        if self.cache.epoch.load(Ordering::SeqCst) == epoch {
            if c.len() >= CACHE_MAX {
                c.clear();
            }
            c.insert(path.to_string(), there);
        }
        Ok(there)
    }

    fn list_dirs(&self, parent: &str) -> Result<Vec<String>> {
        let rows = if parent.is_empty() {
            // The list of accounts (each account's row names it).
            self.query(
                "SELECT name FROM dirs WHERE parent = '' /* daemon-wide */ ORDER BY name",
                &[],
            )?
        } else {
            self.query(
                "SELECT name FROM dirs WHERE account = $1 AND parent = $2 ORDER BY name",
                &[&place::account_of(parent), &parent],
            )?
        };
        Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
    }

    fn read_blob(&self, account: &str, id: u64, size: u64) -> Result<Vec<u8>> {
        let b = self
            .bytes_opt(
                "SELECT data FROM blobs WHERE account = $1 AND id = $2",
                &[&account, &i(id)],
            )?
            .unwrap_or_default();
        if b.len() as u64 != size {
            return Err(blob_size_error(account, id, b.len(), size));
        }
        Ok(b)
    }

    fn get_nodes(&self, paths: &[&str]) -> Result<Vec<Option<NodeRec>>> {
        let (mut accounts, mut parents, mut names) = (Vec::new(), Vec::new(), Vec::new());
        for p in paths {
            let (parent, name) = split(p);
            accounts.push(place::account_of(p));
            parents.push(parent);
            names.push(name);
        }
        let rows = self.query(
            "SELECT k.i, n.rec FROM UNNEST($1::text[], $2::text[], $3::text[]) WITH ORDINALITY \
             AS k(account, parent, name, i) JOIN nodes n ON n.account = k.account \
             AND n.parent = k.parent COLLATE \"C\" AND n.name = k.name COLLATE \"C\"",
            &[&accounts, &parents, &names],
        )?;
        by_ordinal(paths.len(), rows, |b| decode(&b))
    }

    fn get_versions(&self, asks: &[(&str, u64, u32)]) -> Result<Vec<Option<NodeRec>>> {
        let accounts: Vec<&str> = asks.iter().map(|a| a.0).collect();
        let ids: Vec<i64> = asks.iter().map(|a| i(a.1)).collect();
        let versions: Vec<i32> = asks.iter().map(|a| a.2 as i32).collect();
        let rows = self.query(
            "SELECT k.i, v.rec FROM UNNEST($1::text[], $2::bigint[], $3::int[]) WITH ORDINALITY \
             AS k(account, node_id, version, i) JOIN versions v ON v.account = k.account \
             AND v.node_id = k.node_id AND v.version = k.version",
            &[&accounts, &ids, &versions],
        )?;
        by_ordinal(asks.len(), rows, |b| decode(&b))
    }

    fn read_blobs(&self, asks: &[(&str, u64, u64)]) -> Result<Vec<Result<Vec<u8>>>> {
        let accounts: Vec<&str> = asks.iter().map(|a| a.0).collect();
        let ids: Vec<i64> = asks.iter().map(|a| i(a.1)).collect();
        let rows = self.query(
            "SELECT k.i, b.data FROM UNNEST($1::text[], $2::bigint[]) WITH ORDINALITY \
             AS k(account, id, i) JOIN blobs b ON b.account = k.account AND b.id = k.id",
            &[&accounts, &ids],
        )?;
        let found = by_ordinal(asks.len(), rows, Ok)?;
        Ok(found
            .into_iter()
            .zip(asks)
            .map(|(b, (account, id, size))| {
                let b = b.unwrap_or_default();
                if b.len() as u64 == *size {
                    Ok(b)
                } else {
                    Err(blob_size_error(account, *id, b.len(), *size))
                }
            })
            .collect())
    }

    fn node_events(&self, node_path: &str) -> Result<Vec<StoredEvent>> {
        self.events(
            "SELECT seq, json FROM outbox WHERE account = $1 AND node_path = $2 ORDER BY seq",
            &[&place::account_of(node_path), &node_path],
        )
    }

    fn drafts(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.local.drafts()
    }

    fn counter(&self, key: &str) -> Result<i64> {
        Ok(self
            .query(
                "SELECT COALESCE(SUM(value), 0)::bigint FROM counters WHERE key = $1",
                &[&key],
            )?
            .first()
            .map(|r| r.get(0))
            .unwrap_or(0))
    }

    fn counters(&self, keys: &[String]) -> Result<Vec<i64>> {
        let found: std::collections::HashMap<String, i64> = self
            .query(
                "SELECT key, SUM(value)::bigint FROM counters WHERE key = ANY($1) GROUP BY key",
                &[&keys],
            )?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        Ok(keys
            .iter()
            .map(|k| found.get(k).copied().unwrap_or(0))
            .collect())
    }

    fn ix_node_counts(&self) -> Result<std::collections::HashMap<String, usize>> {
        // Counted in the server: no document crosses the network.
        Ok(self
            .query(
                "SELECT account, COUNT(*) FROM ix_docs /* daemon-wide */ \
                 WHERE strpos(path, '#') = 0 GROUP BY account",
                &[],
            )?
            .into_iter()
            .map(|r| (r.get(0), r.get::<_, i64>(1) as usize))
            .collect())
    }

    fn high_water(&self, key: &str) -> Result<u64> {
        if key == crate::schema::counters::EVENT_ID {
            // The last id handed out (`alloc_events`).
            let rows = self.query(
                "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM ctxfs_event_ids",
                &[],
            )?;
            return Ok(rows.first().map(|r| r.get::<_, i64>(0) as u64).unwrap_or(0));
        }
        Ok(self
            .query("SELECT value FROM high_water WHERE key = $1", &[&key])?
            .first()
            .map(|r| r.get::<_, i64>(0) as u64)
            .unwrap_or(0))
    }

    /// The daemon-wide head of the outbox (every account's events, for the
    /// one indexer of the cluster).
    fn outbox_head(&self, limit: usize) -> Result<Vec<StoredEvent>> {
        self.events(
            "SELECT seq, json FROM outbox /* daemon-wide */ ORDER BY seq LIMIT $1",
            &[&(limit as i64)],
        )
    }

    fn dead_events(&self, node_path: &str) -> Result<Vec<StoredEvent>> {
        self.events(
            "SELECT seq, json FROM dlq WHERE account = $1 AND node_path = $2 ORDER BY seq",
            &[&place::account_of(node_path), &node_path],
        )
    }

    fn get_ix(&self, path: &str) -> Result<Option<Vec<u8>>> {
        self.bytes_opt(
            "SELECT data FROM ix_docs WHERE account = $1 AND path = $2",
            &[&place::account_of(path), &path],
        )
    }

    fn scan_ix(&self, prefix: &str, f: &mut dyn FnMut(&str, &[u8]) -> Result<()>) -> Result<()> {
        // Paths are ASCII: every path starting with `prefix` sorts below
        // prefix + DEL. An account's documents are read with its name; only
        // the daemon-wide scan (prefix "") reads every account's.
        let hi = format!("{prefix}\u{7f}");
        let account = place::account_of(prefix).to_string();
        let mut from = prefix.to_string();
        let mut first = true;
        loop {
            let rows = match (prefix.is_empty(), first) {
                (true, true) => self.query(
                    "SELECT path, data FROM ix_docs /* daemon-wide */ WHERE path >= $1 ORDER BY path LIMIT 1000",
                    &[&from],
                )?,
                (true, false) => self.query(
                    "SELECT path, data FROM ix_docs /* daemon-wide */ WHERE path > $1 ORDER BY path LIMIT 1000",
                    &[&from],
                )?,
                (false, true) => self.query(
                    "SELECT path, data FROM ix_docs WHERE account = $1 AND path >= $2 AND path < $3 \
                     ORDER BY path LIMIT 1000",
                    &[&account, &from, &hi],
                )?,
                (false, false) => self.query(
                    "SELECT path, data FROM ix_docs WHERE account = $1 AND path > $2 AND path < $3 \
                     ORDER BY path LIMIT 1000",
                    &[&account, &from, &hi],
                )?,
            };
            first = false;
            for r in &rows {
                let p: &str = r.get(0);
                f(p, r.get::<_, &[u8]>(1))?;
            }
            match rows.last() {
                Some(r) if rows.len() == 1000 => from = r.get::<_, String>(0),
                _ => return Ok(()),
            }
        }
    }

    fn get_vecs(&self, model: &str, hashes: &[u128]) -> Result<Vec<Option<Vec<u8>>>> {
        if hashes.len() < 2 {
            return hashes.iter().map(|h| self.get_vec(model, *h)).collect();
        }
        let keys: Vec<Vec<u8>> = hashes.iter().map(|h| h.to_be_bytes().to_vec()).collect();
        let found: std::collections::HashMap<Vec<u8>, Vec<u8>> = self
            .query(
                "SELECT hash, data FROM vecs WHERE model = $1 AND hash = ANY($2)",
                &[&model, &keys],
            )?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        Ok(keys.iter().map(|k| found.get(k).cloned()).collect())
    }

    fn get_vec(&self, model: &str, hash: u128) -> Result<Option<Vec<u8>>> {
        self.bytes_opt(
            "SELECT data FROM vecs WHERE model = $1 AND hash = $2",
            &[&model, &&hash.to_be_bytes()[..]],
        )
    }

    fn get_scratch(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let (p, n) = split(path);
        self.bytes_opt(
            "SELECT data FROM scratch WHERE account = $1 AND parent = $2 AND name = $3",
            &[&place::account_of(path), &p, &n],
        )
    }

    fn list_scratch(&self, parent: &str) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(self
            .query(
                "SELECT name, data FROM scratch WHERE account = $1 AND parent = $2 ORDER BY name",
                &[&place::account_of(parent), &parent],
            )?
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, Vec<u8>>(1)))
            .collect())
    }

    /// Daemon-wide: every account's expiry times (every daemon hides expired
    /// nodes of every account it serves).
    fn expiries(&self) -> Result<Vec<(String, u64)>> {
        Ok(self
            .query("SELECT path, at_ns FROM expiry /* daemon-wide */", &[])?
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
            .collect())
    }

    /// Daemon-wide: every node of every account, in key order.
    fn scan_nodes(&self, f: &mut dyn FnMut(NodeRec) -> Result<()>) -> Result<()> {
        let mut from = (String::new(), String::new(), String::new());
        loop {
            let rows = self.query(
                "SELECT account, parent, name, rec FROM nodes WHERE (account, parent, name) > ($1, $2, $3) \
                 ORDER BY account, parent, name LIMIT 1000",
                &[&from.0, &from.1, &from.2],
            )?;
            for r in &rows {
                f(decode(&r.get::<_, Vec<u8>>(3))?)?;
            }
            match rows.last() {
                Some(r) if rows.len() == 1000 => from = (r.get(0), r.get(1), r.get(2)),
                _ => return Ok(()),
            }
        }
    }

    fn apply(&self, ops: Vec<Op>, durable: bool) -> Result<()> {
        // This daemon's drafts stay in its local file; the rest is shared.
        let (local, shared): (Vec<Op>, Vec<Op>) = ops
            .into_iter()
            .partition(|o| matches!(o, Op::PutDraft { .. } | Op::DelDraft { .. }));
        if !shared.is_empty() {
            let shard =
                (self.transactions.fetch_add(1, Ordering::Relaxed) % schema::COUNTER_SHARDS) as i16;
            let result = self.run(async {
                let tx = apply::Tx(Some(self.client().await?));
                let c = tx.0.as_ref().expect("set above");
                match apply::transact(c, &shared, durable, &self.origin, shard).await {
                    Ok(()) => {
                        tx.done();
                        Ok(())
                    }
                    Err((e, apply::Ended::Yes)) => {
                        tx.done();
                        Err(e)
                    }
                    Err((e, apply::Ended::No)) => {
                        // Roll back on this connection, or close it (`Tx`).
                        if c.batch_execute("ROLLBACK").await.is_ok() {
                            tx.done();
                        }
                        Err(e)
                    }
                }
            });
            // Committed: the cache holds what was written. Not (a
            // conflict: the row moved): what was read of these paths is no
            // longer to be trusted.
            match &result {
                Ok(()) => self.cache.learn(&shared),
                Err(_) => {
                    let paths: Vec<&str> = shared.iter().filter_map(touched).collect();
                    self.cache.forget(&paths)
                }
            }
            result?;
        }
        // The drafts after the shared state they follow.
        let local: Vec<Op> = {
            let mut held = lock(&self.local_drafts);
            local
                .into_iter()
                .filter(|o| match o {
                    Op::PutDraft { path, .. } => {
                        held.insert(path.clone());
                        true
                    }
                    Op::DelDraft { path } => held.remove(path),
                    _ => true,
                })
                .collect()
        };
        if !local.is_empty() {
            self.local.apply(local, durable)?;
        }
        Ok(())
    }

    fn shared(&self) -> bool {
        true
    }

    fn alloc(&self, key: &str, n: u64) -> Result<u64> {
        if key == crate::schema::counters::EVENT_ID {
            return self.alloc_events(n);
        }
        let rows = self.query(
            "INSERT INTO high_water (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = high_water.value + EXCLUDED.value RETURNING value",
            &[&key, &i(n)],
        )?;
        let last = rows.first().map(|r| r.get::<_, i64>(0) as u64).unwrap_or(n);
        Ok(last + 1 - n)
    }

    fn watch(self: Arc<Self>, f: Box<dyn Fn(Vec<RemoteChange>) + Send + Sync>) -> Result<()> {
        self.follow(f)
    }

    fn leader(&self, role: &str) -> bool {
        self.lead(role)
    }

    fn try_lock_named(&self, name: &str, exclusive: bool) -> Result<bool> {
        let sql = if exclusive {
            "SELECT pg_try_advisory_lock($1)"
        } else {
            "SELECT pg_try_advisory_lock_shared($1)"
        };
        self.session_bool(sql, lock_key(name), None)
    }

    fn unlock_named(&self, name: &str, exclusive: bool) -> Result<()> {
        let sql = if exclusive {
            "SELECT pg_advisory_unlock($1)"
        } else {
            "SELECT pg_advisory_unlock_shared($1)"
        };
        self.session_bool(sql, lock_key(name), None).map(|_| ())
    }

    fn caught_up(&self) -> Result<()> {
        self.wait_for_feed()
    }

    fn maintain_shared(&self) -> Result<()> {
        self.prune_feed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tenancy by construction: every statement on a table of account rows
    /// names `account` (the first column of each of their keys), except the
    /// daemon-wide reads, which say so (`/* daemon-wide */`).
    #[test]
    fn every_statement_on_account_rows_names_the_account() {
        const TABLES: [&str; 9] = [
            "nodes", "dirs", "versions", "blobs", "outbox", "dlq", "ix_docs", "scratch", "expiry",
        ];
        let files = [
            include_str!("mod.rs"),
            include_str!("apply.rs"),
            include_str!("feed.rs"),
            include_str!("session.rs"),
        ];
        let mut checked = 0;
        // Every string literal that is SQL (several lines joined by `\\`).
        for lit in files
            .iter()
            .flat_map(|src| src.split('"').skip(1).step_by(2))
        {
            let sql = lit.replace("\\\n", " ");
            let words: Vec<&str> = sql.split_whitespace().collect();
            let touches = words
                .windows(2)
                .any(|w| matches!(w[0], "FROM" | "INTO" | "UPDATE") && TABLES.contains(&w[1]));
            if !touches {
                continue;
            }
            checked += 1;
            assert!(
                sql.contains("account") || sql.contains("/* daemon-wide */"),
                "a statement on account rows without the account: {sql}"
            );
        }
        assert!(checked >= 40, "only {checked} statements found");
    }

    #[test]
    fn urls_hide_their_password() {
        assert_eq!(
            shown_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(shown_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(place::account_of("acme/users/a"), "acme");
    }
}
