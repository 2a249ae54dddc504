//! Memory from conversations: `accounts/{a}/users/{u}/inbox/`.
//!
//! A writer writes a conversation (`NAME.json` / `NAME.jsonl`) and closes
//! it: the file is checked, stored read-only and queued as a job, and the
//! close returns. Extraction threads (`ctxfs-extract`) take the jobs: the
//! LLM proposes candidate memories, the merge policies place them, existing
//! nodes are merged by the LLM into a new version, near-duplicates found by
//! the search index are merged instead of created, and the result is
//! committed as one batch through the ordinary commit, as the writer
//! (or held as a proposal in `NAME.review` for accounts in review mode).
//! `NAME.status` shows the job.
//!
//! Here: names, job records and their rows, the extraction service;
//! `files.rs`: the inbox's files as the kernel sees them; `jobs.rs`: the
//! extraction threads and one job's run.
//!
//! Stored rows (the scratch table, keyed by path, account first):
//! `{inbox}/NAME.json` the conversation, `{inbox}/.jobs/NAME.json` its job,
//! `{inbox}/.hashes/{sha256}` the file that content was first ingested as.

use super::{Caller, Fs};
use crate::config::LlmSection;
use crate::error::{Error, Result};
use crate::extract::{self, llm, Conversation};
use crate::locks::lock;
use crate::schema::place;
use crate::schema::time::rfc3339_ms;
use crate::store::{Op, ScratchRec};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

pub use crate::schema::names::INBOX;
const JOBS: &str = ".jobs";
const HASHES: &str = ".hashes";
const STATUS_EXT: &str = ".status";
const REVIEW_EXT: &str = ".review";

/// A near-duplicate: an existing memory at least this similar (cosine of
/// the embeddings) to a candidate takes the candidate as a merge.
pub const DUPLICATE_SIMILARITY: f32 = 0.65;
/// An event or case this similar to an existing one is the same one.
pub const SAME_EVENT_SIMILARITY: f32 = 0.85;
/// Sources a merged node's `.meta.json` keeps (the newest).
const MAX_SOURCES: usize = 50;
/// How often idle extraction threads look for work queued by other daemons.
const RESCAN: Duration = Duration::from_secs(5);

/// Is `path` (under `accounts/`) a user directory `{a}/users/{u}`?
pub fn is_user(path: &str) -> bool {
    let c = place::split(path);
    c.len() == 3 && c[1] == "users"
}

/// Is `path` a conversation stored in an inbox (`{a}/users/{u}/inbox/NAME.json`)?
pub fn is_conversation_path(path: &str) -> bool {
    let c = place::split(path);
    c.len() == 5 && c[1] == "users" && c[3] == INBOX && extract::is_conversation_name(c[4])
}

/// The parents of every row an inbox keeps (what a delete must empty).
pub fn stored_dirs(inbox: &str) -> [String; 3] {
    [
        inbox.to_string(),
        format!("{inbox}/{JOBS}"),
        format!("{inbox}/{HASHES}"),
    ]
}

fn split_name(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// What a name in an inbox is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Conversation,
    Status,
    Review,
}

fn entry_of(name: &str) -> Option<(Entry, String)> {
    if extract::is_conversation_name(name) {
        return Some((Entry::Conversation, name.to_string()));
    }
    for (ext, e) in [(STATUS_EXT, Entry::Status), (REVIEW_EXT, Entry::Review)] {
        if let Some(stem) = name.strip_suffix(ext) {
            if !stem.is_empty() && !stem.contains('.') {
                return Some((e, stem.to_string()));
            }
        }
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Waiting for an extraction thread (or its next try).
    Queued,
    Running,
    /// The account's daily LLM token budget is spent: waits for the next UTC day.
    Waiting,
    /// Extracted; the changes wait for a writer (`NAME.review`).
    Review,
    Done,
    /// Retries exhausted or a permanent error: nothing was committed.
    Failed,
    /// A writer dropped the proposal.
    Dropped,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    pub prompt: u64,
    pub completion: u64,
    pub total: u64,
}

/// One decision about one candidate memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeRec {
    /// created, merged, appended, skipped (in review: the action proposed).
    pub action: String,
    pub kind: String,
    /// Node path under the account (empty when skipped without a place).
    pub path: String,
    pub uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    pub why: String,
    /// Message indexes of the conversation it came from.
    pub messages: Vec<usize>,
}

