//! The PostgreSQL schema and its versioned migrations. The version lives
//! in `ctxfs_meta`; migrations run in one transaction under an advisory
//! lock, so daemons starting at once migrate once. A database whose schema
//! is newer than this binary knows is refused with a one-line reason.
//!
//! Every row keyed by a path carries its `account` (seed 001's tenant id),
//! and the SQL stays within what PostgreSQL-compatible distributed engines
//! accept (no extensions needed by the store itself; see docs/SCALE.md).

use super::pe;
use crate::error::{Error, Result};

/// Migrations in order: `MIGRATIONS[n]` takes the schema from version n to n + 1.
pub const MIGRATIONS: &[&str] = &[
    // 1: the tables of the redb store, the change feed.
    r#"
    CREATE TABLE nodes (
        account text NOT NULL,
        parent  text COLLATE "C" NOT NULL,
        name    text COLLATE "C" NOT NULL,
        rec     bytea NOT NULL,
        PRIMARY KEY (account, parent, name)
    );
    CREATE TABLE dirs (
        account text NOT NULL,
        parent  text COLLATE "C" NOT NULL,
        name    text COLLATE "C" NOT NULL,
        PRIMARY KEY (account, parent, name)
    );
    CREATE INDEX dirs_by_parent ON dirs (parent, name);
    CREATE TABLE versions (
        account text NOT NULL,
        node_id bigint NOT NULL,
        version integer NOT NULL,
        rec     bytea NOT NULL,
        PRIMARY KEY (account, node_id, version)
    );
    CREATE TABLE blobs (
        account text NOT NULL,
        id      bigint NOT NULL,
        data    bytea NOT NULL,
        PRIMARY KEY (account, id)
    );
    CREATE TABLE outbox (
        account   text NOT NULL,
        seq       bigint NOT NULL,
        node_path text COLLATE "C" NOT NULL,
        json      bytea NOT NULL,
        PRIMARY KEY (account, seq)
    );
    CREATE INDEX outbox_by_seq ON outbox (seq);
    CREATE INDEX outbox_by_node ON outbox (account, node_path, seq);
    CREATE TABLE dlq (
        account   text NOT NULL,
        seq       bigint NOT NULL,
        node_path text COLLATE "C" NOT NULL,
        json      bytea NOT NULL,
        PRIMARY KEY (account, seq)
    );
    CREATE INDEX dlq_by_node ON dlq (account, node_path, seq);
    CREATE TABLE ix_docs (
        account text NOT NULL,
        path    text COLLATE "C" NOT NULL,
        data    bytea NOT NULL,
        PRIMARY KEY (account, path)
    );
    CREATE TABLE vecs (
        model text NOT NULL,
        hash  bytea NOT NULL,
        data  bytea NOT NULL,
        PRIMARY KEY (model, hash)
    );
    CREATE TABLE counters (
        key   text PRIMARY KEY,
        value bigint NOT NULL
    );
    CREATE TABLE high_water (
        key   text PRIMARY KEY,
        value bigint NOT NULL
    );
    CREATE TABLE scratch (
        account text NOT NULL,
        parent  text COLLATE "C" NOT NULL,
        name    text COLLATE "C" NOT NULL,
        data    bytea NOT NULL,
        PRIMARY KEY (account, parent, name)
    );
    CREATE TABLE expiry (
        account text NOT NULL,
        path    text COLLATE "C" NOT NULL,
        at_ns   bigint NOT NULL,
        PRIMARY KEY (account, path)
    );
    CREATE TABLE changes (
        seq     bigserial PRIMARY KEY,
        origin  text NOT NULL,
        account text NOT NULL,
        path    text NOT NULL,
        kind    text NOT NULL,
        at      timestamptz NOT NULL DEFAULT now()
    );
    "#,
    // 2: what let concurrent commits wait for each other's WAL flush.
    // - Counters in shards: a counter row updated by every commit of an
    //   account (its node count, bytes, outbox) is locked until the
    //   commit's flush; each transaction adds to one of `COUNTER_SHARDS`
    //   rows of a key instead, and a read sums them.
    // - A node's version in a column of its own, so that a commit's
    //   compare-and-set runs in the server (`ctxfs_expect`, raising
    //   `CONFLICT`) and the whole transaction, `COMMIT` included, goes in
    //   one round trip (rows of older versions are filled in by `migrate`).
    // - Event ids from a sequence, taken inside the commit's transaction
    //   without a lock (they were a `high_water` row, updated in a
    //   transaction of their own before each commit). A value is never
    //   handed out twice, also across a crash: the sequence's WAL record
    //   precedes the commit that used it.
    r#"
    ALTER TABLE counters ADD COLUMN shard smallint NOT NULL DEFAULT 0;
    ALTER TABLE counters DROP CONSTRAINT counters_pkey;
    ALTER TABLE counters ADD PRIMARY KEY (key, shard);
    CREATE SEQUENCE ctxfs_event_ids;
    SELECT setval('ctxfs_event_ids',
                  GREATEST(COALESCE((SELECT value FROM high_water WHERE key = 'event'), 0), 1),
                  COALESCE((SELECT value FROM high_water WHERE key = 'event'), 0) > 0);
    DELETE FROM high_water WHERE key = 'event';
    ALTER TABLE nodes ADD COLUMN version integer;
    CREATE FUNCTION ctxfs_expect(a text, p text, n text, want integer) RETURNS void
    LANGUAGE plpgsql AS $$
    DECLARE
        have integer;
    BEGIN
        SELECT version INTO have FROM nodes
        WHERE account = a AND parent = p AND name = n FOR UPDATE;
        IF have IS DISTINCT FROM want THEN
            RAISE EXCEPTION USING ERRCODE = 'CX409', MESSAGE = format(
                '%s is at version %s on the store, this commit was planned on %s',
                CASE WHEN p = '' THEN n ELSE p || '/' || n END,
                COALESCE(have::text, 'none'), COALESCE(want::text, 'none'));
        END IF;
    END $$;
    "#,
];

