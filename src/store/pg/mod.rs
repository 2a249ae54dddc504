//! The PostgreSQL backend: one namespace served by any number of daemons on
//! any hosts (CONTRACT §9). The tables mirror redb's (docs/ARCHITECTURE.md,
//! "Storage"), each row keyed by path also carrying its `account`; every
//! `apply` is one transaction. What several daemons need beyond the `Store`
//! of one:
//!
//! - **ids** come from `high_water` rows updated in place (`alloc`), so no
//!   two daemons hand out the same node, blob or event id;
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
//! The FUSE threads stay synchronous: each call runs on this store's own
//! tokio runtime (`block_on`), bounded by a timeout, so an unreachable
//! database is `EIO` after at most [`OP_TIMEOUT`], never a hang.

use super::{ChangeKind, NodeRec, Op, RemoteChange, Store, StoredEvent};
use crate::error::{Error, Result};
use crate::locks::lock;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

mod schema;

/// Longest a store call may take before it fails with `EIO`.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// The channel of the change feed's notifications.
const CHANNEL: &str = "ctxfs_changes";
/// Feed rows older than this are pruned (by the leader).
const FEED_KEEP: &str = "1 hour";

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

/// The account a store path belongs to (its first segment).
fn account_of(path: &str) -> &str {
    path.split('/').next().unwrap_or("")
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

/// Node records and directory existence as last read, so the many lookups
/// of one write cost no round trip each. An entry goes when this daemon
/// changes it (after its transaction) or the feed says another did (before
/// the core hears of it); a read that raced a change is not kept (the
/// epoch moved). Commits never trust it: their compare-and-set reads the
/// row in the transaction, and a conflict drops the entry.
#[derive(Default)]
struct Cache {
    epoch: AtomicU64,
    nodes: Mutex<std::collections::HashMap<String, Option<NodeRec>>>,
    dirs: Mutex<std::collections::HashMap<String, bool>>,
}

const CACHE_MAX: usize = 200_000;

impl Cache {
    fn forget(&self, paths: &[&str]) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let mut n = lock(&self.nodes);
        let mut d = lock(&self.dirs);
        for p in paths {
            n.remove(*p);
            d.remove(*p);
        }
    }

    fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        lock(&self.nodes).clear();
        lock(&self.dirs).clear();
    }
}

/// The paths whose cached node record or directory `op` changes.
fn touched(op: &Op) -> Option<&str> {
    match op {
        Op::PutNode { path, .. }
        | Op::DelNode { path }
        | Op::PutDir { path }
        | Op::DelDir { path }
        | Op::Expect { path, .. } => Some(path),
        _ => None,
    }
}

/// Where the feed stands, for `caught_up`.
#[derive(Default)]
struct Feed {
    cursor: Mutex<i64>,
    moved: Condvar,
    running: AtomicBool,
}

