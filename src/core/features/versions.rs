//! `NODE/.versions/`: every committed version of a node, read-only, and
//! the control files that restore or redact one of them.
//!
//! ```text
//! NODE/.versions/            reached by path, not listed in NODE (grep -r and cp -r skip it)
//! NODE/.versions/3/          the files of version 3 as committed
//! NODE/.versions/restore     `echo 3 > .versions/restore` commits version 3's files as version N+1
//! NODE/.versions/redact      `echo 3 > .versions/redact` replaces version 3's text by a tombstone
//! ```
//!
//! A version's files are also what `.as-of/T/` shows of a node
//! ([`file_key`]: one inode for both). What a write to `restore` or
//! `redact` does is `core::versions`.

use super::Feature;
use crate::config::Access;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Control, Fs, Handle, Kind, Opened, RestoreHandle};
use crate::error::{Error, Result};
use crate::schema::names::{REDACT, RESTORE, VERSIONS_DIR};
use crate::schema::place::{META, NODE_FILES};
use crate::schema::time::time_of;
use crate::store::NodeRec;
use serde_json::Value;
use std::sync::Arc;

pub(super) struct Versions;

const ID: &str = "versions";

const RESTORE_HELP: &str = "Write a version number here to commit that version's files again \
as the node's next version:\n  echo 3 > .versions/restore\nThe node must have no uncommitted \
changes (EBUSY otherwise). Versions are the directories beside this file.\n";

const REDACT_HELP: &str = "Write the number of an earlier version here to redact it: its \
files are replaced by a tombstone ([REDACTED]) and its text is deleted from the store (run \
`ctxfs compact` on the unmounted data dir to remove it from the disk too):\n  echo 3 > \
.versions/redact\nThe current version cannot be redacted: commit a version without the \
secret first.\n";

/// What of a node's `.versions/` a key names. A version is named with the
/// node's id: a node made since at the same path is another.
#[derive(Debug, Clone, PartialEq, Eq)]
enum At {
    Dir,
    Version { id: u64, version: u32 },
    File { id: u64, version: u32, name: String },
    Restore,
    Redact,
}

/// The name a key of `at` carries (the node is its `dir`).
fn name_of(at: &At) -> String {
    match at {
        At::Dir => VERSIONS_DIR.to_string(),
        At::Version { id, version } => format!("{VERSIONS_DIR}/{version}@{id}"),
        At::File { id, version, name } => format!("{VERSIONS_DIR}/{version}@{id}/{name}"),
        At::Restore => format!("{VERSIONS_DIR}/{RESTORE}"),
        At::Redact => format!("{VERSIONS_DIR}/{REDACT}"),
    }
}

/// The key of version `version` of node `id`, now at `node`:
/// `.versions/N/`, and a node's directory on a view (`core::view`).
pub(in crate::core) fn version_key(node: &str, id: u64, version: u32) -> Key {
    key(node, &At::Version { id, version })
}

/// What a key of this feature names when it is a version's directory
/// (file `None`) or one of its files: the node's id, the version, the file.
pub(in crate::core) fn version_place(key: &VKey) -> Option<(u64, u32, Option<String>)> {
    if key.feature != ID {
        return None;
    }
    match at(key).ok()? {
        At::Version { id, version } => Some((id, version, None)),
        At::File { id, version, name } => Some((id, version, Some(name))),
        _ => None,
    }
}

/// What reading `restore` or `redact` says.
fn help(at: &At) -> &'static str {
    if *at == At::Redact {
        REDACT_HELP
    } else {
        RESTORE_HELP
    }
}

fn key(node: &str, at: &At) -> Key {
    Key::Virtual(VKey::new(ID, node, &name_of(at)))
}

/// The key of file `name` of version `version` of node `id`, now at
/// `node`: `.versions/N/NAME`, and the same file in `.as-of/T/`.
pub(in crate::core) fn file_key(node: &str, id: u64, version: u32, name: &str) -> Key {
    let name = name.to_string();
    key(node, &At::File { id, version, name })
}

/// What `key` names (its name is always one [`name_of`] made).
fn at(key: &VKey) -> Result<At> {
    let rest = key.name.strip_prefix(VERSIONS_DIR).ok_or(Error::NotFound)?;
    let Some(rest) = rest.strip_prefix('/') else {
        return if rest.is_empty() {
            Ok(At::Dir)
        } else {
            Err(Error::NotFound)
        };
    };
    if rest == RESTORE {
        return Ok(At::Restore);
    }
    if rest == REDACT {
        return Ok(At::Redact);
    }
    let (dir, file) = match rest.split_once('/') {
        Some((d, f)) => (d, Some(f)),
        None => (rest, None),
    };
    let (v, id) = dir.split_once('@').ok_or(Error::NotFound)?;
    let version: u32 = v.parse().map_err(|_| Error::NotFound)?;
    let id: u64 = id.parse().map_err(|_| Error::NotFound)?;
    Ok(match file {
        None => At::Version { id, version },
        Some(name) => At::File {
            id,
            version,
            name: name.to_string(),
        },
    })
}