/// Rows a counter is spread over (schema version 2).
pub const COUNTER_SHARDS: u32 = 16;

/// The SQLSTATE of a failed compare-and-set (`ctxfs_expect`).
pub const CONFLICT: &str = "CX409";

/// Version 2: the `version` column of the nodes written before it, read
/// from their records.
async fn fill_versions(t: &deadpool_postgres::Transaction<'_>) -> Result<()> {
    let rows = t
        .query("SELECT account, parent, name, rec FROM nodes", &[])
        .await
        .map_err(pe)?;
    let (mut accts, mut parents, mut names, mut versions) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in &rows {
        accts.push(r.get::<_, String>(0));
        parents.push(r.get::<_, String>(1));
        names.push(r.get::<_, String>(2));
        versions.push(super::decode(&r.get::<_, Vec<u8>>(3))?.version as i32);
    }
    if !rows.is_empty() {
        tracing::info!(nodes = rows.len(), "filling in the nodes' versions");
        t.execute(
            "UPDATE nodes SET version = v.version \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int[]) AS v(account, parent, name, version) \
             WHERE nodes.account = v.account AND nodes.parent = v.parent AND nodes.name = v.name",
            &[&accts, &parents, &names, &versions],
        )
        .await
        .map_err(pe)?;
    }
    Ok(())
}

/// Create or migrate the schema; refuse one newer than this binary.
pub async fn migrate(c: &mut deadpool_postgres::Client) -> Result<()> {
    let t = c.transaction().await.map_err(pe)?;
    t.batch_execute(
        "SELECT pg_advisory_xact_lock(7277846410214545000);
         CREATE TABLE IF NOT EXISTS ctxfs_meta (key text PRIMARY KEY, value text NOT NULL);",
    )
    .await
    .map_err(pe)?;
    let have: usize = t
        .query_opt(
            "SELECT value FROM ctxfs_meta WHERE key = 'schema_version'",
            &[],
        )
        .await
        .map_err(pe)?
        .map(|r| r.get::<_, String>(0).parse().unwrap_or(usize::MAX))
        .unwrap_or(0);
    let want = MIGRATIONS.len();
    if have > want {
        return Err(Error::store(format!(
            "the database's ctxfs schema is version {have}, newer than this binary's {want}: upgrade ctxfs"
        )));
    }
    for (n, sql) in MIGRATIONS.iter().enumerate().skip(have) {
        tracing::info!(from = n, to = n + 1, "migrating the PostgreSQL schema");
        t.batch_execute(sql).await.map_err(pe)?;
        if n == 1 {
            fill_versions(&t).await?;
        }
    }
    if have < want {
        t.execute(
            "INSERT INTO ctxfs_meta (key, value) VALUES ('schema_version', $1) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[&want.to_string()],
        )
        .await
        .map_err(pe)?;
    }
    t.commit().await.map_err(pe)
}
