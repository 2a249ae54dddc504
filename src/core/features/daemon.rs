//! The daemon's own files in `MOUNT/.ctxfs/`: `status`, `pid`, `sync`,
//! `header` (and `header?budget=N`), `help`, `metrics`, each computed at
//! open for the caller (SEMANTICS "Tenancy", "The agent's view").

use super::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{agent, Attr, Caller, Fs, Kind, Opened};
use crate::error::{Error, Result};
use crate::schema::names::{self, CTXFS_FILES};

pub(super) struct DaemonFiles;

fn key(name: &str) -> Key {
    Key::Virtual(VKey::new("ctxfs", "", name))
}

impl Feature for DaemonFiles {
    fn id(&self) -> &'static str {
        "ctxfs"
    }

    fn lookup(&self, _fs: &Fs, _c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        if !matches!(parent, Key::CtxfsDir) {
            return None;
        }
        if CTXFS_FILES.contains(&name) {
            return Some(Ok(key(name)));
        }
        // `header?budget=N`: the header cut to N tokens.
        let budgeted = name
            .strip_prefix(names::HEADER)
            .is_some_and(|rest| rest.starts_with('?'));
        budgeted.then(|| {
            crate::schema::budget::budget_option(name)?.ok_or(Error::NotFound)?;
            Ok(key(name))
        })
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        match parent {
            Key::CtxfsDir => CTXFS_FILES
                .iter()
                .map(|n| (key(n), n.to_string(), Kind::File))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn attr(&self, fs: &Fs, _c: Caller, _key: &VKey, ino: u64) -> Result<Attr> {
        Ok(fs.file_attr(ino, 0, 0o444, std::time::SystemTime::now(), false))
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, write: bool) -> Result<Opened> {
        if write {
            return Err(Error::NotPermitted("read-only virtual file"));
        }
        let bytes = match &*key.name {
            names::STATUS_FILE => fs.status_json(c)?,
            names::SYNC_FILE => fs.sync_file(c)?,
            names::HEADER => fs.header(c, None, None)?,
            names::HELP => agent::help_text().as_bytes().to_vec(),
            names::METRICS_FILE => fs.metrics_text(Some(c))?.into_bytes(),
            names::PID_FILE => format!("{}\n", std::process::id()).into_bytes(),
            budgeted => {
                let (_, budget) =
                    crate::schema::budget::budget_option(budgeted)?.ok_or(Error::NotFound)?;
                fs.header(c, None, Some(budget))?
            }
        };
        fs.read_only(bytes, false)
    }
}
