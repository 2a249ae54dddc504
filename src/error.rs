//! Error kinds of the core, and their one mapping to errno at the edge.
//!
//! The table in `docs/SEMANTICS.md` ("Errors") is this mapping; the unit test
//! below keeps the two honest.

use std::sync::Arc;
use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    #[error("no such file or directory")]
    NotFound,
    #[error("already exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    /// A name or a directory shape outside the tree of the contract.
    #[error("invalid name or place: {0}")]
    Invalid(String),
    /// A commit that cannot be accepted; the reason is also readable in the node.
    #[error("commit refused: {0}")]
    BadCommit(String),
    /// The caller may not touch this account at all.
    #[error("access denied")]
    AccessDenied,
    /// The caller may read this account but not write it.
    #[error("read-only access")]
    ReadOnly,
    /// The operation is never allowed on this object (virtual files, structure).
    #[error("operation not permitted: {0}")]
    NotPermitted(&'static str),
    /// Moves that would cross an account or need a copy.
    #[error("cross-device move")]
    CrossDevice,
    #[error("file too large")]
    TooBig,
    /// A commit whose node exceeds the node size budget; the reason is readable in the node.
    #[error("commit refused: {0}")]
    NodeTooBig(String),
    #[error("name too long")]
    NameTooLong,
    #[error("unsupported operation")]
    Unsupported,
    #[error("bad file handle")]
    BadHandle,
    /// Storage failed; nothing of the request was applied. `source` is the
    /// underlying error (redb, I/O, a decoder), kept for the log.
    #[error("storage error: {what}")]
    Store {
        what: String,
        #[source]
        source: Option<Source>,
        /// The disk is full (`ENOSPC`, or `EDQUOT` of the disk's quota):
        /// answered as `ENOSPC`, so a writer knows to free space.
        no_space: bool,
    },
    /// `.ctxfs/sync` waited longer than its timeout.
    #[error("timed out")]
    TimedOut,
    /// A service a search needs (the embedder) failed; try again later.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    /// The object is in a state that refuses the operation for now.
    #[error("busy: {0}")]
    Busy(&'static str),
    /// An account quota (stored bytes, writes per day) would be exceeded.
    #[error("quota exceeded: {0}")]
    Quota(String),
    /// An account's rate limit (searches per minute) is exhausted for now.
    #[error("rate limited: {0}")]
    RateLimited(String),
    /// The daemon's memory for uncommitted files is full.
    #[error("no space for uncommitted data: {0}")]
    NoSpace(String),
    /// A commit made on a version of the node that is no longer its
    /// current one (`if_version`); the reason is readable in the node.
    #[error("commit refused: {0}")]
    Stale(String),
    /// Another daemon changed the node while this one committed it, again
    /// and again: try later.
    #[error("the node kept changing on another daemon: {0}")]
    Conflict(String),
    /// The caller got a signal while it waited (`flock`, `.ctxfs/sync`).
    #[error("interrupted")]
    Interrupted,
    /// Too many `flock` waits of one uid (or of the daemon) at once.
    #[error("too many waiting locks: {0}")]
    NoLocks(String),
}

/// The error under a storage failure: shared, so `Error` stays `Clone`.
#[derive(Clone)]
pub struct Source(Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Source {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Two errors are equal when they say the same: errors of other crates
/// have no equality of their own.
impl PartialEq for Source {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Source {}

impl Error {
    /// A storage failure with no underlying error.
    pub fn store(what: impl Into<String>) -> Error {
        Error::Store {
            what: what.into(),
            source: None,
            no_space: false,
        }
    }

    /// A storage failure caused by `source`, with what was being done.
    pub fn store_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        // redb's errors keep the I/O error only in their text, which Rust
        // ends with "(os error N)" whatever the locale.
        let text = source.to_string();
        let no_space = [libc::ENOSPC, libc::EDQUOT]
            .iter()
            .any(|n| text.contains(&format!("(os error {n})")));
        Error::Store {
            what: what.into(),
            source: Some(Source(Arc::new(source))),
            no_space,
        }
    }

    /// The error and its causes on one line, for the log.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut cur = std::error::Error::source(self);
        while let Some(e) = cur {
            out.push_str(": ");
            out.push_str(&e.to_string());
            cur = e.source();
        }
        out
    }

    /// The errno a syscall reports for this kind. No catch-all arm: a new kind
    /// must choose its errno here.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::Invalid(_) => libc::EINVAL,
            Error::BadCommit(_) => libc::EINVAL,
            Error::AccessDenied => libc::EACCES,
            // Readers get EROFS, as on a read-only mount, rather than EACCES:
            // the account is visible to them, it is just not writable.
            Error::ReadOnly => libc::EROFS,
            Error::NotPermitted(_) => libc::EPERM,
            // EXDEV makes `mv` fall back to copy + delete, which goes through
            // the normal commit protocol.
            Error::CrossDevice => libc::EXDEV,
            Error::TooBig => libc::EFBIG,
            Error::NodeTooBig(_) => libc::EFBIG,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Unsupported => libc::ENOTSUP,
            Error::BadHandle => libc::EBADF,
            Error::Store { no_space: true, .. } => libc::ENOSPC,
            Error::Store { .. } => libc::EIO,
            Error::TimedOut => libc::ETIMEDOUT,
            Error::Unavailable(_) => libc::EAGAIN,
            Error::Busy(_) => libc::EBUSY,
            Error::Quota(_) => libc::EDQUOT,
            Error::RateLimited(_) => libc::EAGAIN,
            Error::NoSpace(_) => libc::ENOSPC,
            Error::Conflict(_) => libc::EAGAIN,
            Error::Stale(_) => libc::ESTALE,
            Error::Interrupted => libc::EINTR,
            Error::NoLocks(_) => libc::ENOLCK,
        }
    }

    /// Expected refusals are logged at debug; storage failures at error.
    pub fn is_expected(&self) -> bool {
        !matches!(self, Error::Store { .. } | Error::Unavailable(_))
    }
}

