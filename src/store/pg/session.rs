//! The session that holds this daemon's advisory locks: leadership of the
//! cluster-wide roles (indexer, sweeper, feed pruning) and `flock`s.
//! PostgreSQL frees them all when the session ends (the daemon died).

use super::{pe, PgStore};
use crate::error::{Error, Result};
use crate::locks::lock;
use std::collections::{BTreeMap, BTreeSet};
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

/// Held shared by every daemon serving the store (on its lock session),
/// exclusive for the moment a daemon that finds none writes its settings.
fn live_key() -> i64 {
    xxhash_rust::xxh3::xxh3_64(b"ctxfs-live-daemons") as i64
}

impl PgStore {
    /// The settings the daemons serving this store share
    /// (`Settings::shared_sections`).
    fn stored_settings(&self) -> Result<Option<BTreeMap<String, String>>> {
        let rows = self.query(
            "SELECT value FROM ctxfs_meta WHERE key = 'settings' /* daemon-wide */",
            &[],
        )?;
        Ok(rows
            .first()
            .and_then(|r| serde_json::from_str(&r.get::<_, String>(0)).ok()))
    }

    fn store_settings(&self, s: &BTreeMap<String, String>) -> Result<()> {
        let text = serde_json::to_string(s).map_err(|e| Error::store_from("settings", e))?;
        self.query(
            "INSERT INTO ctxfs_meta (key, value) VALUES ('settings', $1) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value /* daemon-wide */",
            &[&text],
        )?;
        Ok(())
    }

    /// Join the daemons serving this store with `mine`: when none serves,
    /// they become the store's settings; when some do, they must be theirs,
    /// or this daemon refuses to start, naming what differs. Held for the
    /// daemon's life by a shared advisory lock on its lock session.
    pub fn agree_settings(&self, mine: &BTreeMap<String, String>) -> Result<()> {
        let key = live_key();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.session_bool("SELECT pg_try_advisory_lock($1)", key, None)? {
                // No daemon serves: ours are the store's settings now.
                let r = (|| {
                    let old = self.stored_settings()?;
                    if old.as_ref() != Some(mine) {
                        if let Some(old) = old {
                            let changed: Vec<&String> = mine
                                .keys()
                                .filter(|k| old.get(*k) != mine.get(*k))
                                .collect();
                            tracing::info!(?changed, "the store's shared settings change with this daemon (no other daemon serves it)");
                        }
                        self.store_settings(mine)?;
                    }
                    self.session_bool("SELECT pg_try_advisory_lock_shared($1)", key, None)
                })();
                self.session_bool("SELECT pg_advisory_unlock($1)", key, None)?;
                return match r {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(Error::store("cannot mark this daemon as serving the store")),
                    Err(e) => Err(e),
                };
            }
            if self.session_bool("SELECT pg_try_advisory_lock_shared($1)", key, None)? {
                let theirs = self.stored_settings()?;
                let differ: Vec<String> = match &theirs {
                    None => Vec::new(),
                    Some(t) => mine
                        .keys()
                        .chain(t.keys())
                        .filter(|k| t.get(*k) != mine.get(*k))
                        .map(|k| {
                            format!(
                                "{k}: theirs {:?}, this daemon's {:?}",
                                t.get(k).map(String::as_str).unwrap_or(""),
                                mine.get(k).map(String::as_str).unwrap_or("")
                            )
                        })
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect(),
                };
                if theirs.is_none() {
                    self.store_settings(mine)?;
                }
                if differ.is_empty() {
                    return Ok(());
                }
                let _ = self.session_bool("SELECT pg_advisory_unlock_shared($1)", key, None);
                return Err(Error::store(format!(
                    "this daemon's config differs from that of the daemons serving this store \
                     ({}); every daemon of one store must have the same accounts, review, \
                     quotas, unindexed prefixes and redaction: fix the config, or stop every \
                     daemon of the store to change them",
                    differ.join("; ")
                )));
            }
            if Instant::now() >= deadline {
                return Err(Error::store(
                    "another daemon kept joining this store for 10 s; try again",
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The advisory lock key of a leadership role.
fn leader_key(role: &str) -> i64 {
    let h = xxhash_rust::xxh3::xxh3_64(format!("ctxfs-leader:{role}").as_bytes());
    h as i64
}
