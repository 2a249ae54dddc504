//! Changes made on what was read, committed only over what was read: no
//! lost update between agents.
//!
//! An edit (`update`, the memory tool's `str_replace` and `insert`) reads
//! the node's committed version, makes its change on that text, and commits
//! the whole node in one request, a line of `accounts/A/.ctxfs/batch` with
//! `"if_version"`: the daemon lands it only over the version read. When
//! another writer committed in between, the edit is made again on a fresh
//! read, and when it no longer applies the caller gets a conflict naming
//! the current version. One request, not the four-step write, so two
//! agents' files never meet in the node's shared draft.

use super::dirfd::write_checked;
use super::{Front, FrontError, FrontResult, NodeWrite};
use crate::schema::names::{CONTENT, META, VERSIONS_DIR};
use serde_json::{json, Map, Value};

/// Reads an edit is made on before it gives up to a stream of other writers.
pub const EDIT_TRIES: u32 = 16;

/// A pause before try `n` (from 1) after another writer was faster: random
/// in 0..=min(2^n, 64) ms, so two agents in step fall out of it.
fn backoff(n: u32) -> std::time::Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(crate::schema::time::now_ns() as u128);
    let top = (1u64 << n.min(6)).min(64);
    std::time::Duration::from_millis(h.finish() % (top + 1))
}

/// A node's committed version: its number, `.meta.json` and `content.md`.
#[derive(Debug, Clone)]
pub struct Committed {
    pub version: u32,
    pub meta: Map<String, Value>,
    pub content: String,
}

/// Why an edit did not land.
#[derive(Debug)]
pub enum EditError<E> {
    /// The edit does not apply to the node as read.
    Edit(E),
    /// Another writer committed the node since it was read, and the edit
    /// no longer applies to what it holds now (version `current`).
    Conflict { current: u32, why: E },
    /// The node is missing, or the file system refused.
    Front(FrontError),
}

impl<E> From<FrontError> for EditError<E> {
    fn from(e: FrontError) -> Self {
        EditError::Front(e)
    }
}

/// The committed-over outcome of one try.
enum Landed {
    Version(u32),
    /// The node is at this version now (0: gone), not the one read.
    MovedOn(u32),
}

impl Front {
    /// `accounts/A/REST` → (`A`, `REST`).
    fn split_account(node: &str) -> FrontResult<(&str, &str)> {
        node.strip_prefix("accounts/")
            .and_then(|r| r.split_once('/'))
            .filter(|(_, rest)| !rest.is_empty())
            .ok_or_else(|| FrontError::invalid(format!("{node} is not a node of an account")))
    }

