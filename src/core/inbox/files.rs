//! The inbox directory's files as the kernel sees them: its entries and
//! their attributes, a conversation's create, write and the check and
//! queueing at close, `NAME.status`, `NAME.review` and its decision, and
//! unlink.

use crate::core::features::Feature;
use crate::core::inbox::entry_of;
use crate::core::inbox::is_user;
use crate::core::inbox::record_results;
use crate::core::inbox::split_name;
use crate::core::inbox::Entry;
use crate::core::inbox::InboxHandle;
use crate::core::inbox::Job;
use crate::core::inbox::State;
use crate::core::inbox::HASHES;
use crate::core::inbox::INBOX;
use crate::core::inbox::JOBS;
use crate::core::inbox::REVIEW_EXT;
use crate::core::inbox::STATUS_EXT;
use crate::core::inodes::Key;
use crate::core::inodes::VKey;
use crate::core::Attr;
use crate::core::Caller;
use crate::core::Fs;
use crate::core::Handle;
use crate::core::Kind;
use crate::core::Opened;
use crate::error::Error;
use crate::error::Result;
use crate::extract;
use crate::locks::lock;
use crate::schema::counters::llm_tokens_key;
use crate::schema::place;
use crate::schema::time::day_of;
use crate::schema::time::now_ns;
use crate::schema::time::rfc3339_ms;
use crate::store::Op;
use crate::store::ScratchRec;
use serde_json::json;
use serde_json::Value;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::SystemTime;

/// The inbox as a feature: `{a}/users/{u}/inbox/` and its files are its
/// keys (`VKey` tagged `inbox`: the directory as `(user dir, "inbox")`, a
/// file as `(inbox dir, NAME)`); what they do is the `Fs` methods below.
pub(in crate::core) struct InboxFiles;

const ID: &str = "inbox";

/// The key of file `name` of inbox directory `inbox`.
fn file_key(inbox: &str, name: &str) -> Key {
    Key::Virtual(VKey::new(ID, inbox, name))
}

/// Is `key` the inbox directory (else one of its files)?
fn is_dir(key: &VKey) -> bool {
    &*key.name == INBOX && is_user(&key.dir)
}

/// The path of `key` (`{a}/users/{u}/inbox` or `…/inbox/NAME`).
fn path_of(key: &VKey) -> String {
    format!("{}/{}", key.dir, key.name)
}

impl Feature for InboxFiles {
    fn id(&self) -> &'static str {
        ID
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        match parent {
            Key::Dir(path) if name == INBOX && is_user(path) => Some(
                fs.gate(c, path, false)
                    .map(|_| Key::Virtual(VKey::new(ID, path, INBOX))),
            ),
            Key::Virtual(v) if v.feature == ID && is_dir(v) => {
                Some(fs.inbox_child(c, &path_of(v), name))
            }
            _ => None,
        }
    }

    fn entries(&self, _fs: &Fs, _c: Caller, parent: &Key) -> Vec<(Key, String, Kind)> {
        match parent {
            Key::Dir(path) if is_user(path) => vec![(
                Key::Virtual(VKey::new(ID, path, INBOX)),
                INBOX.to_string(),
                Kind::Dir,
            )],
            _ => Vec::new(),
        }
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        if is_dir(key) {
            fs.inbox_dir_attr(c, &path_of(key), ino)
        } else {
            fs.inbox_attr(c, &path_of(key), ino)
        }
    }

    fn list(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<Vec<(Key, String, Kind)>> {
        if !is_dir(key) {
            return Err(Error::NotDir);
        }
        let inbox = path_of(key);
        Ok(fs
            .inbox_list(c, &inbox)?
            .into_iter()
            .map(|(name, kind)| (file_key(&inbox, &name), name, kind))
            .collect())
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        if is_dir(key) {
            return Err(Error::IsDir);
        }
        fs.inbox_open(c, &path_of(key), write)
    }

    /// Conversations are written, and a review takes a decision.
    fn takes_writes(&self, key: &VKey) -> bool {
        !is_dir(key)
    }

    fn unlink_in(&self, fs: &Fs, c: Caller, dir: &VKey, name: &str) -> Result<()> {
        if !is_dir(dir) {
            return Err(Error::NotDir);
        }
        fs.inbox_unlink(c, &path_of(dir), name)
    }

    /// Like an empty scratchpad, an empty inbox is "removed" and shows
    /// again, so `rm -r` of a user directory works.
    fn rmdir(&self, fs: &Fs, c: Caller, key: &VKey) -> Option<Result<()>> {
        if !is_dir(key) {
            return None;
        }
        let removed = || {
            fs.gate(c, &key.dir, true)?;
            if !fs.inbox_list(c, &path_of(key))?.is_empty() {
                return Err(Error::NotEmpty);
            }
            Ok(())
        };
        Some(removed())
    }

    fn create(
        &self,
        fs: &Fs,
        c: Caller,
        dir: &VKey,
        name: &str,
        _mode: u32,
        _flags: i32,
    ) -> Result<(Attr, Opened)> {
        if !is_dir(dir) {
            return Err(Error::NotDir);
        }
        let inbox = path_of(dir);
        let opened = fs.inbox_create(c, &inbox, name)?;
        // Not stored before its close: the entry the kernel gets is the
        // file being written (empty, writable by its writer).
        let ino = fs.ino_lookup(file_key(&inbox, name));
        Ok((
            fs.shown.file(ino, 0, 0o644, SystemTime::now(), false),
            opened,
        ))
    }
}

