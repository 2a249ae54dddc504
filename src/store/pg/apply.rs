//! One `Store::apply` on PostgreSQL: every op as the statements of one
//! transaction. Every statement on an account's rows names the account
//! first: it is the first column of every key of those tables.

use super::{decode, encode, i, pe, split};
use crate::error::{Error, Result};
use crate::schema::place::account_of;
use crate::store::{Op, EVENT_PLACEHOLDER};
use std::collections::BTreeSet;
use tokio_postgres::error::SqlState;

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

/// The account of an outbox event, from its URI (`ctx://ACCOUNT/…`). Only
/// the URI is read: the payload may be sealed (`store::seal`).
fn event_account(json: &[u8]) -> Result<String> {
    #[derive(serde::Deserialize)]
    struct Uri {
        uri: String,
    }
    let ev: Uri = serde_json::from_slice(json)
        .map_err(|e| Error::store(format!("an outbox event does not parse: {e}")))?;
    Ok(ev
        .uri
        .strip_prefix("ctx://")
        .map(account_of)
        .unwrap_or("")
        .to_string())
}

/// The id counters `alloc` hands out on a shared store.
const ALLOCATED: [&str; 3] = [
    crate::schema::counters::NODE_ID,
    crate::schema::counters::BLOB_ID,
    crate::schema::counters::EVENT_ID,
];

type Param = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;

struct Stmt {
    sql: &'static str,
    params: Vec<Param>,
    /// Sent as a simple query (`BEGIN`, `COMMIT`): no parameters, not prepared.
    simple: bool,
}

/// Statements sent together: tokio-postgres writes every request of
/// futures polled together before it reads the first answer, so a whole
/// transaction costs one round trip, not one a statement. Their order is
/// kept (the server runs them in the order sent), and nothing of a
/// transaction is decided by the client between them: a compare-and-set
/// that fails raises an error in the server (`ctxfs_expect`), so the
/// `COMMIT` sent with them rolls back.
#[derive(Default)]
pub(super) struct Pipeline {
    stmts: Vec<Stmt>,
    /// Round trips sent so far (the first holds `BEGIN`).
    sent: usize,
}

impl Pipeline {
    fn push(&mut self, sql: &'static str, params: Vec<Param>) {
        self.stmts.push(Stmt {
            sql,
            params,
            simple: false,
        });
    }

    fn simple(&mut self, sql: &'static str) {
        self.stmts.push(Stmt {
            sql,
            params: Vec::new(),
            simple: true,
        });
    }

    /// Run what is queued, in order, in one round trip (and one more for
    /// statements this connection has not prepared yet). Every answer is
    /// read; the first error is the outcome.
    pub(super) async fn flush(&mut self, c: &deadpool_postgres::ClientWrapper) -> Result<()> {
        if self.stmts.is_empty() {
            return Ok(());
        }
        let stmts = std::mem::take(&mut self.stmts);
        let mut sqls: Vec<&'static str> =
            stmts.iter().filter(|s| !s.simple).map(|s| s.sql).collect();
        sqls.sort_unstable();
        sqls.dedup();
        let prepared = futures_util::future::try_join_all(sqls.iter().map(|q| c.prepare_cached(q)))
            .await
            .map_err(pe)?;
        let by_sql: std::collections::HashMap<&str, &tokio_postgres::Statement> =
            sqls.iter().copied().zip(prepared.iter()).collect();
        self.sent += 1;
        let runs = stmts.iter().map(|s| {
            let st = by_sql.get(s.sql).copied();
            async move {
                let Some(st) = st else {
                    return c.batch_execute(s.sql).await;
                };
                let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = s
                    .params
                    .iter()
                    .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
                    .collect();
                c.execute(st, &refs).await.map(|_| ())
            }
        });
        // Every answer is awaited (none is left for the connection's next
        // user), and the first failure in statement order is the outcome:
        // the statements after it only say the transaction was aborted.
        let outs = futures_util::future::join_all(runs).await;
        match outs.into_iter().find_map(|r| r.err()) {
            Some(e) => Err(tx_error(e)),
            None => Ok(()),
        }
    }
}