/// The session that holds the advisory locks of leadership.
struct Leader {
    client: tokio_postgres::Client,
    held: BTreeSet<String>,
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
    feed: Arc<Feed>,
    leader: Mutex<Option<Leader>>,
    last_try: Mutex<Option<Instant>>,
    stop: Arc<AtomicBool>,
    pruned: AtomicU64,
    cache: Arc<Cache>,
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
            feed: Arc::new(Feed::default()),
            leader: Mutex::new(None),
            last_try: Mutex::new(None),
            stop: Arc::new(AtomicBool::new(false)),
            pruned: AtomicU64::new(0),
            cache: Arc::new(Cache::default()),
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

/// The account of the node changes among `ops` (blob and history changes
/// carry no path: they belong to the node changed with them).
fn node_account(ops: &[Op]) -> Option<&str> {
    ops.iter().find_map(|o| match o {
        Op::PutNode { path, .. } | Op::DelNode { path } | Op::Expect { path, .. } => {
            Some(account_of(path))
        }
        Op::PutVersion { rec } => Some(rec.account()),
        _ => None,
    })
}

/// The account of an outbox event, from its URI (`ctx://ACCOUNT/…`).
fn event_account(json: &[u8]) -> Result<String> {
    let ev = crate::schema::event::OutboxEvent::decode(json)
        .map_err(|e| Error::store(format!("an outbox event does not parse: {e}")))?;
    Ok(ev
        .uri
        .strip_prefix("ctx://")
        .and_then(|r| r.split('/').next())
        .unwrap_or("")
        .to_string())
}

/// Run one statement of `t`.
async fn exec(
    t: &deadpool_postgres::Transaction<'_>,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<u64> {
    let st = t.prepare_cached(sql).await.map_err(pe)?;
    t.execute(&st, params).await.map_err(pe)
}

/// Apply `ops` in transaction `t`; the changes other daemons must hear of.
/// Every statement on an account's rows names the account first: it is the
/// first column of every key of those tables.
async fn apply_ops(
    t: &deadpool_postgres::Transaction<'_>,
    ops: &[Op],
    changes: &mut BTreeSet<(String, String, &'static str)>,
) -> Result<()> {
    let mut feed = |path: &str, kind: &'static str| {
        changes.insert((account_of(path).to_string(), path.to_string(), kind));
    };
    let owner = node_account(ops).map(str::to_string);
    let owner_of = |what: &str| {
        owner
            .clone()
            .ok_or_else(|| Error::store(format!("{what} without the node change it belongs to")))
    };
    for op in ops {
        match op {
            Op::Expect { path, version } => {
                let (p, n) = split(path);
                let st = t
                    .prepare_cached(
                        "SELECT rec FROM nodes WHERE account = $1 AND parent = $2 AND name = $3 FOR UPDATE",
                    )
                    .await
                    .map_err(pe)?;
                let rows = t
                    .query(&st, &[&account_of(path), &p, &n])
                    .await
                    .map_err(pe)?;
                let now = match rows.first() {
                    Some(r) => Some(decode(&r.get::<_, Vec<u8>>(0))?.version),
                    None => None,
                };
                if now != *version {
                    return Err(Error::Conflict(format!(
                        "{path} is at version {} on the store, this commit was planned on {}",
                        now.map(|v| v.to_string()).unwrap_or_else(|| "none".into()),
                        version
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| "none".into())
                    )));
                }
            }
            Op::PutNode { path, rec } => {
                let (p, n) = split(path);
                exec(
                    t,
                    "INSERT INTO nodes (account, parent, name, rec) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (account, parent, name) DO UPDATE SET rec = EXCLUDED.rec",
                    &[&account_of(path), &p, &n, &encode(rec)?],
                )
                .await?;
                feed(path, "node");
            }
            Op::DelNode { path } => {
                let (p, n) = split(path);
                exec(
                    t,
                    "DELETE FROM nodes WHERE account = $1 AND parent = $2 AND name = $3",
                    &[&account_of(path), &p, &n],
                )
                .await?;
                feed(path, "node");
            }
            Op::PutDir { path } => {
                let (p, n) = split(path);
                let made = exec(
                    t,
                    "INSERT INTO dirs (account, parent, name) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    &[&account_of(path), &p, &n],
                )
                .await?;
                if made > 0 {
                    feed(path, "dir");
                }
            }
            Op::DelDir { path } => {
                let (p, n) = split(path);
                exec(
                    t,
                    "DELETE FROM dirs WHERE account = $1 AND parent = $2 AND name = $3",
                    &[&account_of(path), &p, &n],
                )
                .await?;
                feed(path, "dir");
            }
            Op::PutVersion { rec } => {
                exec(
                    t,
                    "INSERT INTO versions (account, node_id, version, rec) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (account, node_id, version) DO UPDATE SET rec = EXCLUDED.rec",
                    &[&rec.account(), &i(rec.id), &(rec.version as i32), &encode(rec)?],
                )
                .await?;
            }
            Op::DropHistory { node_id } => {
                let account = owner_of("a history dropped")?;
                let st = t
                    .prepare_cached(
                        "DELETE FROM versions WHERE account = $1 AND node_id = $2 RETURNING rec",
                    )
                    .await
                    .map_err(pe)?;
                let mut blobs = Vec::new();
                for r in t.query(&st, &[&account, &i(*node_id)]).await.map_err(pe)? {
                    blobs.extend(
                        decode(&r.get::<_, Vec<u8>>(0))?
                            .files
                            .iter()
                            .map(|f| f.blob as i64),
                    );
                }
                blobs.sort_unstable();
                blobs.dedup();
                exec(
                    t,
                    "DELETE FROM blobs WHERE account = $1 AND id = ANY($2)",
                    &[&account, &blobs],
                )
                .await?;
            }
            Op::DelBlob { id } => {
                let account = owner_of("a blob deleted")?;
                exec(
                    t,
                    "DELETE FROM blobs WHERE account = $1 AND id = $2",
                    &[&account, &i(*id)],
                )
                .await?;
            }
            Op::PutBlob { .. } => {
                return Err(Error::store(
                    "a blob without its account (written by an older ctxfs) cannot go to a shared store",
                ));
            }
            Op::PutBlobOf { account, id, data } => {
                exec(
                    t,
                    "INSERT INTO blobs (account, id, data) VALUES ($1, $2, $3) \
                     ON CONFLICT (account, id) DO UPDATE SET data = EXCLUDED.data",
                    &[account, &i(*id), &&data[..]],
                )
                .await?;
            }
            Op::PutEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                let made = exec(
                    t,
                    "INSERT INTO outbox (account, seq, node_path, json) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    &[account, &i(*seq), node_path, json],
                )
                .await?;
                if made > 0 {
                    count(t, &crate::schema::counters::outbox_key(account), 1).await?;
                }
            }
            Op::DoneEvent { seq, account, .. } => {
                if exec(
                    t,
                    "DELETE FROM outbox WHERE account = $1 AND seq = $2",
                    &[account, &i(*seq)],
                )
                .await?
                    > 0
                {
                    count(t, &crate::schema::counters::outbox_key(account), -1).await?;
                }
            }
            Op::UpdateEvent { seq, json } => {
                let account = event_account(json)?;
                exec(
                    t,
                    "UPDATE outbox SET json = $3 WHERE account = $1 AND seq = $2",
                    &[&account, &i(*seq), json],
                )
                .await?;
            }
            Op::DeadEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                if exec(
                    t,
                    "DELETE FROM outbox WHERE account = $1 AND seq = $2",
                    &[account, &i(*seq)],
                )
                .await?
                    > 0
                {
                    count(t, &crate::schema::counters::outbox_key(account), -1).await?;
                }
                let made = exec(
                    t,
                    "INSERT INTO dlq (account, seq, node_path, json) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    &[account, &i(*seq), node_path, json],
                )
                .await?;
                if made > 0 {
                    count(t, &crate::schema::counters::dlq_key(account), 1).await?;
                }
            }
            Op::ReviveEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                if exec(
                    t,
                    "DELETE FROM dlq WHERE account = $1 AND seq = $2",
                    &[account, &i(*seq)],
                )
                .await?
                    > 0
                {
                    count(t, &crate::schema::counters::dlq_key(account), -1).await?;
                }
                let made = exec(
                    t,
                    "INSERT INTO outbox (account, seq, node_path, json) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    &[account, &i(*seq), node_path, json],
                )
                .await?;
                if made > 0 {
                    count(t, &crate::schema::counters::outbox_key(account), 1).await?;
                }
            }
            Op::DropDead { seq, account, .. } => {
                if exec(
                    t,
                    "DELETE FROM dlq WHERE account = $1 AND seq = $2",
                    &[account, &i(*seq)],
                )
                .await?
                    > 0
                {
                    count(t, &crate::schema::counters::dlq_key(account), -1).await?;
                }
            }
            Op::PutScratch { path, data } => {
                let (p, n) = split(path);
                exec(
                    t,
                    "INSERT INTO scratch (account, parent, name, data) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (account, parent, name) DO UPDATE SET data = EXCLUDED.data",
                    &[&account_of(path), &p, &n, data],
                )
                .await?;
                feed(path, "scratch");
            }
            Op::DelScratch { path } => {
                let (p, n) = split(path);
                exec(
                    t,
                    "DELETE FROM scratch WHERE account = $1 AND parent = $2 AND name = $3",
                    &[&account_of(path), &p, &n],
                )
                .await?;
                feed(path, "scratch");
            }
            Op::AppendLog {
                path,
                data,
                mode,
                mtime_ns,
            } => {
                let (p, n) = split(path);
                let a = account_of(path);
                // The row first (an empty log), so that two daemons' first
                // appends meet on its lock rather than both inserting.
                let empty = super::ScratchRec::appended(None, &[], *mode, *mtime_ns)?;
                exec(
                    t,
                    "INSERT INTO scratch (account, parent, name, data) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (account, parent, name) DO NOTHING",
                    &[&a, &p, &n, &empty],
                )
                .await?;
                let st = t
                    .prepare_cached(
                        "SELECT data FROM scratch WHERE account = $1 AND parent = $2 AND name = $3 FOR UPDATE",
                    )
                    .await
                    .map_err(pe)?;
                let old: Option<Vec<u8>> = t
                    .query(&st, &[&a, &p, &n])
                    .await
                    .map_err(pe)?
                    .first()
                    .map(|r| r.get(0));
                let rec = super::ScratchRec::appended(old.as_deref(), data, *mode, *mtime_ns)?;
                exec(
                    t,
                    "UPDATE scratch SET data = $4 WHERE account = $1 AND parent = $2 AND name = $3",
                    &[&a, &p, &n, &rec],
                )
                .await?;
                feed(path, "scratch");
            }
            Op::PutExpiry { path, at_ns } => {
                exec(
                    t,
                    "INSERT INTO expiry (account, path, at_ns) VALUES ($1, $2, $3) \
                     ON CONFLICT (account, path) DO UPDATE SET at_ns = EXCLUDED.at_ns",
                    &[&account_of(path), path, &i(*at_ns)],
                )
                .await?;
                feed(path, "expiry");
            }
            Op::DelExpiry { path } => {
                exec(
                    t,
                    "DELETE FROM expiry WHERE account = $1 AND path = $2",
                    &[&account_of(path), path],
                )
                .await?;
                feed(path, "expiry");
            }
            Op::PutIx { path, data } => {
                exec(
                    t,
                    "INSERT INTO ix_docs (account, path, data) VALUES ($1, $2, $3) \
                     ON CONFLICT (account, path) DO UPDATE SET data = EXCLUDED.data",
                    &[&account_of(path), path, data],
                )
                .await?;
                feed(path, "ix");
            }
            Op::DelIx { path } => {
                exec(
                    t,
                    "DELETE FROM ix_docs WHERE account = $1 AND path = $2",
                    &[&account_of(path), path],
                )
                .await?;
                feed(path, "ix");
            }
            // The embedding cache is content-addressed (model, hash of the
            // text) and shared: it holds no path and no text.
            Op::PutVec { model, hash, data } => {
                exec(
                    t,
                    "INSERT INTO vecs (model, hash, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    &[model, &&hash.to_be_bytes()[..], data],
                )
                .await?;
            }
            Op::DelVec { model, hash } => {
                exec(
                    t,
                    "DELETE FROM vecs WHERE model = $1 AND hash = $2",
                    &[model, &&hash.to_be_bytes()[..]],
                )
                .await?;
            }
            Op::PutDraft { .. } | Op::DelDraft { .. } => {}
            Op::Count { key, delta } => count(t, key, *delta).await?,
            Op::HighWater { key, value } => {
                exec(
                    t,
                    "INSERT INTO high_water (key, value) VALUES ($1, $2) \
                     ON CONFLICT (key) DO UPDATE SET value = GREATEST(high_water.value, EXCLUDED.value)",
                    &[key, &i(*value)],
                )
                .await?;
            }
        }
    }
    Ok(())
}

