//! The daemon's own files in `MOUNT/.ctxfs/`: `status`, `pid`, `sync`,
//! `header` (and `header?budget=N`), `help`, `metrics`, each computed at
//! open for the caller (SEMANTICS "Tenancy", "The agent's view").

use super::Feature;
use crate::config::Access;
use crate::core::inodes::{Key, VKey};
use crate::core::metrics;
use crate::core::{Attr, Caller, Fs, Kind, Opened};
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::schema::names::{self, CTXFS_FILES};
use crate::schema::place;
use crate::store::Status;
use std::sync::atomic::Ordering;

pub(super) struct DaemonFiles;

fn key(name: &str) -> Key {
    Key::Virtual(VKey::new("ctxfs", "", name))
}

impl Feature for DaemonFiles {
    fn id(&self) -> &'static str {
        "ctxfs"
    }

    fn lookup(&self, _fs: &Fs, _c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        if !matches!(parent, Key::CtxfsDir) {
            return None;
        }
        if CTXFS_FILES.contains(&name) {
            return Some(Ok(key(name)));
        }
        // `header?budget=N`: the header cut to N tokens.
        let budgeted = name
            .strip_prefix(names::HEADER)
            .is_some_and(|rest| rest.starts_with('?'));
        budgeted.then(|| {
            crate::schema::budget::budget_option(name)?.ok_or(Error::NotFound)?;
            Ok(key(name))
        })
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        match parent {
            Key::CtxfsDir => CTXFS_FILES
                .iter()
                .map(|n| (key(n), n.to_string(), Kind::File))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn attr(&self, fs: &Fs, _c: Caller, _key: &VKey, ino: u64) -> Result<Attr> {
        Ok(fs
            .shown
            .file(ino, 0, 0o444, std::time::SystemTime::now(), false))
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        if write {
            return Err(Error::NotPermitted("read-only virtual file"));
        }
        let bytes = match &*key.name {
            names::STATUS_FILE => fs.status_json(c)?,
            names::SYNC_FILE => fs.sync_file(c)?,
            names::HEADER => fs.header(c, None, None)?,
            names::HELP => fs.help(c).into_bytes(),
            names::METRICS_FILE => fs.metrics_text(Some(c))?.into_bytes(),
            names::PID_FILE => format!("{}\n", std::process::id()).into_bytes(),
            budgeted => {
                let (_, budget) =
                    crate::schema::budget::budget_option(budgeted)?.ok_or(Error::NotFound)?;
                fs.header(c, None, Some(budget))?
            }
        };
        fs.read_only(bytes, false)
    }
}

impl Fs {
    /// `.ctxfs/status`: what the caller's accounts hold.
    ///
    /// Every figure is scoped to what the caller may see: committed nodes of
    /// its accounts; BROKEN nodes, drafts (PENDING) and uncommitted edits
    /// only of the accounts it may write; daemon-wide activity (commits,
    /// refusals, inodes, the indexer's counters) only for uid 0.
    pub fn status_json(&self, caller: Caller) -> Result<Vec<u8>> {
        let accounts = self.accounts_visible(caller)?;
        let writable: Vec<&String> = accounts
            .iter()
            .filter(|a| self.access_of(caller, a) == Access::Write)
            .collect();
        let admin = caller.uid == 0;
        let mut counts = serde_json::Map::new();
        let mut outbox = 0i64;
        for st in Status::all() {
            let mut n = 0;
            for a in &accounts {
                if Self::shows(st, self.access_of(caller, a)) {
                    n += self
                        .store
                        .counter(&crate::schema::counters::nodes_key(a, st))?;
                }
            }
            counts.insert(st.as_str().into(), n.into());
        }
        for a in &accounts {
            outbox += self
                .store
                .counter(&crate::schema::counters::outbox_key(a))?;
        }
        let (mut pending, mut edits) = (0, 0);
        for (path, d) in self.drafts.snapshot().iter() {
            if writable.iter().any(|a| *a == place::account_of(path)) {
                if lock(d).base.is_none() {
                    pending += 1;
                } else {
                    edits += 1;
                }
            }
        }
        counts.insert("PENDING".into(), pending.into());
        let (dead, indexer) = self.index_status(&accounts, admin)?;
        let mut v = serde_json::json!({
            "nodes": counts,
            "uncommitted_edits": edits,
            "outbox_depth": outbox,
            "dead_letters": dead,
            "index_lag_ms": indexer["index_lag_ms"].clone(),
            "indexer": indexer,
            "uptime_s": self.shown.uptime_s(),
            "version": env!("CARGO_PKG_VERSION"),
        });
        if self.tenancy.knows(caller.uid) {
            v["inbox"] = self.inbox_status();
        } else {
            // A uid in no account learns nothing of the others' activity.
            v["index_lag_ms"] = serde_json::Value::Null;
            v["indexer"] = serde_json::json!({});
        }
        if admin {
            v["commits"] = self.metrics.nodes.commits.load(Ordering::Relaxed).into();
            v["commit_failures"] = self
                .metrics
                .nodes
                .commit_failures
                .load(Ordering::Relaxed)
                .into();
            v["inodes"] = self.inode_count().into();
            v["log_lines_dropped"] = metrics::LOG_LINES_DROPPED.load(Ordering::Relaxed).into();
            v["encrypted"] = self.store.sealed().into();
            if let Some(n) = self.store.data_keys() {
                v["data_keys"] = n.into();
            }
        }
        let mut out =
            serde_json::to_vec_pretty(&v).map_err(|e| Error::store_from("rendering status", e))?;
        out.push(b'\n');
        Ok(out)
    }

    pub(in crate::core) fn accounts_visible(&self, caller: Caller) -> Result<Vec<String>> {
        let mut all = self.all_accounts()?;
        all.retain(|a| self.access_of(caller, a) != Access::None);
        Ok(all)
    }
}