/// A failed statement of a transaction. A compare-and-set that failed
/// (`ctxfs_expect`) is a conflict: the commit is planned again. So is an
/// outbox event id taken twice (which the sequence should make
/// impossible), rather than an event lost.
fn tx_error(e: tokio_postgres::Error) -> Error {
    if let Some(d) = e.as_db_error() {
        if d.code().code() == super::schema::CONFLICT {
            return Error::Conflict(d.message().to_string());
        }
        if d.code() == &SqlState::UNIQUE_VIOLATION && d.constraint() == Some("outbox_pkey") {
            return Error::Conflict("an outbox event id is taken already".into());
        }
    }
    pe(e)
}

/// Apply `ops` as one transaction on `c`, in one round trip (two when an
/// op reads before it writes), and tell the other daemons what changed:
/// `BEGIN`, every write, the compare-and-sets (checked in the server),
/// the change feed's rows, the `NOTIFY` and `COMMIT` go together. A
/// commit's events take their ids from the sequence in their own insert,
/// after the compare-and-set locked the node row, so a node's events keep
/// the order of its versions; a directory feeds its change only if it is
/// new (the statement inserts the feed row itself).
///
/// On an error the caller must not give the connection back as it is
/// (`Tx`).
pub(super) async fn transact(
    c: &deadpool_postgres::ClientWrapper,
    ops: &[Op],
    durable: bool,
    origin: &str,
    shard: i16,
) -> std::result::Result<(), (Error, Ended)> {
    let mut pl = Pipeline::default();
    pl.simple(if durable {
        "BEGIN"
    } else {
        "BEGIN; SET LOCAL synchronous_commit = off"
    });
    let mut changes = BTreeSet::new();
    // A failure before the last round trip leaves the transaction open.
    let mut notify = apply_ops(c, &mut pl, ops, shard, origin, &mut changes)
        .await
        .map_err(|e| (e, Ended::No))?;
    if !changes.is_empty() {
        let (mut accts, mut paths, mut kinds) = (Vec::new(), Vec::new(), Vec::new());
        for (a, p, k) in changes {
            accts.push(a);
            paths.push(p);
            kinds.push(k.to_string());
        }
        pl.push(
            "INSERT INTO changes (origin, account, path, kind) \
             SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[])",
            vec![s(origin), Box::new(accts), Box::new(paths), Box::new(kinds)],
        );
        notify = true;
    }
    if notify {
        // The payload names who changed: a daemon is not woken by its own.
        pl.push(
            "SELECT pg_notify($1, $2)",
            vec![s(super::CHANNEL), s(origin)],
        );
    }
    pl.simple("COMMIT");
    let before = pl.sent;
    pl.flush(c).await.map_err(|e| {
        // Sent with the `COMMIT`, a failure ended the transaction (rolled
        // back); not sent, it left open what an earlier round trip began.
        let ended = pl.sent > before || before == 0;
        (e, if ended { Ended::Yes } else { Ended::No })
    })
}

/// Whether a failed transaction has ended (its `COMMIT` was sent and
/// rolled it back) or is still open on the connection.
pub(super) enum Ended {
    Yes,
    No,
}

/// A connection inside a transaction: if it is dropped before the
/// transaction ended (an error, a timeout), the connection is closed rather
/// than given back to the pool, and the server rolls the transaction back.
pub(super) struct Tx(pub(super) Option<deadpool_postgres::Client>);

impl Tx {
    /// The transaction ended (committed or rolled back): the connection
    /// may serve again.
    pub(super) fn done(mut self) {
        self.0.take();
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            drop(deadpool_postgres::Client::take(c));
        }
    }
}

fn s(v: &str) -> Param {
    Box::new(v.to_string())
}

fn n(v: u64) -> Param {
    Box::new(i(v))
}