/// A conversation's job, as stored; `NAME.status` shows it without the
/// fields marked internal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub file: String,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub attempts: u32,
    pub queued_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
    pub messages: usize,
    /// Extraction requests the conversation took: more than one when it
    /// does not fit the model's context at once.
    #[serde(default, skip_serializing_if = "is_one_or_less")]
    pub windows: usize,
    pub tokens: Tokens,
    pub changes: Vec<ChangeRec>,
    /// Candidates the checks dropped, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
    /// When a writer removed the conversation file (the record stays until
    /// `NAME.status` is removed too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_at: Option<String>,
    // internal
    /// `NAME.status` was removed while `NAME.review` still waited: the
    /// record goes with the review's decision.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub status_removed: bool,
    pub uid: u32,
    pub gid: u32,
    pub sha256: String,
    #[serde(default)]
    pub next_try_ms: u64,
    /// In review: the batch lines committed when a writer accepts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proposal: Vec<String>,
}

fn is_one_or_less(n: &usize) -> bool {
    *n <= 1
}

impl Job {
    fn new(file: &str, c: Caller, sha256: String, messages: usize, now: i128, state: State) -> Job {
        Job {
            file: file.to_string(),
            state,
            error: None,
            attempts: 0,
            queued_at: rfc3339_ms(now),
            finished_at: None,
            duplicate_of: None,
            messages,
            windows: 0,
            tokens: Tokens::default(),
            changes: Vec::new(),
            dropped: Vec::new(),
            removed_at: None,
            status_removed: false,
            uid: c.uid,
            gid: c.gid,
            sha256,
            next_try_ms: 0,
            proposal: Vec::new(),
        }
    }

    fn status_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            for k in ["uid", "gid", "next_try_ms", "proposal", "status_removed"] {
                o.remove(k);
            }
        }
        let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

/// `inbox/NAME.json` being written: its bytes, queued at close.
pub(crate) struct InboxHandle {
    path: String,
    caller: Caller,
    buf: Mutex<crate::core::draft::HeldBuf>,
    /// `NAME.review` (a decision) rather than a conversation.
    review: bool,
    /// Why a write was refused (too large, a quota, the daemon's memory):
    /// the close records that reason, not the truncated JSON it holds.
    refused: Mutex<Option<String>>,
}

