//! The background daemon's log file, bounded: once it would pass its size
//! limit it is renamed to `ctxfs.log.1` (dropping the one before) and a new
//! file begun. stderr follows the current file, so a panic message lands
//! there too. In the foreground, logs go to stderr as they are.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// Log writes that failed (a full disk, a removed file) and were dropped:
/// a log line is never worth a request, let alone the daemon (see
/// `.ctxfs/status` `log_lines_dropped` and the metric
/// `ctxfs_log_lines_dropped_total`).
use crate::core::LOG_LINES_DROPPED as DROPPED;

/// Set by `ctxfs mount` for the daemon it starts: the log file to write.
pub const LOG_ENV: &str = "CTXFS_LOG_FILE";
/// The size limit of the log file, in bytes (default [`DEFAULT_LOG_MAX`]).
pub const LOG_MAX_ENV: &str = "CTXFS_LOG_MAX_BYTES";
pub const DEFAULT_LOG_MAX: u64 = 64 << 20;

pub struct RotatingLog {
    path: PathBuf,
    file: File,
    size: u64,
    max: u64,
    /// Point fd 2 at the current file (the daemon; not in tests).
    stderr: bool,
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Point fd 2 at `f`.
fn stderr_to(f: &File) {
    // SAFETY: both descriptors are open (`f` for the duration of the call);
    // dup2 replaces fd 2 atomically and touches no memory of ours.
    unsafe { libc::dup2(f.as_raw_fd(), 2) };
}

impl RotatingLog {
    pub fn open(path: &Path, max: u64, stderr: bool) -> io::Result<RotatingLog> {
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        if stderr {
            stderr_to(&file);
        }
        Ok(RotatingLog {
            path: path.to_path_buf(),
            file,
            size,
            max: max.max(4096),
            stderr,
        })
    }

    /// The file before this one: `ctxfs.log.1`.
    pub fn previous(path: &Path) -> PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(".1");
        PathBuf::from(p)
    }

    fn rotate(&mut self) -> io::Result<()> {
        std::fs::rename(&self.path, Self::previous(&self.path))?;
        self.file = open_append(&self.path)?;
        self.size = 0;
        if self.stderr {
            stderr_to(&self.file);
        }
        Ok(())
    }
}

impl Write for RotatingLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.size > 0 && self.size + buf.len() as u64 > self.max {
            // A failed rotation keeps writing where it was: a log line is
            // never worth failing a request for.
            let _ = self.rotate();
        }
        // A line that cannot be written (ENOSPC on the data dir's disk) is
        // dropped and counted, never an error: the formatter would report
        // an error on stderr, which is this same file, and a failed write
        // to stderr panics.
        match self.file.write_all(buf) {
            Ok(()) => self.size += buf.len() as u64,
            Err(_) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
                // What went in before the failure counts towards the limit.
                if let Ok(md) = self.file.metadata() {
                    self.size = md.len();
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.file.flush();
        Ok(())
    }
}

/// Where this process logs: the bounded file the parent named in
/// [`LOG_ENV`] (a background daemon), else stderr. The flag says whether
/// it is a file (no terminal colours there).
pub fn log_writer() -> (BoxMakeWriter, bool) {
    let Some(path) = std::env::var_os(LOG_ENV) else {
        return (BoxMakeWriter::new(io::stderr), false);
    };
    std::env::remove_var(LOG_ENV);
    let max = std::env::var(LOG_MAX_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_LOG_MAX);
    match RotatingLog::open(Path::new(&path), max, true) {
        Ok(log) => (BoxMakeWriter::new(Mutex::new(log)), true),
        Err(e) => {
            let _ = writeln!(
                io::stderr(),
                "ctxfs: cannot open log {}: {e}; logging to stderr",
                Path::new(&path).display()
            );
            (BoxMakeWriter::new(io::stderr), false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_past_its_limit_and_keeps_one_file_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctxfs.log");
        let mut log = RotatingLog::open(&path, 4096, false).unwrap();
        let line = [b'x'; 100];
        for _ in 0..200 {
            log.write_all(&line).unwrap();
        }
        let now = std::fs::metadata(&path).unwrap().len();
        let before = std::fs::metadata(RotatingLog::previous(&path))
            .unwrap()
            .len();
        assert!(now <= 4096 && before <= 4096, "{now} {before}");
        assert!(now > 0 && before > 3000);
    }

    #[test]
    fn a_line_that_cannot_be_written_is_dropped_and_counted() {
        // /dev/full fails every write with ENOSPC, as a full disk does.
        let mut log = RotatingLog {
            path: PathBuf::from("/dev/full"),
            file: OpenOptions::new().write(true).open("/dev/full").unwrap(),
            size: 0,
            max: 1 << 20,
            stderr: false,
        };
        let before = DROPPED.load(Ordering::Relaxed);
        assert_eq!(log.write(b"a line\n").unwrap(), 7);
        log.flush().unwrap();
        assert!(DROPPED.load(Ordering::Relaxed) > before);
    }
}