impl Fs {
    fn inbox_there(&self, c: Caller, inbox: &str, write: bool) -> Result<()> {
        self.gate(c, inbox, write)?;
        Ok(())
    }

    pub(in crate::core) fn inbox_dir_attr(&self, c: Caller, inbox: &str, ino: u64) -> Result<Attr> {
        self.inbox_there(c, inbox, false)?;
        Ok(self.shown.dir(ino, 0o755, self.shown.started, false))
    }

    pub(in crate::core) fn inbox_child(&self, c: Caller, inbox: &str, name: &str) -> Result<Key> {
        self.inbox_there(c, inbox, false)?;
        entry_of(name).ok_or(Error::NotFound)?;
        Ok(file_key(inbox, name))
    }

    pub(in crate::core) fn inbox_attr(&self, c: Caller, path: &str, ino: u64) -> Result<Attr> {
        let (inbox, name) = split_name(path);
        self.inbox_there(c, inbox, false)?;
        let (entry, stem) = entry_of(name).ok_or(Error::NotFound)?;
        let mtime = |ms: i128| crate::schema::time::time_of(ms);
        match entry {
            Entry::Conversation => match self.conversation_rec(path)? {
                Some(r) => {
                    Ok(self
                        .shown
                        .file(ino, r.data.len() as u64, 0o444, mtime(r.mtime_ns), false))
                }
                None if self
                    .services
                    .inbox()
                    .is_some_and(|ib| lock(&ib.writing).contains(path)) =>
                {
                    Ok(self.shown.file(ino, 0, 0o644, SystemTime::now(), false))
                }
                None => Err(Error::NotFound),
            },
            Entry::Status => {
                let j = self.status_job(inbox, &stem)?.ok_or(Error::NotFound)?;
                let redactor = self
                    .services
                    .redaction()
                    .for_account(place::account_of(inbox));
                let n = status_text(&j, redactor.as_ref()).len() as u64;
                Ok(self.shown.file(ino, n, 0o444, SystemTime::now(), false))
            }
            Entry::Review => match self.job_of_stem(inbox, &stem)? {
                Some(j) if j.state == State::Review => {
                    let redactor = self
                        .services
                        .redaction()
                        .for_account(place::account_of(inbox));
                    let n = review_text(&j, redactor.as_ref()).len() as u64;
                    Ok(self.shown.file(ino, n, 0o644, SystemTime::now(), false))
                }
                _ => Err(Error::NotFound),
            },
        }
    }

