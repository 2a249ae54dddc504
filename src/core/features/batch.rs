//! `accounts/{a}/.ctxfs/batch`: many nodes committed by one write. Open
//! for writing, a batch handle collects JSON lines and commits them at
//! close (`core::commit::batch`); read, the rules and the caller's last
//! result.

use super::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Fs, Handle, Kind, Opened};
use crate::error::Result;
use crate::schema::names::BATCH_FILE;
use std::sync::Mutex;

/// What reading `accounts/{a}/.ctxfs/batch` says before any batch.
const BATCH_HELP: &str = "Write JSON lines here, one node each, and close: every node is \
committed as by the four-step write (whole or not at all), all in one transaction.\n  \
{\"node\": \"users/alice/memories/work/w1\", \"content\": \"...\", \"abstract\": \"...\", \
\"overview\": \"...\", \"relations\": [], \"meta\": {\"status\": \"ACTIVE\"}}\nabstract, \
overview and relations are optional. Reading this file then gives your last batch's result, \
a line per node (its version, or why it was refused).\n";

pub(super) struct Batch;

impl Feature for Batch {
    fn id(&self) -> &'static str {
        "batch"
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        super::account_file(fs, c, parent, name, "batch", BATCH_FILE)
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        super::account_file_entry(parent, "batch", BATCH_FILE)
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        fs.gate(c, &key.dir, false)?;
        Ok(fs
            .shown
            .file(ino, 0, 0o644, std::time::SystemTime::now(), false))
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        let account = &key.dir;
        if write {
            fs.gate_writes_in(c, account)?;
            let fh = fs.new_handle(Handle::Batch(crate::core::commit::BatchHandle {
                account: account.clone(),
                caller: c,
                buf: Mutex::new(crate::core::draft::HeldBuf::new(
                    fs.limits.draft_mem.charge_for(account),
                )),
            }));
            return Ok(Opened {
                fh,
                direct_io: true,
                keep_cache: false,
                no_flush: false,
            });
        }
        fs.gate(c, account, false)?;
        let text = match fs.handles.batch_results.get(account, c.uid) {
            Some(r) => r.to_vec(),
            None => BATCH_HELP.as_bytes().to_vec(),
        };
        fs.read_only(text, false)
    }

    fn takes_writes(&self, _key: &VKey) -> bool {
        true
    }
}
