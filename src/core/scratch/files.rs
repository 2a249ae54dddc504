//! The scratchpads as a feature: `projects/{p}/scratchpad/` and
//! `projects/{p}/activity_log.jsonl` in every project directory, and
//! everything inside the scratchpad, answered by the operations of
//! `scratch/mod.rs`.
//!
//! A key is a [`VKey`] of the account (`dir`) with the entry's whole path
//! as its `name`: a move in the tree never rebases it (a project with
//! scratch entries is not moved).

use super::is_project;
use crate::core::features::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Fs, Kind, Opened, SetAttr};
use crate::error::{Error, Result};
use crate::schema::names::{ACTIVITY_LOG, SCRATCHPAD};
use crate::schema::place;

pub(in crate::core) struct ScratchFiles;

const ID: &str = "scratch";

/// The key of scratch entry `path` (the scratchpad itself, the activity
/// log, or anything in the scratchpad).
pub(in crate::core) fn key(path: &str) -> Key {
    Key::Virtual(VKey::new(ID, place::account_of(path), path))
}

/// The entry a key of this feature names.
fn path_of(key: &VKey) -> &str {
    &key.name
}

/// The project a scratchpad or activity log in the tree belongs to.
fn in_project(key: &VKey) -> Option<(&str, &str)> {
    let (project, name) = path_of(key).rsplit_once('/')?;
    (is_project(project) && (name == SCRATCHPAD || name == ACTIVITY_LOG)).then_some((project, name))
}

impl Feature for ScratchFiles {
    fn id(&self) -> &'static str {
        ID
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        match parent {
            Key::Dir(path) if (name == SCRATCHPAD || name == ACTIVITY_LOG) && is_project(path) => {
                Some(
                    fs.gate(c, path, false)
                        .map(|_| key(&format!("{path}/{name}"))),
                )
            }
            Key::Virtual(v) if v.feature == ID => Some(fs.scratch_child(c, path_of(v), name)),
            _ => None,
        }
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        match parent {
            Key::Dir(path) if is_project(path) => vec![
                (
                    key(&format!("{path}/{SCRATCHPAD}")),
                    SCRATCHPAD.to_string(),
                    Kind::Dir,
                ),
                (
                    key(&format!("{path}/{ACTIVITY_LOG}")),
                    ACTIVITY_LOG.to_string(),
                    Kind::File,
                ),
            ],
            _ => Vec::new(),
        }
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        fs.scratch_attr(c, path_of(key), ino)
    }

    fn list(&self, fs: &Fs, c: Caller, dir: &VKey) -> Result<Vec<(Key, String, Kind)>> {
        let dir = path_of(dir);
        Ok(fs
            .scratch_list(c, dir)?
            .into_iter()
            .map(|(name, kind)| (key(&format!("{dir}/{name}")), name, kind))
            .collect())
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        fs.scratch_open(c, path_of(key), flags)
    }

    /// Plain files: every setattr is `change_attr`'s.
    fn takes_writes(&self, _key: &VKey) -> bool {
        true
    }

    fn change_attr(
        &self,
        fs: &Fs,
        c: Caller,
        key: &VKey,
        ino: u64,
        sa: &SetAttr,
    ) -> Option<Result<Attr>> {
        Some(fs.scratch_setattr(c, path_of(key), ino, sa))
    }

    fn writable(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<()> {
        fs.gate(c, path_of(key), true).map(drop)
    }

    fn create(
        &self,
        fs: &Fs,
        c: Caller,
        dir: &VKey,
        name: &str,
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Opened)> {
        let dir = path_of(dir);
        let opened = fs.scratch_create(c, dir, name, mode, flags)?;
        let path = format!("{dir}/{name}");
        let ino = fs.ino_lookup(key(&path));
        Ok((fs.scratch_attr(c, &path, ino)?, opened))
    }

    fn mkdir(&self, fs: &Fs, c: Caller, dir: &VKey, name: &str, mode: u32) -> Result<()> {
        fs.scratch_mkdir(c, path_of(dir), name, mode)
    }

    fn unlink_in(&self, fs: &Fs, c: Caller, dir: &VKey, name: &str) -> Result<()> {
        fs.scratch_unlink(c, path_of(dir), name, false)
    }

    fn rmdir_in(&self, fs: &Fs, c: Caller, dir: &VKey, name: &str) -> Result<()> {
        fs.scratch_unlink(c, path_of(dir), name, true)
    }

    /// `rm` of the scratchpad is `EISDIR`; the activity log only grows,
    /// but uid 0 removes it (then `rm -r` of the project goes through).
    fn unlink(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<()> {
        match in_project(key) {
            Some((project, ACTIVITY_LOG)) if c.uid == 0 => fs.scratch_drop_log(project),
            Some((_, ACTIVITY_LOG)) => {
                Err(Error::NotPermitted("activity_log.jsonl is append-only"))
            }
            _ => Err(Error::IsDir),
        }
    }

    /// Like structural directories, an empty scratchpad is "removed" and
    /// shows again, so `rm -r` of a project works.
    fn rmdir(&self, fs: &Fs, c: Caller, key: &VKey) -> Option<Result<()>> {
        let (project, SCRATCHPAD) = in_project(key)? else {
            return None;
        };
        let removed = || {
            fs.gate(c, project, true)?;
            if !fs.store().list_scratch(path_of(key))?.is_empty() {
                return Err(Error::NotEmpty);
            }
            Ok(())
        };
        Some(removed())
    }

    fn rename(
        &self,
        fs: &Fs,
        c: Caller,
        from: &VKey,
        name: &str,
        to: &VKey,
        newname: &str,
        noreplace: bool,
    ) -> Result<()> {
        fs.scratch_rename(c, path_of(from), name, path_of(to), newname, noreplace)
    }

    /// Nothing moves between a scratchpad and the tree (or another
    /// feature): `EXDEV`, after the writer's check.
    fn rename_across(&self, fs: &Fs, c: Caller, dir: &VKey) -> Option<Error> {
        Some(match fs.gate(c, path_of(dir), true) {
            Ok(_) => Error::CrossDevice,
            Err(e) => e,
        })
    }

    fn renamed(&self, fs: &Fs, c: Caller, key: &VKey) -> Option<Result<()>> {
        let (project, ACTIVITY_LOG) = in_project(key)? else {
            return None;
        };
        Some(fs.gate(c, project, true).and(Err(Error::NotPermitted(
            "activity_log.jsonl is append-only",
        ))))
    }
}

/// The entry a key names, when it is one of this feature's.
pub(in crate::core) fn entry_of(key: &Key) -> Option<&str> {
    match key {
        Key::Virtual(v) if v.feature == ID => Some(path_of(v)),
        _ => None,
    }
}
