//! The one module that knows fuser: each callback converts its arguments,
//! calls the core and replies. Errors are logged once, here.

use crate::core::{Attr, Caller, DirBatch, Fs, Kind, SetAttr, Target};
use crate::error::Error;
use fuser::{
    AccessFlags, BsdFileFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, LockOwner, MountOption, Notifier, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, SessionACL, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

mod view;
pub use view::{primary_gid, View};

/// The kernel's dentry and attribute caches are shared by all uids, while
/// some answers depend on the caller (tenancy, drafts): those get TTL 0.
/// Answers the core marks `shared` (the same for every caller allowed into
/// the account) only change through the daemon, which invalidates them
/// (commits, moves, deletes, a draft taking over a name), so they are
/// cached long: an agent's `grep -r` every few minutes finds the tree's
/// entries and attributes still cached.
const TTL_SHARED: Duration = Duration::from_secs(600);

fn ttl(a: &Attr) -> Duration {
    if a.shared {
        TTL_SHARED
    } else {
        Duration::ZERO
    }
}

pub struct Adapter {
    fs: Arc<Fs>,
    /// Set once the session is up: drops a per-caller listing from the
    /// kernel's cache from inside `readdir` (see there).
    notifier: Arc<OnceLock<Notifier>>,
}

impl Adapter {
    pub fn new(fs: Arc<Fs>) -> Self {
        Adapter {
            fs,
            notifier: Arc::new(OnceLock::new()),
        }
    }

    /// Invalidate the cached pages of directory `ino` now, on this worker.
    /// Safe inside `readdir`: dropping an inode's pages takes no directory
    /// lock (unlike dropping a dentry, which the invalidation thread does).
    fn drop_cached_listing(&self, ino: INodeNo) {
        match self.notifier.get() {
            Some(n) => {
                if let Err(e) = n.inval_inode(ino, 0, 0) {
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        tracing::warn!(ino = ino.0, error = %e, "listing not dropped from the kernel cache");
                    }
                }
            }
            None => tracing::error!(ino = ino.0, "no notifier: listing left in the kernel cache"),
        }
    }
}

/// fuser's mount configuration for ctxfs.
pub fn config(threads: usize) -> Config {
    let mut c = Config::default();
    c.mount_options = vec![
        MountOption::FSName("ctxfs".into()),
        MountOption::Subtype("ctxfs".into()),
        // A killed daemon must not leave a dead mountpoint behind.
        MountOption::AutoUnmount,
        MountOption::NoDev,
        MountOption::NoSuid,
        // atime is not stored; with it, every read and readdir would mark the
        // cached attributes stale and cost a GETATTR round trip.
        MountOption::NoAtime,
    ];
    // Other uids are served; the core decides what each may do.
    c.acl = SessionACL::All;
    c.n_threads = Some(threads);
    // One /dev/fuse fd per worker: without it, all workers wake on one queue.
    c.clone_fd = true;
    c
}

/// Mount `fs` at `mountpoint`, and a view of it for each `(path, uid)` of
/// `views` (`view.rs`); the daemon's cache invalidations go to all of them.
pub fn spawn(
    fs: Arc<Fs>,
    mountpoint: &Path,
    threads: usize,
    views: &[(PathBuf, u32)],
) -> std::io::Result<(fuser::BackgroundSession, Vec<View>)> {
    let adapter = Adapter::new(fs.clone());
    let for_readdir = adapter.notifier.clone();
    let session = fuser::Session::new(adapter, mountpoint, &config(threads))?;
    let notifier = session.notifier();
    // Before any request is served.
    let _ = for_readdir.set(notifier.clone());
    let mut mounted: Vec<View> = Vec::new();
    for (path, uid) in views {
        match view::mount(fs.clone(), path, *uid, VIEW_THREADS) {
            Ok(v) => mounted.push(v),
            Err(e) => {
                for v in mounted {
                    v.unmount();
                }
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("view of uid {uid} at {}: {e}", path.display()),
                ));
            }
        }
    }
    let session = session.spawn()?;
    let to_views: Vec<Notifier> = mounted.iter().map(|v| v.notifier.clone()).collect();
    fs.set_invalidator(move |t| {
        if !matches!(t, Target::ViewEntry { .. } | Target::ViewListing(_)) {
            send(&notifier, t);
        }
        for n in &to_views {
            send(n, t);
        }
    });
    Ok((session, mounted))
}

/// The workers of each view: reads there are mostly served by the kernel.
const VIEW_THREADS: usize = 2;

