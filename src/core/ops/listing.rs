//! Directory listings (`readdir`): the entries of a directory as one
//! caller sees them, kept per (directory, uid) between the calls of one reading.

use crate::config::Access;
use crate::core::cookie;
use crate::core::ops::arc;
use crate::core::ops::join;
use crate::core::ops::view_names;
use crate::core::ops::Key;
use crate::core::ops::MAX_LISTINGS;
use crate::core::ops::READDIR_BATCH;
use crate::core::Caller;
use crate::core::DirBatch;
use crate::core::DirEntry;
use crate::core::Fs;
use crate::core::Kind;
use crate::core::Listing;
use crate::core::Slot;
use crate::error::Error;
use crate::error::Result;
use crate::locks::lock;
use crate::schema::names;
use crate::schema::place;
use crate::schema::place::DirPlace;
use crate::store::Status;
use std::sync::Arc;

impl Fs {
    // ---- directories -----------------------------------------------------------

    /// A directory's listing as caller `c` sees it (with `.` and `..`), and
    /// whether it is `shared`: the same for every caller allowed in (no
    /// draft, no BROKEN or expiring node, not `accounts/`), so the kernel
    /// may cache it. Changes the kernel does not see itself (commits)
    /// invalidate it.
    pub(in crate::core) fn listing(&self, c: Caller, ino: u64) -> Result<Listing> {
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
            // Its files are the features' (`features/daemon.rs`, `version.rs`).
            Key::CtxfsDir => {}
            Key::Accounts => {
                shared = false;
                for a in self.accounts_visible(c)? {
                    entries.push(d(Key::Dir(arc(&a)), &a, Kind::Dir));
                }
            }
            Key::Dir(path) => {
                let comps = place::split(path);
                let access = self.gate(c, path, false)?;
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
                    let mut names = self.subdirs(path)?;
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
                    // Above the parts of an account's users and agents, each
                    // caller lists what it may reach.
                    let per_caller = self.per_caller_dir(&comps);
                    shared &= !per_caller;
                    for n in names {
                        let child = join(path, &n);
                        if per_caller && self.access_of(c, &child) == Access::None {
                            continue;
                        }
                        entries.push(d(Key::Dir(arc(&child)), &n, Kind::Dir));
                    }
                }
            }
            // Its files are the features' (usage, batch, audit).
            Key::AccountCtxfs(_) => shared = false,
            Key::Virtual(v) => {
                shared = false;
                for (k, name, kind) in crate::core::features::owner(v)?.list(self, c, v)? {
                    entries.push(d(k, &name, kind));
                }
            }
            _ => return Err(Error::NotDir),
        }
        for (k, name, kind) in self.feature_entries(c, &key) {
            entries.push(d(k, &name, kind));
        }
        let mut entries: Vec<(u64, DirEntry)> =
            entries.into_iter().map(|e| (cookie(&e.name), e)).collect();
        entries.sort_by_key(|(c, _)| *c);
        Ok(Listing { entries, shared })
    }

    /// An inode number for a directory entry: the real one if the kernel
    /// knows the entry, else a stable non-zero hash (readdir's d_ino is
    /// informational; `stat` gives the real number).
    pub(in crate::core) fn entry_ino(&self, k: &Key) -> u64 {
        if let Some(i) = lock(&self.kernel.inodes).peek(k) {
            return i;
        }
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        k.hash(&mut h);
        h.finish() | (1 << 63)
    }

    /// Files of a node directory in protocol order, as `access` sees them.
    pub(in crate::core) fn node_listing(
        &self,
        node: &str,
        access: Access,
    ) -> Result<Vec<(String, Key)>> {
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
        Ok(out)
    }

    /// Entries of directory `ino` after `offset` (an empty batch is the
    /// end), with `shared` as in [`Fs::listing`]. There is no open handle:
    /// the kernel opens directories without asking (`no_opendir`), so the
    /// listing is taken at offset 0 and kept per (directory, uid) until its
    /// end is read; a continuation without one rebuilds it. Offsets are
    /// cookies of names ([`cookie`]), so a snapshot replaced by another
    /// lister of the same uid, or rebuilt, continues where this one was.
    pub fn readdir(&self, c: Caller, ino: u64, offset: u64) -> Result<DirBatch> {
        self.read_listing((ino, c.uid), offset, || self.listing(c, ino))
    }

    /// The batch of a listing after `offset`, from the snapshot kept under
    /// `key` (taken by `build` at offset 0, or when none is kept).
    pub(in crate::core) fn read_listing(
        &self,
        key: (u64, u32),
        offset: u64,
        build: impl FnOnce() -> Result<Listing>,
    ) -> Result<DirBatch> {
        let kept = if offset == 0 {
            None
        } else {
            lock(&self.handles.listings).get(&key).cloned()
        };
        let snap = match kept {
            Some(s) => s,
            None => {
                let s = Arc::new(build()?);
                let mut l = lock(&self.handles.listings);
                // Listings abandoned half-read are not kept forever; a
                // dropped one is rebuilt on demand.
                if l.len() >= MAX_LISTINGS {
                    l.clear();
                }
                l.insert(key, s.clone());
                s
            }
        };
        // Resume after the entry whose cookie is `offset`, in whichever
        // snapshot this is. One reply holds a few hundred entries; never
        // copy the whole rest.
        let from = snap.entries.partition_point(|(c, _)| *c <= offset);
        let entries: Vec<(u64, DirEntry)> = snap.entries[from..]
            .iter()
            .take(READDIR_BATCH)
            .cloned()
            .collect();
        if entries.is_empty() {
            lock(&self.handles.listings).remove(&key);
        }
        Ok(DirBatch {
            entries,
            shared: snap.shared,
        })
    }
}