fn b(v: &[u8]) -> Param {
    Box::new(v.to_vec())
}

/// How a table's rows are keyed after the account: by a path's parent and
/// name (`$1`–`$3` of the statement), or by the whole path (`$1`–`$2`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum By {
    Path,
    Key,
}

/// An op that is one statement on one keyed row: the statement, the
/// parameters after the key, and the kind of change other daemons hear
/// of (`None`: nothing to tell).
struct Keyed<'a> {
    by: By,
    sql: &'static str,
    path: &'a str,
    more: Vec<Param>,
    feed: Option<&'static str>,
}

/// The statement of an op on one keyed row; `None` for the ops
/// `apply_ops` queues itself (those that read first, batch rows, or carry
/// no path).
fn keyed(op: &Op) -> Result<Option<Keyed<'_>>> {
    fn k<'a>(
        by: By,
        sql: &'static str,
        path: &'a str,
        more: Vec<Param>,
        feed: Option<&'static str>,
    ) -> Option<Keyed<'a>> {
        Some(Keyed {
            by,
            sql,
            path,
            more,
            feed,
        })
    }
    Ok(match op {
        // Locks the node row and raises `schema::CONFLICT` unless the node
        // is at `version` (none: it must not exist).
        Op::Expect { path, version } => k(
            By::Path,
            "SELECT ctxfs_expect($1, $2, $3, $4) /* account */",
            path,
            vec![Box::new(version.map(|v| v as i32))],
            None,
        ),
        Op::PutNode { path, rec } => k(
            By::Path,
            "INSERT INTO nodes (account, parent, name, rec, version) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (account, parent, name) DO UPDATE SET rec = EXCLUDED.rec, version = EXCLUDED.version",
            path,
            vec![Box::new(encode(rec)?), Box::new(rec.version as i32)],
            Some("node"),
        ),
        Op::DelNode { path } => k(
            By::Path,
            "DELETE FROM nodes WHERE account = $1 AND parent = $2 AND name = $3",
            path,
            vec![],
            Some("node"),
        ),
        Op::PutScratch { path, data } => k(
            By::Path,
            "INSERT INTO scratch (account, parent, name, data) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (account, parent, name) DO UPDATE SET data = EXCLUDED.data",
            path,
            vec![b(data)],
            Some("scratch"),
        ),
        Op::DelScratch { path } => k(
            By::Path,
            "DELETE FROM scratch WHERE account = $1 AND parent = $2 AND name = $3",
            path,
            vec![],
            Some("scratch"),
        ),
        Op::PutExpiry { path, at_ns } => k(
            By::Key,
            "INSERT INTO expiry (account, path, at_ns) VALUES ($1, $2, $3) \
             ON CONFLICT (account, path) DO UPDATE SET at_ns = EXCLUDED.at_ns",
            path,
            vec![n(*at_ns)],
            Some("expiry"),
        ),
        Op::DelExpiry { path } => k(
            By::Key,
            "DELETE FROM expiry WHERE account = $1 AND path = $2",
            path,
            vec![],
            Some("expiry"),
        ),
        Op::PutIx { path, data } => k(
            By::Key,
            "INSERT INTO ix_docs (account, path, data) VALUES ($1, $2, $3) \
             ON CONFLICT (account, path) DO UPDATE SET data = EXCLUDED.data",
            path,
            vec![b(data)],
            Some("ix"),
        ),
        Op::DelIx { path } => k(
            By::Key,
            "DELETE FROM ix_docs WHERE account = $1 AND path = $2",
            path,
            vec![],
            Some("ix"),
        ),
        _ => None,
    })
}