/// The current record of `node` and the caller's access.
fn current(fs: &Fs, c: Caller, node: &str) -> Result<(NodeRec, Access)> {
    let access = fs.gate(c, node, false)?;
    let rec = fs.visible_node(node, access)?.ok_or(Error::NotFound)?;
    Ok((rec, access))
}

/// Version `v` of `node` as `c` may see it; with `id`, only of that node.
fn version(fs: &Fs, c: Caller, node: &str, id: Option<u64>, v: u32) -> Result<NodeRec> {
    let (cur, access) = current(fs, c, node)?;
    if id.is_some_and(|id| id != cur.id) {
        return Err(Error::NotFound);
    }
    let rec = if v == cur.version {
        cur
    } else {
        fs.store()
            .get_version(cur.account(), cur.id, v)?
            .ok_or(Error::NotFound)?
    };
    if !Fs::shows(rec.status, access) {
        return Err(Error::NotFound);
    }
    Ok(rec)
}

/// The `.meta.json` of version `rec` as `.versions/N/` shows it: as
/// committed, and for a version that is no longer the current one,
/// which version superseded it (`superseded_by`) and, unless it says
/// so itself, when it stopped holding (`valid_until`: the next
/// version's `valid_from`, else that version's commit time).
fn meta(fs: &Fs, node: &str, rec: &NodeRec) -> Result<Vec<u8>> {
    let store = fs.store();
    let bytes = store.read_file(rec, META)?.ok_or(Error::NotFound)?;
    let next = match store.get_version(rec.account(), rec.id, rec.version + 1)? {
        Some(n) => n,
        None => match store.get_node(node)? {
            Some(cur) if cur.id == rec.id && cur.version == rec.version + 1 => cur,
            _ => return Ok(bytes),
        },
    };
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&bytes) else {
        return Ok(bytes);
    };
    obj.insert("superseded_by".into(), Value::from(rec.version + 1));
    if !obj.contains_key("valid_until") {
        let from = store
            .read_file(&next, META)?
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|m| m["valid_from"].as_str().map(str::to_string));
        let until = from.unwrap_or_else(|| crate::schema::time::rfc3339(next.updated_ns));
        obj.insert("valid_until".into(), Value::String(until));
    }
    let mut out = serde_json::to_vec_pretty(&Value::Object(obj))
        .map_err(|e| crate::error::Error::store_from("rendering .meta.json", e))?;
    out.push(b'\n');
    Ok(out)
}