    /// The node's committed version, read as one: `.meta.json` gives the
    /// version, and its content comes from `.versions/N/`, which no commit
    /// changes. `None` when there is no node.
    pub fn committed(&self, node: &str) -> FrontResult<Option<Committed>> {
        let meta_path = self.abs(&format!("{node}/{META}"));
        let text = match std::fs::read_to_string(&meta_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FrontError::io(&format!("reading {node}/{META}"), &e, None)),
        };
        let meta: Map<String, Value> = serde_json::from_str(&text).unwrap_or_default();
        let Some(version) = meta
            .get("version")
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
        else {
            // A writer reads its draft's `.meta.json` before the commit.
            return Err(FrontError {
                errno: Some(libc::EBUSY),
                message: format!(
                    "{node} has uncommitted changes in a draft: commit or remove them first"
                ),
            });
        };
        let at = format!("{node}/{VERSIONS_DIR}/{version}/{CONTENT}");
        match std::fs::read_to_string(self.abs(&at)) {
            Ok(content) => Ok(Some(Committed {
                version,
                meta,
                content,
            })),
            // Deleted since: as if never there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FrontError::io(&format!("reading {at}"), &e, None)),
        }
    }

    /// Commit `w` (its content given) as the node's next version over
    /// version `base` of it, in one batch line.
    fn commit_over(&self, node: &str, w: &NodeWrite, base: &Committed) -> FrontResult<Landed> {
        let (account, rest) = Self::split_account(node)?;
        let mut meta = base.meta.clone();
        for (k, v) in &w.meta {
            meta.insert(k.clone(), v.clone());
        }
        if !w.meta.contains_key("status") {
            meta.insert("status".into(), json!("ACTIVE"));
        }
        let mut line = json!({
            "node": rest,
            "content": w.content.as_deref().unwrap_or(&base.content),
            "meta": meta,
            "if_version": base.version,
        });
        for (key, given) in [
            ("abstract", w.abstract_.as_ref().map(|a| json!(a))),
            ("overview", w.overview.as_ref().map(|o| json!(o))),
            ("relations", w.relations.clone()),
        ] {
            if let Some(v) = given {
                line[key] = v;
            }
        }
        let batch = self.abs(&format!("accounts/{account}/.ctxfs/batch"));
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        match write_checked(&batch, &bytes) {
            // Committed over `base`, so the next version.
            Ok(()) => Ok(Landed::Version(base.version + 1)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // Our line's result (another process of this uid may have
                // written a batch since: then ask the node itself).
                let result = std::fs::read_to_string(&batch).unwrap_or_default();
                let mine = result
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .find(|v| v["node"] == rest);
                if let Some(current) = mine.as_ref().and_then(|v| v["current"].as_u64()) {
                    return Ok(Landed::MovedOn(current as u32));
                }
                let now = self.committed(node)?.map_or(0, |c| c.version);
                if now != base.version {
                    return Ok(Landed::MovedOn(now));
                }
                let why = mine
                    .as_ref()
                    .and_then(|v| v["error"].as_str())
                    .map(str::to_string);
                Err(FrontError::io(&format!("committing {node}"), &e, why))
            }
            Err(e) => Err(FrontError::io(&format!("committing {node}"), &e, None)),
        }
    }

    /// Make an edit on the node's committed version and commit it over that
    /// version; made again on a fresh read when another writer committed in
    /// between (up to [`EDIT_TRIES`] reads). `make` gives the files and
    /// `.meta.json` fields the edit writes (the content left out is kept).
    /// The new version's number.
    pub fn edit<E>(
        &self,
        node: &str,
        mut make: impl FnMut(&Committed) -> Result<NodeWrite, E>,
    ) -> Result<u32, EditError<E>> {
        let missing = || {
            EditError::Front(FrontError::io(
                &format!("reading {node}/{META}"),
                &std::io::Error::from_raw_os_error(libc::ENOENT),
                None,
            ))
        };
        let mut moved_on = None;
        for n in 0..EDIT_TRIES {
            if n > 0 {
                std::thread::sleep(backoff(n));
            }
            let cur = match self.committed(node)? {
                Some(c) => c,
                // Deleted by another writer while this edit was made: a
                // delete wins, the edit does not bring the node back.
                None => return Err(missing()),
            };
            let w = match make(&cur) {
                Ok(w) => w,
                Err(why) => {
                    return Err(match moved_on {
                        None => EditError::Edit(why),
                        Some(_) => EditError::Conflict {
                            current: cur.version,
                            why,
                        },
                    })
                }
            };
            match self.commit_over(node, &w, &cur)? {
                Landed::Version(v) => return Ok(v),
                Landed::MovedOn(0) => return Err(missing()),
                Landed::MovedOn(v) => moved_on = Some(v),
            }
        }
        Err(EditError::Front(FrontError {
            errno: Some(libc::ESTALE),
            message: format!(
                "{node} was committed by other writers {EDIT_TRIES} times while this edit was made \
                 (now version {}); read it and try again",
                moved_on.unwrap_or(0)
            ),
        }))
    }
}

impl Front {
    /// A new version of an existing node: the files given replace the
    /// committed ones, the others are kept; `.meta.json`'s own fields are
    /// kept unless given. Committed only over the version it was made on
    /// (`if_version` when given, else the one read, and then made again on
    /// a fresh read when another writer committed in between).
    /// Returns `{path, uri, version, status}`.
    pub fn update(&self, node: &str, w: &NodeWrite, if_version: Option<u32>) -> FrontResult<Value> {
        let stale = |want: u32, have: u32| FrontError {
            errno: Some(libc::ESTALE),
            message: format!(
                "{node} is at version {have}, not {want}: it changed since version {want} was read \
                 (read it again, or see .versions/{have}/)"
            ),
        };
        let done = self.edit(node, |cur| match if_version {
            Some(want) if want != cur.version => Err(stale(want, cur.version)),
            _ => Ok(w.clone()),
        });
        let version = match done {
            Ok(v) => v,
            Err(EditError::Edit(e) | EditError::Conflict { why: e, .. }) => return Err(e),
            Err(EditError::Front(e)) => return Err(e),
        };
        let mut info = self.node_info(node)?;
        info["version"] = json!(version);
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_split_at_its_account() {
        assert_eq!(
            Front::split_account("accounts/acme/users/u/memories/c/s").unwrap(),
            ("acme", "users/u/memories/c/s")
        );
        for bad in ["accounts/acme", "accounts/", "users/u/memories/c/s"] {
            assert!(Front::split_account(bad).is_err(), "{bad}");
        }
    }
}
