//! The inbox's jobs: finding runnable ones, the extraction threads, and
//! one job's try (its budget, attempts and state); what a try does with the
//! conversation is `extraction.rs`.

use crate::core::Fs;
use crate::error::Result;
use crate::extract::llm;
use crate::schema::place;
use std::sync::Arc;

use std::collections::BTreeSet;

use crate::core::inbox::Inbox;

use crate::core::inbox::JOBS;

use crate::core::inbox::Job;

use crate::core::inbox::RESCAN;

use crate::core::inbox::State;

use crate::core::inbox::summaries;

use crate::error::Error;
use crate::extract::Conversation;

use crate::extract;

use crate::locks::lock;
use crate::schema::counters::llm_tokens_key;

use crate::schema::names::INBOX;

use crate::schema::time::day_of;

use crate::schema::time::now_ns;
use crate::schema::time::rfc3339_ms;

use crate::store::Op;

use std::sync::atomic::Ordering;
impl Fs {
    // ---- the jobs -----------------------------------------------------------

    /// Every inbox of the store (accounts, then their users).
    fn inboxes(&self) -> Result<Vec<String>> {
        let mut accounts: BTreeSet<String> = self.store.list_dirs("")?.into_iter().collect();
        accounts.extend(self.tenancy.configured());
        let mut out = Vec::new();
        for a in accounts {
            for u in self.store.list_dirs(&format!("{a}/users"))? {
                out.push(format!("{a}/users/{u}/{INBOX}"));
            }
        }
        Ok(out)
    }

    /// Every unfinished job of the store into `ib.pending`: once, and on a
    /// shared store again every `RESCAN` (other daemons queue jobs there).
    fn scan_jobs(&self, ib: &Inbox) -> Result<()> {
        {
            let mut last = lock(&ib.last_scan);
            let due = match *last {
                None => true,
                Some(t) => self.store.shared() && t.elapsed() >= RESCAN,
            };
            if !due {
                return Ok(());
            }
            *last = Some(std::time::Instant::now());
        }
        for inbox in self.inboxes()? {
            for (file, b) in self.store.list_scratch(&format!("{inbox}/{JOBS}"))? {
                if serde_json::from_slice::<Job>(&b).is_ok_and(|j| runnable_state(j.state)) {
                    lock(&ib.pending).insert((inbox.clone(), file));
                }
            }
        }
        Ok(())
    }

    /// The next job to run now: (inbox, file), marked running in memory.
    /// Fair between accounts: of the accounts with a job due, the one
    /// served longest ago; within it, the job queued first.
    fn next_job(&self, ib: &Inbox) -> Result<Option<(String, String)>> {
        self.scan_jobs(ib)?;
        let now_ms = (now_ns() / 1_000_000) as u64;
        let pending: Vec<(String, String)> = lock(&ib.pending).iter().cloned().collect();
        // Each account's oldest due job: (queued_at, inbox, file).
        let mut oldest: std::collections::HashMap<String, (String, String, String)> =
            Default::default();
        for (inbox, file) in pending {
            let job = self.get_job(&inbox, &file)?;
            let Some(j) = job.filter(|j| runnable_state(j.state)) else {
                // Finished, in review or removed: nothing more to run.
                lock(&ib.pending).remove(&(inbox, file));
                continue;
            };
            // Running in the store but not here: a daemon stopped during
            // it; run it again.
            let due = j.state == State::Running || j.next_try_ms <= now_ms;
            if !due || lock(&ib.running).contains(&format!("{inbox}/{file}")) {
                continue;
            }
            let account = place::account_of(&inbox).to_string();
            let cand = (j.queued_at.clone(), inbox, file);
            match oldest.get(&account) {
                Some(o) if o.0 <= cand.0 => {}
                _ => {
                    oldest.insert(account, cand);
                }
            }
        }
        let mut served = lock(&ib.served);
        let pick = oldest.into_iter().min_by(|(a, x), (b, y)| {
            let (sa, sb) = (served.1.get(a).copied(), served.1.get(b).copied());
            sa.cmp(&sb).then_with(|| x.0.cmp(&y.0))
        });
        let Some((account, (_, inbox, file))) = pick else {
            return Ok(None);
        };
        if !lock(&ib.running).insert(format!("{inbox}/{file}")) {
            return Ok(None);
        }
        served.0 += 1;
        let n = served.0;
        served.1.insert(account, n);
        Ok(Some((inbox, file)))
    }

