//! The session that holds this daemon's advisory locks: leadership of the
//! cluster-wide roles (indexer, sweeper, feed pruning) and `flock`s.
//! PostgreSQL frees them all when the session ends (the daemon died).

use super::{pe, PgStore};
use crate::error::Result;
use crate::locks::lock;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

/// The session that holds this daemon's advisory locks, and the roles
/// among them.
pub(super) struct Session {
    pub(super) client: tokio_postgres::Client,
    pub(super) held: BTreeSet<String>,
}

/// The advisory lock key of a `flock` lock.
pub(super) fn lock_key(name: &str) -> i64 {
    xxhash_rust::xxh3::xxh3_64(format!("ctxfs-flock:{name}").as_bytes()) as i64
}

impl PgStore {
    /// Does this daemon hold `role`? Tried at most once a second.
    pub(super) fn lead(&self, role: &str) -> bool {
        let held = lock(&self.session)
            .as_ref()
            .is_some_and(|l| !l.client.is_closed() && l.held.contains(role));
        if held {
            return true;
        }
        {
            // At most one try a second per role (roles are tried by
            // different threads: one role's tries must not starve another's).
            let mut t = lock(&self.last_try);
            if t.get(role)
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
            {
                return false;
            }
            t.insert(role.to_string(), Instant::now());
        }
        match self.session_bool(
            "SELECT pg_try_advisory_lock($1)",
            leader_key(role),
            Some(role),
        ) {
            Ok(true) => {
                tracing::info!(role, "this daemon leads");
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(role, "leadership: {e}");
                false
            }
        }
    }

    /// Run a one-boolean query on the session that holds this daemon's
    /// advisory locks, connecting it if needed; with `hold`, a true answer
    /// means the session now holds that role. A lost session loses every
    /// lock it held, roles included.
    pub(super) fn session_bool(&self, sql: &str, key: i64, hold: Option<&str>) -> Result<bool> {
        let mut g = lock(&self.session);
        if let Some(l) = g.as_ref().filter(|l| l.client.is_closed()) {
            tracing::warn!(roles = ?l.held, "the lock session was lost: its locks are gone");
            *g = None;
        }
        let pg = self.pg.clone();
        let res = self.run(async {
            if g.is_none() {
                *g = Some(connect_session(&pg).await?);
            }
            let l = g.as_mut().expect("set above");
            let got = l
                .client
                .query_one(sql, &[&key])
                .await
                .map_err(pe)?
                .get::<_, bool>(0);
            if let (true, Some(role)) = (got, hold) {
                l.held.insert(role.to_string());
            }
            Ok(got)
        });
        if res.is_err() {
            *g = None;
        }
        res
    }
}

async fn connect_session(pg: &tokio_postgres::Config) -> Result<Session> {
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
    Ok(Session {
        client,
        held: BTreeSet::new(),
    })
}

/// The advisory lock key of a leadership role.
fn leader_key(role: &str) -> i64 {
    let h = xxhash_rust::xxh3::xxh3_64(format!("ctxfs-leader:{role}").as_bytes());
    h as i64
}
