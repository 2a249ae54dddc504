//! `NODE/.commit-error`: why the last commit of a node's draft was refused
//! (the commit point's reason, kept on the draft until the next commit
//! attempt). Its writers read it; removing it acknowledges the reason
//! (and lets `rm -r` of the node finish). Readers never see drafts, so
//! never this file.

use super::Feature;
use crate::config::Access;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Fs, Kind, Opened};
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::schema::place::COMMIT_ERROR;
use std::time::SystemTime;

pub(super) struct CommitError;

const ID: &str = "commit-error";

fn key(node: &str) -> Key {
    Key::Virtual(VKey::new(ID, node, COMMIT_ERROR))
}

/// The reason, as its writer reads it (`ENOENT` when there is none, or
/// for a reader).
fn text(fs: &Fs, c: Caller, node: &str) -> Result<Vec<u8>> {
    fs.gate(c, node, true).map_err(|e| match e {
        Error::ReadOnly => Error::NotFound,
        e => e,
    })?;
    let d = fs.draft(node).ok_or(Error::NotFound)?;
    let d = lock(&d);
    let e = d.error.as_ref().ok_or(Error::NotFound)?;
    Ok(format!("{e}\n").into_bytes())
}

impl Feature for CommitError {
    fn id(&self) -> &'static str {
        ID
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        super::node_file(fs, c, parent, name, COMMIT_ERROR).map(|n| n.map(|(n, _)| key(n)))
    }

    fn entries(&self, fs: &Fs, c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        match parent {
            // Listed with the draft it belongs to: for writers only.
            Key::Dir(node)
                if fs.draft(node).is_some_and(|d| lock(&d).error.is_some())
                    && fs.access_of(c, node) == Access::Write =>
            {
                vec![(key(node), COMMIT_ERROR.to_string(), Kind::File)]
            }
            _ => Vec::new(),
        }
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        let text = text(fs, c, &key.dir)?;
        Ok(fs
            .shown
            .file(ino, text.len() as u64, 0o444, SystemTime::now(), false))
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        fs.read_only(text(fs, c, &key.dir)?, write)
    }

    fn unlink(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<()> {
        let node = &key.dir;
        fs.gate(c, node, true)?;
        let _g = fs.drafts.stripe(node);
        let d = fs.draft(node).ok_or(Error::NotFound)?;
        let taken = lock(&d).error.take();
        taken.map(|_| ()).ok_or(Error::NotFound)
    }
}
