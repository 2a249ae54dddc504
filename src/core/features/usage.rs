//! `accounts/{a}/.ctxfs/usage`: what the account uses against its quota
//! (JSON, computed at open), for everyone who may read the account.

use super::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Fs, Kind, Opened};
use crate::error::Result;
use crate::schema::names::USAGE_FILE;

pub(super) struct Usage;

impl Feature for Usage {
    fn id(&self) -> &'static str {
        "usage"
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        super::account_file(fs, c, parent, name, "usage", USAGE_FILE)
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        super::account_file_entry(parent, "usage", USAGE_FILE)
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        fs.gate(c, &key.dir, false)?;
        Ok(fs
            .shown
            .file(ino, 0, 0o444, std::time::SystemTime::now(), false))
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        let json = fs.usage_json(c, &key.dir)?;
        fs.read_only(json, write)
    }
}
