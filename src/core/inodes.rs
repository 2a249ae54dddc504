//! Inode numbers for the kernel: allocated on first lookup, dropped when the
//! kernel forgets them. A committed file's key names its version, so its
//! bytes never change under one inode number and the page cache may keep them.

use std::collections::HashMap;
use std::sync::Arc;

pub const ROOT: u64 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Root,
    Accounts,
    CtxfsDir,
    /// A directory under `accounts/` (account, structural, container or node).
    Dir(Arc<str>),
    /// A file of a committed node version.
    File {
        node: Arc<str>,
        name: Arc<str>,
        id: u64,
        version: u32,
    },
    /// A file of a node's draft (writers only).
    Draft {
        node: Arc<str>,
        name: Arc<str>,
    },
    /// `accounts/{a}/.ctxfs/`: the account's own files (reached by path).
    AccountCtxfs(Arc<str>),
    /// A name of a feature that owns its virtual files (`core::features`).
    Virtual(VKey),
}

/// The key of a feature's virtual file or directory: the feature (its
/// `id`), the directory it is in, and its name there (or whatever else the
/// feature needs to find it again).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VKey {
    pub feature: &'static str,
    pub dir: Arc<str>,
    pub name: Arc<str>,
}

impl VKey {
    pub fn new(feature: &'static str, dir: &str, name: &str) -> VKey {
        VKey {
            feature,
            dir: Arc::from(dir),
            name: Arc::from(name),
        }
    }
}

/// `path` with its prefix `from` replaced by `to`, if it is `from` or below.
fn rebase(path: &Arc<str>, from: &str, to: &str) -> Option<Arc<str>> {
    let rest = path.strip_prefix(from)?;
    (rest.is_empty() || rest.starts_with('/')).then(|| Arc::from(format!("{to}{rest}")))
}

impl Key {
    /// This key with its node path moved from `from` to `to`, if it names
    /// `from` or something below it.
    pub fn rebased(&self, from: &str, to: &str) -> Option<Key> {
        let r = |p: &Arc<str>| rebase(p, from, to);
        Some(match self {
            Key::Dir(p) => Key::Dir(r(p)?),
            Key::File {
                node,
                name,
                id,
                version,
            } => Key::File {
                node: r(node)?,
                name: name.clone(),
                id: *id,
                version: *version,
            },
            Key::Draft { node, name } => Key::Draft {
                node: r(node)?,
                name: name.clone(),
            },
            Key::Virtual(v) => Key::Virtual(VKey {
                dir: r(&v.dir)?,
                ..v.clone()
            }),
            _ => return None,
        })
    }
}

pub struct Inodes {
    by_key: HashMap<Key, u64>,
    by_ino: HashMap<u64, (Key, u64)>,
    next: u64,
}

impl Default for Inodes {
    /// The table with the root alone.
    fn default() -> Self {
        Inodes::new()
    }
}

impl Inodes {
    pub fn new() -> Self {
        let mut t = Inodes {
            by_key: HashMap::new(),
            by_ino: HashMap::new(),
            next: ROOT + 1,
        };
        t.by_key.insert(Key::Root, ROOT);
        t.by_ino.insert(ROOT, (Key::Root, 1));
        t
    }

    /// The inode of `key`, counting one kernel lookup reference.
    pub fn lookup(&mut self, key: Key) -> u64 {
        if let Some(&ino) = self.by_key.get(&key) {
            if let Some(e) = self.by_ino.get_mut(&ino) {
                e.1 += 1;
            }
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_key.insert(key.clone(), ino);
        self.by_ino.insert(ino, (key, 1));
        ino
    }

    /// The inode of `key` without a lookup reference (for readdir entries).
    pub fn peek(&self, key: &Key) -> Option<u64> {
        self.by_key.get(key).copied()
    }

    /// Every inode the kernel may hold.
    pub fn all(&self) -> Vec<u64> {
        self.by_ino.keys().copied().collect()
    }

    pub fn key(&self, ino: u64) -> Option<Key> {
        self.by_ino.get(&ino).map(|(k, _)| k.clone())
    }

    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        if let Some(e) = self.by_ino.get_mut(&ino) {
            e.1 = e.1.saturating_sub(n);
            if e.1 == 0 {
                let (key, _) = self.by_ino.remove(&ino).expect("present");
                // The key may belong to another inode since (a rename).
                if self.by_key.get(&key) == Some(&ino) {
                    self.by_key.remove(&key);
                }
            }
        }
    }

