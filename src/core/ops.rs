//! The filesystem operations of the core, one method per syscall family.

use super::agent;
use super::commit::{self, blob_bytes, Intent};
use super::inodes::Key;
use super::scratch;
use super::*;
use crate::schema::counters;
use crate::schema::event::{Change, OutboxEvent};
use crate::schema::place::{self, DirPlace, META, NODE_FILES};
use serde_json::Value;

/// A node as one caller sees it: its visible committed record and, for
/// writers, its draft.
type NodeView = (Option<NodeRec>, Option<Arc<Mutex<Draft>>>);

/// Entries handed to one readdir reply at most (a reply buffer holds fewer).
const READDIR_BATCH: usize = 1024;

/// Directory listings kept between the readdir calls of one reading.
const MAX_LISTINGS: usize = 4096;

fn arc(s: &str) -> Arc<str> {
    Arc::from(s)
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

use crate::locks::{read as read_lock, write as write_lock};

impl Fs {
    // ---- attributes --------------------------------------------------------

    pub(super) fn dir_attr(&self, ino: u64, perm: u16, mtime: SystemTime, shared: bool) -> Attr {
        Attr {
            ino,
            kind: Kind::Dir,
            size: 0,
            perm,
            uid: self.owner.0,
            gid: self.owner.1,
            mtime,
            ctime: mtime,
            shared,
        }
    }

    pub(super) fn file_attr(
        &self,
        ino: u64,
        size: u64,
        mode: u16,
        mtime: SystemTime,
        shared: bool,
    ) -> Attr {
        Attr {
            ino,
            kind: Kind::File,
            size,
            perm: if mode == 0 { 0o644 } else { mode & 0o7777 },
            uid: self.owner.0,
            gid: self.owner.1,
            mtime,
            ctime: mtime,
            shared,
        }
    }

    /// Attributes of `key` as `c` sees it; `NotFound` when it is not there for `c`.
    /// Attributes never depend on the caller (see `Attr::shared`); whether
    /// the thing is there at all may.
    pub(super) fn attr_of(&self, c: Caller, key: &Key, ino: u64) -> Result<Attr> {
        match key {
            Key::Root | Key::Accounts | Key::CtxfsDir => {
                Ok(self.dir_attr(ino, 0o555, self.started, true))
            }
            Key::CtxfsFile(_) => Ok(self.file_attr(ino, 0, 0o444, SystemTime::now(), false)),
            Key::Dir(path) => {
                let comps = place::split(path);
                let access = self.gate(c, Self::account_of(path), false)?;
                // Whether an account is there depends on the caller.
                let shared = comps.len() > 1;
                match place::classify_dir(&comps)? {
                    DirPlace::Node => {
                        let (rec, draft) = self.node_for(path, access)?;
                        match (&rec, &draft) {
                            (Some(r), _) if r.status != Status::Broken => {
                                let shared = shared && !self.expires(path);
                                Ok(self.dir_attr(ino, 0o755, time_of(r.updated_ns), shared))
                            }
                            (_, Some(d)) => {
                                Ok(self.dir_attr(ino, 0o755, time_of(lock(d).modified_ns), false))
                            }
                            (Some(r), None) => {
                                Ok(self.dir_attr(ino, 0o755, time_of(r.updated_ns), false))
                            }
                            (None, None) => Err(Error::NotFound),
                        }
                    }
                    _ => {
                        if self.dir_present(path, &comps)? {
                            Ok(self.dir_attr(ino, 0o755, self.started, shared))
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
                let access = self.gate(c, Self::account_of(node), false)?;
                let (rec, stale) = self.current_rec(node, *id, *version, access)?;
                let stale = stale || self.is_tainted(ino);
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
                Ok(self.file_attr(ino, f.data.len() as u64, f.mode, f.mtime, false))
            }
            Key::CommitError(node) => {
                let text = self.commit_error_text(c, node)?;
                Ok(self.file_attr(ino, text.len() as u64, 0o444, SystemTime::now(), false))
            }
            Key::Outbox(node) | Key::OutboxDlq(node) => {
                let access = self.gate(c, Self::account_of(node), false)?;
                self.node_for(node, access)?;
                Ok(self.dir_attr(ino, 0o555, self.started, false))
            }
            Key::Event { node, seq } => {
                let json = self.event_json(c, node, *seq)?;
                Ok(self.file_attr(ino, json.len() as u64, 0o444, self.started, false))
            }
            Key::DeadEvent { node, seq } => {
                let json = self.dead_event_json(c, node, *seq)?;
                Ok(self.file_attr(ino, json.len() as u64, 0o644, self.started, false))
            }
            Key::SearchDir(dir) => {
                self.gate(c, Self::account_of(dir), false)?;
                Ok(self.dir_attr(ino, 0o555, self.started, false))
            }
            Key::Scratch(path) => self.scratch_attr(c, path, ino),
            Key::AccountCtxfs(account) => {
                self.gate(c, account, false)?;
                Ok(self.dir_attr(ino, 0o555, self.started, false))
            }
            Key::Usage(account) => {
                self.gate(c, account, false)?;
                Ok(self.file_attr(ino, 0, 0o444, SystemTime::now(), false))
            }
            Key::Versions(_)
            | Key::VersionDir { .. }
            | Key::VersionFile { .. }
            | Key::Restore(_) => self.versions_attr(c, key, ino),
            Key::Generated { dir, .. } => {
                self.check_space(c, dir)?;
                Ok(self.file_attr(ino, 0, 0o444, SystemTime::now(), false))
            }
            Key::Search { dir, name } => {
                self.gate(c, Self::account_of(dir), false)?;
                super::search::parse_query_name(name)?;
                Ok(self.file_attr(ino, 0, 0o444, SystemTime::now(), false))
            }
        }
    }

    /// Does a non-node directory exist?
    fn dir_present(&self, path: &str, comps: &[&str]) -> Result<bool> {
        match place::classify_dir(comps)? {
            DirPlace::Account => Ok(self.tenancy.configured().iter().any(|a| a == path)
                || self.store.dir_exists(path)?),
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
    fn node_for(&self, node: &str, access: Access) -> Result<NodeView> {
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
    fn current_rec(
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

    fn draft_file(&self, c: Caller, node: &str, name: &str) -> Result<Arc<RwLock<DFile>>> {
        // Readers never learn that a draft exists.
        if self.access_of(c, Self::account_of(node)) != Access::Write {
            return Err(match self.access_of(c, Self::account_of(node)) {
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

    fn commit_error_text(&self, c: Caller, node: &str) -> Result<Vec<u8>> {
        self.gate(c, Self::account_of(node), true)
            .map_err(|e| match e {
                Error::ReadOnly => Error::NotFound,
                e => e,
            })?;
        let d = self.draft(node).ok_or(Error::NotFound)?;
        let d = lock(&d);
        let e = d.error.as_ref().ok_or(Error::NotFound)?;
        Ok(format!("{e}\n").into_bytes())
    }

    fn event_json(&self, c: Caller, node: &str, seq: u64) -> Result<Vec<u8>> {
        let access = self.gate(c, Self::account_of(node), false)?;
        self.node_for(node, access)?;
        super::search::event_file(self.store.node_events(node)?, seq)
    }

    // ---- lookup, getattr ----------------------------------------------------

    /// The key of `name` in directory `parent` for caller `c`.
    /// The key of `name` in `parent` for caller `c`, with its attributes
    /// when they were already at hand.
    fn child_key(&self, c: Caller, parent: &Key, name: &str) -> Result<(Key, Option<Attr>)> {
        if let Key::Dir(path) = parent {
            let access = self.gate(c, Self::account_of(path), false)?;
            if place::classify_dir(&place::split(path))? == DirPlace::Node {
                return self.node_child_key(path, name, access);
            }
        }
        Ok((self.structural_child_key(c, parent, name)?, None))
    }

    /// `child_key` outside node directories.
    fn structural_child_key(&self, c: Caller, parent: &Key, name: &str) -> Result<Key> {
        match parent {
            Key::Root => match name {
                "accounts" => Ok(Key::Accounts),
                names::CTXFS_DIR => Ok(Key::CtxfsDir),
                _ => Err(Error::NotFound),
            },
            Key::CtxfsDir => match names::CTXFS_FILES.iter().find(|n| **n == name) {
                Some(n) => Ok(Key::CtxfsFile(n)),
                None => Err(Error::NotFound),
            },
            Key::Accounts => {
                if place::check_name(name).is_err() {
                    return Err(Error::NotFound);
                }
                self.gate(c, name, false)?;
                Ok(Key::Dir(arc(name)))
            }
            Key::Dir(path) if name == names::SEARCH_DIR => {
                self.gate(c, Self::account_of(path), false)?;
                Ok(Key::SearchDir(path.clone()))
            }
            Key::Dir(path)
                if scratch::is_project(path)
                    && (name == names::SCRATCHPAD || name == names::ACTIVITY_LOG) =>
            {
                self.gate(c, Self::account_of(path), false)?;
                Ok(Key::Scratch(arc(&join(path, name))))
            }
            Key::Scratch(dir) => self.scratch_child(c, dir, name),
            Key::Versions(_) | Key::VersionDir { .. } => self.versions_child(c, parent, name),
            Key::Dir(path) if name == names::CTXFS_DIR && !path.contains('/') => {
                self.gate(c, path, false)?;
                Ok(Key::AccountCtxfs(path.clone()))
            }
            Key::AccountCtxfs(account) if name == names::USAGE_FILE => {
                self.gate(c, account, false)?;
                Ok(Key::Usage(account.clone()))
            }
            Key::Dir(path)
                if (name == names::MAP_FILE || name == names::HEADER_FILE)
                    && agent::is_owner_space(path) =>
            {
                self.gate(c, Self::account_of(path), false)?;
                Ok(Key::Generated {
                    dir: path.clone(),
                    name: if name == names::MAP_FILE {
                        names::MAP_FILE
                    } else {
                        names::HEADER_FILE
                    },
                })
            }
            Key::SearchDir(dir) => {
                self.gate(c, Self::account_of(dir), false)?;
                super::search::parse_query_name(name)?;
                Ok(Key::Search {
                    dir: dir.clone(),
                    name: arc(name),
                })
            }
            Key::Dir(path) => {
                self.gate(c, Self::account_of(path), false)?;
                let child = join(path, name);
                match place::classify_dir(&place::split(&child)) {
                    Ok(_) => Ok(Key::Dir(arc(&child))),
                    Err(Error::NameTooLong) => Err(Error::NameTooLong),
                    Err(_) => Err(Error::NotFound),
                }
            }
            Key::Outbox(node) => {
                if name == names::OUTBOX_DLQ {
                    return Ok(Key::OutboxDlq(node.clone()));
                }
                let seq = crate::schema::event::event_seq(name).ok_or(Error::NotFound)?;
                Ok(Key::Event {
                    node: node.clone(),
                    seq,
                })
            }
            Key::OutboxDlq(node) => {
                let seq = crate::schema::event::event_seq(name).ok_or(Error::NotFound)?;
                Ok(Key::DeadEvent {
                    node: node.clone(),
                    seq,
                })
            }
            _ => Err(Error::NotDir),
        }
    }

    /// The key of file `name` in node directory `node`; for a committed file
    /// also its attributes (from the record read here, not read again).
    fn node_child_key(
        &self,
        node: &str,
        name: &str,
        access: Access,
    ) -> Result<(Key, Option<Attr>)> {
        match name {
            place::OUTBOX => return Ok((Key::Outbox(arc(node)), None)),
            names::VERSIONS_DIR => {
                self.visible_node(node, access)?.ok_or(Error::NotFound)?;
                return Ok((Key::Versions(arc(node)), None));
            }
            names::SEARCH_DIR => {
                self.node_for(node, access)?;
                return Ok((Key::SearchDir(arc(node)), None));
            }
            place::COMMIT_ERROR => return Ok((Key::CommitError(arc(node)), None)),
            _ => {}
        }
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

    fn committed_file_attr(&self, ino: u64, rec: &NodeRec, f: &crate::store::FileRec) -> Attr {
        let shared = rec.status != Status::Broken && !self.expires(&rec.path);
        self.file_attr(ino, f.size, f.mode, time_of(f.mtime_ns), shared)
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
                    return Ok(self.file_attr(ino, f.data.len() as u64, f.mode, f.mtime, false));
                }
                if let Handle::Scratch(s) = &*h {
                    let f = read_lock(s.file());
                    return Ok(self.file_attr(ino, f.data.len() as u64, f.mode, f.mtime, false));
                }
            }
        }
        let key = self.key_of(ino)?;
        self.attr_of(c, &key, ino)
    }

    // ---- directories -----------------------------------------------------------

    /// A directory's listing as caller `c` sees it (with `.` and `..`), and
    /// whether it is `shared`: the same for every caller allowed in (no
    /// draft, no BROKEN or expiring node, not `accounts/`), so the kernel
    /// may cache it. Changes the kernel does not see itself (commits)
    /// invalidate it.
    pub(crate) fn listing(&self, c: Caller, ino: u64) -> Result<Listing> {
        let key = self.key_of(ino)?;
        let attr = self.attr_of(c, &key, ino)?;
        if attr.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let mut entries = vec![
            DirEntry {
                ino,
                name: ".".into(),
                kind: Kind::Dir,
            },
            DirEntry {
                ino,
                name: "..".into(),
                kind: Kind::Dir,
            },
        ];
        let d = |k: Key, name: &str, kind: Kind| DirEntry {
            ino: self.entry_ino(&k),
            name: name.to_string(),
            kind,
        };
        let mut shared = true;
        match &key {
            Key::Root => {
                entries.push(d(Key::Accounts, "accounts", Kind::Dir));
                entries.push(d(Key::CtxfsDir, names::CTXFS_DIR, Kind::Dir));
            }
            Key::CtxfsDir => {
                for n in names::CTXFS_FILES {
                    entries.push(d(Key::CtxfsFile(n), n, Kind::File));
                }
            }
            Key::Accounts => {
                shared = false;
                for a in self.accounts_visible(c)? {
                    entries.push(d(Key::Dir(arc(&a)), &a, Kind::Dir));
                }
            }
            Key::Dir(path) => {
                let comps = place::split(path);
                let access = self.gate(c, Self::account_of(path), false)?;
                let placed = place::classify_dir(&comps)?;
                if placed == DirPlace::Node {
                    shared = self.draft(path).is_none()
                        && !self.expires(path)
                        && self
                            .store
                            .get_node(path)?
                            .is_some_and(|r| r.status != Status::Broken);
                    // d_ino ascends in protocol order: tools that sort entries
                    // by inode number before copying (GNU cp) still write
                    // .meta.json last.
                    let base = (self.entry_ino(&key) >> 16) << 16;
                    for (i, (name, _)) in self.node_listing(path, access)?.into_iter().enumerate() {
                        entries.push(DirEntry {
                            ino: base | (i as u64 + 1).min(0xffff),
                            name,
                            kind: Kind::File,
                        });
                    }
                } else {
                    let mut names: Vec<String> = place::fixed_children(&comps, &placed)
                        .iter()
                        .map(|f| f.name().to_string())
                        .collect();
                    names.extend(self.store.list_dirs(path)?);
                    // One probe of the expiry map per listing when no node expires.
                    let any_expiry = self.any_expiry();
                    for (n, r) in self.store.list_nodes(path)? {
                        // BROKEN nodes are listed for writers only.
                        shared &= r.status != Status::Broken;
                        // Expiring nodes leave the listing the instant they
                        // expire: never cached by the kernel.
                        if any_expiry && self.expires(&r.path) {
                            shared = false;
                            if self.expired(&r.path) {
                                continue;
                            }
                        }
                        if Self::shows(r.status, access) {
                            names.push(n);
                        }
                    }
                    names.sort();
                    names.dedup();
                    for n in names {
                        let child = join(path, &n);
                        entries.push(d(Key::Dir(arc(&child)), &n, Kind::Dir));
                    }
                    if scratch::is_project(path) {
                        let k = Key::Scratch(arc(&join(path, names::SCRATCHPAD)));
                        entries.push(d(k, names::SCRATCHPAD, Kind::Dir));
                        let k = Key::Scratch(arc(&join(path, names::ACTIVITY_LOG)));
                        entries.push(d(k, names::ACTIVITY_LOG, Kind::File));
                    }
                    if agent::is_owner_space(path) {
                        for name in [names::MAP_FILE, names::HEADER_FILE] {
                            let k = Key::Generated {
                                dir: path.clone(),
                                name,
                            };
                            entries.push(d(k, name, Kind::File));
                        }
                    }
                }
            }
            Key::Outbox(node) => {
                shared = false;
                entries.push(d(
                    Key::OutboxDlq(node.clone()),
                    names::OUTBOX_DLQ,
                    Kind::Dir,
                ));
                for e in self.store.node_events(node)? {
                    let k = Key::Event {
                        node: node.clone(),
                        seq: e.seq,
                    };
                    entries.push(d(k, &format!("{:016x}.json", e.seq), Kind::File));
                }
            }
            Key::OutboxDlq(node) => {
                shared = false;
                for e in self.store.dead_events(node)? {
                    let k = Key::DeadEvent {
                        node: node.clone(),
                        seq: e.seq,
                    };
                    entries.push(d(k, &format!("{:016x}.json", e.seq), Kind::File));
                }
            }
            Key::SearchDir(_) => shared = false,
            Key::AccountCtxfs(account) => {
                shared = false;
                let k = Key::Usage(account.clone());
                entries.push(d(k, names::USAGE_FILE, Kind::File));
            }
            Key::Versions(_) | Key::VersionDir { .. } => {
                shared = false;
                for (k, name, kind) in self.versions_list(c, &key)? {
                    entries.push(d(k, &name, kind));
                }
            }
            Key::Scratch(dir) => {
                shared = false;
                for (name, kind) in self.scratch_list(c, dir)? {
                    let k = Key::Scratch(arc(&join(dir, &name)));
                    entries.push(d(k, &name, kind));
                }
            }
            _ => return Err(Error::NotDir),
        }
        Ok(Listing { entries, shared })
    }

    /// An inode number for a directory entry: the real one if the kernel
    /// knows the entry, else a stable non-zero hash (readdir's d_ino is
    /// informational; `stat` gives the real number).
    fn entry_ino(&self, k: &Key) -> u64 {
        if let Some(i) = lock(&self.inodes).peek(k) {
            return i;
        }
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        k.hash(&mut h);
        h.finish() | (1 << 63)
    }

    /// Files of a node directory in protocol order, as `access` sees them.
    fn node_listing(&self, node: &str, access: Access) -> Result<Vec<(String, Key)>> {
        let (rec, draft) = self.node_for(node, access)?;
        let mut out = Vec::new();
        let guard = draft.as_ref().map(|d| lock(d));
        let names = view_names(rec.as_ref(), guard.as_deref());
        for name in names {
            let key = match guard.as_ref().and_then(|d| d.files.get(&name)) {
                Some(Slot::File(_)) => Key::Draft {
                    node: arc(node),
                    name: arc(&name),
                },
                _ => match &rec {
                    Some(r) => Key::File {
                        node: arc(node),
                        name: arc(&name),
                        id: r.id,
                        version: r.version,
                    },
                    None => continue,
                },
            };
            out.push((name, key));
        }
        if let Some(d) = guard.as_ref() {
            if d.error.is_some() {
                out.push((place::COMMIT_ERROR.to_string(), Key::CommitError(arc(node))));
            }
        }
        Ok(out)
    }

    /// Entries of directory `ino` from `offset` on (an empty batch is the
    /// end), with `shared` as in [`Fs::listing`]. There is no open handle:
    /// the kernel opens directories without asking (`no_opendir`), so the
    /// listing is taken at offset 0 and kept per (directory, uid) until its
    /// end is read; a continuation without one rebuilds it.
    pub fn readdir(&self, c: Caller, ino: u64, offset: u64) -> Result<DirBatch> {
        let key = (ino, c.uid);
        let kept = if offset == 0 {
            None
        } else {
            lock(&self.listings).get(&key).cloned()
        };
        let snap = match kept {
            Some(s) => s,
            None => {
                let s = Arc::new(self.listing(c, ino)?);
                let mut l = lock(&self.listings);
                // Listings abandoned half-read are not kept forever; a
                // dropped one is rebuilt on demand.
                if l.len() >= MAX_LISTINGS {
                    l.clear();
                }
                l.insert(key, s.clone());
                s
            }
        };
        // One reply holds a few hundred entries; never copy the whole rest.
        let entries: Vec<(u64, DirEntry)> = snap
            .entries
            .iter()
            .enumerate()
            .skip(offset as usize)
            .take(READDIR_BATCH)
            .map(|(i, e)| (i as u64 + 1, e.clone()))
            .collect();
        if entries.is_empty() {
            lock(&self.listings).remove(&key);
        }
        Ok(DirBatch {
            entries,
            shared: snap.shared,
        })
    }

    /// The path of directory `name` in `parent`, for a change by writer `c`
    /// (mkdir, rmdir). Node directories hold no directories: `Invalid`.
    fn dir_child(&self, c: Caller, parent: u64, name: &str) -> Result<String> {
        let path = match self.key_of(parent)? {
            Key::Accounts => name.to_string(),
            Key::Dir(p) => {
                self.gate(c, Self::account_of(&p), true)?;
                if place::classify_dir(&place::split(&p))? == DirPlace::Node {
                    return Err(Error::Invalid("node directories hold files only".into()));
                }
                join(&p, name)
            }
            Key::Root | Key::CtxfsDir => return Err(Error::NotPermitted("fixed directory")),
            _ => return Err(Error::NotPermitted("virtual directory")),
        };
        self.gate(c, Self::account_of(&path), true)?;
        Ok(path)
    }

    pub fn mkdir(&self, c: Caller, parent: u64, name: &str) -> Result<Attr> {
        if let Key::Scratch(dir) = self.key_of(parent)? {
            self.scratch_mkdir(c, &dir, name, 0o755)?;
            return self.lookup(c, parent, name);
        }
        if self.key_of(parent)? == Key::Accounts {
            place::check_name(name)?;
        }
        let path = self.dir_child(c, parent, name)?;
        let comps = place::split(&path);
        match place::classify_dir(&comps)? {
            DirPlace::Fixed(_) => return Err(Error::Exists),
            DirPlace::Account | DirPlace::Container => {
                if self.dir_present(&path, &comps)? {
                    return Err(Error::Exists);
                }
                let mut ops = self.container_ops(&path);
                ops.push(Op::PutDir { path: path.clone() });
                self.store.apply(ops, false)?;
            }
            DirPlace::Node => {
                let _g = self.stripe(&path);
                if self.live_node(&path)?.is_some() || self.draft(&path).is_some() {
                    return Err(Error::Exists);
                }
                lock(&self.drafts).insert(path.clone(), Arc::new(Mutex::new(Draft::new(None))));
            }
        }
        self.lookup(c, parent, name)
    }

    pub fn rmdir(&self, c: Caller, parent: u64, name: &str) -> Result<()> {
        match self.key_of(parent)? {
            Key::Scratch(dir) => return self.scratch_unlink(c, &dir, name, true),
            Key::Dir(p) if scratch::is_project(&p) && name == names::SCRATCHPAD => {
                self.gate(c, Self::account_of(&p), true)?;
                return Err(Error::NotPermitted("the scratchpad itself stays"));
            }
            _ => {}
        }
        let path = match self.dir_child(c, parent, name) {
            Err(Error::Invalid(_)) if name == place::OUTBOX => {
                return Err(Error::NotPermitted("virtual directory"))
            }
            Err(Error::Invalid(_)) => return Err(Error::NotFound),
            r => r?,
        };
        let comps = place::split(&path);
        let placed = match place::classify_dir(&comps) {
            Ok(p) => p,
            Err(_) => return Err(Error::NotFound),
        };
        match placed {
            DirPlace::Node => self.delete_node(&path),
            DirPlace::Fixed(_) | DirPlace::Account | DirPlace::Container => {
                if !self.dir_present(&path, &comps)? {
                    return Err(Error::NotFound);
                }
                if self.subtree_busy(&path)?
                    || (scratch::is_project(&path) && self.project_busy(&path)?)
                {
                    return Err(Error::NotEmpty);
                }
                match placed {
                    // Structural directories are implicit: an empty one is
                    // "removed" and shows again, so `rm -r` of an owner works.
                    DirPlace::Fixed(_) => Ok(()),
                    DirPlace::Account if self.tenancy.configured().contains(&path) => {
                        Err(Error::NotPermitted("the account is defined by the config"))
                    }
                    _ => self.store.apply(vec![Op::DelDir { path }], true),
                }
            }
        }
    }

    /// Has the subtree at `path` any node, container or draft?
    fn subtree_busy(&self, path: &str) -> Result<bool> {
        if self.store.has_children(path)? {
            return Ok(true);
        }
        // Fixed children (users/, memories/...) are stored under their own path.
        let comps = place::split(path);
        if let Ok(placed) = place::classify_dir(&comps) {
            for f in place::fixed_children(&comps, &placed) {
                if self.subtree_busy(&join(path, f.name()))? {
                    return Ok(true);
                }
            }
        }
        let prefix = format!("{path}/");
        Ok(lock(&self.drafts).keys().any(|k| k.starts_with(&prefix)))
    }

    fn delete_node(&self, node: &str) -> Result<()> {
        let _g = self.stripe(node);
        let rec = self.live_node(node)?;
        let draft = self.draft(node);
        if rec.is_none() && draft.is_none() {
            return Err(Error::NotFound);
        }
        {
            let guard = draft.as_ref().map(|d| lock(d));
            if !view_names(rec.as_ref(), guard.as_deref()).is_empty() {
                return Err(Error::NotEmpty);
            }
        }
        let mut ops = vec![Op::DelDraft {
            path: node.to_string(),
        }];
        if let Some(rec) = &rec {
            ops.extend(self.remove_ops(node, rec)?);
            ops.extend(self.write_quota_ops(node, 0)?);
        }
        self.store.apply(ops, true)?;
        self.notify_index();
        self.set_expiry(node, None);
        lock(&self.drafts).remove(node);
        self.stats.deletes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The ops that remove committed node `rec` at `node` with its history,
    /// its expiry and its `DELETE_CONTEXT` event (delete, expiry sweep, and
    /// a commit over an expired node).
    pub(super) fn remove_ops(&self, node: &str, rec: &NodeRec) -> Result<Vec<Op>> {
        let account = Self::account_of(node).to_string();
        let seq = self.next_event.fetch_add(1, Ordering::Relaxed);
        let freed = self.history_bytes(rec)?;
        let mut ops = vec![
            Op::DelNode {
                path: node.to_string(),
            },
            Op::DropHistory { node_id: rec.id },
            Op::Count {
                key: crate::schema::counters::nodes_key(&account, rec.status),
                delta: -1,
            },
            Op::Count {
                key: super::quota::bytes_key(&account),
                delta: -(freed as i64),
            },
            Op::PutEvent {
                seq,
                node_path: node.to_string(),
                account,
                json: self.event(seq, node, Change::DeleteContext {}),
            },
            Op::HighWater {
                key: counters::EVENT_ID.into(),
                value: seq,
            },
        ];
        if self.expiry_at(node).is_some() {
            ops.push(Op::DelExpiry {
                path: node.to_string(),
            });
        }
        Ok(ops)
    }

    /// Bytes the versions of a node hold in the store (each blob once).
    pub(super) fn history_bytes(&self, rec: &NodeRec) -> Result<u64> {
        let mut seen = std::collections::HashSet::new();
        let mut total = 0;
        for v in 1..=rec.version {
            let r = if v == rec.version {
                Some(rec.clone())
            } else {
                self.store.get_version(rec.id, v)?
            };
            for f in r.map(|r| r.files).unwrap_or_default() {
                if seen.insert(f.blob) {
                    total += f.size;
                }
            }
        }
        Ok(total)
    }

    // ---- files --------------------------------------------------------------------

    /// Copy-on-write: the draft file `name` of `node`, made from the committed
    /// file when the draft does not have it yet. Caller holds the node stripe.
    fn cow(&self, node: &str, name: &str, create_mode: Option<u16>) -> Result<Arc<RwLock<DFile>>> {
        let rec = self.live_node(node)?;
        let draft = match (&rec, self.draft(node)) {
            (_, Some(d)) => d,
            (Some(r), None) => self.draft_or_new(node, Some(r)),
            (None, None) => return Err(Error::NotFound),
        };
        let mut d = lock(&draft);
        if let Some(Slot::File(f)) = d.files.get(name) {
            return Ok(f.clone());
        }
        let whiteout = matches!(d.files.get(name), Some(Slot::Whiteout));
        let file = match rec
            .as_ref()
            .and_then(|r| r.file(name))
            .filter(|_| !whiteout)
        {
            Some(fr) => {
                let f = DFile::new(self.store.read_blob(fr.blob, fr.size)?, fr.mode);
                write_lock(&f).mtime = time_of(fr.mtime_ns);
                f
            }
            None => match create_mode {
                Some(mode) => DFile::new(Vec::new(), mode),
                None => return Err(Error::NotFound),
            },
        };
        d.files.insert(name.to_string(), Slot::File(file.clone()));
        d.touch();
        if rec.as_ref().and_then(|r| r.file(name)).is_some() {
            // The writer's next lookup must find the draft, not the cached version.
            self.invalidate(node, &[name], false);
        }
        Ok(file)
    }

    fn draft_handle(
        &self,
        node: &str,
        name: &str,
        file: Arc<RwLock<DFile>>,
        flags: i32,
    ) -> Result<Opened> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writable {
            read_lock(&file).writers.fetch_add(1, Ordering::Relaxed);
        }
        let trunc = writable && flags & libc::O_TRUNC != 0;
        if trunc {
            let mut f = write_lock(&file);
            f.data.clear();
            f.mtime = SystemTime::now();
        }
        let fh = self.new_handle(Handle::Draft(DraftHandle {
            node: arc(node),
            name: name.to_string(),
            file,
            append: flags & libc::O_APPEND != 0,
            writable,
            dirty: AtomicBool::new(false),
        }));
        Ok(Opened {
            fh,
            direct_io: true,
            keep_cache: false,
            no_flush: !(writable && name == META),
        })
    }

    pub fn open(&self, c: Caller, ino: u64, flags: i32) -> Result<Opened> {
        let key = self.key_of(ino)?;
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let data = |bytes: Vec<u8>| -> Result<Opened> {
            if write {
                return Err(Error::NotPermitted("read-only virtual file"));
            }
            let fh = self.new_handle(Handle::Data(Arc::from(bytes)));
            Ok(Opened {
                fh,
                direct_io: true,
                keep_cache: false,
                no_flush: true,
            })
        };
        match &key {
            Key::CtxfsFile(names::STATUS_FILE) => data(self.status_json(c)?),
            Key::CtxfsFile(names::SYNC_FILE) => data(self.sync_file()?),
            Key::Scratch(path) => self.scratch_open(c, path, flags),
            Key::VersionFile { .. } | Key::Restore(_) => self.versions_open(c, &key, write),
            Key::Usage(account) => data(self.usage_json(c, account)?),
            Key::CtxfsFile(names::HEADER) => data(self.header(c, None)?),
            Key::CtxfsFile(names::HELP) => data(agent::help_text().as_bytes().to_vec()),
            Key::CtxfsFile(names::METRICS_FILE) => data(self.metrics_text(Some(c))?.into_bytes()),
            Key::Generated { dir, name } => {
                // Readers meet EROFS on any write, as everywhere in their account.
                if write {
                    self.gate(c, Self::account_of(dir), true)?;
                }
                if *name == names::MAP_FILE {
                    data(self.memory_map(c, dir)?)
                } else {
                    data(self.header(c, Some(dir))?)
                }
            }
            Key::DeadEvent { node, seq } => data(self.dead_event_json(c, node, *seq)?),
            Key::Search { dir, name } => data(self.search_file(c, dir, name)?),
            Key::CtxfsFile(_) => data(format!("{}\n", std::process::id()).into_bytes()),
            Key::CommitError(node) => data(self.commit_error_text(c, node)?),
            Key::Event { node, seq } => data(self.event_json(c, node, *seq)?),
            Key::File {
                node,
                name,
                id,
                version,
            } => {
                let access = self.gate(c, Self::account_of(node), write)?;
                if access == Access::Write {
                    let g = self.stripe(node);
                    let in_draft = self
                        .draft(node)
                        .map(|d| matches!(lock(&d).files.get(&**name), Some(Slot::File(_))))
                        .unwrap_or(false);
                    if write || in_draft {
                        let file = self.cow(node, name, None)?;
                        let opened = self.draft_handle(node, name, file, flags);
                        drop(g);
                        if write && opened.is_ok() {
                            // The kernel truncates and resizes this inode for
                            // everyone once this open returns (see `Cached`).
                            self.taint(ino);
                        }
                        return opened;
                    }
                }
                let (rec, stale) = self.current_rec(node, *id, *version, access)?;
                let f = rec.file(name).ok_or(Error::NotFound)?;
                let bytes = self.store.read_blob(f.blob, f.size)?;
                let fh = self.new_handle(Handle::Data(Arc::from(bytes)));
                let stale = stale || !self.open_cached(ino, fh);
                // A current inode's pages never change (a new version is a
                // new inode), so the kernel keeps them. A stale inode serves
                // the current version's bytes around its cached pages.
                Ok(Opened {
                    fh,
                    direct_io: stale,
                    keep_cache: !stale,
                    no_flush: true,
                })
            }
            Key::Draft { node, name } => match self.draft_file(c, node, name) {
                Ok(file) => self.draft_handle(node, name, file, flags),
                // Another writer committed between the lookup and this open:
                // the file left the draft and is the committed version now.
                Err(Error::NotFound) => {
                    let access = self.gate(c, Self::account_of(node), write)?;
                    let rec = self.visible_node(node, access)?.ok_or(Error::NotFound)?;
                    let key = Key::File {
                        node: node.clone(),
                        name: name.clone(),
                        id: rec.id,
                        version: rec.version,
                    };
                    rec.file(name).ok_or(Error::NotFound)?;
                    let ino = self.ino_lookup(key);
                    let opened = self.open(c, ino, flags);
                    self.forget(ino, 1);
                    opened
                }
                Err(e) => Err(e),
            },
            _ => Err(Error::IsDir),
        }
    }

    pub fn create(
        &self,
        c: Caller,
        parent: u64,
        name: &str,
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Opened)> {
        let pkey = self.key_of(parent)?;
        if let Key::Scratch(dir) = &pkey {
            let opened = self.scratch_create(c, dir, name, mode, flags)?;
            let attr = self.lookup(c, parent, name)?;
            return Ok((attr, opened));
        }
        let node = match &pkey {
            Key::Dir(p) => p.clone(),
            Key::Accounts => {
                return Err(Error::Invalid(
                    "accounts/ holds account directories only".into(),
                ))
            }
            _ => return Err(Error::NotPermitted("no files can be created here")),
        };
        self.gate(c, Self::account_of(&node), true)?;
        if place::classify_dir(&place::split(&node))? != DirPlace::Node {
            return Err(Error::Invalid(
                "files live inside node directories only; create the node directory first".into(),
            ));
        }
        place::check_file_name(name)?;
        let file = {
            let _g = self.stripe(&node);
            self.node_for(&node, Access::Write)?;
            let exists = self.node_child_key(&node, name, Access::Write).is_ok();
            if exists && flags & libc::O_EXCL != 0 {
                return Err(Error::Exists);
            }
            self.cow(&node, name, Some((mode & 0o7777) as u16))?
        };
        let opened = self.draft_handle(&node, name, file, flags)?;
        let attr = self.lookup(c, parent, name)?;
        Ok((attr, opened))
    }

    /// `mknod` of a regular file (some tools create files this way).
    pub fn mknod(&self, c: Caller, parent: u64, name: &str, mode: u32) -> Result<Attr> {
        if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
            return Err(Error::NotPermitted(
                "only regular files and directories are stored",
            ));
        }
        let (attr, opened) = self.create(c, parent, name, mode, libc::O_WRONLY | libc::O_EXCL)?;
        self.release(opened.fh);
        Ok(attr)
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let h = self.handle(fh)?;
        match &*h {
            Handle::Data(d) => Ok(super::draft::slice_at(d, offset, size)),
            Handle::Draft(d) => Ok(read_lock(&d.file).read_at(offset, size)),
            Handle::Scratch(s) => Ok(Self::scratch_read(s, offset, size)),
            Handle::Restore(_) => Err(Error::BadHandle),
        }
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.handle(fh)?;
        if let Handle::Scratch(s) = &*h {
            return Self::scratch_write(s, offset, data);
        }
        if let Handle::Restore(node) = &*h {
            return self.restore_write(node, data);
        }
        let Handle::Draft(d) = &*h else {
            return Err(Error::BadHandle);
        };
        if !d.writable {
            return Err(Error::BadHandle);
        }
        let mut f = write_lock(&d.file);
        let start = if d.append {
            f.data.len() as u64
        } else {
            offset
        };
        // A file that could not be committed under the account's byte quota
        // is refused at the write, before anything of it is stored.
        let grown = start.saturating_add(data.len() as u64);
        if grown > f.data.len() as u64 {
            self.check_bytes(Self::account_of(&d.node), grown)?;
        }
        let n = f.write_at(start, data)?;
        d.dirty.store(true, Ordering::Relaxed);
        Ok(n)
    }

    /// `close(2)`: closing a written `.meta.json` is the commit point.
    pub fn flush(&self, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        if let Handle::Draft(d) = &*h {
            if d.name == META && d.dirty.swap(false, Ordering::AcqRel) {
                self.commit(&d.node, Some(&d.file))?;
            }
        }
        if let Handle::Scratch(s) = &*h {
            self.scratch_persist(s, false)?;
        }
        Ok(())
    }

    pub fn release(&self, fh: u64) {
        self.release_cached(fh);
        let h = lock(&self.handles).remove(&fh);
        if let Some(h) = h {
            if let Handle::Scratch(s) = &*h {
                let path = s.path().to_string();
                if let Err(e) = self.scratch_persist(s, false) {
                    tracing::error!(%path, error = %e, "scratch file not written back");
                }
                drop(h);
                self.scratch_released(&path);
            }
        }
    }

    /// `fsync` of a draft file makes the node's whole draft durable.
    pub fn fsync(&self, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        if let Handle::Scratch(s) = &*h {
            return self.scratch_persist(s, true);
        }
        if let Handle::Draft(d) = &*h {
            let _g = self.stripe(&d.node);
            if let Some(draft) = self.draft(&d.node) {
                let op = self.persist_draft_op(&d.node, &lock(&draft))?;
                self.store.apply(vec![op], true)?;
            }
        }
        Ok(())
    }

    /// `fsync` of a directory: everything acknowledged before is durable.
    pub fn fsyncdir(&self) -> Result<()> {
        self.store.apply(Vec::new(), true)
    }

    pub fn setattr(&self, c: Caller, ino: u64, fh: Option<u64>, sa: SetAttr) -> Result<Attr> {
        let key = self.key_of(ino)?;
        let (node, name) = match &key {
            Key::File { node, name, .. } | Key::Draft { node, name } => {
                (node.clone(), name.clone())
            }
            Key::Dir(path) => {
                // Directory attributes are not stored; accepted for writers.
                self.gate(c, Self::account_of(path), true)?;
                return self.attr_of(c, &key, ino);
            }
            Key::Root | Key::Accounts | Key::CtxfsDir => return self.attr_of(c, &key, ino),
            Key::Generated { dir, .. } => {
                self.gate(c, Self::account_of(dir), true)?;
                return Err(Error::NotPermitted("generated file"));
            }
            Key::Scratch(path) => return self.scratch_setattr(c, path, ino, &sa),
            // `echo N > restore` truncates first: nothing to truncate.
            Key::Restore(_) if sa.mode.is_none() && sa.size == Some(0) => {
                return self.attr_of(c, &key, ino)
            }
            _ => return Err(Error::NotPermitted("read-only virtual file")),
        };
        self.gate(c, Self::account_of(&node), true)?;
        if sa.uid.is_some_and(|u| u != c.uid) || sa.gid.is_some_and(|g| g != c.gid) {
            return Err(Error::NotPermitted(
                "files belong to their account; chown is refused",
            ));
        }
        let from_handle = fh
            .and_then(|fh| self.handle(fh).ok())
            .and_then(|h| match &*h {
                Handle::Draft(d) => Some(d.file.clone()),
                _ => None,
            });
        let file = match from_handle {
            Some(f) => f,
            None => {
                let _g = self.stripe(&node);
                self.cow(&node, &name, None)?
            }
        };
        write_lock(&file).set_attr(&sa)?;
        let f = read_lock(&file);
        Ok(self.file_attr(ino, f.data.len() as u64, f.mode, f.mtime, false))
    }

    pub fn access(&self, c: Caller, ino: u64, mask: i32) -> Result<()> {
        let key = self.key_of(ino)?;
        let attr = self.attr_of(c, &key, ino)?;
        if mask & libc::W_OK != 0 {
            match &key {
                Key::Dir(p) => {
                    self.gate(c, Self::account_of(p), true)?;
                }
                Key::File { node, .. } | Key::Draft { node, .. } | Key::Scratch(node) => {
                    self.gate(c, Self::account_of(node), true)?;
                }
                _ => return Err(Error::AccessDenied),
            }
        }
        if mask & libc::X_OK != 0 && attr.kind == Kind::File {
            return Err(Error::AccessDenied);
        }
        Ok(())
    }

    pub fn unlink(&self, c: Caller, parent: u64, name: &str) -> Result<()> {
        let pkey = self.key_of(parent)?;
        if let Key::OutboxDlq(node) = &pkey {
            return self.drop_dead(c, node, name);
        }
        if let Key::Scratch(dir) = &pkey {
            return self.scratch_unlink(c, dir, name, false);
        }
        let Key::Dir(node) = &pkey else {
            return Err(Error::NotPermitted("virtual directory"));
        };
        self.gate(c, Self::account_of(node), true)?;
        if scratch::is_project(node) && name == names::ACTIVITY_LOG {
            return Err(Error::NotPermitted("activity_log.jsonl is append-only"));
        }
        if place::classify_dir(&place::split(node))? != DirPlace::Node {
            return match self.child_key(c, &pkey, name) {
                // Generated again at the next open: removing it changes
                // nothing, and `rm -r` of a user directory goes through.
                Ok((Key::Generated { .. }, _)) => Ok(()),
                Ok(_) => Err(Error::IsDir),
                Err(e) => Err(e),
            };
        }
        if name == place::OUTBOX {
            return Err(Error::IsDir);
        }
        let _g = self.stripe(node);
        if name == place::COMMIT_ERROR {
            // Removing the reason acknowledges it (and lets `rm -r` finish).
            let d = self.draft(node).ok_or(Error::NotFound)?;
            return lock(&d).error.take().map(|_| ()).ok_or(Error::NotFound);
        }
        let rec = self.live_node(node)?;
        let in_committed = rec.as_ref().and_then(|r| r.file(name)).is_some();
        let draft = match self.draft(node) {
            Some(d) => d,
            None if in_committed => self.draft_or_new(node, rec.as_ref()),
            None => return Err(Error::NotFound),
        };
        let mut d = lock(&draft);
        match d.files.get(name) {
            Some(Slot::Whiteout) => return Err(Error::NotFound),
            Some(Slot::File(_)) => {
                d.files.remove(name);
            }
            None if !in_committed => return Err(Error::NotFound),
            None => {}
        }
        if in_committed {
            d.files.insert(name.to_string(), Slot::Whiteout);
        }
        d.touch();
        Ok(())
    }

    pub fn rename(
        &self,
        c: Caller,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        noreplace: bool,
    ) -> Result<()> {
        if let (Key::OutboxDlq(sn), Key::Outbox(dn)) =
            (self.key_of(parent)?, self.key_of(newparent)?)
        {
            return self.revive_dead(c, &sn, name, &dn, newname);
        }
        match (self.key_of(parent)?, self.key_of(newparent)?) {
            (Key::Dir(sp), _) if scratch::is_project(&sp) && name == names::ACTIVITY_LOG => {
                self.gate(c, Self::account_of(&sp), true)?;
                return Err(Error::NotPermitted("activity_log.jsonl is append-only"));
            }
            (Key::Scratch(sd), Key::Scratch(dd)) => {
                return self.scratch_rename(c, &sd, name, &dd, newname, noreplace)
            }
            (Key::Scratch(sd), _) => {
                self.gate(c, Self::account_of(&sd), true)?;
                return Err(Error::CrossDevice);
            }
            (_, Key::Scratch(dd)) => {
                self.gate(c, Self::account_of(&dd), true)?;
                return Err(Error::CrossDevice);
            }
            _ => {}
        }
        let (Key::Dir(sp), Key::Dir(dp)) = (self.key_of(parent)?, self.key_of(newparent)?) else {
            return Err(Error::NotPermitted(
                "only files and directories of accounts can be renamed",
            ));
        };
        let (sa, da) = (Self::account_of(&sp), Self::account_of(&dp));
        self.gate(c, sa, true)?;
        self.gate(c, da, true)?;
        if sa != da {
            return Err(Error::CrossDevice);
        }
        let s_place = place::classify_dir(&place::split(&sp))?;
        let d_place = place::classify_dir(&place::split(&dp))?;
        if s_place == DirPlace::Node {
            if d_place != DirPlace::Node {
                return Err(Error::Invalid(
                    "node files can only move into another node directory".into(),
                ));
            }
            return self.rename_file(&sp, name, &dp, newname, noreplace);
        }
        let src = join(&sp, name);
        let dst = join(&dp, newname);
        match place::classify_dir(&place::split(&src)) {
            Ok(DirPlace::Node) => {}
            Ok(DirPlace::Fixed(_)) => return Err(Error::NotPermitted("structural directory")),
            Ok(_) => return Err(Error::CrossDevice),
            Err(_) => return Err(Error::NotFound),
        }
        if place::classify_dir(&place::split(&dst))? != DirPlace::Node {
            return Err(Error::Invalid(
                "a node can only move to a node place".into(),
            ));
        }
        self.move_node(&src, &dst, noreplace)
    }

    fn lock_two(&self, a: &str, b: &str) -> (MutexGuard<'_, ()>, Option<MutexGuard<'_, ()>>) {
        let (i, j) = (stripe_of(a), stripe_of(b));
        if i == j {
            (lock(&self.stripes[i]), None)
        } else {
            let (lo, hi) = (i.min(j), i.max(j));
            let g1 = lock(&self.stripes[lo]);
            let g2 = lock(&self.stripes[hi]);
            (g1, Some(g2))
        }
    }

    fn rename_file(
        &self,
        sn: &str,
        sname: &str,
        dn: &str,
        dname: &str,
        noreplace: bool,
    ) -> Result<()> {
        for n in [sname, dname] {
            if n == place::OUTBOX || n == place::COMMIT_ERROR {
                return Err(Error::NotPermitted("reserved virtual name"));
            }
        }
        place::check_file_name(dname)?;
        let _g = self.lock_two(sn, dn);
        if self.node_for(dn, Access::Write).is_err() {
            return Err(Error::NotFound);
        }
        let file = self.cow(sn, sname, None)?;
        let s_rec = self.live_node(sn)?;
        let d_rec = self.live_node(dn)?;
        let sdraft = self.draft(sn).ok_or(Error::NotFound)?;
        let ddraft = self.draft_or_new(dn, d_rec.as_ref());
        let same = Arc::ptr_eq(&sdraft, &ddraft);
        if sn == dn && sname == dname {
            return Ok(());
        }
        let old_src;
        let old_dst;
        {
            let mut s = lock(&sdraft);
            let d_exists = |d: &Draft| match d.files.get(dname) {
                Some(Slot::File(_)) => true,
                Some(Slot::Whiteout) => false,
                None => d_rec.as_ref().and_then(|r| r.file(dname)).is_some(),
            };
            if same {
                if noreplace && d_exists(&s) {
                    return Err(Error::Exists);
                }
                old_src = s.files.get(sname).cloned();
                old_dst = s.files.get(dname).cloned();
                apply_move(&mut s, sname, s_rec.as_ref(), None, dname, &file);
            } else {
                let mut d = lock(&ddraft);
                if noreplace && d_exists(&d) {
                    return Err(Error::Exists);
                }
                old_src = s.files.get(sname).cloned();
                old_dst = d.files.get(dname).cloned();
                apply_move(&mut s, sname, s_rec.as_ref(), Some(&mut d), dname, &file);
            }
        }
        if dname == META {
            // A rename onto `.meta.json` commits, as its close would.
            if let Err(e) = self.commit_as(dn, &ddraft, Intent::Close, None) {
                let restore = |d: &mut Draft, name: &str, old: Option<Slot>| match old {
                    Some(s) => {
                        d.files.insert(name.to_string(), s);
                    }
                    None => {
                        d.files.remove(name);
                    }
                };
                let mut s = lock(&sdraft);
                if same {
                    restore(&mut s, dname, old_dst);
                    restore(&mut s, sname, old_src);
                } else {
                    restore(&mut s, sname, old_src);
                    drop(s);
                    restore(&mut lock(&ddraft), dname, old_dst);
                }
                return Err(e);
            }
            // The kernel holds this directory's lock until rename returns.
            self.invalidate_commit(dn, false);
        }
        Ok(())
    }

    fn move_node(&self, src: &str, dst: &str, noreplace: bool) -> Result<()> {
        let _g = self.lock_two(src, dst);
        let rec = self.live_node(src)?;
        let draft = self.draft(src);
        if rec.is_none() && draft.is_none() {
            return Err(Error::NotFound);
        }
        if src == dst {
            return Ok(());
        }
        if self.live_node(dst)?.is_some() || self.draft(dst).is_some() {
            return Err(if noreplace {
                Error::Exists
            } else {
                Error::NotEmpty
            });
        }
        let mut ops = vec![Op::DelDraft {
            path: src.to_string(),
        }];
        // An expired node at the target goes now, in the same transaction.
        if let Some(stale) = self.store.get_node(dst)? {
            ops.extend(self.remove_ops(dst, &stale)?);
        }
        let expiry = self.expiry_at(src);
        let mut new_base = None;
        if let Some(rec) = &rec {
            let now = now_ns();
            let version = rec.version + 1;
            let mut files = Vec::new();
            for f in &rec.files {
                let rewritten = match f.name.as_str() {
                    META => {
                        let bytes = self.store.read_blob(f.blob, f.size)?;
                        let obj = match serde_json::from_slice::<Value>(&bytes) {
                            Ok(Value::Object(o)) => o,
                            _ => serde_json::Map::new(),
                        };
                        Some(commit::rules::render_meta(
                            obj,
                            &commit::rules::Derived {
                                node: dst,
                                status: rec.status,
                                version,
                                created_at: &rec.created_at,
                                updated_at: &rfc3339(now),
                            },
                        ))
                    }
                    place::RELATIONS => {
                        let bytes = self.store.read_blob(f.blob, f.size)?;
                        commit::rules::rebase_relations(&bytes, dst)
                    }
                    _ => None,
                };
                match rewritten {
                    Some(bytes) => {
                        let id = self.blob_id();
                        files.push(crate::store::FileRec {
                            name: f.name.clone(),
                            blob: id,
                            size: bytes.len() as u64,
                            mtime_ns: now,
                            mode: f.mode,
                        });
                        ops.push(Op::PutBlob {
                            id,
                            data: Arc::from(bytes),
                        });
                        ops.push(Op::HighWater {
                            key: counters::BLOB_ID.into(),
                            value: id,
                        });
                    }
                    None => files.push(f.clone()),
                }
            }
            let new = NodeRec {
                path: dst.to_string(),
                version,
                updated_at: rfc3339(now),
                updated_ns: now,
                files,
                ..rec.clone()
            };
            let seq = self.next_event.fetch_add(1, Ordering::Relaxed);
            let account = Self::account_of(dst).to_string();
            ops.extend(self.container_ops(dst));
            ops.extend([
                Op::DelNode {
                    path: src.to_string(),
                },
                Op::PutNode {
                    path: dst.to_string(),
                    rec: new.clone(),
                },
                Op::PutVersion { rec: new },
                Op::PutEvent {
                    seq,
                    node_path: dst.to_string(),
                    account,
                    json: self.event(
                        seq,
                        src,
                        Change::MoveContext {
                            new_uri: place::uri_of(dst),
                        },
                    ),
                },
                Op::HighWater {
                    key: counters::EVENT_ID.into(),
                    value: seq,
                },
            ]);
            new_base = Some((rec.id, version));
            let new_bytes = blob_bytes(&ops);
            self.check_write_quota(Self::account_of(dst), new_bytes)?;
            ops.extend(self.write_quota_ops(dst, new_bytes)?);
            if let Some(at) = expiry {
                ops.push(Op::DelExpiry {
                    path: src.to_string(),
                });
                ops.push(Op::PutExpiry {
                    path: dst.to_string(),
                    at_ns: at,
                });
            }
        } else {
            ops.extend(self.container_ops(dst));
        }
        self.store.apply(ops, true)?;
        self.notify_index();
        if rec.is_some() {
            self.set_expiry(src, None);
            self.set_expiry(dst, expiry);
        }
        let mut drafts = lock(&self.drafts);
        if let Some(d) = drafts.remove(src) {
            if new_base.is_some() {
                lock(&d).base = new_base;
            }
            drafts.insert(dst.to_string(), d);
        }
        drop(drafts);
        // The kernel moved its dentry to an inode named by the old path.
        for path in [src, dst] {
            let (parent, name) = place::parent_name(path);
            self.invalidate(parent, &[name], false);
        }
        self.stats.moves.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn container_ops(&self, node: &str) -> Vec<Op> {
        place::ancestor_containers(&place::split(node))
            .into_iter()
            .map(|(p, n)| Op::PutDir { path: join(&p, &n) })
            .collect()
    }

    /// The stored JSON of outbox event `seq` of `node`, created now.
    fn event(&self, seq: u64, node: &str, change: Change) -> Vec<u8> {
        OutboxEvent::new(seq, node, change, rfc3339_ms(now_ns())).encode()
    }
}

/// Move draft file `file` from `sname` of draft `s` to `dname` of draft `d`
/// (or of `s` itself when `d` is `None`).
fn apply_move(
    s: &mut Draft,
    sname: &str,
    s_rec: Option<&NodeRec>,
    d: Option<&mut Draft>,
    dname: &str,
    file: &Arc<RwLock<DFile>>,
) {
    if s_rec.and_then(|r| r.file(sname)).is_some() {
        s.files.insert(sname.to_string(), Slot::Whiteout);
    } else {
        s.files.remove(sname);
    }
    s.touch();
    let target = match d {
        Some(d) => d,
        None => s,
    };
    target
        .files
        .insert(dname.to_string(), Slot::File(file.clone()));
    target.touch();
}

/// The file names of a node as a writer sees them, in protocol order.
pub(super) fn view_names(rec: Option<&NodeRec>, draft: Option<&Draft>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if let Some(r) = rec {
        names.extend(r.files.iter().map(|f| f.name.clone()));
    }
    if let Some(d) = draft {
        for (n, s) in &d.files {
            match s {
                Slot::File(_) => names.push(n.clone()),
                Slot::Whiteout => names.retain(|x| x != n),
            }
        }
    }
    names.sort_by_key(|n| {
        (
            NODE_FILES.iter().position(|x| x == n).unwrap_or(usize::MAX),
            n.clone(),
        )
    });
    names.dedup();
    names
}