/// Queue `ops` on `pl`; the changes other daemons must hear of go to
/// `changes`, and the answer says whether a `NOTIFY` is due even without
/// them (a directory that feeds its own change if it is new).
/// Every statement on an account's rows names the account first: it is the
/// first column of every key of those tables. Statements are pipelined;
/// the few ops that read before they write (dropping a history, appending
/// to a log) send what is queued first.
async fn apply_ops(
    c: &deadpool_postgres::ClientWrapper,
    pl: &mut Pipeline,
    ops: &[Op],
    shard: i16,
    origin: &str,
    changes: &mut BTreeSet<(String, String, &'static str)>,
) -> Result<bool> {
    let mut feed = |path: &str, kind: &'static str| {
        changes.insert((account_of(path).to_string(), path.to_string(), kind));
    };
    let owner = node_account(ops).map(str::to_string);
    let owner_of = |what: &str| {
        owner
            .clone()
            .ok_or_else(|| Error::store(format!("{what} without the node change it belongs to")))
    };
    let mut notify = false;
    let mut rows = Rows::default();
    for op in ops {
        if let Some(k) = keyed(op)? {
            match k.by {
                By::Path => at_path(pl, k.sql, k.path, k.more),
                By::Key => at_key(pl, k.sql, k.path, k.more),
            }
            if let Some(kind) = k.feed {
                feed(k.path, kind);
            }
            continue;
        }
        match op {
            Op::PutDir { path } => {
                rows.dirs.insert(path.clone());
                notify = true;
            }
            Op::DelDir { path } => {
                rows.queue(pl, shard, origin);
                at_path(
                    pl,
                    "DELETE FROM dirs WHERE account = $1 AND parent = $2 AND name = $3",
                    path,
                    vec![],
                );
                feed(path, "dir");
            }
            Op::PutVersion { rec } => {
                pl.push(
                    "INSERT INTO versions (account, node_id, version, rec) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (account, node_id, version) DO UPDATE SET rec = EXCLUDED.rec",
                    vec![
                        s(rec.account()),
                        n(rec.id),
                        Box::new(rec.version as i32),
                        Box::new(encode(rec)?),
                    ],
                );
            }
            Op::DropHistory { node_id } => {
                rows.queue(pl, shard, origin);
                drop_history(c, pl, &owner_of("a history dropped")?, *node_id).await?;
            }
            Op::DelBlob { id } => {
                rows.queue(pl, shard, origin);
                let account = owner_of("a blob deleted")?;
                pl.push(
                    "DELETE FROM blobs WHERE account = $1 AND id = $2",
                    vec![s(&account), n(*id)],
                );
            }
            Op::PutBlob { .. } => {
                return Err(Error::store(
                    "a blob without its account (written by an older ctxfs) cannot go to a shared store",
                ));
            }
            Op::PutBlobOf { account, id, data } => {
                rows.blobs.insert((account.clone(), i(*id)), data.to_vec());
            }
            Op::PutEvent {
                seq,
                node_path,
                account,
                json,
            } => put_event(pl, Queue::Outbox, account, *seq, node_path, json, shard)?,
            Op::DoneEvent { seq, account, .. } => {
                drop_event(pl, Queue::Outbox, account, *seq, shard)
            }
            Op::UpdateEvent { seq, json } => {
                let account = event_account(json)?;
                pl.push(
                    "UPDATE outbox SET json = $3 WHERE account = $1 AND seq = $2",
                    vec![s(&account), n(*seq), b(json)],
                );
            }
            Op::DeadEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                drop_event(pl, Queue::Outbox, account, *seq, shard);
                put_event(pl, Queue::Dead, account, *seq, node_path, json, shard)?;
            }
            Op::ReviveEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                drop_event(pl, Queue::Dead, account, *seq, shard);
                put_event(pl, Queue::Outbox, account, *seq, node_path, json, shard)?;
            }
            Op::DropDead { seq, account, .. } => drop_event(pl, Queue::Dead, account, *seq, shard),
            Op::AppendLog {
                path,
                data,
                mode,
                mtime_ns,
            } => {
                rows.queue(pl, shard, origin);
                append_log(c, pl, path, data, *mode, *mtime_ns).await?;
                feed(path, "scratch");
            }
            // The embedding cache is content-addressed (model, hash of the
            // text) and shared: it holds no path and no text (on an
            // encrypted store, hashes are keyed per scope and vectors sealed).
            Op::PutVec { model, hash, data }
            | Op::PutVecOf {
                model, hash, data, ..
            } => {
                rows.vecs
                    .entry((model.clone(), hash.to_be_bytes().to_vec()))
                    .or_insert_with(|| data.clone());
            }
            Op::DelVec { model, hash } => {
                rows.queue(pl, shard, origin);
                pl.push(
                    "DELETE FROM vecs WHERE model = $1 AND hash = $2",
                    vec![s(model), b(&hash.to_be_bytes())],
                );
            }
            Op::PutDraft { .. } | Op::DelDraft { .. } => {}
            // One keyed row each: `keyed` above.
            Op::Expect { .. }
            | Op::PutNode { .. }
            | Op::DelNode { .. }
            | Op::PutScratch { .. }
            | Op::DelScratch { .. }
            | Op::PutExpiry { .. }
            | Op::DelExpiry { .. }
            | Op::PutIx { .. }
            | Op::DelIx { .. } => {}
            Op::Count { key, delta } => *rows.counts.entry(key.clone()).or_default() += delta,
            // On a shared store node, blob and event ids come from `alloc`,
            // which moved their marks already: setting them again would
            // only lock the row until this commit's WAL flush, making
            // every concurrent commit wait for it.
            Op::HighWater { key, .. } if ALLOCATED.contains(&key.as_str()) => {}
            Op::HighWater { key, value } => {
                pl.push(
                    "INSERT INTO high_water (key, value) VALUES ($1, $2) \
                     ON CONFLICT (key) DO UPDATE SET value = GREATEST(high_water.value, EXCLUDED.value)",
                    vec![s(key), n(*value)],
                );
            }
        }
    }
    rows.queue(pl, shard, origin);
    Ok(notify)
}