/// The symbolic name of an errno the daemon and its fronts answer with
/// (`EIO` for any other).
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EINVAL => "EINVAL",
        libc::EACCES => "EACCES",
        libc::EROFS => "EROFS",
        libc::EPERM => "EPERM",
        libc::EXDEV => "EXDEV",
        libc::EFBIG => "EFBIG",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTSUP => "ENOTSUP",
        libc::EBADF => "EBADF",
        libc::EBUSY => "EBUSY",
        libc::EDQUOT => "EDQUOT",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EAGAIN => "EAGAIN",
        libc::ESTALE => "ESTALE",
        libc::ENOSYS => "ENOSYS",
        libc::ENOSPC => "ENOSPC",
        libc::EINTR => "EINTR",
        libc::ENOLCK => "ENOLCK",
        _ => "EIO",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_table_matches_docs() {
        let table: &[(Error, i32, &str)] = &[
            (Error::NotFound, libc::ENOENT, "ENOENT"),
            (Error::Exists, libc::EEXIST, "EEXIST"),
            (Error::NotDir, libc::ENOTDIR, "ENOTDIR"),
            (Error::IsDir, libc::EISDIR, "EISDIR"),
            (Error::NotEmpty, libc::ENOTEMPTY, "ENOTEMPTY"),
            (Error::Invalid("x".into()), libc::EINVAL, "EINVAL"),
            (Error::BadCommit("x".into()), libc::EINVAL, "EINVAL"),
            (Error::AccessDenied, libc::EACCES, "EACCES"),
            (Error::ReadOnly, libc::EROFS, "EROFS"),
            (Error::NotPermitted("x"), libc::EPERM, "EPERM"),
            (Error::CrossDevice, libc::EXDEV, "EXDEV"),
            (Error::TooBig, libc::EFBIG, "EFBIG"),
            (Error::NodeTooBig("x".into()), libc::EFBIG, "EFBIG"),
            (Error::NameTooLong, libc::ENAMETOOLONG, "ENAMETOOLONG"),
            (Error::Unsupported, libc::ENOTSUP, "ENOTSUP"),
            (Error::BadHandle, libc::EBADF, "EBADF"),
            (Error::store("x"), libc::EIO, "EIO"),
            (Error::TimedOut, libc::ETIMEDOUT, "ETIMEDOUT"),
            (Error::Unavailable("x".into()), libc::EAGAIN, "EAGAIN"),
            (Error::Busy("x"), libc::EBUSY, "EBUSY"),
            (Error::Quota("x".into()), libc::EDQUOT, "EDQUOT"),
            (Error::RateLimited("x".into()), libc::EAGAIN, "EAGAIN"),
            (Error::NoSpace("x".into()), libc::ENOSPC, "ENOSPC"),
            (Error::Conflict("x".into()), libc::EAGAIN, "EAGAIN"),
            (Error::Stale("x".into()), libc::ESTALE, "ESTALE"),
            (Error::Interrupted, libc::EINTR, "EINTR"),
            (Error::NoLocks("x".into()), libc::ENOLCK, "ENOLCK"),
        ];
        let e = Error::store_from("reading blob 7", std::io::Error::other("disk on fire"));
        assert_eq!(e.to_string(), "storage error: reading blob 7");
        assert_eq!(e.report(), "storage error: reading blob 7: disk on fire");
        assert_eq!(e.clone(), e);
        let full = Error::store_from(
            "write-ahead log",
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert_eq!(full.errno(), libc::ENOSPC, "a full disk says so");
        let doc = include_str!("../docs/SEMANTICS.md");
        for (err, errno, name) in table {
            assert_eq!(err.errno(), *errno, "{err:?}");
            assert!(
                doc.contains(name),
                "docs/SEMANTICS.md does not mention {name}"
            );
        }
    }
}