async fn count(t: &deadpool_postgres::Transaction<'_>, key: &str, delta: i64) -> Result<()> {
    let st = t
        .prepare_cached(
            "INSERT INTO counters (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = counters.value + EXCLUDED.value",
        )
        .await
        .map_err(pe)?;
    t.execute(&st, &[&key, &delta]).await.map_err(pe)?;
    Ok(())
}

fn kind_of(s: &str) -> Option<ChangeKind> {
    Some(match s {
        "node" => ChangeKind::Node,
        "dir" => ChangeKind::Dir,
        "scratch" => ChangeKind::Scratch,
        "ix" => ChangeKind::Ix,
        "expiry" => ChangeKind::Expiry,
        _ => return None,
    })
}

impl PgStore {
    /// Follow the change feed: LISTEN, then read every row past the cursor
    /// (at each notification, and every second in case one was missed or
    /// the connection was lost), handing other daemons' changes to `f`.
    fn follow(self: &Arc<Self>, f: Box<dyn Fn(Vec<RemoteChange>) + Send + Sync>) -> Result<()> {
        let start: i64 = self
            .query("SELECT COALESCE(MAX(seq), 0) FROM changes", &[])?
            .first()
            .map(|r| r.get(0))
            .unwrap_or(0);
        *lock(&self.feed.cursor) = start;
        self.feed.running.store(true, Ordering::SeqCst);
        // The core's handler calls back into this store (blocking on its
        // runtime), so it runs on a thread of its own; the feed's cursor
        // moves once a batch is applied (what `caught_up` waits for).
        let (tx, rx) = std::sync::mpsc::channel::<(Vec<RemoteChange>, i64)>();
        let applied = self.feed.clone();
        std::thread::Builder::new()
            .name("ctxfs-feed".into())
            .spawn(move || {
                for (changes, last) in rx {
                    if !changes.is_empty() {
                        f(changes);
                    }
                    let mut c = lock(&applied.cursor);
                    *c = (*c).max(last);
                    applied.moved.notify_all();
                }
            })
            .map_err(|e| Error::store_from("cannot start the change feed thread", e))?;
        let (pg, origin, stop) = (self.pg.clone(), self.origin.clone(), self.stop.clone());
        let cache = self.cache.clone();
        let url = self.url.clone();
        self.rt.spawn(async move {
            let mut read_to = start;
            let mut first = true;
            while !stop.load(Ordering::SeqCst) {
                if !first {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                first = false;
                let (client, mut conn) = match pg.connect(NoTls).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(url = %url, "change feed: cannot connect: {e}");
                        continue;
                    }
                };
                let wake = Arc::new(tokio::sync::Notify::new());
                let w = wake.clone();
                let driver = tokio::spawn(async move {
                    loop {
                        match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                            Some(Ok(tokio_postgres::AsyncMessage::Notification(_))) => w.notify_one(),
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => {
                                w.notify_one();
                                break;
                            }
                        }
                    }
                });
                if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                    tracing::warn!("change feed: LISTEN failed: {e}");
                    driver.abort();
                    continue;
                }
                tracing::info!("change feed: listening");
                loop {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let cursor = read_to;
                    let rows = match client
                        .query(
                            "SELECT seq, origin, path, kind, (SELECT MIN(seq) FROM changes) FROM changes \
                             WHERE seq > $1 ORDER BY seq LIMIT 2000",
                            &[&cursor],
                        )
                        .await
                    {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::warn!("change feed: read failed, reconnecting: {e}");
                            break;
                        }
                    };
                    let mut out = Vec::new();
                    let mut last = cursor;
                    for r in &rows {
                        let seq: i64 = r.get(0);
                        if last == cursor {
                            let min: Option<i64> = r.get(4);
                            if min.is_some_and(|m| m > cursor + 1) && cursor > 0 {
                                // Rows this daemon never read were pruned:
                                // everything it caches may be stale.
                                out.push(RemoteChange { kind: ChangeKind::Reset, path: String::new() });
                            }
                        }
                        last = seq;
                        let o: &str = r.get(1);
                        if o == origin {
                            continue;
                        }
                        if let Some(kind) = kind_of(r.get(3)) {
                            out.push(RemoteChange { kind, path: r.get::<_, String>(2) });
                        }
                    }
                    if last != cursor {
                        read_to = last;
                        if out.iter().any(|c| c.kind == ChangeKind::Reset) {
                            cache.clear();
                        } else {
                            let paths: Vec<&str> = out
                                .iter()
                                .filter(|c| matches!(c.kind, ChangeKind::Node | ChangeKind::Dir))
                                .map(|c| c.path.as_str())
                                .collect();
                            cache.forget(&paths);
                        }
                        if tx.send((out, last)).is_err() {
                            return;
                        }
                    }
                    if rows.len() == 2000 {
                        continue;
                    }
                    if driver.is_finished() {
                        break;
                    }
                    let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
                }
                driver.abort();
            }
        });
        Ok(())
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
            &[&account_of(path), &p, &n],
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
            &[&account_of(parent), &parent],
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
                &[&account_of(parent), &parent],
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
                &[&account_of(path), &p, &n],
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
                &[&account_of(parent), &parent],
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
            return Err(Error::store(format!(
                "blob {id} of {account} has {} bytes, its record says {size}",
                b.len()
            )));
        }
        Ok(b)
    }

    fn node_events(&self, node_path: &str) -> Result<Vec<StoredEvent>> {
        Ok(self
            .query(
                "SELECT seq, json FROM outbox WHERE account = $1 AND node_path = $2 ORDER BY seq",
                &[&account_of(node_path), &node_path],
            )?
            .iter()
            .map(|r| StoredEvent {
                seq: r.get::<_, i64>(0) as u64,
                json: r.get(1),
            })
            .collect())
    }

    fn drafts(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.local.drafts()
    }

    fn counter(&self, key: &str) -> Result<i64> {
        Ok(self
            .query("SELECT value FROM counters WHERE key = $1", &[&key])?
            .first()
            .map(|r| r.get(0))
            .unwrap_or(0))
    }

    fn high_water(&self, key: &str) -> Result<u64> {
        Ok(self
            .query("SELECT value FROM high_water WHERE key = $1", &[&key])?
            .first()
            .map(|r| r.get::<_, i64>(0) as u64)
            .unwrap_or(0))
    }

    /// The daemon-wide head of the outbox (every account's events, for the
    /// one indexer of the cluster).
    fn outbox_head(&self, limit: usize) -> Result<Vec<StoredEvent>> {
        Ok(self
            .query(
                "SELECT seq, json FROM outbox /* daemon-wide */ ORDER BY seq LIMIT $1",
                &[&(limit as i64)],
            )?
            .iter()
            .map(|r| StoredEvent {
                seq: r.get::<_, i64>(0) as u64,
                json: r.get(1),
            })
            .collect())
    }

    fn dead_events(&self, node_path: &str) -> Result<Vec<StoredEvent>> {
        Ok(self
            .query(
                "SELECT seq, json FROM dlq WHERE account = $1 AND node_path = $2 ORDER BY seq",
                &[&account_of(node_path), &node_path],
            )?
            .iter()
            .map(|r| StoredEvent {
                seq: r.get::<_, i64>(0) as u64,
                json: r.get(1),
            })
            .collect())
    }

    fn get_ix(&self, path: &str) -> Result<Option<Vec<u8>>> {
        self.bytes_opt(
            "SELECT data FROM ix_docs WHERE account = $1 AND path = $2",
            &[&account_of(path), &path],
        )
    }

    fn scan_ix(&self, prefix: &str, f: &mut dyn FnMut(&str, &[u8]) -> Result<()>) -> Result<()> {
        // Paths are ASCII: every path starting with `prefix` sorts below
        // prefix + DEL. An account's documents are read with its name; only
        // the daemon-wide scan (prefix "") reads every account's.
        let hi = format!("{prefix}\u{7f}");
        let account = account_of(prefix).to_string();
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
            &[&account_of(path), &p, &n],
        )
    }

    fn list_scratch(&self, parent: &str) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(self
            .query(
                "SELECT name, data FROM scratch WHERE account = $1 AND parent = $2 ORDER BY name",
                &[&account_of(parent), &parent],
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
        let shared: Vec<&Op> = ops
            .iter()
            .filter(|o| !matches!(o, Op::PutDraft { .. } | Op::DelDraft { .. }))
            .collect();
        if !shared.is_empty() {
            let origin = self.origin.clone();
            let paths: Vec<&str> = shared.iter().filter_map(|o| touched(o)).collect();
            let result = self.run(async {
                let mut c = self.client().await?;
                let t = c.transaction().await.map_err(pe)?;
                if !durable {
                    t.batch_execute("SET LOCAL synchronous_commit = off")
                        .await
                        .map_err(pe)?;
                }
                let mut changes = BTreeSet::new();
                let owned: Vec<Op> = shared.iter().map(|o| (*o).clone()).collect();
                apply_ops(&t, &owned, &mut changes).await?;
                if !changes.is_empty() {
                    let (mut accts, mut paths, mut kinds) = (Vec::new(), Vec::new(), Vec::new());
                    for (a, p, k) in changes {
                        accts.push(a);
                        paths.push(p);
                        kinds.push(k.to_string());
                    }
                    let st = t
                        .prepare_cached(
                            "INSERT INTO changes (origin, account, path, kind) \
                             SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[])",
                        )
                        .await
                        .map_err(pe)?;
                    t.execute(&st, &[&origin, &accts, &paths, &kinds])
                        .await
                        .map_err(pe)?;
                    t.batch_execute(&format!("NOTIFY {CHANNEL}"))
                        .await
                        .map_err(pe)?;
                }
                t.commit().await.map_err(pe)
            });
            // Committed or not (a conflict: the row moved), what was read
            // of these paths is no longer to be trusted.
            self.cache.forget(&paths);
            result?;
        }
        // This daemon's drafts, after the shared state they follow.
        let local: Vec<Op> = ops
            .into_iter()
            .filter(|o| matches!(o, Op::PutDraft { .. } | Op::DelDraft { .. }))
            .collect();
        if !local.is_empty() {
            self.local.apply(local, durable)?;
        }
        Ok(())
    }

    fn shared(&self) -> bool {
        true
    }

    fn alloc(&self, key: &str, n: u64) -> Result<u64> {
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
        let mut g = lock(&self.leader);
        if let Some(l) = g.as_ref() {
            if l.client.is_closed() {
                tracing::warn!("lost the leadership session; roles held: {:?}", l.held);
                *g = None;
            } else if l.held.contains(role) {
                return true;
            }
        }
        // Try at most once a second per daemon.
        {
            let mut t = lock(&self.last_try);
            if t.is_some_and(|t| t.elapsed() < Duration::from_secs(1))
                && g.as_ref().is_none_or(|l| !l.held.contains(role))
            {
                return false;
            }
            *t = Some(Instant::now());
        }
        let pg = self.pg.clone();
        let res: Result<bool> = self.run(async {
            if g.is_none() {
                *g = Some(connect_session(&pg).await?);
            }
            let l = g.as_mut().expect("set above");
            let key = leader_key(role);
            let row = l
                .client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
                .await
                .map_err(pe)?;
            let got: bool = row.get(0);
            if got {
                l.held.insert(role.to_string());
            }
            Ok(got)
        });
        match res {
            Ok(true) => {
                tracing::info!(role, "this daemon leads");
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(role, "leadership: {e}");
                *g = None;
                false
            }
        }
    }

    fn try_lock_named(&self, name: &str, exclusive: bool) -> Result<bool> {
        let sql = if exclusive {
            "SELECT pg_try_advisory_lock($1)"
        } else {
            "SELECT pg_try_advisory_lock_shared($1)"
        };
        self.session_bool(sql, lock_key(name))
    }

    fn unlock_named(&self, name: &str, exclusive: bool) -> Result<()> {
        let sql = if exclusive {
            "SELECT pg_advisory_unlock($1)"
        } else {
            "SELECT pg_advisory_unlock_shared($1)"
        };
        self.session_bool(sql, lock_key(name)).map(|_| ())
    }

    fn caught_up(&self) -> Result<()> {
        if !self.feed.running.load(Ordering::SeqCst) {
            return Ok(());
        }
        let target: i64 = self
            .query("SELECT COALESCE(MAX(seq), 0) FROM changes", &[])?
            .first()
            .map(|r| r.get(0))
            .unwrap_or(0);
        let deadline = Instant::now() + OP_TIMEOUT;
        let mut c = lock(&self.feed.cursor);
        while *c < target {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::TimedOut);
            }
            c = self
                .feed
                .moved
                .wait_timeout(c, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        Ok(())
    }

    fn maintain_shared(&self) -> Result<()> {
        // Prune old feed rows once a minute (the leader of "feed").
        let now = crate::schema::time::now_ns() as u64 / 1_000_000_000;
        let last = self.pruned.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 60 || !self.leader("feed") {
            return Ok(());
        }
        self.pruned.store(now, Ordering::Relaxed);
        self.query(
            &format!("DELETE FROM changes WHERE at < now() - interval '{FEED_KEEP}'"),
            &[],
        )?;
        // Search counts of minutes gone (`counters::searches_key`).
        let minute = (now / 60) as i64;
        self.query(
            "DELETE FROM high_water WHERE key LIKE $1 AND split_part(key, ':', 3)::bigint < $2",
            &[
                &format!("{}%", crate::schema::counters::SEARCHES_PREFIX),
                &(minute - 1),
            ],
        )?;
        Ok(())
    }
}