    /// Start the extraction threads.
    pub fn start_inbox(self: &Arc<Self>) -> Result<()> {
        let Some(ib) = self.services.inbox().cloned() else {
            return Ok(());
        };
        if ib.summaries {
            // The indexer tells which directories' summaries went stale.
            if let Some(ix) = self.services.index() {
                let w = Arc::downgrade(&ib);
                ix.on_changed_dirs(Box::new(move |dirs| {
                    if let Some(ib) = w.upgrade() {
                        ib.touch(dirs, true);
                    }
                }));
            }
        }
        for i in 0..ib.concurrency {
            let ib2 = ib.clone();
            let t = std::thread::Builder::new()
                .name(format!("ctxfs-extract-{i}"))
                .spawn(move || extract_loop(ib2))
                .map_err(|e| Error::store_from("cannot start an extraction thread", e))?;
            lock(&ib.threads).push(t);
        }
        Ok(())
    }
}

/// A job in this state has work left for an extraction thread.
fn runnable_state(s: State) -> bool {
    matches!(s, State::Queued | State::Waiting | State::Running)
}

fn extract_loop(ib: Arc<Inbox>) {
    loop {
        if ib.stop.load(Ordering::SeqCst) {
            return;
        }
        // On a shared store one daemon runs the jobs; summaries are
        // written by whichever daemon found them stale.
        let next = ib.with_fs(|fs| {
            if fs.store.shared() && !fs.leads("extractor") {
                return Ok(None);
            }
            fs.next_job(&ib)
        });
        match next {
            None => return,
            Some(Ok(Some((inbox, file)))) => {
                run_job(&ib, &inbox, &file);
                lock(&ib.running).remove(&format!("{inbox}/{file}"));
                continue;
            }
            Some(Ok(None)) => {}
            Some(Err(e)) => tracing::error!(error = %e.report(), "inbox: cannot look for work"),
        }
        // No conversation waits: a directory summary, if one is due.
        if summaries::run_due_summary(&ib) {
            continue;
        }
        let mut woken = lock(&ib.wake.0);
        if !*woken {
            woken = ib
                .wake
                .1
                .wait_timeout(woken, ib.idle_wait())
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        *woken = false;
    }
}

/// What one try of a job ended in.
pub(super) enum Outcome {
    /// Committed, or proposed for review.
    Finished,
    Retry(String),
    Fail(String),
    /// The account's LLM tokens of the day are spent: the job waits for
    /// the next UTC day (and runs again whole then).
    Wait(String),
}

impl Fs {
    /// Why `account` may spend no more LLM tokens today, counting `running`
    /// tokens a job spent that are not counted in the store yet.
    pub(super) fn llm_budget_spent(&self, account: &str, running: u64) -> Option<String> {
        let max = self.quota(account).and_then(|q| q.llm_tokens_per_day)?;
        let used = self
            .store
            .counter(&llm_tokens_key(account, day_of(now_ns())))
            .ok()?
            .max(0) as u64;
        (used + running >= max).then(|| {
            format!(
                "the account's {max} LLM tokens of today are spent (this job spent {running}); \
                 waits for the next UTC day"
            )
        })
    }
}

fn run_job(ib: &Inbox, inbox: &str, file: &str) {
    // Start: budget, attempts, state.
    let start = ib.with_fs(|fs| -> Result<Option<(Job, Conversation)>> {
        let _g = fs.scratch.structure();
        let Some(mut job) = fs.get_job(inbox, file)? else {
            return Ok(None);
        };
        let account = place::account_of(inbox);
        let now = now_ns();
        if let Some(max) = fs.quota(account).and_then(|q| q.llm_tokens_per_day) {
            let used = fs
                .store
                .counter(&llm_tokens_key(account, day_of(now)))?
                .max(0) as u64;
            if used >= max {
                let next_day = (day_of(now) + 1) * 86_400_000;
                job.state = State::Waiting;
                job.error = Some(format!(
                    "the account's {max} LLM tokens of today are spent; waits for the next UTC day"
                ));
                job.next_try_ms = next_day;
                fs.save_job(inbox, &job)?;
                return Ok(None);
            }
        }
        let Some(rec) = fs.conversation_rec(&format!("{inbox}/{file}"))? else {
            job.state = State::Failed;
            job.error = Some("the conversation file is gone".into());
            fs.save_job(inbox, &job)?;
            return Ok(None);
        };
        let data = rec.data;
        let conv = match extract::parse(file, &data) {
            // Relative times resolved against each message's time: the
            // model, the checks and the memories see the date meant.
            Ok(mut c) => {
                extract::when::annotate_conversation(&mut c);
                c
            }
            Err(e) => {
                job.state = State::Failed;
                job.error = Some(e);
                fs.save_job(inbox, &job)?;
                return Ok(None);
            }
        };
        job.state = State::Running;
        job.attempts += 1;
        job.error = None;
        fs.save_job(inbox, &job)?;
        Ok(Some((job, conv)))
    });
    let (mut job, conv) = match start {
        Some(Ok(Some(x))) => x,
        Some(Ok(None)) | None => return,
        Some(Err(e)) => {
            tracing::error!(inbox, file, error = %e.report(), "inbox: cannot start a job");
            return;
        }
    };
    let t0 = std::time::Instant::now();
    let mut spent = llm::Usage::default();
    let outcome = super::extraction::extract_job(ib, inbox, &mut job, &conv, &mut spent);
    let account = place::account_of(inbox).to_string();
    let saved = ib.with_fs(|fs| -> Result<()> {
        let _g = fs.scratch.structure();
        let now = now_ns();
        job.tokens.prompt += spent.prompt;
        job.tokens.completion += spent.completion;
        job.tokens.total = job.tokens.prompt + job.tokens.completion;
        match &outcome {
            Outcome::Finished => {
                job.finished_at = (job.state == State::Done).then(|| rfc3339_ms(now));
            }
            Outcome::Wait(why) => {
                // Waiting for the budget is no failed try.
                job.attempts = job.attempts.saturating_sub(1);
                job.state = State::Waiting;
                job.error = Some(why.clone());
                job.next_try_ms = (day_of(now) + 1) * 86_400_000;
                job.changes.clear();
                job.proposal.clear();
            }
            Outcome::Retry(e) if job.attempts < ib.max_attempts => {
                job.state = State::Queued;
                job.error = Some(format!("try {} of {}: {e}", job.attempts, ib.max_attempts));
                let delay = ib
                    .backoff_ms
                    .saturating_mul(1 << (job.attempts - 1).min(16));
                job.next_try_ms = (now / 1_000_000) as u64 + delay;
            }
            Outcome::Retry(e) | Outcome::Fail(e) => {
                job.state = State::Failed;
                job.error = Some(format!("after {} tries: {e}", job.attempts));
                job.finished_at = Some(rfc3339_ms(now));
                job.changes.clear();
                job.proposal.clear();
            }
        }
        let ops = vec![
            Fs::job_op(inbox, &job),
            Op::Count {
                key: llm_tokens_key(&account, day_of(now)),
                delta: spent.total() as i64,
            },
        ];
        fs.store.apply(ops, true)
    });
    let how = match (&outcome, job.state) {
        (_, State::Done) => "done",
        (_, State::Review) => "review",
        (_, State::Queued) => "retry",
        (_, State::Waiting) => "waiting",
        _ => "failed",
    };
    ib.with_fs(|fs| {
        fs.metrics
            .extraction(&account, how, spent.prompt, spent.completion)
    });
    if let Some(Err(e)) = saved {
        tracing::error!(inbox, file, error = %e.report(), "inbox: cannot save a job");
    }
    tracing::info!(
        inbox, file, state = ?job.state, tokens = spent.total(),
        ms = t0.elapsed().as_millis() as u64, "inbox: extraction"
    );
}
