//! `accounts/{a}/.ctxfs/audit`: who did what in the account (the trail is
//! kept by `core::audit`); its writers and root read it, readers get
//! `EACCES`, and no one writes it.

use super::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Fs, Kind, Opened};
use crate::error::{Error, Result};
use crate::schema::names::AUDIT_FILE;

pub(super) struct Audit;

impl Feature for Audit {
    fn id(&self) -> &'static str {
        "audit"
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        super::account_file(fs, c, parent, name, "audit", AUDIT_FILE)
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        super::account_file_entry(parent, "audit", AUDIT_FILE)
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        fs.gate(c, &key.dir, false)?;
        Ok(fs
            .shown
            .file(ino, 0, 0o440, std::time::SystemTime::now(), false))
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        if write {
            fs.gate(c, &key.dir, true)?;
            return Err(Error::NotPermitted(
                "the audit trail is the daemon's, append-only",
            ));
        }
        let text = fs.audit_text(c, &key.dir)?;
        fs.read_only(text, false)
    }
}