/// A statement on the row of `path` in a table keyed by (account, parent,
/// name): those are `$1`–`$3`, `more` the parameters after them.
fn at_path(pl: &mut Pipeline, sql: &'static str, path: &str, more: Vec<Param>) {
    let (p, nm) = split(path);
    let mut params = vec![s(account_of(path)), s(p), s(nm)];
    params.extend(more);
    pl.push(sql, params);
}

/// A statement on the row of `path` in a table keyed by (account, path):
/// those are `$1` and `$2`, `more` the parameters after them.
fn at_key(pl: &mut Pipeline, sql: &'static str, path: &str, more: Vec<Param>) {
    let mut params = vec![s(account_of(path)), s(path)];
    params.extend(more);
    pl.push(sql, params);
}

/// Every version of node `node_id` of `account`, and the blobs they hold.
/// It reads what it deletes: what is queued is sent first.
async fn drop_history(
    c: &deadpool_postgres::ClientWrapper,
    pl: &mut Pipeline,
    account: &str,
    node_id: u64,
) -> Result<()> {
    pl.flush(c).await?;
    let st = c
        .prepare_cached("DELETE FROM versions WHERE account = $1 AND node_id = $2 RETURNING rec")
        .await
        .map_err(pe)?;
    let mut blobs = Vec::new();
    for r in c.query(&st, &[&account, &i(node_id)]).await.map_err(pe)? {
        blobs.extend(
            decode(&r.get::<_, Vec<u8>>(0))?
                .files
                .iter()
                .map(|f| f.blob as i64),
        );
    }
    blobs.sort_unstable();
    blobs.dedup();
    pl.push(
        "DELETE FROM blobs WHERE account = $1 AND id = ANY($2)",
        vec![s(account), Box::new(blobs)],
    );
    Ok(())
}