    pub(in crate::core) fn inbox_list(
        &self,
        c: Caller,
        inbox: &str,
    ) -> Result<Vec<(String, Kind)>> {
        self.inbox_there(c, inbox, false)?;
        let mut out = Vec::new();
        let mut stems = std::collections::HashSet::new();
        for (file, b) in self.store.list_scratch(&format!("{inbox}/{JOBS}"))? {
            let stem = extract::stem(&file).to_string();
            if !stems.insert(stem.clone()) {
                // A job of each extension (stores before one name's jobs
                // replaced each other): one status, the first's.
                continue;
            }
            let job = serde_json::from_slice::<Job>(&b).ok();
            if job.as_ref().is_some_and(|j| j.state == State::Review) {
                out.push((format!("{stem}{REVIEW_EXT}"), Kind::File));
            }
            if !job.is_some_and(|j| j.status_removed) {
                out.push((format!("{stem}{STATUS_EXT}"), Kind::File));
            }
        }
        for (name, _) in self.store.list_scratch(inbox)? {
            if extract::is_conversation_name(&name) {
                out.push((name, Kind::File));
            }
        }
        Ok(out)
    }

    /// Why the inbox cannot take a conversation from `c` now, if it cannot.
    fn inbox_writable(&self, c: Caller, inbox: &str) -> Result<()> {
        self.inbox_there(c, inbox, true)?;
        if self.services.inbox().is_none() {
            return Err(Error::Unsupported);
        }
        let account = place::account_of(inbox);
        if let Some(max) = self.quota(account).and_then(|q| q.llm_tokens_per_day) {
            let used = self
                .store
                .counter(&llm_tokens_key(account, day_of(now_ns())))?
                .max(0) as u64;
            if used >= max {
                return Err(Error::Quota(format!(
                    "account {account} spent its {max} LLM tokens of today; conversations are taken again tomorrow (UTC)"
                )));
            }
        }
        Ok(())
    }

    pub(in crate::core) fn inbox_create(
        &self,
        c: Caller,
        inbox: &str,
        name: &str,
    ) -> Result<Opened> {
        self.inbox_there(c, inbox, true)?;
        conversation_only(name, || {
            Error::Invalid(format!(
                "{}: the inbox takes conversations named NAME.json or NAME.jsonl",
                crate::schema::excerpt(name)
            ))
        })?;
        place::check_name(extract::stem(name))?;
        self.inbox_writable(c, inbox)?;
        let path = format!("{inbox}/{name}");
        let stem = extract::stem(name);
        let taken = |n: String| -> Result<bool> {
            Ok(self.store.get_scratch(&format!("{inbox}/{n}"))?.is_some())
        };
        if taken(format!("{stem}.json"))? || taken(format!("{stem}.jsonl"))? {
            return Err(Error::NotPermitted(
                "a queued conversation is read-only; write a new NAME",
            ));
        }
        if let Some(ib) = self.services.inbox() {
            lock(&ib.writing).insert(path.clone());
        }
        Ok(self.inbox_handle(c, path, false))
    }

    /// The handle is gone: a conversation never closed with bytes is no more.
    pub(in crate::core) fn inbox_released(&self, h: &InboxHandle) {
        if let Some(ib) = self.services.inbox() {
            lock(&ib.writing).remove(&h.path);
        }
    }

    fn inbox_handle(&self, c: Caller, path: String, review: bool) -> Opened {
        let charge = self.limits.draft_mem.charge_for(place::account_of(&path));
        let fh = self.new_handle(Handle::Inbox(InboxHandle {
            path,
            caller: c,
            buf: Mutex::new(crate::core::draft::HeldBuf::new(charge)),
            review,
            refused: Mutex::new(None),
        }));
        Opened {
            fh,
            direct_io: true,
            keep_cache: false,
            no_flush: false,
        }
    }

