//! One `Store::apply` on PostgreSQL: every op as the statements of one
//! transaction. Every statement on an account's rows names the account
//! first: it is the first column of every key of those tables.

use super::{account_of, decode, encode, i, pe, split};
use crate::error::{Error, Result};
use crate::store::Op;
use std::collections::BTreeSet;

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
        .and_then(|r| r.split('/').next())
        .unwrap_or("")
        .to_string())
}

type Param = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;

/// What a statement's outcome decides once the pipeline returns.
enum After {
    Nothing,
    /// Tell other daemons of `path` (as `kind`) if a row changed.
    FeedIfChanged(String, &'static str),
    /// The compare-and-set of a commit: the node at `path` must be at `version`.
    Expect(String, Option<u32>),
    /// The statement must change a row, else the commit conflicts (an
    /// event id another daemon was handed too: plan again with a new one).
    MustChange(&'static str),
}

struct Stmt {
    sql: &'static str,
    params: Vec<Param>,
    after: After,
}

enum Out {
    Rows(Vec<tokio_postgres::Row>),
    Count(u64),
}

/// Statements sent together: tokio-postgres writes every request of
/// futures polled together before it reads the first answer, so a whole
/// transaction's writes cost one round trip, not one each. Their order is
/// kept (the server runs them in the order sent).
#[derive(Default)]
pub(super) struct Pipeline {
    stmts: Vec<Stmt>,
}

impl Pipeline {
    fn push(&mut self, sql: &'static str, params: Vec<Param>) {
        self.then(sql, params, After::Nothing);
    }

    fn then(&mut self, sql: &'static str, params: Vec<Param>, after: After) {
        self.stmts.push(Stmt { sql, params, after });
    }

    /// Run what is queued, in order, in one round trip (and one more for
    /// statements this connection has not prepared yet).
    pub(super) async fn flush(
        &mut self,
        t: &deadpool_postgres::Transaction<'_>,
        feed: &mut dyn FnMut(&str, &'static str),
    ) -> Result<()> {
        if self.stmts.is_empty() {
            return Ok(());
        }
        let stmts = std::mem::take(&mut self.stmts);
        let mut sqls: Vec<&'static str> = stmts.iter().map(|s| s.sql).collect();
        sqls.sort_unstable();
        sqls.dedup();
        let prepared = futures_util::future::try_join_all(sqls.iter().map(|q| t.prepare_cached(q)))
            .await
            .map_err(pe)?;
        let by_sql: std::collections::HashMap<&str, &tokio_postgres::Statement> =
            sqls.iter().copied().zip(prepared.iter()).collect();
        let runs = stmts.iter().map(|s| {
            let st = by_sql[s.sql];
            async move {
                let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = s
                    .params
                    .iter()
                    .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
                    .collect();
                match s.after {
                    After::Expect(..) => t.query(st, &refs).await.map(Out::Rows),
                    _ => t.execute(st, &refs).await.map(Out::Count),
                }
            }
        });
        let outs = futures_util::future::try_join_all(runs).await.map_err(pe)?;
        for (s, out) in stmts.iter().zip(outs) {
            match (&s.after, out) {
                (After::FeedIfChanged(path, kind), Out::Count(n)) if n > 0 => feed(path, kind),
                (After::MustChange(why), Out::Count(0)) => {
                    return Err(Error::Conflict((*why).to_string()));
                }
                (After::Expect(path, version), Out::Rows(rows)) => {
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
                _ => {}
            }
        }
        Ok(())
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

/// Apply `ops` in transaction `t`; the changes other daemons must hear of.
/// Every statement on an account's rows names the account first: it is the
/// first column of every key of those tables. Statements are pipelined;
/// the few ops that read before they write (dropping a history, appending
/// to a log) send what is queued first.
pub(super) async fn apply_ops(
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
    let mut pl = Pipeline::default();
    for op in ops {
        match op {
            Op::Expect { path, version } => {
                let (p, nm) = split(path);
                pl.then(
                    "SELECT rec FROM nodes WHERE account = $1 AND parent = $2 AND name = $3 FOR UPDATE",
                    vec![s(account_of(path)), s(p), s(nm)],
                    After::Expect(path.clone(), *version),
                );
            }
            Op::PutNode { path, rec } => {
                let (p, nm) = split(path);
                pl.push(
                    "INSERT INTO nodes (account, parent, name, rec) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (account, parent, name) DO UPDATE SET rec = EXCLUDED.rec",
                    vec![s(account_of(path)), s(p), s(nm), Box::new(encode(rec)?)],
                );
                feed(path, "node");
            }
            Op::DelNode { path } => {
                let (p, nm) = split(path);
                pl.push(
                    "DELETE FROM nodes WHERE account = $1 AND parent = $2 AND name = $3",
                    vec![s(account_of(path)), s(p), s(nm)],
                );
                feed(path, "node");
            }
            Op::PutDir { path } => {
                let (p, nm) = split(path);
                pl.then(
                    "INSERT INTO dirs (account, parent, name) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    vec![s(account_of(path)), s(p), s(nm)],
                    After::FeedIfChanged(path.clone(), "dir"),
                );
            }
            Op::DelDir { path } => {
                let (p, nm) = split(path);
                pl.push(
                    "DELETE FROM dirs WHERE account = $1 AND parent = $2 AND name = $3",
                    vec![s(account_of(path)), s(p), s(nm)],
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
                let account = owner_of("a history dropped")?;
                pl.flush(t, &mut feed).await?;
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
                pl.push(
                    "DELETE FROM blobs WHERE account = $1 AND id = ANY($2)",
                    vec![s(&account), Box::new(blobs)],
                );
            }
            Op::DelBlob { id } => {
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
                pl.push(
                    "INSERT INTO blobs (account, id, data) VALUES ($1, $2, $3) \
                     ON CONFLICT (account, id) DO UPDATE SET data = EXCLUDED.data",
                    vec![s(account), n(*id), b(data)],
                );
            }
            Op::PutEvent {
                seq,
                node_path,
                account,
                json,
            } => put_event(&mut pl, Queue::Outbox, account, *seq, node_path, json),
            Op::DoneEvent { seq, account, .. } => drop_event(&mut pl, Queue::Outbox, account, *seq),
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
                drop_event(&mut pl, Queue::Outbox, account, *seq);
                put_event(&mut pl, Queue::Dead, account, *seq, node_path, json);
            }
            Op::ReviveEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                drop_event(&mut pl, Queue::Dead, account, *seq);
                put_event(&mut pl, Queue::Outbox, account, *seq, node_path, json);
            }
            Op::DropDead { seq, account, .. } => drop_event(&mut pl, Queue::Dead, account, *seq),
            Op::PutScratch { path, data } => {
                let (p, nm) = split(path);
                pl.push(
                    "INSERT INTO scratch (account, parent, name, data) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (account, parent, name) DO UPDATE SET data = EXCLUDED.data",
                    vec![s(account_of(path)), s(p), s(nm), b(data)],
                );
                feed(path, "scratch");
            }
            Op::DelScratch { path } => {
                let (p, nm) = split(path);
                pl.push(
                    "DELETE FROM scratch WHERE account = $1 AND parent = $2 AND name = $3",
                    vec![s(account_of(path)), s(p), s(nm)],
                );
                feed(path, "scratch");
            }
            Op::AppendLog {
                path,
                data,
                mode,
                mtime_ns,
            } => {
                let (p, nm) = split(path);
                let a = account_of(path);
                // The row first (an empty log), so that two daemons' first
                // appends meet on its lock rather than both inserting; it
                // goes with what is queued, before the read.
                let empty = crate::store::ScratchRec::appended(None, &[], *mode, *mtime_ns)?;
                pl.push(
                    "INSERT INTO scratch (account, parent, name, data) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (account, parent, name) DO NOTHING",
                    vec![s(a), s(p), s(nm), Box::new(empty)],
                );
                pl.flush(t, &mut feed).await?;
                let st = t
                    .prepare_cached(
                        "SELECT data FROM scratch WHERE account = $1 AND parent = $2 AND name = $3 FOR UPDATE",
                    )
                    .await
                    .map_err(pe)?;
                let old: Option<Vec<u8>> = t
                    .query(&st, &[&a, &p, &nm])
                    .await
                    .map_err(pe)?
                    .first()
                    .map(|r| r.get(0));
                let rec =
                    crate::store::ScratchRec::appended(old.as_deref(), data, *mode, *mtime_ns)?;
                pl.push(
                    "UPDATE scratch SET data = $4 WHERE account = $1 AND parent = $2 AND name = $3",
                    vec![s(a), s(p), s(nm), Box::new(rec)],
                );
                feed(path, "scratch");
            }
            Op::PutExpiry { path, at_ns } => {
                pl.push(
                    "INSERT INTO expiry (account, path, at_ns) VALUES ($1, $2, $3) \
                     ON CONFLICT (account, path) DO UPDATE SET at_ns = EXCLUDED.at_ns",
                    vec![s(account_of(path)), s(path), n(*at_ns)],
                );
                feed(path, "expiry");
            }
            Op::DelExpiry { path } => {
                pl.push(
                    "DELETE FROM expiry WHERE account = $1 AND path = $2",
                    vec![s(account_of(path)), s(path)],
                );
                feed(path, "expiry");
            }
            Op::PutIx { path, data } => {
                pl.push(
                    "INSERT INTO ix_docs (account, path, data) VALUES ($1, $2, $3) \
                     ON CONFLICT (account, path) DO UPDATE SET data = EXCLUDED.data",
                    vec![s(account_of(path)), s(path), b(data)],
                );
                feed(path, "ix");
            }
            Op::DelIx { path } => {
                pl.push(
                    "DELETE FROM ix_docs WHERE account = $1 AND path = $2",
                    vec![s(account_of(path)), s(path)],
                );
                feed(path, "ix");
            }
            // The embedding cache is content-addressed (model, hash of the
            // text) and shared: it holds no path and no text (on an
            // encrypted store, hashes are keyed per scope and vectors sealed).
            Op::PutVec { model, hash, data }
            | Op::PutVecOf {
                model, hash, data, ..
            } => {
                pl.push(
                    "INSERT INTO vecs (model, hash, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    vec![s(model), b(&hash.to_be_bytes()), b(data)],
                );
            }
            Op::DelVec { model, hash } => {
                pl.push(
                    "DELETE FROM vecs WHERE model = $1 AND hash = $2",
                    vec![s(model), b(&hash.to_be_bytes())],
                );
            }
            Op::PutDraft { .. } | Op::DelDraft { .. } => {}
            Op::Count { key, delta } => count(&mut pl, key, *delta),
            Op::HighWater { key, value } => {
                pl.push(
                    "INSERT INTO high_water (key, value) VALUES ($1, $2) \
                     ON CONFLICT (key) DO UPDATE SET value = GREATEST(high_water.value, EXCLUDED.value)",
                    vec![s(key), n(*value)],
                );
            }
        }
    }
    pl.flush(t, &mut feed).await
}

/// Record `changes` in the change feed and wake the other daemons, in one
/// round trip.
pub(super) async fn publish(
    t: &deadpool_postgres::Transaction<'_>,
    origin: &str,
    changes: BTreeSet<(String, String, &'static str)>,
) -> Result<()> {
    let (mut accts, mut paths, mut kinds) = (Vec::new(), Vec::new(), Vec::new());
    for (a, p, k) in changes {
        accts.push(a);
        paths.push(p);
        kinds.push(k.to_string());
    }
    let mut pl = Pipeline::default();
    pl.push(
        "INSERT INTO changes (origin, account, path, kind) \
         SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[])",
        vec![s(origin), Box::new(accts), Box::new(paths), Box::new(kinds)],
    );
    pl.push("SELECT pg_notify($1, '')", vec![s(super::CHANNEL)]);
    pl.flush(t, &mut |_, _| {}).await
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

/// Add an event to a queue, counted when it was not there (one statement:
/// the count follows the insert in the database, not a round trip).
fn put_event(pl: &mut Pipeline, q: Queue, account: &str, seq: u64, node_path: &str, json: &[u8]) {
    let sql = match q {
        Queue::Outbox => {
            "WITH ins AS (INSERT INTO outbox (account, seq, node_path, json) VALUES ($1, $2, $3, $4) \
             ON CONFLICT DO NOTHING RETURNING 1) \
             INSERT INTO counters (key, value) SELECT $5, 1 FROM ins \
             ON CONFLICT (key) DO UPDATE SET value = counters.value + EXCLUDED.value"
        }
        Queue::Dead => {
            "WITH ins AS (INSERT INTO dlq (account, seq, node_path, json) VALUES ($1, $2, $3, $4) \
             ON CONFLICT DO NOTHING RETURNING 1) \
             INSERT INTO counters (key, value) SELECT $5, 1 FROM ins \
             ON CONFLICT (key) DO UPDATE SET value = counters.value + EXCLUDED.value"
        }
    };
    let params = vec![
        s(account),
        n(seq),
        s(node_path),
        b(json),
        s(&q.counter(account)),
    ];
    match q {
        Queue::Outbox => pl.then(
            sql,
            params,
            After::MustChange("an outbox event id is taken already"),
        ),
        Queue::Dead => pl.push(sql, params),
    }
}

/// Remove an event from a queue, counted when it was there.
fn drop_event(pl: &mut Pipeline, q: Queue, account: &str, seq: u64) {
    let sql = match q {
        Queue::Outbox => {
            "WITH del AS (DELETE FROM outbox WHERE account = $1 AND seq = $2 RETURNING 1) \
             INSERT INTO counters (key, value) SELECT $3, -1 FROM del \
             ON CONFLICT (key) DO UPDATE SET value = counters.value + EXCLUDED.value"
        }
        Queue::Dead => {
            "WITH del AS (DELETE FROM dlq WHERE account = $1 AND seq = $2 RETURNING 1) \
             INSERT INTO counters (key, value) SELECT $3, -1 FROM del \
             ON CONFLICT (key) DO UPDATE SET value = counters.value + EXCLUDED.value"
        }
    };
    pl.push(sql, vec![s(account), n(seq), s(&q.counter(account))]);
}

fn count(pl: &mut Pipeline, key: &str, delta: i64) {
    pl.push(
        "INSERT INTO counters (key, value) VALUES ($1, $2) \
         ON CONFLICT (key) DO UPDATE SET value = counters.value + EXCLUDED.value",
        vec![s(key), Box::new(delta)],
    );
}
