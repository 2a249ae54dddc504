//! `.as-of/` as a feature: its names as keys, and what the operations ask
//! of them. Everything in it is read-only but `restore` (a control file):
//! mkdir, create, unlink, rmdir and rename there are `EROFS`.
//!
//! A key is a [`VKey`] of the account (`dir`), so a move of a node never
//! rebases it (a path in the past does not move), and a tagged `name`:
//! what it is, the time it was reached by and the path at that time, NUL
//! separated (no name or path holds a NUL).

use super::parse_time;
use crate::core::features::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Fs, Kind, Opened};
use crate::error::{Error, Result};
use crate::schema::names::AS_OF_DIR;
use crate::schema::place;
use std::sync::Arc;

pub(in crate::core) struct AsOfFiles;

const ID: &str = "as-of";

/// A name of `.as-of/`, decoded from its key.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::core) enum Past {
    /// `accounts/A/.as-of/`: reached by path, lists nothing.
    Root { account: Arc<str> },
    /// A directory of `accounts/A/.as-of/{time}/`: `path` is its place at
    /// `at` (ns since the epoch), `time` the name it was reached by.
    Dir {
        time: Arc<str>,
        at: i128,
        path: Arc<str>,
    },
    /// `accounts/A/.as-of/{time}/restore`: a path written here is
    /// committed again as it was then.
    Restore {
        time: Arc<str>,
        at: i128,
        account: Arc<str>,
    },
    /// `.search/` of a directory `dir` of a view (`name` `None`), or a
    /// query file in it: searches the versions current at `at`.
    Search {
        time: Arc<str>,
        at: i128,
        dir: Arc<str>,
        name: Option<Arc<str>>,
    },
}

impl Past {
    /// Its key.
    pub(in crate::core) fn key(&self) -> Key {
        let (account, name) = match self {
            Past::Root { account } => (place::account_of(account), String::new()),
            Past::Dir { time, path, .. } => (place::account_of(path), format!("d\0{time}\0{path}")),
            Past::Restore { time, account, .. } => (&**account, format!("r\0{time}\0{account}")),
            Past::Search {
                time,
                dir,
                name: None,
                ..
            } => (place::account_of(dir), format!("s\0{time}\0{dir}")),
            Past::Search {
                time,
                dir,
                name: Some(q),
                ..
            } => (place::account_of(dir), format!("q\0{time}\0{dir}\0{q}")),
        };
        Key::Virtual(VKey::new(ID, account, &name))
    }

    /// The name a key of this feature stands for.
    fn of(key: &VKey) -> Result<Past> {
        if key.name.is_empty() {
            return Ok(Past::Root {
                account: key.dir.clone(),
            });
        }
        let mut parts = key.name.splitn(4, '\0');
        let (Some(tag), Some(time), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(Error::NotFound);
        };
        let at = parse_time(time)?;
        let (time, path) = (Arc::from(time), Arc::from(path));
        Ok(match (tag, parts.next()) {
            ("d", None) => Past::Dir { time, at, path },
            ("r", None) => Past::Restore {
                time,
                at,
                account: path,
            },
            ("s", None) => Past::Search {
                time,
                at,
                dir: path,
                name: None,
            },
            ("q", Some(q)) => Past::Search {
                time,
                at,
                dir: path,
                name: Some(Arc::from(q)),
            },
            _ => return Err(Error::NotFound),
        })
    }
}

impl Feature for AsOfFiles {
    fn id(&self) -> &'static str {
        ID
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        self.lookup_attr(fs, c, parent, name)
            .map(|r| r.map(|(k, _)| k))
    }

    fn lookup_attr(
        &self,
        fs: &Fs,
        c: Caller,
        parent: &Key,
        name: &str,
    ) -> Option<Result<(Key, Option<Attr>)>> {
        match parent {
            Key::Dir(account) if name == AS_OF_DIR && !account.contains('/') => {
                Some(fs.gate(c, account, false).map(|_| {
                    let root = Past::Root {
                        account: account.clone(),
                    };
                    (root.key(), None)
                }))
            }
            Key::Virtual(v) if v.feature == ID => Some(Past::of(v).and_then(|p| match p {
                Past::Root { account } => Ok((fs.as_of_root_child(c, &account, name)?.key(), None)),
                p => fs.as_of_child(c, &p, name),
            })),
            _ => None,
        }
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        fs.as_of_attr(c, &Past::of(key)?, ino)
    }

    fn list(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<Vec<(Key, String, Kind)>> {
        fs.as_of_list(c, &Past::of(key)?)
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        match Past::of(key)? {
            Past::Restore { at, account, .. } => fs.as_of_restore_open(c, &account, at, write),
            p @ Past::Search { name: Some(_), .. } => {
                let bytes = fs.as_of_search_file(c, &p)?;
                fs.read_only(bytes, write)
            }
            _ => Err(Error::IsDir),
        }
    }

    /// `.as-of/` in an account's directory is a directory.
    fn unlink(&self, _fs: &Fs, _c: Caller, _key: &VKey) -> Result<()> {
        Err(Error::IsDir)
    }

    fn takes_writes(&self, key: &VKey) -> bool {
        matches!(Past::of(key), Ok(Past::Restore { .. }))
    }

    fn read_only(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_of_the_past_is_its_key_and_back() {
        let t: Arc<str> = Arc::from("2026-11-20T10:00:00Z");
        let at = parse_time(&t).unwrap();
        let a: Arc<str> = Arc::from("acme");
        let p: Arc<str> = Arc::from("acme/users/priya/memories");
        for past in [
            Past::Root { account: a.clone() },
            Past::Dir {
                time: t.clone(),
                at,
                path: a.clone(),
            },
            Past::Dir {
                time: t.clone(),
                at,
                path: p.clone(),
            },
            Past::Restore {
                time: t.clone(),
                at,
                account: a.clone(),
            },
            Past::Search {
                time: t.clone(),
                at,
                dir: p.clone(),
                name: None,
            },
            Past::Search {
                time: t.clone(),
                at,
                dir: p.clone(),
                name: Some(Arc::from("tea?k=3")),
            },
        ] {
            let Key::Virtual(v) = past.key() else {
                panic!("{past:?}")
            };
            // Keyed by the account: a move of a node never rebases it.
            assert_eq!(&*v.dir, "acme", "{past:?}");
            assert_eq!(Past::of(&v).unwrap(), past);
        }
        // A time that does not parse, or a tag no key has, is no name.
        for name in [
            "d\0yesterday\0acme",
            "x\x002026-11-20\0acme",
            "d\x002026-11-20",
        ] {
            assert!(Past::of(&VKey::new(ID, "acme", name)).is_err(), "{name:?}");
        }
    }
}