    pub(in crate::core) fn inbox_open(&self, c: Caller, path: &str, write: bool) -> Result<Opened> {
        let (inbox, name) = split_name(path);
        self.inbox_there(c, inbox, write)?;
        let (entry, stem) = entry_of(name).ok_or(Error::NotFound)?;
        let data = |bytes: Vec<u8>| {
            let fh = self.new_handle(Handle::Data(Arc::from(bytes)));
            Opened {
                fh,
                direct_io: true,
                keep_cache: false,
                no_flush: true,
            }
        };
        match entry {
            Entry::Conversation => {
                let r = self.conversation_rec(path)?.ok_or(Error::NotFound)?;
                if write {
                    return Err(Error::NotPermitted(
                        "a queued conversation is read-only; write a new NAME",
                    ));
                }
                Ok(data(r.data))
            }
            Entry::Status => {
                if write {
                    return Err(Error::NotPermitted("read-only virtual file"));
                }
                let j = self.status_job(inbox, &stem)?.ok_or(Error::NotFound)?;
                let redactor = self
                    .services
                    .redaction()
                    .for_account(place::account_of(inbox));
                Ok(data(status_text(&j, redactor.as_ref())))
            }
            Entry::Review => {
                let j = self.job_of_stem(inbox, &stem)?.ok_or(Error::NotFound)?;
                if j.state != State::Review {
                    return Err(Error::NotFound);
                }
                if write {
                    return Ok(self.inbox_handle(c, path.to_string(), true));
                }
                let redactor = self
                    .services
                    .redaction()
                    .for_account(place::account_of(inbox));
                Ok(data(review_text(&j, redactor.as_ref())))
            }
        }
    }

