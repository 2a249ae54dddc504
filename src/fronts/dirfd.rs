//! Writing a node through held descriptors: the node directory opened
//! `O_PATH` once, each file opened relative to it (`openat`), so the kernel
//! looks up only the file's own name, not every component of its path; and
//! a `close` whose result is checked, since a node's commit (or its
//! refusal) is reported there.

use super::{FrontError, FrontResult};
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::Path;

/// A node directory held open (`O_PATH`): each of its files is opened
/// relative to it, costing the kernel a lookup of its own name only (the
/// AGENTS recipe for programs does the same).
pub(super) struct NodeDir {
    pub(super) fd: OwnedFd,
    /// The node, relative to the mount (for messages).
    pub(super) node: String,
}

fn cstr(p: &str) -> std::io::Result<CString> {
    CString::new(p).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// `openat(dir, rel, flags, mode)` as an owned descriptor.
pub(super) fn open_at(
    dir: BorrowedFd,
    rel: &str,
    flags: i32,
    mode: u32,
) -> std::io::Result<OwnedFd> {
    let c = cstr(rel)?;
    // SAFETY: `dir` is a live descriptor, `c` a NUL-terminated path; the
    // returned descriptor is owned by the `OwnedFd` made of it.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `mkdir -p` of `rel` under `dir`: true when `rel` itself was made.
pub(super) fn mkdirs_at(dir: BorrowedFd, rel: &str) -> std::io::Result<bool> {
    let c = cstr(rel)?;
    // SAFETY: as in `open_at`.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EEXIST) => Ok(false),
        Some(libc::ENOENT) => match rel.rsplit_once('/') {
            Some((parent, _)) => {
                mkdirs_at(dir, parent)?;
                mkdirs_at(dir, rel)
            }
            None => Err(e),
        },
        _ => Err(e),
    }
}

impl NodeDir {
    /// Create or truncate `name`, write `data` and close it, checking the
    /// close (where a commit is refused).
    pub(super) fn write(&self, name: &str, data: &[u8]) -> std::io::Result<()> {
        let fd = open_at(
            self.fd.as_fd(),
            name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            0o644,
        )?;
        let mut f = std::fs::File::from(fd);
        f.write_all(data)?;
        close_checked(f)
    }

    /// The text of `name`, `None` when it is not there.
    pub(super) fn read(&self, name: &str) -> std::io::Result<Option<String>> {
        match open_at(self.fd.as_fd(), name, libc::O_RDONLY, 0) {
            Ok(fd) => {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut s)?;
                Ok(Some(s))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn unlink_if_present(&self, name: &str) -> FrontResult<()> {
        let c = cstr(name).map_err(|e| FrontError::io(name, &e, None))?;
        // SAFETY: as in `open_at`.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::NotFound {
            return Ok(());
        }
        Err(FrontError::io(
            &format!("removing {}/{name}", self.node),
            &e,
            None,
        ))
    }
}

/// Close `f`, reporting what `close` says (a refused commit), which
/// `File`'s drop would ignore.
fn close_checked(f: std::fs::File) -> std::io::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just released by the `File` that owned it; it is
    // closed exactly once, here.
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Create or truncate `path`, write `data`, and close it checking the
/// result: a node's commit (and a refused one) is reported at `close`,
/// which `File`'s drop would ignore.
pub(super) fn write_checked(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    f.write_all(data)?;
    close_checked(f)
}
