//! The readers' mount (`fuse/readers.rs`): the tree as a reader sees it,
//! committed versions only, every node directory a version of its own.
//!
//! A node directory is served as the version its caller may read at the
//! time of the lookup (the `.versions/N/` directory of that version,
//! `Key::VersionDir`), so every file reached through it is of that version:
//! a reader never mixes files of two versions of one node. A commit drops
//! the node's entry in its parent from the kernel's cache (`readers_inval`),
//! so the next walk finds the new version; one already inside the old
//! directory keeps reading the old version whole.

use super::super::{Attr, Caller, DirBatch, Fs, Key, Target};
use crate::error::{Error, Result};
use crate::schema::place::{self, DirPlace};
use crate::schema::Status;

impl Fs {
    /// `lookup` on the readers' mount: directories, committed node files,
    /// and node directories as their current visible version; anything
    /// else (virtual files, drafts, scratchpads, the inbox) is not there.
    pub fn readers_lookup(&self, c: Caller, parent: u64, name: &str) -> Result<Attr> {
        let a = self.lookup(c, parent, name)?;
        let key = self.key_of(a.ino)?;
        let hidden = |fs: &Fs| {
            fs.forget(a.ino, 1);
            Err(Error::NotFound)
        };
        match &key {
            Key::Dir(path)
                if place::classify_dir(&place::split(path)).ok() == Some(DirPlace::Node) =>
            {
                let access = self.gate(c, Self::account_of(path), false)?;
                let Some(rec) = self.visible_node(path, access)? else {
                    return hidden(self);
                };
                self.forget(a.ino, 1);
                let key = Key::VersionDir {
                    node: path.clone(),
                    id: rec.id,
                    version: rec.version,
                };
                let ino = self.ino_lookup(key);
                self.readers_attr(c, ino)
            }
            Key::Root | Key::Accounts | Key::Dir(_) | Key::File { .. } => Ok(a),
            Key::VersionFile { .. } => self.readers_attr(c, a.ino),
            _ => hidden(self),
        }
    }

    /// `getattr` on the readers' mount: a version's directory and files are
    /// cached by the kernel when every reader of the account sees that
    /// version (it is ACTIVE), as committed files are on the main mount.
    pub fn readers_attr(&self, c: Caller, ino: u64) -> Result<Attr> {
        let a = self.getattr(c, ino, None)?;
        match self.key_of(ino)? {
            Key::VersionDir { node, id, version }
            | Key::VersionFile {
                node, id, version, ..
            } => {
                let rec = self
                    .store
                    .get_version(Self::account_of(&node), id, version)?
                    .ok_or(Error::NotFound)?;
                Ok(Attr {
                    shared: rec.status == Status::Active,
                    ..a
                })
            }
            _ => Ok(a),
        }
    }

    /// `readdir` on the readers' mount: a version's listing is the same for
    /// every reader when the version is ACTIVE, so the kernel may keep it.
    pub fn readers_readdir(&self, c: Caller, ino: u64, offset: u64) -> Result<DirBatch> {
        let mut batch = self.readdir(c, ino, offset)?;
        if let Key::VersionDir { node, id, version } = self.key_of(ino)? {
            batch.shared = self
                .store
                .get_version(Self::account_of(&node), id, version)?
                .is_some_and(|r| r.status == Status::Active);
        }
        Ok(batch)
    }

    /// What the readers' mount must also drop when the main mount drops
    /// `t`: a change under a node directory drops the node's entry in its
    /// parent, so the next walk meets the node's new version.
    pub fn readers_inval(&self, t: &Target) -> Option<Target> {
        let dir = match t {
            Target::Entry { parent, .. } => *parent,
            Target::Inode(ino) => *ino,
        };
        let Ok(Key::Dir(node)) = self.key_of(dir) else {
            return None;
        };
        if place::classify_dir(&place::split(&node)).ok() != Some(DirPlace::Node) {
            return None;
        }
        let (parent, name) = place::parent_name(&node);
        Some(Target::Entry {
            parent: self.dir_ino(parent)?,
            name: name.to_string(),
        })
    }

    /// Is `key` listed on the readers' mount? (A node directory's own
    /// listing is never asked for there: node directories are versions.)
    pub(in crate::core) fn for_readers(key: &Key) -> bool {
        matches!(
            key,
            Key::Root
                | Key::Accounts
                | Key::Dir(_)
                | Key::File { .. }
                | Key::VersionDir { .. }
                | Key::VersionFile { .. }
        )
    }

    /// A read without an open (the readers' mount): the bytes of the
    /// committed node version inode `ino` names, that version exactly.
    pub fn read_committed(&self, c: Caller, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let key = self.key_of(ino)?;
        match &key {
            Key::VersionFile { .. } => {
                // As `.versions/N/` serves it (its `.meta.json` says which
                // version it is).
                let o = self.open(c, ino, libc::O_RDONLY)?;
                let data = self.read(o.fh, offset, size);
                self.release(o.fh);
                data
            }
            Key::File {
                node,
                name,
                id,
                version,
            } => {
                let account = Self::account_of(node);
                self.gate(c, account, false)?;
                let rec = self
                    .store
                    .get_version(account, *id, *version)?
                    .ok_or(Error::NotFound)?;
                let f = rec.file(name).ok_or(Error::NotFound)?;
                let bytes = self.store.read_blob(rec.account(), f.blob, f.size)?;
                Ok(super::super::draft::slice_at(&bytes, offset, size))
            }
            _ => Err(Error::NotFound),
        }
    }
}