    pub(in crate::core) fn inbox_write(
        &self,
        h: &InboxHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<u32> {
        if h.review {
            // The decision is applied when a line is complete, so the
            // writer's `write` gets its error (a shell reports no close).
            let line = {
                let mut buf = lock(&h.buf);
                if buf.len() + data.len() > 64 {
                    return Err(Error::Invalid("write accept or drop".into()));
                }
                let at = buf.len();
                buf.write_at(at, data);
                if !buf.as_slice().contains(&b'\n') {
                    return Ok(data.len() as u32);
                }
                buf.take()
            };
            self.inbox_decide(h, &line)?;
            return Ok(data.len() as u32);
        }
        let mut buf = lock(&h.buf);
        let end = offset as usize + data.len();
        if end > extract::MAX_CONVERSATION_BYTES {
            *lock(&h.refused) = Some(format!(
                "larger than the {} bytes a conversation may have",
                extract::MAX_CONVERSATION_BYTES
            ));
            return Err(Error::TooBig);
        }
        // Buffered bytes count as uncommitted ones (draft memory, quota).
        let now = buf.len() as u64;
        if let Err(e) = self.check_growth(place::account_of(&h.path), now, (end as u64).max(now)) {
            *lock(&h.refused) = Some(format!("a write was refused: {e}"));
            return Err(e);
        }
        buf.write_at(offset as usize, data);
        Ok(data.len() as u32)
    }

    /// `close`: queue the conversation (or apply the review decision).
    pub(in crate::core) fn inbox_flush(&self, h: &InboxHandle) -> Result<()> {
        let bytes = lock(&h.buf).take();
        if bytes.is_empty() {
            return Ok(());
        }
        if h.review {
            return self.inbox_decide(h, &bytes);
        }
        let (inbox, name) = split_name(&h.path);
        self.inbox_writable(h.caller, inbox)?;
        let refused = lock(&h.refused).take();
        let parsed = match refused {
            Some(why) => Err(why),
            None => extract::parse(name, &bytes).map_err(|e| e.to_string()),
        };
        let _g = self.scratch.structure();
        if self.store.get_scratch(&h.path)?.is_some() {
            return Err(Error::NotPermitted(
                "a queued conversation is read-only; write a new NAME",
            ));
        }
        let now = now_ns();
        let conv = match parsed {
            Ok(c) => c,
            Err(e) => {
                // Nothing is stored but the reason, in NAME.status; the
                // name stays free for a corrected file.
                let why = format!("{name} is not a conversation: {e}");
                let job = Job::new(name, h.caller, String::new(), 0, now, State::Failed);
                let job = Job {
                    error: Some(why.clone()),
                    finished_at: Some(rfc3339_ms(now)),
                    ..job
                };
                self.save_stem_job(inbox, &job)?;
                return Err(Error::Invalid(why));
            }
        };
        let sha = sha256_hex(&bytes);
        let digest = self.store.digest_name(inbox, &bytes)?;
        // Stored as a commit would store it: secrets redacted (readers
        // read the conversation, and what extraction proposes from it).
        let (bytes, conv) = match redact_conversation(
            name,
            &bytes,
            self.services
                .redaction()
                .for_account(place::account_of(inbox))
                .as_ref(),
        ) {
            Some(red) => match extract::parse(name, &red) {
                Ok(c) => (red, c),
                Err(_) => (bytes, conv),
            },
            None => (bytes, conv),
        };
        // The row is named by the digest the store gives (keyed by the
        // user's key on an encrypted store: no guessed conversation can be
        // confirmed from row names, and none survives the user's keys).
        let hash_path = format!("{inbox}/{HASHES}/{digest}");
        // Only a conversation still stored, and not failed or dropped,
        // makes the same bytes a duplicate (else they are extracted anew).
        let first = match self.store.get_scratch(&hash_path)? {
            Some(f) => {
                let fname = String::from_utf8_lossy(&f).into_owned();
                let live = self
                    .conversation_rec(&format!("{inbox}/{fname}"))?
                    .is_some()
                    && self
                        .get_job(inbox, &fname)?
                        .is_some_and(|j| !matches!(j.state, State::Failed | State::Dropped));
                live.then_some(f)
            }
            None => None,
        };
        let mut job = Job::new(
            name,
            h.caller,
            sha.clone(),
            conv.messages.len(),
            now,
            State::Queued,
        );
        // Stored conversations count in the account's byte quota.
        let account = place::account_of(inbox);
        let size = bytes.len() as u64;
        if let Err(e) = self.check_bytes(account, size) {
            let job = Job {
                error: Some(format!("{name} is not stored: {e}")),
                finished_at: Some(rfc3339_ms(now)),
                ..Job::new(name, h.caller, String::new(), 0, now, State::Failed)
            };
            self.save_stem_job(inbox, &job)?;
            return Err(e);
        }
        let rec = ScratchRec {
            dir: false,
            data: bytes,
            mode: 0o444,
            mtime_ns: now,
        };
        // The conversation's identity in the index (`IxDoc::source`).
        let stored_ns = rec.time_ns();
        let mut ops = vec![
            Op::PutScratch {
                path: h.path.clone(),
                data: rec.encode()?,
            },
            Op::Count {
                key: crate::schema::counters::inbox_bytes_key(account),
                delta: size as i64,
            },
        ];
        match first {
            // The same bytes were ingested before: nothing to extract.
            Some(other) => {
                job.state = State::Done;
                job.finished_at = Some(rfc3339_ms(now));
                job.duplicate_of = Some(String::from_utf8_lossy(&other).into_owned());
            }
            // Its messages become searchable (a duplicate's already are).
            None => {
                ops.push(Op::PutScratch {
                    path: hash_path,
                    data: name.as_bytes().to_vec(),
                });
                ops.extend(self.message_event_ops(&h.path, &conv, Some(stored_ns))?);
            }
        }
        ops.extend(Self::stem_job_ops(inbox, &job));
        self.store.apply(ops, true)?;
        self.notify_index();
        drop(_g);
        if let Some(ib) = self.services.inbox() {
            if job.state == State::Queued {
                lock(&ib.pending).insert((inbox.to_string(), name.to_string()));
            }
            ib.notify();
        }
        Ok(())
    }

    /// `unlink` in an inbox. Each removal takes the file it names and no
    /// other, so `rm -r` of a user goes through in one run whatever order
    /// it removes in:
    /// - `NAME.json` / `NAME.jsonl`: the stored conversation and its
    ///   messages in search; the job's record stays (`removed_at`), and a
    ///   job not extracted yet is dropped;
    /// - `NAME.review`: the proposal is dropped, as `echo drop` does;
    /// - `NAME.status`: the job's record (a queued or waiting job is
    ///   dropped with it; while `NAME.review` waits, the record goes with
    ///   its decision).
    ///
    /// A job being extracted right now holds both (`EBUSY`).
    pub(in crate::core) fn inbox_unlink(&self, c: Caller, inbox: &str, name: &str) -> Result<()> {
        self.inbox_there(c, inbox, true)?;
        let (entry, stem) = entry_of(name).ok_or(Error::NotFound)?;
        if entry == Entry::Review {
            return self.decide(c, inbox, &stem, "drop");
        }
        let busy = || {
            Error::Busy(
                "the conversation is being extracted; remove it when its NAME.status says done",
            )
        };
        let _g = self.scratch.structure();
        let mut ops = Vec::new();
        let file = match entry {
            Entry::Status => {
                let job = self.status_job(inbox, &stem)?.ok_or(Error::NotFound)?;
                match job.state {
                    State::Running => return Err(busy()),
                    State::Review => ops.push(Self::job_op(
                        inbox,
                        &Job {
                            status_removed: true,
                            ..job.clone()
                        },
                    )),
                    _ => ops.push(Op::DelScratch {
                        path: Self::job_path(inbox, &job.file),
                    }),
                }
                job.file
            }
            _ => {
                let path = format!("{inbox}/{name}");
                if self.store.get_scratch(&path)?.is_none() {
                    return Err(Error::NotFound);
                }
                if let Some(mut job) = self.get_job(inbox, name)? {
                    if job.state == State::Running {
                        return Err(busy());
                    }
                    let now = rfc3339_ms(now_ns());
                    if matches!(job.state, State::Queued | State::Waiting) {
                        job.state = State::Dropped;
                        job.error = Some("the conversation was removed before extraction".into());
                        job.finished_at = Some(now.clone());
                    }
                    job.removed_at = Some(now);
                    ops.push(Self::job_op(inbox, &job));
                }
                if let Some(conv) = self.stored_conversation(&path)? {
                    ops.extend(self.message_event_ops(&path, &conv, None)?);
                }
                ops.extend(self.conversation_bytes_op(&path)?);
                ops.extend(self.audit_ops(
                    place::account_of(inbox),
                    c.by(None),
                    json!({"op": "conversation-remove", "conversation": place::in_account(&path)}),
                )?);
                ops.push(Op::DelScratch { path });
                name.to_string()
            }
        };
        self.store.apply(ops, true)?;
        if let Some(ib) = self.services.inbox() {
            lock(&ib.pending).remove(&(inbox.to_string(), file));
        }
        self.notify_index();
        Ok(())
    }

    /// `accept` or `drop` written to `NAME.review`.
    fn inbox_decide(&self, h: &InboxHandle, bytes: &[u8]) -> Result<()> {
        let (inbox, name) = split_name(&h.path);
        self.inbox_there(h.caller, inbox, true)?;
        let stem = name.strip_suffix(REVIEW_EXT).unwrap_or(name);
        let word = String::from_utf8_lossy(bytes).trim().to_string();
        self.decide(h.caller, inbox, stem, &word)
    }

    /// Apply `word` (`accept` or `drop`) to the job of `stem` in review.
    fn decide(&self, caller: Caller, inbox: &str, stem: &str, word: &str) -> Result<()> {
        let name = format!("{stem}{REVIEW_EXT}");
        let _g = self.scratch.structure();
        let mut job = self.job_of_stem(inbox, stem)?.ok_or(Error::NotFound)?;
        if job.state != State::Review {
            return Err(Error::NotFound);
        }
        let now = now_ns();
        match word {
            "accept" => {
                let lines = job.proposal.join("\n");
                let account = place::account_of(inbox);
                let (result, _) = self.commit_batch(caller, account, lines.as_bytes(), "inbox")?;
                record_results(&mut job, &result);
                job.state = State::Done;
            }
            "drop" => {
                // Only what waits is dropped (a job holding back its
                // instructions to the agent committed the rest already).
                let waiting: std::collections::HashSet<String> = job
                    .proposal
                    .iter()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .filter_map(|v| v["node"].as_str().map(String::from))
                    .collect();
                for ch in &mut job.changes {
                    if ch.action != "skipped" && waiting.contains(&ch.path) {
                        ch.why = format!("dropped in review ({})", ch.why);
                        ch.action = "dropped".into();
                    }
                }
                job.state = State::Dropped;
            }
            _ => {
                return Err(Error::Invalid(format!(
                    "write accept or drop to {name}, not {}",
                    crate::schema::excerpt(word)
                )))
            }
        }
        job.proposal.clear();
        job.finished_at = Some(rfc3339_ms(now));
        let removed = job.status_removed;
        self.audit(
            place::account_of(inbox),
            caller.by(Some("inbox")),
            json!({
                "op": "review",
                "conversation": format!("{}/{stem}", place::in_account(inbox)),
                "decision": word,
            }),
        )?;
        if removed {
            // Its status was removed while it waited: the record goes now.
            return self.store.apply(
                vec![Op::DelScratch {
                    path: Self::job_path(inbox, &job.file),
                }],
                true,
            );
        }
        self.save_job(inbox, &job)
    }
}

/// Writers create only conversations: status and review files are the
/// daemon's (`EPERM`); `unknown` is the error for any other name.
fn conversation_only(name: &str, unknown: impl FnOnce() -> Error) -> Result<()> {
    match entry_of(name) {
        Some((Entry::Conversation, _)) => Ok(()),
        Some(_) => Err(Error::NotPermitted(
            "status and review files are the daemon's",
        )),
        None => Err(unknown()),
    }
}

/// `NAME.status`, redacted (it quotes the model's words, which may copy a
/// secret, and a reader reads it).
fn status_text(j: &Job, redactor: Option<&crate::schema::redact::Redactor>) -> Vec<u8> {
    let raw = j.status_json();
    let Some(r) = redactor else {
        return raw;
    };
    let Ok(mut v) = serde_json::from_slice::<Value>(&raw) else {
        return raw;
    };
    if r.redact_json(&mut v) == 0 {
        return raw;
    }
    let mut out = serde_json::to_vec_pretty(&v).unwrap_or(raw);
    out.push(b'\n');
    out
}

/// `NAME.review`: what waits, redacted as its commit will be (a reader
/// reads it).
fn review_text(j: &Job, redactor: Option<&crate::schema::redact::Redactor>) -> Vec<u8> {
    let mut nodes: Vec<Value> = j
        .proposal
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    if let Some(r) = redactor {
        for n in &mut nodes {
            r.redact_json(n);
        }
    }
    let waiting = |path: &str| nodes.iter().any(|n| n["node"] == path);
    let v = json!({
        "file": j.file,
        "proposed": j.changes.iter().filter(|c| c.action != "skipped" && waiting(&c.path)).collect::<Vec<_>>(),
        "skipped": j.changes.iter().filter(|c| c.action == "skipped").collect::<Vec<_>>(),
        "nodes": nodes,
        "decide": "write accept (commit every proposed node) or drop to this file",
    });
    let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// A conversation's bytes with its secrets redacted (values of secret keys
/// and credential shapes in every string, as at commit), or `None` when
/// there is nothing to redact (the bytes are stored as written).
fn redact_conversation(
    name: &str,
    bytes: &[u8],
    redactor: Option<&crate::schema::redact::Redactor>,
) -> Option<Vec<u8>> {
    let r = redactor?;
    let text = std::str::from_utf8(bytes).ok()?;
    if name.ends_with(".jsonl") {
        let mut n = 0;
        let mut out = Vec::new();
        for line in text.lines() {
            match serde_json::from_str::<Value>(line) {
                Ok(mut v) if !line.trim().is_empty() => {
                    n += r.redact_json(&mut v);
                    out.extend(serde_json::to_vec(&v).ok()?);
                }
                _ => out.extend(line.as_bytes()),
            }
            out.push(b'\n');
        }
        (n > 0).then_some(out)
    } else {
        let mut v: Value = serde_json::from_str(text).ok()?;
        let n = r.redact_json(&mut v);
        let mut out = serde_json::to_vec_pretty(&v).ok()?;
        out.push(b'\n');
        (n > 0).then_some(out)
    }
}

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    crate::store::hex_of(&sha2::Sha256::digest(bytes))
}
