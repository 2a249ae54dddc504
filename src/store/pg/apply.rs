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
            } => put_event(t, Queue::Outbox, account, *seq, node_path, json).await?,
            Op::DoneEvent { seq, account, .. } => {
                drop_event(t, Queue::Outbox, account, *seq).await?;
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
                drop_event(t, Queue::Outbox, account, *seq).await?;
                put_event(t, Queue::Dead, account, *seq, node_path, json).await?;
            }
            Op::ReviveEvent {
                seq,
                node_path,
                account,
                json,
            } => {
                drop_event(t, Queue::Dead, account, *seq).await?;
                put_event(t, Queue::Outbox, account, *seq, node_path, json).await?;
            }
            Op::DropDead { seq, account, .. } => {
                drop_event(t, Queue::Dead, account, *seq).await?;
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
                let empty = crate::store::ScratchRec::appended(None, &[], *mode, *mtime_ns)?;
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
                let rec =
                    crate::store::ScratchRec::appended(old.as_deref(), data, *mode, *mtime_ns)?;
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
            Op::PutVec { model, hash, data }
            | Op::PutVecOf {
                model, hash, data, ..
            } => {
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

/// Add an event to a queue (counted when it was not there).
async fn put_event(
    t: &deadpool_postgres::Transaction<'_>,
    q: Queue,
    account: &str,
    seq: u64,
    node_path: &str,
    json: &[u8],
) -> Result<()> {
    let sql = match q {
        Queue::Outbox => {
            "INSERT INTO outbox (account, seq, node_path, json) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"
        }
        Queue::Dead => {
            "INSERT INTO dlq (account, seq, node_path, json) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"
        }
    };
    if exec(t, sql, &[&account, &i(seq), &node_path, &json]).await? > 0 {
        count(t, &q.counter(account), 1).await?;
    }
    Ok(())
}

/// Remove an event from a queue (counted when it was there).
async fn drop_event(
    t: &deadpool_postgres::Transaction<'_>,
    q: Queue,
    account: &str,
    seq: u64,
) -> Result<()> {
    let sql = match q {
        Queue::Outbox => "DELETE FROM outbox WHERE account = $1 AND seq = $2",
        Queue::Dead => "DELETE FROM dlq WHERE account = $1 AND seq = $2",
    };
    if exec(t, sql, &[&account, &i(seq)]).await? > 0 {
        count(t, &q.counter(account), -1).await?;
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
