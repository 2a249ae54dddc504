//! `.ctxfs/version`: what this daemon is (its version, the store it
//! serves, whether search and the inbox are on), one JSON object. The
//! smallest feature, and the example of the recipe in `mod.rs`.

use super::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Fs, Kind, Opened};
use crate::error::Result;

pub(super) struct Version;

const NAME: &str = "version";

fn key() -> Key {
    Key::Virtual(VKey::new("version", "", NAME))
}

impl Feature for Version {
    fn id(&self) -> &'static str {
        "version"
    }

    fn lookup(&self, _fs: &Fs, _c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        (matches!(parent, Key::CtxfsDir) && name == NAME).then(|| Ok(key()))
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        match parent {
            Key::CtxfsDir => vec![(key(), NAME.to_string(), Kind::File)],
            _ => Vec::new(),
        }
    }

    fn attr(&self, fs: &Fs, _c: Caller, _key: &VKey, ino: u64) -> Result<Attr> {
        Ok(fs.shown.file(ino, 0, 0o444, fs.shown.started, true))
    }

    fn open(&self, fs: &Fs, _c: Caller, _key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        let v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "store": if fs.store().shared() { "postgresql" } else { "redb" },
            "encrypted": fs.store().sealed(),
            "search": fs.index().is_some(),
        });
        fs.read_only(format!("{v}\n").into_bytes(), write)
    }
}
