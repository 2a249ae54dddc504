//! Attributes and name lookup: what a name in a directory is for one
//! caller (`lookup`, `getattr`), and the views of nodes it is built from.

use crate::config::Access;
use crate::core::ops::arc;
use crate::core::ops::join;
use crate::core::ops::read_lock;
use crate::core::ops::Key;
use crate::core::ops::NodeView;
use crate::core::Attr;
use crate::core::Caller;
use crate::core::DFile;
use crate::core::Fs;
use crate::core::Handle;
use crate::core::Slot;
use crate::error::Error;
use crate::error::Result;
use crate::locks::lock;
use crate::schema::names;
use crate::schema::place;
use crate::schema::place::DirPlace;
use crate::schema::time::time_of;
use crate::store::NodeRec;
use crate::store::Status;
use std::sync::Arc;
use std::sync::RwLock;

impl Fs {
    // ---- attributes --------------------------------------------------------

    /// Attributes of `key` as `c` sees it; `NotFound` when it is not there for `c`.
    /// Attributes never depend on the caller (see `Attr::shared`); whether
    /// the thing is there at all may.
    pub(in crate::core) fn attr_of(&self, c: Caller, key: &Key, ino: u64) -> Result<Attr> {
        match key {
            Key::Root | Key::Accounts | Key::CtxfsDir => {
                Ok(self.shown.dir(ino, 0o555, self.shown.started, true))
            }
            Key::Dir(path) => {
                let comps = place::split(path);
                let access = self.gate(c, path, false)?;
                // Whether an account is there depends on the caller, and in
                // an account with users' and agents' uids, whether one's
                // directory is.
                let shared = comps.len() > 1 && !self.per_caller_entry(&comps);
                match place::classify_dir(&comps)? {
                    DirPlace::Node => {
                        let (rec, draft) = self.node_for(path, access)?;
                        match (&rec, &draft) {
                            (Some(r), _) if r.status != Status::Broken => {
                                let shared = shared && !self.expires(path);
                                Ok(self.shown.dir(ino, 0o755, time_of(r.updated_ns), shared))
                            }
                            (_, Some(d)) => {
                                Ok(self
                                    .shown
                                    .dir(ino, 0o755, time_of(lock(d).modified_ns), false))
                            }
                            (Some(r), None) => {
                                Ok(self.shown.dir(ino, 0o755, time_of(r.updated_ns), false))
                            }
                            (None, None) => Err(Error::NotFound),
                        }
                    }
                    _ => {
                        if self.dir_present(path, &comps)? {
                            Ok(self.shown.dir(ino, 0o755, self.shown.started, shared))
                        } else {
                            Err(Error::NotFound)
                        }
                    }
                }
            }
            Key::File {
                node,
                name,
                id,
                version,
            } => {
                let access = self.gate(c, node, false)?;
                let (rec, stale) = self.current_rec(node, *id, *version, access)?;
                let stale = stale || self.kernel.cached.is_tainted(ino);
                let f = rec.file(name).ok_or(Error::NotFound)?;
                let attr = self.committed_file_attr(ino, &rec, f);
                // A stale inode's answer is not cached: the next lookup
                // finds the current inode.
                Ok(Attr {
                    shared: attr.shared && !stale,
                    ..attr
                })
            }
            Key::Draft { node, name } => {
                let file = self.draft_file(c, node, name)?;
                let f = read_lock(&file);
                Ok(self
                    .shown
                    .file(ino, f.data.len() as u64, f.mode, f.mtime, false))
            }
            Key::AccountCtxfs(account) => {
                self.gate(c, account, false)?;
                Ok(self.shown.dir(ino, 0o555, self.shown.started, false))
            }
            Key::Virtual(v) => crate::core::features::owner(v)?.attr(self, c, v, ino),
        }
    }

