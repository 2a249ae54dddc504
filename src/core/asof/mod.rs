//! `accounts/A/.as-of/T/`: the account as it stood at time T, read-only.
//!
//! ```text
//! accounts/acme/.as-of/                                reached by path, lists nothing
//! accounts/acme/.as-of/2026-11-20T10:00:00Z/           the account at that instant
//! accounts/acme/.as-of/2026-11-20T10:00:00Z/users/priya/memories/profile/content.md
//! accounts/acme/.as-of/2026-11-20/                     a day: its first instant, UTC
//! ```
//!
//! Every version of a node is kept, each with the path it had and the time
//! it was committed, so the tree at T is known: each node that is still
//! there, at the path and with the files of its newest version committed
//! at or before T. A node made after T is not there; a node deleted since
//! is not there either, at any time (a delete forgets a node's history,
//! and a crypto-shredded user has no past). A directory is there when a
//! node below it was. The files are the versions' own (`features::version_file_key`,
//! as `.versions/N/` serves them), so a redacted version reads as its
//! tombstone here too.
//!
//! A view of an account at a time is built once (every node's version at T
//! found by a binary search over its versions' commit times) and kept for
//! [`FRESH`]; each use checks that the nodes it names are still the same
//! nodes, so a node deleted after the view was built is gone at once, and
//! one moved is found at its new place when the view is built again.

mod files;
mod restore;
mod search;

pub(in crate::core) use files::{AsOfFiles, Past};

