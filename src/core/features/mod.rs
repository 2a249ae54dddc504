//! Virtual files owned whole by their feature.
//!
//! A feature that adds files or directories to the mount implements
//! [`Feature`] in a file of its own and is listed in [`FEATURES`]: it says
//! where its names appear (`lookup`, `entries`), and answers attributes,
//! listings and opens of its own keys ([`Key::Virtual`], tagged with its
//! `id`). The operations of `ops/` ask the features first, so nothing
//! else changes when one is added. A feature answers `create`, `unlink`
//! and `rename` in its own directories too; other changes (write-open of
//! a directory, mkdir) are refused by the operations' fallbacks (`EPERM`).
//! A feature with a module of its own implements the trait there (the
//! inbox, `inbox/files.rs`; the past, `asof/files.rs`).
//!
//! The recipe for a new virtual file: a file here with a unit struct
//! implementing `Feature`, its `mod` line and its entry in `FEATURES`
//! below; `version.rs` (`.ctxfs/version`) is the example.

mod audit;
mod batch;
mod commit_error;
mod daemon;
mod generated;
mod outbox;
mod search;
mod usage;
mod version;
mod versions;

pub(in crate::core) use versions::file_key as version_file_key;
pub(in crate::core) use versions::{version_key, version_place};

use super::inodes::{Key, VKey};
use super::{Attr, Caller, Fs, Kind, Opened, SetAttr};
use crate::error::{Error, Result};

/// A feature's virtual files.
pub(in crate::core) trait Feature: Sync {
    /// The tag of its keys.
    fn id(&self) -> &'static str;

    /// The key of `name` in directory `parent`, when this feature puts
    /// something there (`None`: not its name).
    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>>;

    /// [`Feature::lookup`] with the attributes, when finding the key read
    /// them already (the kernel asks for them next).
    fn lookup_attr(
        &self,
        fs: &Fs,
        c: Caller,
        parent: &Key,
        name: &str,
    ) -> Option<Result<(Key, Option<Attr>)>> {
        self.lookup(fs, c, parent, name)
            .map(|r| r.map(|k| (k, None)))
    }

    /// Are its directories read-only (mkdir, create, unlink, rmdir and
    /// rename in them `EROFS`, as the past is)? Otherwise each of those
    /// asks its own method below, or is refused with `EPERM`.
    fn read_only(&self) -> bool {
        false
    }

    /// What it adds to the listing of `parent` (the same for every caller
    /// the listing is shown to: the kernel may cache it with the rest).
    fn entries(&self, _fs: &Fs, _c: Caller, _parent: &Key) -> Vec<(Key, String, Kind)> {
        Vec::new()
    }

    /// The attributes of one of its keys.
    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr>;

    /// The entries of one of its directories.
    fn list(&self, _fs: &Fs, _c: Caller, _key: &VKey) -> Result<Vec<(Key, String, Kind)>> {
        Err(Error::NotDir)
    }

    /// Open one of its files with open(2)'s `flags` ([`writes`]: for
    /// writing).
    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened>;

    /// Does `key` take writes (a control file: `echo … > FILE` truncates
    /// it first, which is accepted)?
    fn takes_writes(&self, _key: &VKey) -> bool {
        false
    }

    /// Why a `setattr` (chmod, truncate, utimes) of one of its names is
    /// refused, for a feature that takes no writes.
    fn setattr(&self, _fs: &Fs, _c: Caller, _key: &VKey) -> Error {
        Error::NotPermitted("read-only virtual file")
    }

    /// `unlink` of one of its names in a directory of the tree.
    fn unlink(&self, _fs: &Fs, _c: Caller, _key: &VKey) -> Result<()> {
        Err(Error::NotPermitted("read-only virtual file"))
    }

    /// `unlink` of `name` in one of its directories, `dir`.
    fn unlink_in(&self, _fs: &Fs, _c: Caller, _dir: &VKey, _name: &str) -> Result<()> {
        Err(Error::NotPermitted("virtual directory"))
    }

    /// `rmdir` of one of its directories that appears in the tree (`None`:
    /// the tree's rules answer).
    fn rmdir(&self, _fs: &Fs, _c: Caller, _key: &VKey) -> Option<Result<()>> {
        None
    }

    /// `create` of `name` in one of its directories, `dir`, with open(2)'s
    /// `mode` and `flags`: the new file's attributes and its open handle.
    fn create(
        &self,
        _fs: &Fs,
        _c: Caller,
        _dir: &VKey,
        _name: &str,
        _mode: u32,
        _flags: i32,
    ) -> Result<(Attr, Opened)> {
        Err(Error::NotPermitted("no files can be created here"))
    }

    /// `mkdir` of `name` in one of its directories, `dir`.
    fn mkdir(&self, _fs: &Fs, _c: Caller, _dir: &VKey, _name: &str, _mode: u32) -> Result<()> {
        Err(Error::NotPermitted("virtual directory"))
    }

    /// `rmdir` of `name` in one of its directories, `dir`.
    fn rmdir_in(&self, _fs: &Fs, _c: Caller, _dir: &VKey, _name: &str) -> Result<()> {
        Err(Error::NotPermitted("virtual directory"))
    }

    /// A `setattr` of one of its names (`None`: the operations' own rule
    /// for control files and read-only files answers, see `setattr`).
    fn change_attr(
        &self,
        _fs: &Fs,
        _c: Caller,
        _key: &VKey,
        _ino: u64,
        _sa: &SetAttr,
    ) -> Option<Result<Attr>> {
        None
    }