/// Append `data` to the log at `path`, under its row's lock.
async fn append_log(
    c: &deadpool_postgres::ClientWrapper,
    pl: &mut Pipeline,
    path: &str,
    data: &[u8],
    mode: u16,
    mtime_ns: i128,
) -> Result<()> {
    let (p, nm) = split(path);
    let a = account_of(path);
    // The row first (an empty log), so that two daemons' first appends meet
    // on its lock rather than both inserting; it goes with what is queued,
    // before the read.
    let empty = crate::store::ScratchRec::appended(None, &[], mode, mtime_ns)?;
    at_path(
        pl,
        "INSERT INTO scratch (account, parent, name, data) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (account, parent, name) DO NOTHING",
        path,
        vec![Box::new(empty)],
    );
    pl.flush(c).await?;
    let st = c
        .prepare_cached(
            "SELECT data FROM scratch WHERE account = $1 AND parent = $2 AND name = $3 FOR UPDATE",
        )
        .await
        .map_err(pe)?;
    let old: Option<Vec<u8>> = c
        .query(&st, &[&a, &p, &nm])
        .await
        .map_err(pe)?
        .first()
        .map(|r| r.get(0));
    let rec = crate::store::ScratchRec::appended(old.as_deref(), data, mode, mtime_ns)?;
    at_path(
        pl,
        "UPDATE scratch SET data = $4 WHERE account = $1 AND parent = $2 AND name = $3",
        path,
        vec![Box::new(rec)],
    );
    Ok(())
}

/// Rows of one kind that many ops of a transaction write, sent as one
/// statement each (arrays unnested in the server) rather than one
/// statement a row: a commit's blobs, counters and directories, an
/// indexer batch's vectors. Queued before any op that could touch the
/// same rows (a delete of a blob, directory or vector), so the order of
/// the ops holds.
#[derive(Default)]
struct Rows {
    blobs: std::collections::BTreeMap<(String, i64), Vec<u8>>,
    counts: std::collections::BTreeMap<String, i64>,
    dirs: BTreeSet<String>,
    vecs: std::collections::BTreeMap<(String, Vec<u8>), Vec<u8>>,
}

/// Rows keyed by two columns, as the three arrays an `UNNEST` takes.
fn columns<A, B, C>(rows: std::collections::BTreeMap<(A, B), C>) -> (Vec<A>, Vec<B>, Vec<C>) {
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for ((x, y), z) in rows {
        a.push(x);
        b.push(y);
        c.push(z);
    }
    (a, b, c)
}

impl Rows {
    fn queue(&mut self, pl: &mut Pipeline, shard: i16, origin: &str) {
        let blobs = std::mem::take(&mut self.blobs);
        if !blobs.is_empty() {
            let (accts, ids, data) = columns(blobs);
            pl.push(
                "INSERT INTO blobs (account, id, data) \
                 SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bytea[]) \
                 ON CONFLICT (account, id) DO UPDATE SET data = EXCLUDED.data",
                vec![Box::new(accts), Box::new(ids), Box::new(data)],
            );
        }
        let counts = std::mem::take(&mut self.counts);
        if !counts.is_empty() {
            let (keys, deltas): (Vec<String>, Vec<i64>) = counts.into_iter().unzip();
            pl.push(
                "INSERT INTO counters (key, shard, value) \
                 SELECT k, $3, v FROM UNNEST($1::text[], $2::bigint[]) AS t(k, v) \
                 ON CONFLICT (key, shard) DO UPDATE SET value = counters.value + EXCLUDED.value",
                vec![Box::new(keys), Box::new(deltas), Box::new(shard)],
            );
        }
        let dirs = std::mem::take(&mut self.dirs);
        if !dirs.is_empty() {
            let (mut accts, mut parents, mut names) = (Vec::new(), Vec::new(), Vec::new());
            for path in &dirs {
                let (p, nm) = split(path);
                accts.push(account_of(path).to_string());
                parents.push(p.to_string());
                names.push(nm.to_string());
            }
            // A directory that is new feeds its own change (in the server:
            // only the rows the insert made).
            pl.push(
                "WITH ins AS (INSERT INTO dirs (account, parent, name) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[]) \
                 ON CONFLICT DO NOTHING RETURNING account, parent, name) \
                 INSERT INTO changes (origin, account, path, kind) \
                 SELECT $4, account, CASE WHEN parent = '' THEN name ELSE parent || '/' || name END, 'dir' \
                 FROM ins",
                vec![
                    Box::new(accts),
                    Box::new(parents),
                    Box::new(names),
                    s(origin),
                ],
            );
        }
        let vecs = std::mem::take(&mut self.vecs);
        if !vecs.is_empty() {
            let (models, hashes, data) = columns(vecs);
            pl.push(
                "INSERT INTO vecs (model, hash, data) \
                 SELECT * FROM UNNEST($1::text[], $2::bytea[], $3::bytea[]) ON CONFLICT DO NOTHING",
                vec![Box::new(models), Box::new(hashes), Box::new(data)],
            );
        }
    }
}

