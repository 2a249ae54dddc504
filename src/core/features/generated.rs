//! The files the daemon writes into the tree's directories: a user's or
//! agent's memory map (`README.md`) and prompt header (`.header.md`), each
//! also as `NAME?budget=N` (cut to N tokens), and the derived summaries
//! of user, agent and category directories (`.abstract.md`,
//! `.overview.md`). Computed at open for the caller; read-only (readers
//! `EROFS`, writers `EPERM`); `rm` of one changes nothing, so `rm -r` of a
//! user directory goes through.

use super::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{agent, Attr, Caller, Fs, Kind, Opened};
use crate::error::{Error, Result};
use crate::schema::names::{ABSTRACT, HEADER_FILE, MAP_FILE, OVERVIEW};

pub(super) struct Generated;

fn key(dir: &str, name: &str) -> Key {
    Key::Virtual(VKey::new("generated", dir, name))
}

/// The generated names of directory `path`.
fn names_of(path: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    if agent::is_owner_space(path) {
        out.extend([MAP_FILE, HEADER_FILE]);
    }
    if agent::is_summarized(path) {
        out.extend([ABSTRACT, OVERVIEW]);
    }
    out
}

/// `README.md?budget=N` or `.header.md?budget=N` of an owner space.
fn budgeted(path: &str, name: &str) -> bool {
    agent::is_owner_space(path)
        && [MAP_FILE, HEADER_FILE].iter().any(|f| {
            name.strip_prefix(f)
                .is_some_and(|rest| rest.starts_with('?'))
        })
}

impl Feature for Generated {
    fn id(&self) -> &'static str {
        "generated"
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        let Key::Dir(path) = parent else {
            return None;
        };
        // Cheap first: most names asked in a directory are not these.
        let ours = [MAP_FILE, HEADER_FILE, ABSTRACT, OVERVIEW]
            .iter()
            .any(|n| name.starts_with(n));
        if !ours {
            return None;
        }
        if names_of(path).contains(&name) {
            return Some(fs.gate(c, path, false).map(|_| key(path, name)));
        }
        budgeted(path, name).then(|| {
            fs.gate(c, path, false)?;
            crate::schema::budget::budget_option(name)?.ok_or(Error::NotFound)?;
            Ok(key(path, name))
        })
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        match parent {
            Key::Dir(path) => names_of(path)
                .into_iter()
                .map(|n| (key(path, n), n.to_string(), Kind::File))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        fs.check_space(c, &key.dir)?;
        Ok(fs
            .shown
            .file(ino, 0, 0o444, std::time::SystemTime::now(), false))
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        let dir = &*key.dir;
        // Readers meet EROFS on any write, as everywhere in their account.
        if write {
            fs.gate(c, dir, true)?;
            return Err(Error::NotPermitted("read-only virtual file"));
        }
        let (base, budget) = match crate::schema::budget::budget_option(&key.name)? {
            Some((base, b)) => (base, Some(b)),
            None => (&*key.name, None),
        };
        let bytes = match base {
            MAP_FILE => fs.memory_map(c, dir, budget)?,
            HEADER_FILE => fs.header(c, Some(dir), budget)?,
            other => fs.dir_summary(c, dir, other == OVERVIEW)?,
        };
        fs.read_only(bytes, false)
    }

    fn setattr(&self, fs: &Fs, c: Caller, key: &VKey) -> Error {
        match fs.gate(c, &key.dir, true) {
            Err(e) => e,
            Ok(_) => Error::NotPermitted("generated file"),
        }
    }

    fn unlink(&self, _fs: &Fs, _c: Caller, _key: &VKey) -> Result<()> {
        // Generated again at the next open: removing it changes nothing.
        Ok(())
    }
}
