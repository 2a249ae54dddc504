//! The core's plain types: who calls ([`Caller`]), what a file is
//! ([`Attr`], [`Kind`]), what a listing returns ([`DirEntry`],
//! [`DirBatch`] and its offsets), how an open file may be cached
//! ([`Opened`]), attribute changes ([`SetAttr`]) and the counters of
//! [`Stats`].

use crate::core::commit::rules;
use crate::schema::names;
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

/// Largest file a node may hold (a write past it fails with EFBIG).
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Uncommitted bytes the daemon holds in memory at most, unless set
/// (`ctxfs mount --draft-memory-mb`): writes past it fail with ENOSPC.
pub const DEFAULT_DRAFT_MEMORY: u64 = 1 << 30;
/// Node locks: a node takes the stripe of its path's hash.
pub(super) const STRIPES: usize = 256;

/// Who is asking: taken from each FUSE request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The calling thread (0: the daemon's own work, never interrupted).
    pub pid: u32,
}

impl Caller {
    /// Has the caller got a signal it does not block or ignore? A wait on
    /// its behalf then ends with `EINTR`. The kernel waits out a FUSE
    /// request already sent to the daemon even through Ctrl-C (and fuser
    /// answers FUSE_INTERRUPT with ENOSYS), so a long wait looks for the
    /// signal itself, in `/proc/PID/status`.
    pub fn interrupted(&self) -> bool {
        self.pid != 0 && signal_pending(self.pid)
    }

    /// The front a request came through, for `committed_by`: `mcp` or
    /// `memtool` when the calling process is `ctxfs mcp` or `ctxfs memtool`,
    /// else `shell` (any other process on the mount); `daemon` for the
    /// daemon's own work. Attribution, not authority: the uid is what
    /// tenancy checks.
    pub fn front(&self) -> &'static str {
        if self.pid == 0 {
            return "daemon";
        }
        let Ok(cmd) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return "shell";
        };
        let mut args = cmd.split(|b| *b == 0);
        let prog = args.next().unwrap_or_default();
        let prog = prog.rsplit(|b| *b == b'/').next().unwrap_or_default();
        match (prog, args.next()) {
            (b"ctxfs", Some(b"mcp")) => "mcp",
            (b"ctxfs", Some(b"memtool")) => "memtool",
            _ => "shell",
        }
    }

    /// `committed_by` of a version this caller commits through `via`
    /// (its front when `None`).
    pub(crate) fn by(&self, via: Option<&'static str>) -> rules::By {
        rules::By {
            uid: self.uid,
            via: via.unwrap_or_else(|| self.front()),
        }
    }
}

/// A signal pending for thread `pid` (or its process) that it neither
/// blocks nor ignores; SIGKILL (a fatal signal) always counts. A thread
/// that is gone counts too: nobody waits for the answer.
pub fn signal_pending(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = field("SigPnd:") | field("ShdPnd:");
    let kill = 1u64 << (libc::SIGKILL - 1);
    pending & kill != 0 || pending & !field("SigBlk:") & !field("SigIgn:") != 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// The same answer holds for every caller allowed into the account, so
    /// the kernel may cache it (its dentry and attribute caches are shared by
    /// all uids). Answers that depend on the caller (account-level entries,
    /// drafts, PENDING and BROKEN nodes, virtual files) are never cached.
    pub shared: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub name: String,
    pub kind: Kind,
}

/// A directory's entries as one caller saw them at offset 0.
pub(crate) struct Listing {
    /// Sorted by their cookie (see [`cookie`]).
    pub(super) entries: Vec<(u64, DirEntry)>,
    pub(super) shared: bool,
}

/// The readdir offset of the entry after `name`: a function of the name
/// alone, so a continuation resumes after the last name returned whatever
/// snapshot of the directory it meets (another lister's, a rebuilt one):
/// every entry present for the whole listing is returned exactly once.
/// `.` and `..` come first, then node files in protocol order (`.meta.json`
/// after the other four, so copies write it last), then every other name in
/// the order of its 58-bit hash. Two names of one directory sharing a hash
/// (odds about 1 in 10^8 for 100,000 entries) could hide one of them from a
/// listing cut between them.
pub(crate) fn cookie(name: &str) -> u64 {
    match name {
        "." => 1,
        ".." => 2,
        _ => {
            let rank = names::NODE_FILES
                .iter()
                .position(|n| *n == name)
                .unwrap_or(names::NODE_FILES.len()) as u64;
            let h = xxhash_rust::xxh3::xxh3_64(name.as_bytes()) >> 6;
            16 + ((rank << 58) | h)
        }
    }
}

/// One readdir reply's worth of entries, each with the offset of the next.
#[derive(Debug)]
pub struct DirBatch {
    pub entries: Vec<(u64, DirEntry)>,
    /// The listing is the same for every caller: the kernel may keep it.
    /// Otherwise the adapter drops the kernel's copy at the end of a reading.
    pub shared: bool,
}

/// How the kernel may cache an open file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// Bytes change under this handle (drafts, generated files): bypass the page cache.
    pub direct_io: bool,
    /// The bytes of this inode never change (a committed version): keep the
    /// cache.
    pub keep_cache: bool,
    /// Nothing happens at close (read-only handles): the kernel may skip FLUSH.
    pub no_flush: bool,
}

/// Attribute changes of `setattr`.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub size: Option<u64>,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
}

#[derive(Default)]
pub struct Stats {
    pub commits: AtomicU64,
    pub commit_failures: AtomicU64,
    pub deletes: AtomicU64,
    pub moves: AtomicU64,
    pub repairs: AtomicU64,
    /// Nodes removed by the TTL sweeper.
    pub expired: AtomicU64,
}
