//! The change feed: every transaction that changes what a daemon may have
//! cached adds rows to `changes` and `NOTIFY`s; each daemon follows the
//! rows past its cursor and hands other daemons' changes to the core.

use super::{PgStore, CHANNEL, FEED_KEEP, OP_TIMEOUT};
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::store::{ChangeKind, RemoteChange};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

/// Where the feed stands, for `caught_up`.
#[derive(Default)]
pub(super) struct Feed {
    pub(super) cursor: Mutex<i64>,
    pub(super) moved: Condvar,
    pub(super) running: AtomicBool,
    /// Wakes the follower to read the feed now (`wait_for_feed`).
    pub(super) poke: tokio::sync::Notify,
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
    /// (at each other daemon's notification, when `wait_for_feed` asks, and
    /// every second in case one was missed or the connection was lost),
    /// handing other daemons' changes to `f`. Notifications carry who
    /// changed: this daemon's own do not wake it (its rows are skipped
    /// anyway; the cursor passes them at the next read).
    pub(super) fn follow(
        self: &Arc<Self>,
        f: Box<dyn Fn(Vec<RemoteChange>) + Send + Sync>,
    ) -> Result<()> {
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
        let feed = self.feed.clone();
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
                let me = origin.clone();
                let driver = tokio::spawn(async move {
                    loop {
                        match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                            Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                                if n.payload() != me {
                                    w.notify_one()
                                }
                            }
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
                let read = match client
                    .prepare(
                        "SELECT seq, origin, path, kind, (SELECT MIN(seq) FROM changes) FROM changes \
                         WHERE seq > $1 ORDER BY seq LIMIT 2000",
                    )
                    .await
                {
                    Ok(st) => st,
                    Err(e) => {
                        tracing::warn!("change feed: cannot prepare its read, reconnecting: {e}");
                        driver.abort();
                        continue;
                    }
                };
                loop {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let cursor = read_to;
                    let rows = match client
                        .query(&read, &[&cursor])
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
                    let _ = tokio::time::timeout(Duration::from_secs(1), async {
                        tokio::select! {
                            _ = wake.notified() => {}
                            _ = feed.poke.notified() => {}
                        }
                    })
                    .await;
                }
                driver.abort();
            }
        });
        Ok(())
    }

    /// Wait until every change committed (by any daemon) before the call
    /// has been applied here (`.ctxfs/sync`).
    pub(super) fn wait_for_feed(&self) -> Result<()> {
        if !self.feed.running.load(Ordering::SeqCst) {
            return Ok(());
        }
        let target: i64 = self
            .query("SELECT COALESCE(MAX(seq), 0) FROM changes", &[])?
            .first()
            .map(|r| r.get(0))
            .unwrap_or(0);
        let deadline = Instant::now() + OP_TIMEOUT;
        if *lock(&self.feed.cursor) < target {
            // Rows of this daemon's own do not wake the follower.
            self.feed.poke.notify_one();
        }
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

    /// Prune feed rows older than an hour and search counts of minutes
    /// gone, once a minute, on the daemon that leads "feed".
    pub(super) fn prune_feed(&self) -> Result<()> {
        // Prune old feed rows once a minute (the leader of "feed").
        let now = crate::schema::time::now_ns() as u64 / 1_000_000_000;
        let last = self.pruned.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 60 || !self.lead("feed") {
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
