//! A read-only second mount of the same daemon, for readers that never
//! write (a prototype, measured in BENCHMARKS "A readers' mount"): only
//! directories and committed node files appear; `OPEN` answers `ENOSYS`,
//! so the kernel stops sending `OPEN` and `RELEASE` on this connection and
//! keeps every file's pages, and the `ro` superblock needs no atime. A
//! cached file then costs no round trip. Tenancy is the main mount's: the
//! account's entry is never cached, and every read names its caller.

use super::{caller, fattr, ttl, Adapter};
use crate::core::{Fs, Kind};
use fuser::{
    AccessFlags, Errno, FileHandle, FileType, Filesystem, Generation, INodeNo, LockOwner,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, Request,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

pub struct Readers(Adapter);

/// The readers' session of `fs` at `mountpoint` (read-only), not yet
/// serving, and its notifier.
pub(super) fn session(
    fs: Arc<Fs>,
    mountpoint: &Path,
    threads: usize,
) -> std::io::Result<(fuser::Session<Readers>, fuser::Notifier)> {
    let mut config = super::config(threads);
    config.mount_options.push(MountOption::RO);
    let adapter = Adapter::new(fs);
    let for_readdir = adapter.notifier.clone();
    let session = fuser::Session::new(Readers(adapter), mountpoint, &config)?;
    let notifier = session.notifier();
    let _ = for_readdir.set(notifier.clone());
    Ok((session, notifier))
}

impl Filesystem for Readers {
    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let fs = &self.0.fs;
        let _t = fs.metrics.start("lookup");
        let Some(name) = name.to_str() else {
            reply.error(Errno::EINVAL);
            return;
        };
        match fs.readers_lookup(caller(req), parent.0, name) {
            Ok(a) => reply.entry(&ttl(&a), &fattr(&a), Generation(0)),
            Err(e) => reply.error(self.0.err("lookup", &e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.0.fs.metrics.start("getattr");
        match self.0.fs.readers_attr(caller(req), ino.0) {
            Ok(a) => reply.attr(&ttl(&a), &fattr(&a)),
            Err(e) => reply.error(self.0.err("getattr", &e)),
        }
    }

    /// `ENOSYS` sets the connection's `no_open`: no `OPEN` or `RELEASE`
    /// again, reads without a handle, pages kept.
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = self.0.fs.metrics.start("read");
        match self.0.fs.read_committed(caller(req), ino.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(self.0.err("read", &e)),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let fs = &self.0.fs;
        let _t = fs.metrics.start("readdir");
        match fs.readers_readdir(caller(req), ino.0, offset) {
            Ok(batch) => {
                if batch.entries.is_empty() && !batch.shared {
                    self.0.drop_cached_listing(ino);
                }
                for (next, e) in batch.entries {
                    if !e.readers {
                        continue;
                    }
                    let kind = match e.kind {
                        Kind::Dir => FileType::Directory,
                        Kind::File => FileType::RegularFile,
                    };
                    if reply.add(INodeNo(e.ino), next, kind, &e.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(self.0.err("readdir", &e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 32, 1 << 31, 1 << 31, 1 << 32, 1 << 31, 4096, 255, 4096);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if mask.bits() & libc::W_OK != 0 {
            reply.error(Errno::EROFS);
            return;
        }
        match self.0.fs.access(caller(req), ino.0, mask.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.0.err("access", &e)),
        }
    }
}