use super::features::version_file_key;
use super::inodes::Key;
use super::{Attr, Caller, Fs, Kind};
use crate::config::Access;
use crate::error::{Error, Result};
use crate::index::PastIndex;
use crate::locks::lock;
use crate::schema::names::{RESTORE, SEARCH_DIR};
use crate::schema::place::{self, NODE_FILES};
use crate::schema::time::time_of;
use crate::store::NodeRec;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a built view is used before it is built again (a node moved
/// meanwhile is found at its new place after at most this long).
const FRESH: Duration = Duration::from_secs(5);
/// Views kept at once (the least recently built goes first).
const KEPT: usize = 8;

/// The instant a name of `.as-of/` names, in nanoseconds since the epoch:
/// an RFC 3339 time (`2026-11-20T10:00:00Z`, `2026-11-20T11:00:00+01:00`)
/// or a day (`2026-11-20`, its first instant in UTC).
pub fn parse_time(name: &str) -> Result<i128> {
    let bad = || {
        Error::Invalid(format!(
            "{name:?} is not a time: give an RFC 3339 time such as 2026-11-20T10:00:00Z, or a day such as 2026-11-20"
        ))
    };
    if let Ok(t) = name.parse::<jiff::Timestamp>() {
        return Ok(t.as_nanosecond());
    }
    // A time of day needs its offset: "10:00" of which zone?
    if name.contains(['T', 't', ' ']) {
        return Err(bad());
    }
    let day: jiff::civil::Date = name.parse().map_err(|_| bad())?;
    let t = day
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_err(|_| bad())?
        .timestamp();
    Ok(t.as_nanosecond())
}

/// A node of a view: where it is now, and its version at the view's time.
#[derive(Debug, Clone)]
pub struct Placed {
    pub now: Arc<str>,
    pub id: u64,
    pub version: u32,
}

/// One account at one instant.
pub struct View {
    account: String,
    at: i128,
    made: Instant,
    /// Nodes by their path at the view's time.
    nodes: BTreeMap<String, Placed>,
    /// Directories by path at the view's time (the account's own included).
    dirs: BTreeSet<String>,
}

impl View {
    /// The node at `path` (a path at the view's time).
    pub fn node(&self, path: &str) -> Option<&Placed> {
        self.nodes.get(path)
    }

    pub fn is_dir(&self, path: &str) -> bool {
        self.dirs.contains(path)
    }

    /// Directories and nodes directly under `dir`, in name order.
    fn children(&self, dir: &str) -> Vec<(String, Option<&Placed>)> {
        let prefix = format!("{dir}/");
        fn direct<'a>(p: &'a str, prefix: &str) -> Option<&'a str> {
            p.strip_prefix(prefix).filter(|r| !r.contains('/'))
        }
        let mut out: Vec<(String, Option<&Placed>)> = self
            .dirs
            .range(prefix.clone()..)
            .take_while(|p| p.starts_with(&prefix))
            .filter_map(|p| direct(p, &prefix).map(|n| (n.to_string(), None)))
            .collect();
        out.extend(
            self.nodes
                .range(prefix.clone()..)
                .take_while(|(p, _)| p.starts_with(&prefix))
                .filter_map(|(p, n)| direct(p, &prefix).map(|name| (name.to_string(), Some(n)))),
        );
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Past indexes kept at once (the least recently used goes first), and
/// how long one unused is kept.
const SEARCHED: usize = 4;
const SEARCHED_FOR: Duration = Duration::from_secs(300);

/// (account, at, last use, the exact index of that view's versions).
type Searched = (String, i128, Instant, Arc<PastIndex>);

/// The views built lately, the exact indexes of those searched, and the
/// last restore of each (account, uid).
#[derive(Default)]
pub struct Views {
    built: Mutex<Vec<Arc<View>>>,
    /// (account, at, last use, index): the past does not change, but a
    /// version redacted since is checked at each search.
    searched: Mutex<Vec<Searched>>,
    restored: super::handles::LastResults,
}

impl Views {
    fn get(&self, account: &str, at: i128) -> Option<Arc<View>> {
        lock(&self.built)
            .iter()
            .find(|v| v.account == account && v.at == at && v.made.elapsed() < FRESH)
            .cloned()
    }

    /// Drop the view of `account` at `at`, if kept.
    fn forget(&self, account: &str, at: i128) {
        lock(&self.built).retain(|o| !(o.account == account && o.at == at));
    }

    fn past_index(&self, account: &str, at: i128) -> Option<Arc<PastIndex>> {
        let mut s = lock(&self.searched);
        s.retain(|e| e.2.elapsed() < SEARCHED_FOR);
        let e = s.iter_mut().find(|e| e.0 == account && e.1 == at)?;
        e.2 = Instant::now();
        Some(e.3.clone())
    }

    fn keep_past_index(&self, account: &str, at: i128, px: Arc<PastIndex>) {
        let mut s = lock(&self.searched);
        s.retain(|e| !(e.0 == account && e.1 == at));
        if s.len() >= SEARCHED {
            s.sort_by_key(|e| std::cmp::Reverse(e.2.elapsed()));
            s.remove(0);
        }
        s.push((account.to_string(), at, Instant::now(), px));
    }

    /// Drop every view and past index of `account`: after a delete or a
    /// redaction no copy of the text it removed stays in memory here.
    pub(super) fn forget_account(&self, account: &str) {
        lock(&self.built).retain(|v| v.account != account);
        lock(&self.searched).retain(|e| e.0 != account);
    }

    fn forget_past_index(&self, account: &str, at: i128) {
        lock(&self.searched).retain(|e| !(e.0 == account && e.1 == at));
    }

    fn keep(&self, v: Arc<View>) {
        let mut b = lock(&self.built);
        b.retain(|o| !(o.account == v.account && o.at == v.at) && o.made.elapsed() < FRESH);
        if b.len() >= KEPT {
            b.remove(0);
        }
        b.push(v);
    }
}

impl Fs {
    /// The version of `cur` (a node's current record) committed last at or
    /// before `at`; `None` when the node was made after `at`.
    pub(super) fn version_at(&self, cur: &NodeRec, at: i128) -> Result<Option<NodeRec>> {
        if cur.updated_ns <= at {
            return Ok(Some(cur.clone()));
        }
        let account = cur.account();
        // Versions 1..cur.version-1, commit times rising with the number.
        let (mut lo, mut hi) = (1u32, cur.version.saturating_sub(1));
        let mut best = None;
        while lo <= hi {
            let mid = lo + (hi - lo) / 2;
            match self.store.get_version(account, cur.id, mid)? {
                Some(r) if r.updated_ns <= at => {
                    best = Some(r);
                    lo = mid + 1;
                }
                Some(_) => hi = mid - 1,
                // A version the store no longer has (forgotten): look at
                // each, newest first.
                None => {
                    for v in (1..cur.version).rev() {
                        if let Some(r) = self.store.get_version(account, cur.id, v)? {
                            if r.updated_ns <= at {
                                return Ok(Some(r));
                            }
                        }
                    }
                    return Ok(None);
                }
            }
        }
        Ok(best)
    }

    /// The view of `account` at `at`, built now or lately.
    pub(super) fn as_of_view(&self, account: &str, at: i128) -> Result<Arc<View>> {
        if let Some(v) = self.as_of.get(account, at) {
            return Ok(v);
        }
        let mut nodes = BTreeMap::new();
        let mut dirs = BTreeSet::new();
        dirs.insert(account.to_string());
        let mut todo = vec![account.to_string()];
        while let Some(dir) = todo.pop() {
            for (name, cur) in self.store.list_nodes(&dir)? {
                let now = format!("{dir}/{name}");
                if self.expired(&now) {
                    continue;
                }
                let Some(then) = self.version_at(&cur, at)? else {
                    continue;
                };
                // Its path then, if it was in this account (a move keeps
                // a node in its account).
                let path = if place::account_of(&then.path) == account {
                    then.path.clone()
                } else {
                    now.clone()
                };
                let mut d = path.as_str();
                while let Some((parent, _)) = d.rsplit_once('/') {
                    if !dirs.insert(parent.to_string()) {
                        break;
                    }
                    d = parent;
                }
                nodes.insert(
                    path,
                    Placed {
                        now: Arc::from(now),
                        id: then.id,
                        version: then.version,
                    },
                );
            }
            for sub in self.subdirs(&dir)? {
                todo.push(format!("{dir}/{sub}"));
            }
        }
        let v = Arc::new(View {
            account: account.to_string(),
            at,
            made: Instant::now(),
            nodes,
            dirs,
        });
        self.as_of.keep(v.clone());
        Ok(v)
    }

    /// Version `placed.version` of the node `placed` names, if that node is
    /// still there (the same node: a node made since at its place is not it)
    /// and shown to `access`.
    pub(super) fn placed_rec(&self, placed: &Placed, access: Access) -> Result<Option<NodeRec>> {
        let Some(cur) = self.live_node(&placed.now)? else {
            return Ok(None);
        };
        if cur.id != placed.id {
            return Ok(None);
        }
        let rec = if cur.version == placed.version {
            Some(cur)
        } else {
            self.store
                .get_version(cur.account(), cur.id, placed.version)?
        };
        Ok(rec.filter(|r| Self::shows(r.status, access)))
    }

    /// `accounts/A/.as-of/NAME`: the view's root.
    pub(super) fn as_of_root_child(&self, c: Caller, account: &str, name: &str) -> Result<Past> {
        self.gate(c, account, false)?;
        let at = parse_time(name)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(i128::MAX);
        // The future is not known yet.
        if at > now {
            return Err(Error::NotFound);
        }
        Ok(Past::Dir {
            time: Arc::from(name),
            at,
            path: Arc::from(account),
        })
    }

    /// The attributes of directory `path` of `view` (read-only; a node's
    /// directory carries its version's time, the others the view's);
    /// `NotFound` when it is not there for `access`.
    fn view_dir_attr(&self, view: &View, path: &str, access: Access, ino: u64) -> Result<Attr> {
        let mtime = match view.node(path) {
            Some(placed) => {
                let rec = self.placed_rec(placed, access)?.ok_or(Error::NotFound)?;
                time_of(rec.updated_ns)
            }
            None if view.is_dir(path) => time_of(view.at),
            None => return Err(Error::NotFound),
        };
        Ok(self.shown.dir(ino, 0o555, mtime, false))
    }

    /// A name inside a directory of a view, with a directory's attributes
    /// (from the record read to find it).
    pub(super) fn as_of_child(
        &self,
        c: Caller,
        parent: &Past,
        name: &str,
    ) -> Result<(Key, Option<Attr>)> {
        if let Past::Search {
            time,
            at,
            dir,
            name: None,
        } = parent
        {
            self.gate(c, dir, false)?;
            super::search::parse_query_name(name)?;
            let key = Past::Search {
                time: time.clone(),
                at: *at,
                dir: dir.clone(),
                name: Some(Arc::from(name)),
            };
            return Ok((key.key(), None));
        }
        let Past::Dir { time, at, path } = parent else {
            return Err(Error::NotDir);
        };
        let account = place::account_of(path);
        let access = self.gate(c, path, false)?;
        let view = self.as_of_view(account, *at)?;
        if name == SEARCH_DIR && view.is_dir(path) {
            let key = Past::Search {
                time: time.clone(),
                at: *at,
                dir: path.clone(),
                name: None,
            };
            return Ok((key.key(), None));
        }
        if let Some(placed) = view.node(path) {
            let rec = self.placed_rec(placed, access)?.ok_or(Error::NotFound)?;
            rec.file(name).ok_or(Error::NotFound)?;
            let key = version_file_key(&placed.now, placed.id, placed.version, name);
            return Ok((key, None));
        }
        if name == RESTORE && !path.contains('/') {
            let key = Past::Restore {
                time: time.clone(),
                at: *at,
                account: path.clone(),
            };
            return Ok((key.key(), None));
        }
        let child = format!("{path}/{name}");
        let access = self.gate(c, &child, false)?;
        let attr = self.view_dir_attr(&view, &child, access, 0)?;
        let key = Past::Dir {
            time: time.clone(),
            at: *at,
            path: Arc::from(child),
        };
        Ok((key.key(), Some(attr)))
    }

    /// Attributes of `.as-of/` and of a view's directories (read-only; a
    /// node's directory carries its version's time, the others the view's).
    pub(super) fn as_of_attr(&self, c: Caller, past: &Past, ino: u64) -> Result<Attr> {
        match past {
            Past::Root { account } => {
                self.gate(c, account, false)?;
                Ok(self.shown.dir(ino, 0o555, self.shown.started, false))
            }
            Past::Restore { account, .. } => {
                self.gate(c, account, false)?;
                let size = self.as_of_restore_text(c, account).len() as u64;
                Ok(self.shown.file(ino, size, 0o644, self.shown.started, false))
            }
            Past::Dir { at, path, .. } => {
                let account = place::account_of(path);
                let access = self.gate(c, path, false)?;
                let view = self.as_of_view(account, *at)?;
                self.view_dir_attr(&view, path, access, ino)
            }
            Past::Search { dir, name, .. } => {
                self.gate(c, dir, false)?;
                Ok(match name {
                    None => self.shown.dir(ino, 0o555, self.shown.started, false),
                    Some(_) => self
                        .shown
                        .file(ino, 0, 0o444, std::time::SystemTime::now(), false),
                })
            }
        }
    }

    /// The entries of a view's directory: its directories and nodes then,
    /// or a node's files then.
    pub(super) fn as_of_list(&self, c: Caller, past: &Past) -> Result<Vec<(Key, String, Kind)>> {
        let mut out = Vec::new();
        let Past::Dir { time, at, path } = past else {
            // `.as-of/` itself lists nothing: any time is reached by path.
            return Ok(out);
        };
        let account = place::account_of(path);
        let access = self.gate(c, path, false)?;
        let view = self.as_of_view(account, *at)?;
        if let Some(placed) = view.node(path) {
            let rec = self.placed_rec(placed, access)?.ok_or(Error::NotFound)?;
            for name in NODE_FILES {
                if rec.file(name).is_some() {
                    let k = version_file_key(&placed.now, placed.id, placed.version, name);
                    out.push((k, name.to_string(), Kind::File));
                }
            }
            return Ok(out);
        }
        if !view.is_dir(path) {
            return Err(Error::NotFound);
        }
        let per_caller = self.per_caller_dir(&place::split(path));
        for (name, placed) in view.children(path) {
            if per_caller && self.access_of(c, &format!("{path}/{name}")) == Access::None {
                continue;
            }
            if let Some(p) = placed {
                if self.placed_rec(p, access)?.is_none() {
                    continue;
                }
            }
            let k = Past::Dir {
                time: time.clone(),
                at: *at,
                path: Arc::from(format!("{path}/{name}")),
            };
            out.push((k.key(), name, Kind::Dir));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_a_day_in_utc() {
        let t = parse_time("2026-11-20T10:00:00Z").unwrap();
        assert_eq!(t, 1_795_168_800_000_000_000);
        assert_eq!(parse_time("2026-11-20T11:00:00+01:00").unwrap(), t);
        assert_eq!(
            parse_time("2026-11-20").unwrap(),
            t - 10 * 3600 * 1_000_000_000
        );
        for bad in ["yesterday", "2026-13-01", "", "2026-11-20T10:00:00"] {
            assert!(matches!(parse_time(bad), Err(Error::Invalid(_))), "{bad}");
        }
    }
}