    /// The container directories under `path`: the tree's fixed ones
    /// (`users`, `memories`, …) and those made by `mkdir`, each once, in
    /// name order.
    pub(in crate::core) fn subdirs(&self, path: &str) -> Result<Vec<String>> {
        let comps = place::split(path);
        let mut names: Vec<String> = match place::classify_dir(&comps) {
            Ok(placed) => place::fixed_children(&comps, &placed)
                .iter()
                .map(|f| f.name().to_string())
                .collect(),
            Err(_) => Vec::new(),
        };
        names.extend(self.store.list_dirs(path)?);
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Does what `comps` (a directory above the parts of an account's users
    /// and agents: the account, `users`, `agents`) lists depend on the
    /// caller?
    pub(in crate::core) fn per_caller_dir(&self, comps: &[&str]) -> bool {
        comps.len() <= 2 && self.tenancy.is_scoped(comps[0])
    }

    /// Does whether `comps` may be entered depend on the caller (a user's
    /// or an agent's directory in an account with users' and agents' uids)?
    /// Such an entry is never cached by the kernel, so every path walk
    /// into it asks the daemon.
    pub(in crate::core) fn per_caller_entry(&self, comps: &[&str]) -> bool {
        comps.len() == 3
            && (comps[1] == "users" || comps[1] == "agents")
            && self.tenancy.is_scoped(comps[0])
    }

    /// Does a non-node directory exist?
    pub(in crate::core) fn dir_present(&self, path: &str, comps: &[&str]) -> Result<bool> {
        match place::classify_dir(comps)? {
            DirPlace::Account => {
                Ok(self.tenancy.is_configured(path) || self.store.dir_exists(path)?)
            }
            DirPlace::Fixed(_) => {
                let parent = &comps[..comps.len() - 1];
                self.dir_present(&parent.join("/"), parent)
            }
            DirPlace::Container => self.store.dir_exists(path),
            DirPlace::Node => Ok(false),
        }
    }

    /// The node as `access` sees it: its visible committed record, and its
    /// draft for writers. `NotFound` when neither is there.
    pub(in crate::core) fn node_for(&self, node: &str, access: Access) -> Result<NodeView> {
        let rec = self.visible_node(node, access)?;
        let draft = if access == Access::Write {
            self.draft(node)
        } else {
            None
        };
        if rec.is_none() && draft.is_none() {
            return Err(Error::NotFound);
        }
        Ok((rec, draft))
    }

    /// The record a committed file's inode is served from, and whether the
    /// inode is stale. The inode names the version its lookup saw; after a
    /// commit the kernel may still hold that dentry for a moment (the
    /// invalidations of a node's five files are not one atomic step, and a
    /// lookup can race with them). An open or stat through a stale inode
    /// meets the node's *current* version, never an older one, so a reader
    /// cannot combine files of two versions; a deleted or moved node's stale
    /// file is `ENOENT`.
    pub(in crate::core) fn current_rec(
        &self,
        node: &str,
        id: u64,
        version: u32,
        access: Access,
    ) -> Result<(NodeRec, bool)> {
        let rec = self.live_node(node)?.ok_or(Error::NotFound)?;
        if !Self::shows(rec.status, access) {
            return Err(Error::NotFound);
        }
        let stale = rec.id != id || rec.version != version;
        Ok((rec, stale))
    }

    pub(in crate::core) fn draft_file(
        &self,
        c: Caller,
        node: &str,
        name: &str,
    ) -> Result<Arc<RwLock<DFile>>> {
        // Readers never learn that a draft exists.
        if self.access_of(c, node) != Access::Write {
            return Err(match self.access_of(c, node) {
                Access::None => Error::AccessDenied,
                _ => Error::NotFound,
            });
        }
        let d = self.draft(node).ok_or(Error::NotFound)?;
        let d = lock(&d);
        match d.files.get(name) {
            Some(Slot::File(f)) => Ok(f.clone()),
            _ => Err(Error::NotFound),
        }
    }

    // ---- lookup, getattr ----------------------------------------------------

    /// The key of `name` in directory `parent` for caller `c`.
    /// The key of `name` in `parent` for caller `c`, with its attributes
    /// when they were already at hand.
    pub(in crate::core) fn child_key(
        &self,
        c: Caller,
        parent: &Key,
        name: &str,
    ) -> Result<(Key, Option<Attr>)> {
        if let Some(k) = self.feature_lookup(c, parent, name) {
            return k;
        }
        if let Key::Dir(path) = parent {
            let access = self.gate(c, path, false)?;
            if place::classify_dir(&place::split(path))? == DirPlace::Node {
                return self.node_child_key(path, name, access);
            }
        }
        Ok((self.structural_child_key(c, parent, name)?, None))
    }

    /// `child_key` outside node directories.
    pub(in crate::core) fn structural_child_key(
        &self,
        c: Caller,
        parent: &Key,
        name: &str,
    ) -> Result<Key> {
        match parent {
            Key::Root => match name {
                "accounts" => Ok(Key::Accounts),
                names::CTXFS_DIR => Ok(Key::CtxfsDir),
                _ => Err(Error::NotFound),
            },
            Key::Accounts => {
                if place::check_name(name).is_err() {
                    return Err(Error::NotFound);
                }
                self.gate(c, name, false)?;
                Ok(Key::Dir(arc(name)))
            }
            Key::Dir(path) if name == names::CTXFS_DIR && !path.contains('/') => {
                self.gate(c, path, false)?;
                Ok(Key::AccountCtxfs(path.clone()))
            }
            Key::Dir(path) => {
                self.gate(c, path, false)?;
                let child = join(path, name);
                match place::classify_dir(&place::split(&child)) {
                    Ok(_) => Ok(Key::Dir(arc(&child))),
                    Err(Error::NameTooLong) => Err(Error::NameTooLong),
                    Err(_) => Err(Error::NotFound),
                }
            }
            _ => Err(Error::NotDir),
        }
    }

    /// The key of file `name` in node directory `node`; for a committed file
    /// also its attributes (from the record read here, not read again).
    pub(in crate::core) fn node_child_key(
        &self,
        node: &str,
        name: &str,
        access: Access,
    ) -> Result<(Key, Option<Attr>)> {
        let (rec, draft) = self.node_for(node, access)?;
        if let Some(d) = draft {
            match lock(&d).files.get(name) {
                Some(Slot::File(_)) => {
                    let key = Key::Draft {
                        node: arc(node),
                        name: arc(name),
                    };
                    return Ok((key, None));
                }
                Some(Slot::Whiteout) => return Err(Error::NotFound),
                None => {}
            }
        }
        let rec = rec.ok_or(Error::NotFound)?;
        let f = rec.file(name).ok_or(Error::NotFound)?;
        let mut attr = self.committed_file_attr(0, &rec, f);
        // While a draft changes this name, writers find the draft and
        // readers the committed file: a cached entry would give one the
        // other's answer.
        if attr.shared {
            if let Some(d) = self.draft(node) {
                attr.shared = !lock(&d).files.contains_key(name);
            }
        }
        let key = Key::File {
            node: arc(node),
            name: arc(name),
            id: rec.id,
            version: rec.version,
        };
        Ok((key, Some(attr)))
    }

    pub(in crate::core) fn committed_file_attr(
        &self,
        ino: u64,
        rec: &NodeRec,
        f: &crate::store::FileRec,
    ) -> Attr {
        let shared = rec.status != Status::Broken && !self.expires(&rec.path);
        self.shown
            .file(ino, f.size, f.mode, time_of(f.mtime_ns), shared)
    }

    pub fn lookup(&self, c: Caller, parent: u64, name: &str) -> Result<Attr> {
        let pkey = self.key_of(parent)?;
        let (key, known) = self.child_key(c, &pkey, name)?;
        let attr = match known {
            Some(a) => a,
            None => self.attr_of(c, &key, 0)?,
        };
        let ino = self.ino_lookup(key);
        Ok(Attr { ino, ..attr })
    }

    pub fn getattr(&self, c: Caller, ino: u64, fh: Option<u64>) -> Result<Attr> {
        if let Some(fh) = fh {
            if let Ok(h) = self.handle(fh) {
                if let Handle::Draft(d) = &*h {
                    let f = read_lock(&d.file);
                    return Ok(self
                        .shown
                        .file(ino, f.data.len() as u64, f.mode, f.mtime, false));
                }
                if let Handle::Scratch(s) = &*h {
                    let f = read_lock(s.file());
                    return Ok(self
                        .shown
                        .file(ino, f.data.len() as u64, f.mode, f.mtime, false));
                }
            }
        }
        let key = self.key_of(ino)?;
        self.attr_of(c, &key, ino)
    }
}