/// The extraction service of a daemon: its settings, its queue, its threads.
pub struct Inbox {
    client: llm::Client,
    /// The model's context in tokens (`[llm] context_tokens`).
    context_tokens: usize,
    /// `[llm] memories`: how memories are written.
    style: extract::Style,
    concurrency: usize,
    max_attempts: u32,
    backoff_ms: u64,
    review: BTreeSet<String>,
    fs: Mutex<Weak<Fs>>,
    /// Set by `notify`: look for work now.
    wake: (Mutex<bool>, Condvar),
    running: Mutex<HashSet<String>>,
    /// Jobs not finished yet, as (inbox, file): filled by one scan of the
    /// store at the first look for work (and every `RESCAN` on a shared
    /// store, where other daemons queue jobs) and by every queued close.
    pending: Mutex<BTreeSet<(String, String)>>,
    /// When each account was last given a job (a count of picks): the
    /// account served longest ago goes next, so one account's queue never
    /// holds another's back.
    served: Mutex<(u64, std::collections::HashMap<String, u64>)>,
    last_scan: Mutex<Option<std::time::Instant>>,
    /// Conversation files open for writing, not stored before their close.
    writing: Mutex<HashSet<String>>,
    /// Directory summaries by the LLM (`[llm] summaries`), written once a
    /// directory has been quiet this long.
    summaries: bool,
    summary_delay: Duration,
    waiting: Mutex<summaries::Waiting>,
    summary_stats: summaries::SummaryStats,
    stop: AtomicBool,
    /// Threads holding the file system right now (`shutdown` waits for none).
    busy: AtomicUsize,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Inbox {
    pub fn new(s: &LlmSection, review: BTreeSet<String>) -> anyhow::Result<Inbox> {
        let api_key = match &s.api_key_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                anyhow::anyhow!(
                    "[llm] api_key_env names {var}, which is not set in the environment"
                )
            })?),
            None => None,
        };
        if !(s.url.starts_with("http://") || s.url.starts_with("https://")) {
            anyhow::bail!(
                "[llm] url must start with http:// or https://, not {:?}",
                s.url
            );
        }
        let style = extract::Style::parse(s.memories.as_deref()).map_err(anyhow::Error::msg)?;
        Ok(Inbox {
            style,
            client: llm::Client::new(llm::LlmSettings {
                url: s.url.clone(),
                model: s.model.clone(),
                api_key,
                timeout: Duration::from_secs(s.timeout_s.unwrap_or(120).max(1)),
                max_tokens: s.max_tokens.unwrap_or(1024).max(64),
            }),
            context_tokens: s.context_tokens.unwrap_or(8192).max(512) as usize,
            concurrency: s.concurrency.unwrap_or(1).clamp(1, 16),
            max_attempts: s.max_attempts.unwrap_or(4).clamp(1, 100),
            backoff_ms: s.retry_backoff_ms.unwrap_or(2000),
            review,
            fs: Mutex::new(Weak::new()),
            wake: (Mutex::new(false), Condvar::new()),
            running: Mutex::new(HashSet::new()),
            pending: Mutex::new(BTreeSet::new()),
            served: Mutex::new((0, std::collections::HashMap::new())),
            last_scan: Mutex::new(None),
            writing: Mutex::new(HashSet::new()),
            summaries: s.summaries.unwrap_or(true),
            summary_delay: Duration::from_secs(s.summary_delay_s.unwrap_or(10)),
            waiting: Mutex::new(Default::default()),
            summary_stats: Default::default(),
            stop: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
        })
    }

    pub fn notify(&self) {
        *lock(&self.wake.0) = true;
        self.wake.1.notify_all();
    }

    /// Run `f` with the file system, unless the daemon is stopping.
    fn with_fs<R>(&self, f: impl FnOnce(&Arc<Fs>) -> R) -> Option<R> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        let r = if self.stop.load(Ordering::SeqCst) {
            None
        } else {
            let fs = lock(&self.fs).upgrade();
            fs.map(|fs| f(&fs))
        };
        self.busy.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// Stop the threads: none holds the file system when this returns (a
    /// request to the LLM under way is abandoned; its job runs again at the
    /// next start).
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.notify();
        while self.busy.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Threads waiting on the condition variable end now; threads in a
        // request end when it returns (they hold no file system).
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Message indexes as the provenance of a node version.
fn provenance(user: &str, file: &str, conv: &Conversation, messages: &[usize]) -> Value {
    let mut p = json!({
        "inbox": format!("users/{user}/inbox/{file}"),
        "messages": messages,
    });
    if let Some(s) = &conv.session {
        p["session"] = json!(s);
    }
    if let Some(g) = &conv.agent {
        p["agent"] = json!(g);
    }
    p
}

impl Fs {
    pub fn set_inbox(self: &Arc<Self>, inbox: Arc<Inbox>) {
        *lock(&inbox.fs) = Arc::downgrade(self);
        self.services.set_inbox(inbox);
    }

    /// `inbox` of `.ctxfs/status`: whether conversations are taken, and by
    /// which model.
    pub(super) fn inbox_status(&self) -> Value {
        match self.services.inbox() {
            Some(ib) => json!({
                "llm": "configured",
                "model": ib.client.model(),
                "extracting": lock(&ib.running).len(),
                "summaries": ib.summary_status(),
            }),
            None => json!({
                "llm": "not configured: conversations written to users/U/inbox/ are refused (ENOTSUP); add [llm] to the config",
            }),
        }
    }

    /// The outbox events that index the messages of the conversation
    /// stored at `path` at time `stored_ns` (`None`: that forget them), in
    /// the transaction that stores (or removes) it, so search finds what
    /// was said even where no memory holds it (SEMANTICS "Conversations in
    /// search").
    pub(in crate::core) fn message_event_ops(
        &self,
        path: &str,
        conv: &Conversation,
        stored_ns: Option<u64>,
    ) -> Result<Vec<Op>> {
        use crate::schema::event::{message_path, Change};
        let account = place::account_of(path).to_string();
        let changes: Vec<(usize, Change)> = match stored_ns {
            None => (0..conv.messages.len())
                .map(|i| (i, Change::DeleteContext {}))
                .collect(),
            // Under a prefix the account keeps out of the index.
            Some(_) if self.services.is_unindexed(path) => Vec::new(),
            Some(ns) => {
                let r = self.services.redaction().for_account(&account);
                extract::message_changes(conv, r.as_ref(), ns)
            }
        };
        let mut ops = Vec::with_capacity(changes.len() + 1);
        let mut max_seq = 0;
        for (i, change) in changes {
            let seq = self.ids.event()?;
            max_seq = seq;
            let doc = message_path(path, i);
            ops.push(Op::PutEvent {
                seq,
                json: self.event(seq, &doc, change),
                node_path: doc,
                account: account.clone(),
            });
        }
        if max_seq > 0 {
            ops.push(Op::HighWater {
                key: crate::schema::counters::EVENT_ID.into(),
                value: max_seq,
            });
        }
        Ok(ops)
    }

