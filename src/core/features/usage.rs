//! `accounts/{a}/.ctxfs/usage`: what the account uses against its quota
//! (JSON, computed at open), for everyone who may read the account.

use super::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Fs, Kind, Opened};
use crate::error::Result;
use crate::schema::names::USAGE_FILE;

pub(super) struct Usage;

fn key(account: &str) -> Key {
    Key::Virtual(VKey::new("usage", account, USAGE_FILE))
}

impl Feature for Usage {
    fn id(&self) -> &'static str {
        "usage"
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        match parent {
            Key::AccountCtxfs(account) if name == USAGE_FILE => {
                Some(fs.gate(c, account, false).map(|_| key(account)))
            }
            _ => None,
        }
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        match parent {
            Key::AccountCtxfs(account) => vec![(key(account), USAGE_FILE.to_string(), Kind::File)],
            _ => Vec::new(),
        }
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        fs.gate(c, &key.dir, false)?;
        Ok(fs.file_attr(ino, 0, 0o444, std::time::SystemTime::now(), false))
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, write: bool) -> Result<Opened> {
        let json = fs.usage_json(c, &key.dir)?;
        fs.read_only(json, write)
    }
}
