//! Views (`ctxfs mount --views DIR`): the tree as one uid may read it, on a
//! mount of its own (`fuse/view.rs`) that only that uid can enter.
//!
//! A view shows directories and committed node files, nothing else: no
//! drafts, no virtual files, no `.search/`, no inbox or scratchpad. Every
//! node directory is served as the directory of the version current at
//! the lookup (the key of `.versions/N/`), so everything read through one
//! directory is of one version, and a commit drops the node's entry from
//! each view's kernel cache (`Target::ViewEntry`): the next walk meets the
//! new version. Since one uid alone reaches a view, an answer that depends
//! on the caller may still be cached there; only what changes without an
//! invalidation (expiring nodes) is not. Each answer's `shared` says
//! whether the view's kernel may keep it.

use crate::config::Access;
use crate::core::features::{version_file_key, version_key, version_place};
use crate::core::inodes::Key;
use crate::core::{Attr, Caller, DirBatch, Fs, Kind, Listing};
use crate::error::{Error, Result};
use crate::schema::names;
use crate::schema::place::{self, DirPlace, NODE_FILES};
use crate::schema::time::time_of;
use crate::store::NodeRec;

/// The bit that keeps a view's listing snapshots apart from the main
/// mount's for the same directory and uid (inode numbers are counters,
/// far below it).
const VIEW_LISTING: u64 = 1 << 62;

impl Fs {
    /// `lookup` on a view.
    pub fn view_lookup(&self, c: Caller, parent: u64, name: &str) -> Result<Attr> {
        let pkey = self.key_of(parent)?;
        let key = self.view_child(c, &pkey, name)?;
        let attr = self.view_attr_of(c, &key, 0)?;
        let ino = self.ino_lookup(key);
        Ok(Attr { ino, ..attr })
    }

    /// `getattr` on a view.
    pub fn view_getattr(&self, c: Caller, ino: u64) -> Result<Attr> {
        let key = self.key_of(ino)?;
        self.view_attr_of(c, &key, ino)
    }

    /// `readdir` on a view: what `lookup` there finds, in listing order.
    pub fn view_readdir(&self, c: Caller, ino: u64, offset: u64) -> Result<DirBatch> {
        self.read_listing((ino | VIEW_LISTING, c.uid), offset, || {
            self.view_listing(c, ino)
        })
    }

    /// A read without an open: bytes of the committed version file `ino`.
    pub fn view_read(&self, c: Caller, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let Key::Virtual(v) = self.key_of(ino)? else {
            return Err(Error::IsDir);
        };
        let Some((id, version, Some(name))) = version_place(&v) else {
            return Err(Error::IsDir);
        };
        let rec = self.view_version(c, &v.dir, id, version)?;
        let bytes = self.store.read_file(&rec, &name)?.ok_or(Error::NotFound)?;
        Ok(crate::core::draft::slice_at(&bytes, offset, size))
    }

    /// The key of `name` in `parent` on a view.
    fn view_child(&self, c: Caller, parent: &Key, name: &str) -> Result<Key> {
        match parent {
            // A node's version: its files.
            Key::Virtual(v) => {
                let Some((id, version, None)) = version_place(v) else {
                    return Err(Error::NotDir);
                };
                if !NODE_FILES.contains(&name) {
                    return Err(Error::NotFound);
                }
                let rec = self.view_version(c, &v.dir, id, version)?;
                rec.file(name).ok_or(Error::NotFound)?;
                Ok(version_file_key(&v.dir, id, version, name))
            }
            Key::Root if name != "accounts" => Err(Error::NotFound),
            // Names of the tree never begin with a dot; virtual files do.
            Key::Accounts | Key::Dir(_) if name.starts_with('.') => Err(Error::NotFound),
            Key::Root | Key::Accounts | Key::Dir(_) => match self.child_key(c, parent, name)?.0 {
                Key::Accounts => Ok(Key::Accounts),
                Key::Dir(path) => match place::classify_dir(&place::split(&path))? {
                    DirPlace::Node => {
                        let rec = self.view_node(c, &path)?;
                        Ok(version_key(&path, rec.id, rec.version))
                    }
                    _ => Ok(Key::Dir(path)),
                },
                _ => Err(Error::NotFound),
            },
            _ => Err(Error::NotFound),
        }
    }