    /// The conversation stored at `path`, parsed (`None`: not there).
    pub(in crate::core) fn stored_conversation(&self, path: &str) -> Result<Option<Conversation>> {
        let name = path.rsplit('/').next().unwrap_or("");
        Ok(self
            .conversation_rec(path)?
            .and_then(|rec| extract::parse(name, &rec.data).ok()))
    }

    // ---- the files ----------------------------------------------------------

    fn job_path(inbox: &str, file: &str) -> String {
        format!("{inbox}/{JOBS}/{file}")
    }

    fn get_job(&self, inbox: &str, file: &str) -> Result<Option<Job>> {
        match self.store.get_scratch(&Self::job_path(inbox, file))? {
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| Error::store_from("corrupt inbox job", e)),
            None => Ok(None),
        }
    }

    fn job_op(inbox: &str, job: &Job) -> Op {
        Op::PutScratch {
            path: Self::job_path(inbox, &job.file),
            data: serde_json::to_vec(job).unwrap_or_default(),
        }
    }

    fn save_job(&self, inbox: &str, job: &Job) -> Result<()> {
        self.store.apply(vec![Self::job_op(inbox, job)], true)
    }

    /// The ops that save a new job of a written file: one name has one
    /// job, so the record of the other extension (`NAME.jsonl` for
    /// `NAME.json`: a refused one, as nothing of it is stored) goes.
    fn stem_job_ops(inbox: &str, job: &Job) -> [Op; 2] {
        let stem = extract::stem(&job.file);
        let other = if job.file.ends_with(".jsonl") {
            format!("{stem}.json")
        } else {
            format!("{stem}.jsonl")
        };
        [
            Self::job_op(inbox, job),
            Op::DelScratch {
                path: Self::job_path(inbox, &other),
            },
        ]
    }

    fn save_stem_job(&self, inbox: &str, job: &Job) -> Result<()> {
        self.store
            .apply(Self::stem_job_ops(inbox, job).into(), true)
    }

    /// The job of stem `stem`, whichever extension its file has.
    fn job_of_stem(&self, inbox: &str, stem: &str) -> Result<Option<Job>> {
        for ext in [".json", ".jsonl"] {
            if let Some(j) = self.get_job(inbox, &format!("{stem}{ext}"))? {
                return Ok(Some(j));
            }
        }
        Ok(None)
    }

    /// The job `NAME.status` shows (none once a writer removed it).
    fn status_job(&self, inbox: &str, stem: &str) -> Result<Option<Job>> {
        Ok(self.job_of_stem(inbox, stem)?.filter(|j| !j.status_removed))
    }

    /// The stored conversation file at `path`.
    /// The counter op that takes a stored conversation's bytes out of its
    /// account's quota (none when nothing is stored at `path`).
    pub(in crate::core) fn conversation_bytes_op(&self, path: &str) -> Result<Option<Op>> {
        Ok(self.conversation_rec(path)?.map(|r| Op::Count {
            key: crate::schema::counters::inbox_bytes_key(place::account_of(path)),
            delta: -(r.data.len() as i64),
        }))
    }

    fn conversation_rec(&self, path: &str) -> Result<Option<ScratchRec>> {
        self.store
            .get_scratch(path)?
            .map(|b| ScratchRec::decode(&b))
            .transpose()
    }
}

/// Fill versions (or errors) of a job's changes from a batch's result lines.
fn record_results(job: &mut Job, result: &[u8]) {
    for line in result.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        let node = v["node"].as_str().unwrap_or("");
        for ch in job
            .changes
            .iter_mut()
            .filter(|c| c.path == node && c.action != "skipped")
        {
            match (v["version"].as_u64(), v["error"].as_str()) {
                (Some(ver), _) => ch.version = Some(ver as u32),
                (_, Some(e)) => {
                    ch.why = format!("refused by the commit: {e}");
                    ch.action = "skipped".into();
                }
                _ => {}
            }
        }
    }
}

mod extraction;
mod files;
pub(in crate::core) use files::InboxFiles;
mod jobs;
pub mod summaries;