/// The pending outbox or the dead letters, with the counter of each.
#[derive(Clone, Copy)]
enum Queue {
    Outbox,
    Dead,
}

impl Queue {
    fn counter(self, account: &str) -> String {
        match self {
            Queue::Outbox => crate::schema::counters::outbox_key(account),
            Queue::Dead => crate::schema::counters::dlq_key(account),
        }
    }
}

/// Add an event to a queue, counted (one statement: the count follows the
/// insert in the database, not a round trip). An event id already pending
/// fails the transaction (`tx_error`); a dead letter already there is kept.
fn put_event(
    pl: &mut Pipeline,
    q: Queue,
    account: &str,
    seq: u64,
    node_path: &str,
    json: &[u8],
    shard: i16,
) -> Result<()> {
    if matches!(q, Queue::Outbox) && seq >= EVENT_PLACEHOLDER {
        // A commit's event: its id from the sequence, written into the
        // JSON's `event_id` in place of the placeholder (16 hex digits at
        // byte `$2`, one-based), so a sealed payload is left as it is.
        const KEY: &str = "\"event_id\":\"";
        let hex = crate::schema::event::event_id(seq);
        let Some(at) = find(json, format!("{KEY}{hex}\"").as_bytes()) else {
            return Err(Error::store("a planned event without its placeholder id"));
        };
        let at = (at + KEY.len() + 1) as i32;
        pl.push(
            "WITH e AS (SELECT nextval('ctxfs_event_ids') AS seq), \
             ins AS (INSERT INTO outbox (account, seq, node_path, json) \
             SELECT $1, e.seq, $3, overlay($4 placing convert_to(lpad(to_hex(e.seq), 16, '0'), 'UTF8') from $2 for 16) \
             FROM e RETURNING 1) \
             INSERT INTO counters (key, shard, value) SELECT $5, $6, 1 FROM ins \
             ON CONFLICT (key, shard) DO UPDATE SET value = counters.value + EXCLUDED.value",
            vec![
                s(account),
                Box::new(at),
                s(node_path),
                b(json),
                s(&q.counter(account)),
                Box::new(shard),
            ],
        );
        return Ok(());
    }
    let sql = match q {
        Queue::Outbox => {
            "WITH ins AS (INSERT INTO outbox (account, seq, node_path, json) VALUES ($1, $2, $3, $4) \
             RETURNING 1) \
             INSERT INTO counters (key, shard, value) SELECT $5, $6, 1 FROM ins \
             ON CONFLICT (key, shard) DO UPDATE SET value = counters.value + EXCLUDED.value"
        }
        Queue::Dead => {
            "WITH ins AS (INSERT INTO dlq (account, seq, node_path, json) VALUES ($1, $2, $3, $4) \
             ON CONFLICT DO NOTHING RETURNING 1) \
             INSERT INTO counters (key, shard, value) SELECT $5, $6, 1 FROM ins \
             ON CONFLICT (key, shard) DO UPDATE SET value = counters.value + EXCLUDED.value"
        }
    };
    let params = vec![
        s(account),
        n(seq),
        s(node_path),
        b(json),
        s(&q.counter(account)),
        Box::new(shard),
    ];
    pl.push(sql, params);
    Ok(())
}