    /// The thing `key` named was removed. Its inode keeps meaning it for
    /// the references the kernel still holds (a process's working
    /// directory, an open file), but a new thing at the same place gets a
    /// new inode: the kernel marks a removed directory's inode dead, and a
    /// reused number would hand that dead inode out again (`mkdir` inside
    /// the new directory failing `ENOENT`, its listing empty).
    pub fn detach(&mut self, key: &Key) {
        self.by_key.remove(key);
    }

    /// The kernel moved the dentry of directory `from` to `to` (a rename
    /// it was told succeeded), and with it every dentry below: each inode
    /// that meant `from` or a path under it now means the same thing under
    /// `to`, as the kernel's dentries say, so a lookup or open through them
    /// right after the rename (`to/.meta.json` through the dentry cached as
    /// `from/.meta.json`) finds the moved thing and not `ENOENT` before the
    /// invalidation thread catches up. An inode that meant a path under
    /// `to` before (a removed node's, still held) keeps its key but no
    /// longer owns it.
    pub fn rename_tree(&mut self, from: &str, to: &str) {
        let moved: Vec<(u64, Key, Key)> = self
            .by_ino
            .iter()
            .filter_map(|(&ino, (k, _))| Some((ino, k.clone(), k.rebased(from, to)?)))
            .collect();
        for (ino, old, _) in &moved {
            if self.by_key.get(old) == Some(ino) {
                self.by_key.remove(old);
            }
        }
        for (ino, _, new) in moved {
            if let Some(e) = self.by_ino.get_mut(&ino) {
                e.0 = new.clone();
            }
            self.by_key.insert(new, ino);
        }
    }

    pub fn len(&self) -> usize {
        self.by_ino.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_ino.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_forget() {
        let mut t = Inodes::new();
        let k = Key::Dir("acme".into());
        let a = t.lookup(k.clone());
        assert_eq!(t.lookup(k.clone()), a);
        t.forget(a, 1);
        assert_eq!(t.key(a), Some(k.clone()));
        t.forget(a, 1);
        assert_eq!(t.key(a), None);
        let b = t.lookup(k);
        assert_ne!(a, b, "inode numbers are never reused");
        t.forget(ROOT, 100);
        assert_eq!(t.key(ROOT), Some(Key::Root));
    }

    #[test]
    fn a_removed_key_held_by_the_kernel_gets_a_new_inode_at_its_next_lookup() {
        let mut t = Inodes::new();
        let k = Key::Dir("acme/c".into());
        let old = t.lookup(k.clone());
        t.detach(&k);
        let new = t.lookup(k.clone());
        assert_ne!(old, new);
        // The old inode still means its key for the kernel, and its forget
        // leaves the new owner alone.
        assert_eq!(t.key(old), Some(k.clone()));
        t.forget(old, 1);
        assert_eq!(t.key(old), None);
        assert_eq!(t.peek(&k), Some(new));
    }

    #[test]
    fn a_renamed_directory_keeps_its_inode_under_the_new_key() {
        let mut t = Inodes::new();
        let (a, b) = (Key::Dir("acme/x".into()), Key::Dir("acme/y".into()));
        let old_b = t.lookup(b.clone());
        let ino = t.lookup(a.clone());
        let file = |node: &str| Key::File {
            node: node.into(),
            name: ".meta.json".into(),
            id: 7,
            version: 1,
        };
        let f = t.lookup(file("acme/x"));
        let other = t.lookup(Key::Dir("acme/xy".into()));
        t.rename_tree("acme/x", "acme/y");
        // The file the kernel reaches through the moved dentry means the
        // moved node's file; a sibling sharing the prefix is untouched.
        assert_eq!(t.key(f), Some(file("acme/y")));
        assert_eq!(t.key(other), Some(Key::Dir("acme/xy".into())));
        assert_eq!(t.key(ino), Some(b.clone()));
        assert_eq!(t.peek(&b), Some(ino));
        assert_eq!(t.peek(&a), None);
        // The displaced inode's forget leaves the new owner alone.
        t.forget(old_b, 1);
        assert_eq!(t.peek(&b), Some(ino));
    }
}
