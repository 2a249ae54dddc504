//! Write-ahead log in front of redb. A durable batch is acknowledged once its
//! record is appended and `fdatasync`ed (~0.1 ms here, against ~3 ms for a
//! redb `Immediate` commit); redb then applies it without syncing, and a
//! periodic checkpoint (`Immediate` commit, then truncation of the log) bounds
//! the log. Records carry a sequence number that redb stores in the same
//! transaction, so replay after a crash applies exactly the records redb lost.
//!
//! Record: `magic u32 | len u32 | crc32 u32 | postcard(Record)`, little-endian.

use super::Op;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

const MAGIC: u32 = 0x4354_5857; // "CTXW"

#[derive(Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub ops: Vec<Op>,
}

pub struct Wal {
    file: File,
    bytes: u64,
}

fn io(e: std::io::Error) -> Error {
    Error::store_from("write-ahead log", e)
}

impl Wal {
    /// Open the log, returning it and every intact record in it. A torn or
    /// corrupt tail (a crash mid-append) ends the records.
    pub fn open(path: &Path) -> Result<(Wal, Vec<Record>)> {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf).map_err(io)?;
        let mut records = Vec::new();
        let mut at = 0usize;
        while at + 12 <= buf.len() {
            let word = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
            let (magic, len, crc) = (word(at), word(at + 4) as usize, word(at + 8));
            let start = at + 12;
            if magic != MAGIC || start + len > buf.len() {
                break;
            }
            let payload = &buf[start..start + len];
            if crc32fast::hash(payload) != crc {
                break;
            }
            match postcard::from_bytes::<Record>(payload) {
                Ok(r) => records.push(r),
                Err(_) => break,
            }
            at = start + len;
        }
        if at < buf.len() {
            tracing::warn!(
                valid = at,
                total = buf.len(),
                "write-ahead log has a torn tail; cut off"
            );
            file.set_len(at as u64).map_err(io)?;
            file.sync_data().map_err(io)?;
        }
        Ok((
            Wal {
                file,
                bytes: at as u64,
            },
            records,
        ))
    }

    /// Append a record; with `sync`, return only once it is on disk.
    pub fn append(&mut self, rec: &Record, sync: bool) -> Result<()> {
        let payload =
            postcard::to_stdvec(rec).map_err(|e| Error::store_from("encoding a log record", e))?;
        let mut frame = Vec::with_capacity(payload.len() + 12);
        frame.extend_from_slice(&MAGIC.to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        frame.extend_from_slice(&payload);
        self.file.write_all(&frame).map_err(io)?;
        self.bytes += frame.len() as u64;
        if sync {
            self.file.sync_data().map_err(io)?;
        }
        Ok(())
    }

    /// Cut the log back to `len` bytes (a record whose batch failed to apply).
    pub fn rewind(&mut self, len: u64) -> Result<()> {
        self.file.set_len(len).map_err(io)?;
        self.bytes = len;
        Ok(())
    }

    /// Drop every record (after a checkpoint made them redundant).
    pub fn truncate(&mut self) -> Result<()> {
        self.file.set_len(0).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        self.bytes = 0;
        Ok(())
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_tail_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("wal");
        {
            let (mut w, recs) = Wal::open(&p).unwrap();
            assert!(recs.is_empty());
            for seq in 1..=3 {
                let ops = vec![Op::PutDir {
                    path: format!("a{seq}"),
                }];
                w.append(&Record { seq, ops }, true).unwrap();
            }
        }
        // Tear the last record.
        let len = std::fs::metadata(&p).unwrap().len();
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(len - 3).unwrap();
        let (mut w, recs) = Wal::open(&p).unwrap();
        assert_eq!(recs.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
        w.truncate().unwrap();
        assert!(Wal::open(&p).unwrap().1.is_empty());
    }
}
