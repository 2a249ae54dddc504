//! Views (`ctxfs mount --views DIR`): one read-only mount of the daemon's
//! tree per uid, at `DIR/UID`, that only that uid can enter.
//!
//! The kernel enforces who enters: the mount is made without
//! `allow_other`, with `user_id`/`group_id` the view's uid and its primary
//! group, so a request from anyone else (root too) fails with `EACCES`
//! before it reaches the daemon. Every answer is then the same for every
//! caller the kernel lets in, and the view caches what `core::view` marks
//! `shared`: entries, attributes, listings and pages, the accounts'
//! directories included. `OPEN` and `OPENDIR` answer `ENOSYS`, so the
//! kernel sends neither (nor `RELEASE`) on this connection again and keeps
//! every file's pages; the `ro` superblock needs no atime.

use super::{caller, fattr, reply_statfs, ttl, Adapter};
use crate::core::Fs;
use fuser::{
    AccessFlags, Config, Errno, FileHandle, Filesystem, Generation, INodeNo, IoctlFlags, LockOwner,
    Notifier, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyOpen, ReplyStatfs, ReplyXattr, Request, SessionACL,
};
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One uid's view, mounted and served.
pub struct View {
    pub uid: u32,
    pub path: PathBuf,
    pub session: fuser::BackgroundSession,
    pub(super) notifier: Notifier,
}

/// A view's requests: the main adapter's helpers (errors, listings, its
/// notifier once the session is up), the view's own answers.
struct ViewFs(Adapter);

/// The primary group of `uid` (from the password database), else the
/// group of the same number.
pub fn primary_gid(uid: u32) -> u32 {
    // SAFETY: getpwuid returns NULL or a pointer to a static record, read
    // at once; the daemon calls it from one thread at mount.
    unsafe {
        let pw = libc::getpwuid(uid);
        if pw.is_null() {
            uid
        } else {
            (*pw).pw_gid
        }
    }
}

/// Mount the view of `uid` at `path` (made if missing; a stale mount
/// there is detached first) and serve it with `threads` workers.
pub fn mount(fs: Arc<Fs>, path: &Path, uid: u32, threads: usize) -> std::io::Result<View> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())?;
    // A view left by a daemon that died (`kill -9`: views have no
    // auto-unmount helper): its mountpoint answers ENOTCONN until detached.
    let _ = detach(&c);
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    // SAFETY: a plain open of a device path; the result is checked.
    let raw = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let gid = primary_gid(uid);
    let opts = CString::new(format!(
        "fd={raw},rootmode=40000,user_id={uid},group_id={gid}"
    ))?;
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            c"ctxfs".as_ptr(),
            c.as_ptr(),
            c"fuse.ctxfs".as_ptr(),
            flags,
            opts.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut config = Config::default();
    config.n_threads = Some(threads);
    config.clone_fd = true;
    // The kernel already admits only `uid`.
    let adapter = Adapter::new(fs);
    let set = adapter.notifier.clone();
    let session = match fuser::Session::from_fd(ViewFs(adapter), fd, SessionACL::All, config) {
        Ok(s) => s,
        Err(e) => {
            let _ = detach(&c);
            return Err(e);
        }
    };
    let notifier = session.notifier();
    let _ = set.set(notifier.clone());
    Ok(View {
        uid,
        path: path.to_path_buf(),
        session: session.spawn()?,
        notifier,
    })
}

/// Detach the mount at `path` lazily (`umount2(MNT_DETACH)`).
fn detach(path: &CStr) -> std::io::Result<()> {
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl View {
    /// Detach the view (lazily: an open file or a working directory in it
    /// does not hold the daemon) and wait for its workers.
    pub fn unmount(self) {
        if let Ok(c) = CString::new(self.path.as_os_str().as_encoded_bytes()) {
            if let Err(e) = detach(&c) {
                tracing::warn!(path = %self.path.display(), error = %e, "view not unmounted");
            }
        }
        if let Err(e) = self.session.join() {
            tracing::warn!(uid = self.uid, error = %e, "view session ended with an error");
        }
    }
}

impl Filesystem for ViewFs {
    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.0.fs.metrics.start("view_lookup");
        let Some(name) = name.to_str() else {
            reply.error(Errno::ENOENT);
            return;
        };
        match self.0.fs.view_lookup(caller(req), parent.0, name) {
            Ok(a) => reply.entry(&ttl(&a), &fattr(&a), Generation(0)),
            Err(e) => reply.error(self.0.err("view_lookup", &e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.0.fs.metrics.start("view_getattr");
        match self.0.fs.view_getattr(caller(req), ino.0) {
            Ok(a) => reply.attr(&ttl(&a), &fattr(&a)),
            Err(e) => reply.error(self.0.err("view_getattr", &e)),
        }
    }

    /// `ENOSYS` sets the connection's `no_open`: no `OPEN` or `RELEASE`
    /// again, reads without a handle, pages kept.
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
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
        let _t = self.0.fs.metrics.start("view_read");
        match self.0.fs.view_read(caller(req), ino.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(self.0.err("view_read", &e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let _t = self.0.fs.metrics.start("view_readdir");
        let batch = self.0.fs.view_readdir(caller(req), ino.0, offset);
        self.0.reply_listing("view_readdir", ino, batch, reply);
    }

    /// `ENOSYS` sets `no_flush`: a close sends nothing again.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// No extended attributes: `ENOSYS` stops the kernel asking again.
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    /// A terminal's question (`isatty`) and any other: not a device.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply_statfs(reply);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if mask.bits() & libc::W_OK != 0 {
            reply.error(Errno::EROFS);
            return;
        }
        match self.0.fs.view_getattr(caller(req), ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(self.0.err("view_access", &e)),
        }
    }
}