/// Where `needle` first starts in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Remove an event from a queue, counted when it was there.
fn drop_event(pl: &mut Pipeline, q: Queue, account: &str, seq: u64, shard: i16) {
    let sql = match q {
        Queue::Outbox => {
            "WITH del AS (DELETE FROM outbox WHERE account = $1 AND seq = $2 RETURNING 1) \
             INSERT INTO counters (key, shard, value) SELECT $3, $4, -1 FROM del \
             ON CONFLICT (key, shard) DO UPDATE SET value = counters.value + EXCLUDED.value"
        }
        Queue::Dead => {
            "WITH del AS (DELETE FROM dlq WHERE account = $1 AND seq = $2 RETURNING 1) \
             INSERT INTO counters (key, shard, value) SELECT $3, $4, -1 FROM del \
             ON CONFLICT (key, shard) DO UPDATE SET value = counters.value + EXCLUDED.value"
        }
    };
    pl.push(
        sql,
        vec![s(account), n(seq), s(&q.counter(account)), Box::new(shard)],
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NodeRec, Status};

    /// Each op on one keyed row as a table: how its table is keyed, what
    /// other daemons hear, and a statement whose placeholders are exactly
    /// the key's columns and the parameters after them (a parameter
    /// missing or left over fails only at run time on PostgreSQL).
    #[test]
    fn each_keyed_op_and_its_statement_as_a_table() {
        let path = "acme/users/u/memories/a/b".to_string();
        let rec = NodeRec {
            id: 7,
            path: path.clone(),
            status: Status::Active,
            version: 2,
            created_at: String::new(),
            updated_at: String::new(),
            updated_ns: 0,
            files: Vec::new(),
        };
        let p = || path.clone();
        let data = || vec![1u8, 2];
        let rows: Vec<(Op, By, &str, Option<&str>)> = vec![
            (
                Op::Expect {
                    path: p(),
                    version: Some(1),
                },
                By::Path,
                "ctxfs_expect",
                None,
            ),
            (
                Op::PutNode { path: p(), rec },
                By::Path,
                "nodes",
                Some("node"),
            ),
            (Op::DelNode { path: p() }, By::Path, "nodes", Some("node")),
            (
                Op::PutScratch {
                    path: p(),
                    data: data(),
                },
                By::Path,
                "scratch",
                Some("scratch"),
            ),
            (
                Op::DelScratch { path: p() },
                By::Path,
                "scratch",
                Some("scratch"),
            ),
            (
                Op::PutExpiry {
                    path: p(),
                    at_ns: 5,
                },
                By::Key,
                "expiry",
                Some("expiry"),
            ),
            (
                Op::DelExpiry { path: p() },
                By::Key,
                "expiry",
                Some("expiry"),
            ),
            (
                Op::PutIx {
                    path: p(),
                    data: data(),
                },
                By::Key,
                "ix_docs",
                Some("ix"),
            ),
            (Op::DelIx { path: p() }, By::Key, "ix_docs", Some("ix")),
        ];
        for (op, by, table, feed) in rows {
            let k = keyed(&op).unwrap().expect("a keyed op");
            assert_eq!((k.by, k.path, k.feed), (by, path.as_str(), feed), "{op:?}");
            assert!(k.sql.contains(table), "{op:?}: {}", k.sql);
            let key = match by {
                By::Path => 3,
                By::Key => 2,
            };
            let highest = (1..=9).filter(|i| k.sql.contains(&format!("${i}"))).max();
            assert_eq!(highest, Some(key + k.more.len()), "{op:?}: {}", k.sql);
        }
        // Ops that read first, batch their rows or carry no path are not.
        for op in [
            Op::PutDir { path: p() },
            Op::DelDir { path: p() },
            Op::DropHistory { node_id: 7 },
            Op::DelVec {
                model: "m".into(),
                hash: 1,
            },
        ] {
            assert!(keyed(&op).unwrap().is_none(), "{op:?}");
        }
    }
}
