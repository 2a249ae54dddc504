//! `DIR/.search/QUERY`: search as files. `.search/` is in every directory
//! a caller may enter (reached by path, listing nothing); a query file's
//! results are computed at open (`core::search`, SEMANTICS "Search").

use super::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::search::parse_query_name;
use crate::core::{Attr, Caller, Fs, Kind, Opened};
use crate::error::{Error, Result};
use crate::schema::names::SEARCH_DIR;
use crate::schema::place::{self, DirPlace};

pub(super) struct SearchFiles;

const ID: &str = "search";

impl Feature for SearchFiles {
    fn id(&self) -> &'static str {
        ID
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        match parent {
            Key::Dir(path) if name == SEARCH_DIR => Some((|| {
                let access = fs.gate(c, path, false)?;
                // A node's `.search/` is there for whoever sees the node.
                if place::classify_dir(&place::split(path))? == DirPlace::Node {
                    fs.node_for(path, access)?;
                }
                Ok(Key::Virtual(VKey::new(ID, path, "")))
            })()),
            Key::Virtual(v) if v.feature == ID && v.name.is_empty() => Some((|| {
                fs.gate(c, &v.dir, false)?;
                parse_query_name(name)?;
                Ok(Key::Virtual(VKey::new(ID, &v.dir, name)))
            })()),
            _ => None,
        }
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        fs.gate(c, &key.dir, false)?;
        if key.name.is_empty() {
            return Ok(fs.shown.dir(ino, 0o555, fs.shown.started, false));
        }
        parse_query_name(&key.name)?;
        Ok(fs
            .shown
            .file(ino, 0, 0o444, std::time::SystemTime::now(), false))
    }

    fn list(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<Vec<(Key, String, Kind)>> {
        if !key.name.is_empty() {
            return Err(Error::NotDir);
        }
        // Any query is reached by its name; none is listed.
        fs.gate(c, &key.dir, false)?;
        Ok(Vec::new())
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        if key.name.is_empty() {
            return Err(Error::IsDir);
        }
        if write {
            return Err(Error::NotPermitted("read-only virtual file"));
        }
        let bytes = fs.search_file(c, &key.dir, &key.name)?;
        fs.read_only(bytes, false)
    }
}