    /// `access(W_OK)` of one of its names.
    fn writable(&self, _fs: &Fs, _c: Caller, _key: &VKey) -> Result<()> {
        Err(Error::AccessDenied)
    }

    /// `rename` of `name` in its directory `from` to `newname` in its
    /// directory `to` (`noreplace`: `RENAME_NOREPLACE`).
    #[allow(clippy::too_many_arguments)]
    fn rename(
        &self,
        _fs: &Fs,
        _c: Caller,
        _from: &VKey,
        _name: &str,
        _to: &VKey,
        _newname: &str,
        _noreplace: bool,
    ) -> Result<()> {
        Err(Error::NotPermitted(
            "only files and directories of accounts can be renamed",
        ))
    }

    /// A `rename` between one of its directories, `dir`, and a directory
    /// that is not its own: its refusal (`None`: the tree's rules answer).
    fn rename_across(&self, _fs: &Fs, _c: Caller, _dir: &VKey) -> Option<Error> {
        None
    }

    /// A `rename` of one of its names that appears in a directory of the
    /// tree, `key` (`None`: the tree's rules answer).
    fn renamed(&self, _fs: &Fs, _c: Caller, _key: &VKey) -> Option<Result<()>> {
        None
    }
}

/// Does open(2) with `flags` write?
pub(in crate::core) fn writes(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

/// Every feature, asked in this order.
static FEATURES: &[&dyn Feature] = &[
    &usage::Usage,
    &batch::Batch,
    &audit::Audit,
    &daemon::DaemonFiles,
    &generated::Generated,
    &search::SearchFiles,
    &version::Version,
    &commit_error::CommitError,
    &outbox::Outbox,
    &versions::Versions,
    &crate::core::inbox::InboxFiles,
    &crate::core::asof::AsOfFiles,
    &crate::core::scratch::ScratchFiles,
];

/// `accounts/{a}/.ctxfs/FILE` of feature `id`: its key when `name` is
/// `file` in an account's `.ctxfs/` (the caller may read the account).
fn account_file(
    fs: &Fs,
    c: Caller,
    parent: &Key,
    name: &str,
    id: &'static str,
    file: &str,
) -> Option<Result<Key>> {
    match parent {
        Key::AccountCtxfs(account) if name == file => Some(
            fs.gate(c, account, false)
                .map(|_| Key::Virtual(VKey::new(id, account, file))),
        ),
        _ => None,
    }
}

/// `NODE/NAME` for a feature that puts `name` in every node directory:
/// the node and the caller's access, when `parent` is one and `name` is
/// `file` (`Some(Err)` when the caller may not enter it; `None`: not this
/// name, or not a node).
fn node_file<'a>(
    fs: &Fs,
    c: Caller,
    parent: &'a Key,
    name: &str,
    file: &str,
) -> Option<Result<(&'a std::sync::Arc<str>, crate::config::Access)>> {
    let Key::Dir(node) = parent else {
        return None;
    };
    if name != file {
        return None;
    }
    let access = match fs.gate(c, node, false) {
        Ok(a) => a,
        Err(e) => return Some(Err(e)),
    };
    match crate::schema::place::classify_dir(&crate::schema::place::split(node)) {
        Ok(crate::schema::place::DirPlace::Node) => Some(Ok((node, access))),
        Ok(_) => None,
        Err(e) => Some(Err(e)),
    }
}

/// The entry of `accounts/{a}/.ctxfs/FILE` of feature `id` in the
/// listing of `parent`, when it is an account's `.ctxfs/`.
fn account_file_entry(parent: &Key, id: &'static str, file: &str) -> Vec<(Key, String, Kind)> {
    match parent {
        Key::AccountCtxfs(account) => vec![(
            Key::Virtual(VKey::new(id, account, file)),
            file.to_string(),
            Kind::File,
        )],
        _ => Vec::new(),
    }
}

/// The feature that owns `key`.
pub(in crate::core) fn owner(key: &VKey) -> Result<&'static dyn Feature> {
    FEATURES
        .iter()
        .copied()
        .find(|f| f.id() == key.feature)
        .ok_or(Error::NotFound)
}

impl Fs {
    /// The key a feature gives `name` in `parent`, if one does, with its
    /// attributes when they were at hand.
    pub(in crate::core) fn feature_lookup(
        &self,
        c: Caller,
        parent: &Key,
        name: &str,
    ) -> Option<Result<(Key, Option<Attr>)>> {
        FEATURES
            .iter()
            .find_map(|f| f.lookup_attr(self, c, parent, name))
    }

    /// `EROFS` when `dir` is a directory of a read-only feature.
    pub(in crate::core) fn refuse_in_read_only(&self, dir: &Key) -> Result<()> {
        match dir {
            Key::Virtual(v) if owner(v)?.read_only() => Err(Error::ReadOnly),
            _ => Ok(()),
        }
    }

    /// What the features add to the listing of `parent`.
    pub(in crate::core) fn feature_entries(
        &self,
        c: Caller,
        parent: &Key,
    ) -> Vec<(Key, String, Kind)> {
        FEATURES
            .iter()
            .flat_map(|f| f.entries(self, c, parent))
            .collect()
    }

    /// An open handle on `bytes`, read-only (a virtual file computed at
    /// open): `EPERM` for writing.
    pub(in crate::core) fn read_only(&self, bytes: Vec<u8>, write: bool) -> Result<Opened> {
        if write {
            return Err(Error::NotPermitted("read-only virtual file"));
        }
        let fh = self.new_handle(super::Handle::Data(std::sync::Arc::from(bytes)));
        Ok(Opened {
            fh,
            direct_io: true,
            keep_cache: false,
            no_flush: true,
        })
    }
}