/// The advisory lock key of a `flock` lock.
fn lock_key(name: &str) -> i64 {
    xxhash_rust::xxh3::xxh3_64(format!("ctxfs-flock:{name}").as_bytes()) as i64
}

impl PgStore {
    /// Run a one-boolean query on the session that holds this daemon's
    /// advisory locks (leadership and `flock`s), connecting it if needed.
    fn session_bool(&self, sql: &str, key: i64) -> Result<bool> {
        let mut g = lock(&self.leader);
        if g.as_ref().is_some_and(|l| l.client.is_closed()) {
            tracing::warn!("the lock session was lost: its locks are gone");
            *g = None;
        }
        let pg = self.pg.clone();
        let res = self.run(async {
            if g.is_none() {
                *g = Some(connect_session(&pg).await?);
            }
            let l = g.as_ref().expect("set above");
            let row = l.client.query_one(sql, &[&key]).await.map_err(pe)?;
            Ok(row.get::<_, bool>(0))
        });
        if res.is_err() {
            *g = None;
        }
        res
    }
}

async fn connect_session(pg: &tokio_postgres::Config) -> Result<Leader> {
    let (client, conn) = pg.connect(NoTls).await.map_err(pe)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    // Let the server notice a dead daemon within about 25 s.
    client
        .batch_execute(
            "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3",
        )
        .await
        .map_err(pe)?;
    Ok(Leader {
        client,
        held: BTreeSet::new(),
    })
}

/// The advisory lock key of a leadership role.
fn leader_key(role: &str) -> i64 {
    let h = xxhash_rust::xxh3::xxh3_64(format!("ctxfs-leader:{role}").as_bytes());
    h as i64
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
        let src = include_str!("mod.rs");
        let mut checked = 0;
        // Every string literal that is SQL (several lines joined by `\`).
        for lit in src.split('"').skip(1).step_by(2) {
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
        assert_eq!(account_of("acme/users/a"), "acme");
    }
}