    /// Attributes on a view; `shared` when its kernel may keep them.
    fn view_attr_of(&self, c: Caller, key: &Key, ino: u64) -> Result<Attr> {
        match key {
            Key::Root | Key::Accounts => Ok(self.shown.dir(ino, 0o555, self.shown.started, true)),
            Key::Dir(path) => {
                let a = self.attr_of(c, key, ino)?;
                // Not shared on the main mount because the answer depends on
                // the caller: the same for the view's one uid, and changed
                // only by what invalidates it (a delete, a move).
                let comps = place::split(path);
                let one_caller = comps.len() == 1 || self.per_caller_entry(&comps);
                Ok(Attr {
                    perm: 0o555,
                    shared: a.shared || one_caller,
                    ..a
                })
            }
            Key::Virtual(v) => {
                let (id, version, file) = version_place(v).ok_or(Error::NotFound)?;
                let rec = self.view_version(c, &v.dir, id, version)?;
                // A node that expires leaves at its time, uninvalidated.
                let keep = !self.expires(&v.dir);
                match file {
                    None => Ok(self.shown.dir(ino, 0o555, time_of(rec.updated_ns), keep)),
                    Some(name) => {
                        let f = rec.file(&name).ok_or(Error::NotFound)?;
                        Ok(self
                            .shown
                            .file(ino, f.size, 0o444, time_of(f.mtime_ns), keep))
                    }
                }
            }
            _ => Err(Error::NotFound),
        }
    }

    /// A directory's entries on a view: the main mount's, less what the
    /// view does not show (virtual files and directories, drafts).
    fn view_listing(&self, c: Caller, ino: u64) -> Result<Listing> {
        let key = self.key_of(ino)?;
        let dir = match &key {
            Key::Root | Key::Accounts => None,
            Key::Dir(path) => Some(path.clone()),
            Key::Virtual(v) => {
                let Some((id, version, None)) = version_place(v) else {
                    return Err(Error::NotDir);
                };
                // A version's files never change.
                let rec = self.view_version(c, &v.dir, id, version)?;
                let mut l = self.listing(c, ino)?;
                l.entries
                    .retain(|(_, e)| e.kind == Kind::Dir || rec.file(&e.name).is_some());
                l.shared = !self.expires(&v.dir);
                return Ok(l);
            }
            _ => return Err(Error::NotDir),
        };
        let mut l = self.listing(c, ino)?;
        l.entries.retain(|(_, e)| {
            e.name == "."
                || e.name == ".."
                || (e.kind == Kind::Dir && Self::view_shows(dir.as_deref(), &e.name))
        });
        // A listing the main mount may not share can hold nodes a view does
        // not show (a BROKEN node, listed for writers): each node is asked.
        if let (false, Some(path)) = (l.shared, &dir) {
            l.entries.retain(|(_, e)| {
                let child = format!("{path}/{}", e.name);
                e.name == "."
                    || e.name == ".."
                    || place::classify_dir(&place::split(&child)) != Ok(DirPlace::Node)
                    || self.view_node(c, &child).is_ok()
            });
        }
        let one_caller = match &dir {
            None => true,
            Some(path) => {
                let comps = place::split(path);
                comps.len() == 1 || self.per_caller_dir(&comps)
            }
        };
        l.shared |= one_caller;
        Ok(l)
    }

    /// Is directory `name` of `dir` (`None`: the root or `accounts/`) a
    /// directory of the tree (a view shows it), not a virtual one?
    fn view_shows(dir: Option<&str>, name: &str) -> bool {
        if name.starts_with('.') {
            return false;
        }
        match dir {
            None => true,
            Some(d) => {
                !(crate::core::inbox::is_user(d) && name == names::INBOX
                    || crate::core::scratch::is_project(d) && name == names::SCRATCHPAD)
            }
        }
    }

    /// The committed record a view shows of `node` now: ACTIVE or
    /// ARCHIVED (never BROKEN, whoever the uid is).
    fn view_node(&self, c: Caller, node: &str) -> Result<NodeRec> {
        let access = self.gate(c, node, false)?.min(Access::Read);
        self.visible_node(node, access)?.ok_or(Error::NotFound)
    }

    /// Version `version` of node `id` at `node`, while that node is there
    /// and the view may show it.
    fn view_version(&self, c: Caller, node: &str, id: u64, version: u32) -> Result<NodeRec> {
        let cur = self.view_node(c, node)?;
        if cur.id != id {
            return Err(Error::NotFound);
        }
        let rec = if cur.version == version {
            cur
        } else {
            self.store
                .get_version(cur.account(), id, version)?
                .ok_or(Error::NotFound)?
        };
        if Self::shows(rec.status, Access::Read) {
            Ok(rec)
        } else {
            Err(Error::NotFound)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_shows_the_tree_not_its_virtual_directories() {
        assert!(Fs::view_shows(None, "accounts"));
        assert!(Fs::view_shows(Some("acme/users/alice/memories"), "people"));
        assert!(!Fs::view_shows(Some("acme/users/alice"), names::INBOX));
        assert!(Fs::view_shows(
            Some("acme/users/alice/memories"),
            names::INBOX
        ));
        assert!(!Fs::view_shows(Some("acme/users"), ".search"));
    }
}