impl Feature for Versions {
    fn id(&self) -> &'static str {
        ID
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        match parent {
            Key::Dir(_) => super::node_file(fs, c, parent, name, VERSIONS_DIR).map(|n| {
                let (node, access) = n?;
                fs.visible_node(node, access)?.ok_or(Error::NotFound)?;
                Ok(key(node, &At::Dir))
            }),
            Key::Virtual(v) if v.feature == ID => Some((|| {
                let node = &v.dir;
                match at(v)? {
                    At::Dir if name == RESTORE || name == REDACT => {
                        current(fs, c, node)?;
                        Ok(key(
                            node,
                            if name == RESTORE {
                                &At::Restore
                            } else {
                                &At::Redact
                            },
                        ))
                    }
                    At::Dir => {
                        let n: u32 = name.parse().map_err(|_| Error::NotFound)?;
                        if name != n.to_string() {
                            return Err(Error::NotFound);
                        }
                        let rec = version(fs, c, node, None, n)?;
                        Ok(key(
                            node,
                            &At::Version {
                                id: rec.id,
                                version: n,
                            },
                        ))
                    }
                    At::Version { id, version: n } => {
                        let rec = version(fs, c, node, Some(id), n)?;
                        rec.file(name).ok_or(Error::NotFound)?;
                        Ok(file_key(node, id, n, name))
                    }
                    _ => Err(Error::NotDir),
                }
            })()),
            _ => None,
        }
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        let node = &key.dir;
        match at(key)? {
            At::Dir => {
                let (rec, _) = current(fs, c, node)?;
                Ok(fs.shown.dir(ino, 0o555, time_of(rec.updated_ns), false))
            }
            At::Version { id, version: n } => {
                let rec = version(fs, c, node, Some(id), n)?;
                Ok(fs.shown.dir(ino, 0o555, time_of(rec.updated_ns), false))
            }
            At::File {
                id,
                version: n,
                name,
            } => {
                let rec = version(fs, c, node, Some(id), n)?;
                let f = rec.file(&name).ok_or(Error::NotFound)?;
                let size = if name == META {
                    meta(fs, node, &rec)?.len() as u64
                } else {
                    f.size
                };
                Ok(fs.shown.file(ino, size, 0o444, time_of(f.mtime_ns), false))
            }
            a @ (At::Restore | At::Redact) => {
                current(fs, c, node)?;
                let size = help(&a).len() as u64;
                Ok(fs.shown.file(ino, size, 0o644, fs.shown.started, false))
            }
        }
    }

    /// The versions (oldest first, then `restore` and `redact`), or the
    /// files of one version.
    fn list(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<Vec<(Key, String, Kind)>> {
        let node = &key.dir;
        let mut out = Vec::new();
        match at(key)? {
            At::Dir => {
                let (cur, access) = current(fs, c, node)?;
                for v in 1..=cur.version {
                    let rec = if v == cur.version {
                        Some(cur.clone())
                    } else {
                        fs.store().get_version(cur.account(), cur.id, v)?
                    };
                    if rec.is_some_and(|r| Fs::shows(r.status, access)) {
                        let k = self::key(
                            node,
                            &At::Version {
                                id: cur.id,
                                version: v,
                            },
                        );
                        out.push((k, v.to_string(), Kind::Dir));
                    }
                }
                out.push((self::key(node, &At::Restore), RESTORE.into(), Kind::File));
                out.push((self::key(node, &At::Redact), REDACT.into(), Kind::File));
            }
            At::Version { id, version: n } => {
                let rec = version(fs, c, node, Some(id), n)?;
                for name in NODE_FILES {
                    if rec.file(name).is_some() {
                        out.push((file_key(node, id, n, name), name.to_string(), Kind::File));
                    }
                }
            }
            _ => return Err(Error::NotDir),
        }
        Ok(out)
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        let node = &key.dir;
        let at = at(key)?;
        let data = match &at {
            At::File {
                id,
                version: n,
                name,
            } => {
                if write {
                    fs.gate(c, node, true)?;
                    return Err(Error::NotPermitted(
                        "old versions are read-only; restore one with `echo N > .versions/restore`",
                    ));
                }
                let rec = version(fs, c, node, Some(*id), *n)?;
                if name == META {
                    meta(fs, node, &rec)?
                } else {
                    let f = rec.file(name).ok_or(Error::NotFound)?;
                    fs.store().read_blob(rec.account(), f.blob, f.size)?
                }
            }
            At::Restore | At::Redact => {
                let redact = at == At::Redact;
                current(fs, c, node)?;
                if write {
                    fs.gate(c, node, true)?;
                    let (what, via) = if redact {
                        (Control::Redact, "redact")
                    } else {
                        (Control::Restore, "restore")
                    };
                    let fh = fs.new_handle(Handle::Restore(RestoreHandle::new(
                        node.clone(),
                        what,
                        c.by(Some(via)),
                    )));
                    return Ok(Opened {
                        fh,
                        direct_io: true,
                        keep_cache: false,
                        no_flush: false,
                    });
                }
                help(&at).as_bytes().to_vec()
            }
            At::Dir | At::Version { .. } => return Err(Error::IsDir),
        };
        // A version's bytes never change under its inode, except the
        // `.meta.json` of the current version, which gains `superseded_by`
        // when the next one is committed: read afresh every time.
        let file = matches!(at, At::File { .. });
        let meta = matches!(&at, At::File { name, .. } if name == META);
        let fh = fs.new_handle(Handle::Data(Arc::from(data)));
        Ok(Opened {
            fh,
            direct_io: meta,
            keep_cache: file && !meta,
            no_flush: true,
        })
    }

    /// `echo N > restore` (and `redact`): the control files take writes.
    fn takes_writes(&self, key: &VKey) -> bool {
        matches!(at(key), Ok(At::Restore | At::Redact))
    }

    fn unlink(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<()> {
        fs.gate(c, &key.dir, true)?;
        Err(Error::IsDir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_place_of_the_versions_is_named_and_found_again() {
        for a in [
            At::Dir,
            At::Version { id: 7, version: 1 },
            At::File {
                id: u64::MAX,
                version: 12,
                name: META.into(),
            },
            At::Restore,
            At::Redact,
        ] {
            let Key::Virtual(k) = key("acme/users/u/memories/c/n", &a) else {
                unreachable!()
            };
            assert_eq!(at(&k).unwrap(), a, "{a:?} as {}", k.name);
        }
        for odd in [
            ".versions/3",
            ".versions/x@1",
            ".versionsx",
            ".versions/3@1@2",
        ] {
            assert!(at(&VKey::new(ID, "n", odd)).is_err(), "{odd}");
        }
    }
}
