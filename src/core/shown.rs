//! What every attribute shows whoever asks (the kernel may cache an
//! attribute for all callers, so none depends on the caller): the
//! daemon's owner, and its start as the time of a file with none of its
//! own.

use super::{Attr, Kind};
use std::time::SystemTime;

pub(super) struct Shown {
    owner: (u32, u32),
    pub(super) started: SystemTime,
}

impl Shown {
    pub(super) fn new() -> Shown {
        Shown {
            // SAFETY: geteuid(2) and getegid(2) have no preconditions and cannot fail.
            owner: unsafe { (libc::geteuid(), libc::getegid()) },
            started: SystemTime::now(),
        }
    }

    /// A directory's attributes.
    pub(super) fn dir(&self, ino: u64, perm: u16, mtime: SystemTime, shared: bool) -> Attr {
        Attr {
            ino,
            kind: Kind::Dir,
            size: 0,
            perm,
            uid: self.owner.0,
            gid: self.owner.1,
            mtime,
            ctime: mtime,
            shared,
        }
    }

    /// A file's attributes (`mode` 0: 0644).
    pub(super) fn file(
        &self,
        ino: u64,
        size: u64,
        mode: u16,
        mtime: SystemTime,
        shared: bool,
    ) -> Attr {
        Attr {
            ino,
            kind: Kind::File,
            size,
            perm: if mode == 0 { 0o644 } else { mode & 0o7777 },
            uid: self.owner.0,
            gid: self.owner.1,
            mtime,
            ctime: mtime,
            shared,
        }
    }

    /// Seconds since the daemon started.
    pub(super) fn uptime_s(&self) -> u64 {
        self.started.elapsed().map(|d| d.as_secs()).unwrap_or(0)
    }
}