/// Drop `t` from the kernel cache of the connection `n` notifies.
fn send(n: &Notifier, t: &Target) {
    // fuser already treats ENOENT (nothing cached) as done.
    let r = match t {
        Target::Entry { parent, name } | Target::ViewEntry { parent, name } => {
            n.inval_entry(INodeNo(*parent), OsStr::new(name))
        }
        Target::Inode(ino) | Target::ViewListing(ino) => n.inval_inode(INodeNo(*ino), 0, 0),
    };
    if let Err(e) = r {
        tracing::debug!(target = ?t, error = %e, "invalidation failed");
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

impl Adapter {
    /// Reply to a `READDIR` of `ino` with `batch`. At the end of a listing
    /// the kernel may not keep (it depends on the caller, or may change
    /// uninvalidated), its pages are dropped before the kernel marks its
    /// cache complete, so the next reading asks again.
    fn reply_listing(
        &self,
        op: &'static str,
        ino: INodeNo,
        batch: crate::error::Result<DirBatch>,
        mut reply: ReplyDirectory,
    ) {
        match batch {
            Ok(batch) => {
                if batch.entries.is_empty() && !batch.shared {
                    self.drop_cached_listing(ino);
                }
                for (next, e) in batch.entries {
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
            Err(e) => reply.error(self.err(op, &e)),
        }
    }

    /// The errno of `e`, counted and logged.
    fn err(&self, op: &'static str, e: &Error) -> Errno {
        self.fs.metrics.error(op, e.errno());
        errno(op, e)
    }
}

fn errno(op: &str, e: &Error) -> Errno {
    if e.is_expected() {
        tracing::debug!(op, error = %e, "refused");
    } else {
        tracing::error!(op, error = %e.report(), "failed");
    }
    Errno::from_i32(e.errno())
}

/// Capacity is the data dir's disk; ctxfs reports a large, constant
/// figure rather than a misleading one.
fn reply_statfs(reply: ReplyStatfs) {
    reply.statfs(1 << 32, 1 << 31, 1 << 31, 1 << 32, 1 << 31, 4096, 255, 4096);
}

fn fattr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: match a.kind {
            Kind::Dir => FileType::Directory,
            Kind::File => FileType::RegularFile,
        },
        perm: a.perm,
        nlink: if a.kind == Kind::Dir { 2 } else { 1 },
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn fopen(o: &crate::core::Opened) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if o.direct_io {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if o.keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if o.no_flush {
        f |= FopenFlags::FOPEN_NOFLUSH;
    }
    f
}

/// Names must be UTF-8; anything else is refused with EINVAL.
macro_rules! name_or {
    ($name:expr, $reply:expr) => {
        match $name.to_str() {
            Some(n) => n,
            None => {
                $reply.error(Errno::EINVAL);
                return;
            }
        }
    };
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl Filesystem for Adapter {
    /// Shared `mmap` of files opened with direct I/O (scratchpad files,
    /// drafts): SQLite's WAL mode maps its `-shm` file shared. Processes on
    /// this host map the same kernel pages, so they see each other's
    /// changes; the kernel writes mapped pages back through WRITE requests.
    /// Kernels before 6.6 lack it: such mounts refuse shared mmap as before.
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
            tracing::info!(
                ?missing,
                "the kernel cannot mmap direct-I/O files; shared mmap stays refused"
            );
        }
        // Several daemons on one store: `flock` must exclude across them, so
        // the daemon takes the locks (the kernel keeps them on one daemon).
        if self.fs.takes_flocks() {
            if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_FLOCK_LOCKS) {
                tracing::warn!(
                    ?missing,
                    "the kernel keeps flock locks: they exclude on this host only"
                );
            }
        }
        Ok(())
    }

    /// `flock` on a shared store (FUSE_FLOCK_LOCKS): whole-file locks taken
    /// by the daemon (`Fs::flock`).
    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        typ: i32,
        _pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.fs.metrics.start("setlk");
        let c = caller(req);
        let (ino, owner) = (ino.0, lock_owner.0);
        // First without waiting; a wait then runs on a thread of its own,
        // so a tenant's blocked locks never hold the FUSE workers.
        match self.fs.flock(c, ino, owner, typ, false) {
            Ok(()) => reply.ok(),
            Err(Error::Unavailable(_)) if sleep && typ != libc::F_UNLCK => {
                let slot = match self.fs.flock_wait_slot(c.uid) {
                    Ok(s) => s,
                    Err(e) => return reply.error(self.err("setlk", &e)),
                };
                let fs = self.fs.clone();
                let spawned = std::thread::Builder::new()
                    .name("ctxfs-flock".into())
                    .spawn(move || {
                        let r = fs.flock(c, ino, owner, typ, true);
                        drop(slot);
                        match r {
                            Ok(()) => reply.ok(),
                            Err(e) => {
                                fs.metrics.error("setlk", e.errno());
                                reply.error(errno("setlk", &e))
                            }
                        }
                    });
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot start a lock waiter");
                }
            }
            Err(e) => reply.error(self.err("setlk", &e)),
        }
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.fs.metrics.start("lookup");
        let name = name_or!(name, reply);
        match self.fs.lookup(caller(req), parent.0, name) {
            Ok(a) => reply.entry(&ttl(&a), &fattr(&a), Generation(0)),
            Err(e) => reply.error(self.err("lookup", &e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.fs.metrics.start("getattr");
        match self.fs.getattr(caller(req), ino.0, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&ttl(&a), &fattr(&a)),
            Err(e) => reply.error(self.err("getattr", &e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _t = self.fs.metrics.start("setattr");
        let sa = SetAttr {
            size,
            mode,
            uid,
            gid,
            mtime: mtime.map(time),
        };
        match self.fs.setattr(caller(req), ino.0, fh.map(|f| f.0), sa) {
            Ok(a) => reply.attr(&ttl(&a), &fattr(&a)),
            Err(e) => reply.error(self.err("setattr", &e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.fs.metrics.start("mknod");
        let name = name_or!(name, reply);
        match self.fs.mknod(caller(req), parent.0, name, mode) {
            Ok(a) => reply.entry(&ttl(&a), &fattr(&a), Generation(0)),
            Err(e) => reply.error(self.err("mknod", &e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.fs.metrics.start("mkdir");
        let name = name_or!(name, reply);
        match self.fs.mkdir(caller(req), parent.0, name) {
            Ok(a) => reply.entry(&ttl(&a), &fattr(&a), Generation(0)),
            Err(e) => reply.error(self.err("mkdir", &e)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.fs.metrics.start("unlink");
        let name = name_or!(name, reply);
        match self.fs.unlink(caller(req), parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.err("unlink", &e)),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.fs.metrics.start("rmdir");
        let name = name_or!(name, reply);
        match self.fs.rmdir(caller(req), parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.err("rmdir", &e)),
        }
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        let _t = self.fs.metrics.start("symlink");
        reply.error(self.err(
            "symlink",
            &Error::NotPermitted("symbolic links are not stored"),
        ));
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _t = self.fs.metrics.start("link");
        reply.error(self.err("link", &Error::NotPermitted("hard links are not stored")));
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.fs.metrics.start("rename");
        let name = name_or!(name, reply);
        let newname = name_or!(newname, reply);
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            reply.error(self.err("rename", &Error::Unsupported));
            return;
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        match self
            .fs
            .rename(caller(req), parent.0, name, newparent.0, newname, noreplace)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.err("rename", &e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.fs.metrics.start("open");
        match self.fs.open(caller(req), ino.0, flags.0) {
            Ok(o) => reply.opened(FileHandle(o.fh), fopen(&o)),
            Err(e) => reply.error(self.err("open", &e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = self.fs.metrics.start("read");
        match self.fs.read(fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(self.err("read", &e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.fs.metrics.start("write");
        match self.fs.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(self.err("write", &e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.fs.metrics.start("flush");
        match self.fs.flush(caller(req), fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.err("flush", &e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.fs.metrics.start("release");
        if let Some(owner) = lock_owner {
            self.fs.release_flocks(owner.0);
        }
        self.fs.release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.fs.metrics.start("fsync");
        match self.fs.fsync(fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.err("fsync", &e)),
        }
    }

    /// Directories are opened by the kernel alone: ENOSYS here sets the
    /// connection's `no_opendir`, so `ls`, `find` and `grep -r` cost no
    /// OPENDIR/RELEASEDIR round trips, and every listing may be kept in the
    /// kernel's readdir cache (see `readdir` for listings that must not).
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let _t = self.fs.metrics.start("readdir");
        let batch = self.fs.readdir(caller(req), ino.0, offset);
        self.reply_listing("readdir", ino, batch, reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.fs.metrics.start("fsyncdir");
        match self.fs.fsyncdir() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.err("fsyncdir", &e)),
        }
    }

    /// No ioctl is supported. Python's `open` asks `isatty` (TCGETS) of
    /// every file it opens, and the kernel keeps no "not implemented" flag
    /// for ioctl: answer ENOTTY at once, without the default handler's
    /// warning in the log (four lines per `open`, unbounded log growth).
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        let _t = self.fs.metrics.start("ioctl");
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.fs.metrics.start("statfs");
        reply_statfs(reply);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _t = self.fs.metrics.start("access");
        match self.fs.access(caller(req), ino.0, mask.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.err("access", &e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _t = self.fs.metrics.start("create");
        let name = name_or!(name, reply);
        match self.fs.create(caller(req), parent.0, name, mode, flags) {
            Ok((a, o)) => reply.created(
                &ttl(&a),
                &fattr(&a),
                Generation(0),
                FileHandle(o.fh),
                fopen(&o),
            ),
            Err(e) => reply.error(self.err("create", &e)),
        }
    }
}
