//! Account quotas (seed 001 "Quotas & cost controls"): stored bytes, writes
//! per day, searches per minute, embedding tokens per day.
//!
//! Usage lives in the store's counters, changed in the same transaction as
//! what it counts: `bytes:{account}` (every version's blobs, each once),
//! `writes:{account}:{day}` and `embed_tokens:{account}:{day}` (UTC days
//! since the epoch). Searches are counted in memory over a sliding minute.
//! Usage is readable at `accounts/{a}/.ctxfs/usage`.

use super::{Caller, Fs};
use crate::config::Quota;
use crate::error::{Error, Result};
use crate::schema::place;
use crate::schema::time::now_ns;
use crate::store::Op;
use serde_json::json;
use std::time::{Duration, Instant};

use crate::locks::lock;
use crate::schema::counters::{self, bytes_key, tokens_key, writes_key};
use crate::schema::time::day_of;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};

/// What bounds the accounts: the quotas by account once the daemon has set
/// them (none: unlimited), the recent searches of each account (the
/// searches-per-minute quota), the memory uncommitted files hold, and the
/// log lines refusals may write.
#[derive(Default)]
pub(super) struct Limits {
    quotas: OnceLock<BTreeMap<String, Quota>>,
    searches: Mutex<HashMap<String, VecDeque<Instant>>>,
    /// Bytes of uncommitted files in memory, and their limit.
    pub(super) draft_mem: super::draft::DraftMemory,
    /// Log lines per account for refusals a client causes at will.
    pub(super) log_budget: super::metrics::LogBudget,
}

impl Fs {
    pub fn set_quotas(&self, q: BTreeMap<String, Quota>) {
        let _ = self.limits.quotas.set(q);
    }

    pub(super) fn quota(&self, account: &str) -> Option<&Quota> {
        self.limits.quotas.get().and_then(|m| m.get(account))
    }

    /// Count and log a refusal by quota; returns `err`.
    fn deny(&self, account: &str, kind: &'static str, err: Error) -> Error {
        self.metrics.quota_denial(account, kind);
        if let Some(suppressed) = self.limits.log_budget.take(account) {
            tracing::info!(account, kind, %err, suppressed, "quota denial");
        }
        err
    }

    /// May `account` store `new_bytes` more and make one more write today?
    pub(super) fn check_write_quota(&self, account: &str, new_bytes: u64) -> Result<()> {
        let Some(q) = self.quota(account) else {
            return Ok(());
        };
        if let Some(max) = q.writes_per_day {
            let used = self.store.counter(&writes_key(account, day_of(now_ns())))?;
            if used as u64 >= max {
                return Err(self.deny(
                    account,
                    "writes",
                    Error::Quota(format!(
                        "account {account} has made its {max} writes of today (UTC); \
                         try again tomorrow or raise writes_per_day"
                    )),
                ));
            }
        }
        self.check_bytes(account, new_bytes)
    }

    /// Would `new_bytes` more go over the account's stored-bytes quota?
    /// A file of `account` held in memory grows from `now` to `to` bytes:
    /// refused when the daemon's memory for uncommitted files is full
    /// (ENOSPC), or when the account's stored bytes, its uncommitted bytes
    /// and the growth pass its byte quota (EDQUOT).
    pub(super) fn check_growth(&self, account: &str, now: u64, to: u64) -> Result<()> {
        let growth = to.saturating_sub(now);
        if growth == 0 {
            return Ok(());
        }
        let limit = self.limits.draft_mem.limit();
        let held = self.limits.draft_mem.total();
        if held.saturating_add(growth) > limit {
            return Err(self.deny(
                account,
                "draft_memory",
                Error::NoSpace(format!(
                    "uncommitted files hold {held} of the daemon's {limit} bytes; {growth} more do \
                     not fit (commit or remove drafts; the limit is ctxfs mount --draft-memory-mb)"
                )),
            ));
        }
        // One account may hold half of it: another tenant's writes always
        // have room.
        let share = limit / 2;
        let mine = self.limits.draft_mem.of_account(account);
        if mine.saturating_add(growth) > share {
            return Err(self.deny(
                account,
                "draft_memory",
                Error::NoSpace(format!(
                    "account {account} holds {mine} bytes uncommitted, and one account may hold \
                     {share} (half of the daemon's {limit}); {growth} more do not fit (commit \
                     or remove drafts; the limit is ctxfs mount --draft-memory-mb)"
                )),
            ));
        }
        let Some(max) = self.quota(account).and_then(|q| q.bytes) else {
            return Ok(());
        };
        let used = self.stored_bytes(account)?;
        let drafts = mine;
        if used.saturating_add(drafts).saturating_add(growth) > max {
            return Err(self.deny(
                account,
                "bytes",
                Error::Quota(format!(
                    "account {account} stores {used} and holds {drafts} uncommitted of its {max} \
                     bytes; {growth} more do not fit (commit or remove drafts, delete nodes or \
                     raise the quota)"
                )),
            ));
        }
        Ok(())
    }

    pub(super) fn check_bytes(&self, account: &str, new_bytes: u64) -> Result<()> {
        let Some(max) = self.quota(account).and_then(|q| q.bytes) else {
            return Ok(());
        };
        let used = self.stored_bytes(account)?;
        if used.saturating_add(new_bytes) > max {
            return Err(self.deny(
                account,
                "bytes",
                Error::Quota(format!(
                    "account {account} stores {used} of its {max} bytes; {new_bytes} more do not fit \
                     (delete nodes or raise the quota)"
                )),
            ));
        }
        Ok(())
    }

    /// What counts in `account`'s byte quota: every version of its nodes,
    /// and the conversations stored in its inboxes.
    pub(super) fn stored_bytes(&self, account: &str) -> Result<u64> {
        let nodes = self.store.counter(&bytes_key(account))?.max(0) as u64;
        let inbox = self
            .store
            .counter(&counters::inbox_bytes_key(account))?
            .max(0) as u64;
        Ok(nodes + inbox)
    }

    /// The writes and bytes `ops` count for `account` today.
    pub(super) fn counted(&self, account: &str, ops: &[Op]) -> (i64, i64) {
        let (wk, bk) = (writes_key(account, day_of(now_ns())), bytes_key(account));
        let (mut writes, mut bytes) = (0i64, 0i64);
        for op in ops {
            if let Op::Count { key, delta } = op {
                if *key == wk {
                    writes += delta;
                } else if *key == bk {
                    bytes += delta;
                }
            }
        }
        (writes, bytes)
    }

    /// May `writes` and `bytes` more (several nodes of one batch, not
    /// applied yet) be added to what `account` has used? Each node is
    /// checked alone when it is planned; this adds the nodes planned
    /// before it in the same transaction.
    pub(super) fn check_pending(&self, account: &str, writes: i64, bytes: i64) -> Result<()> {
        let Some(q) = self.quota(account) else {
            return Ok(());
        };
        let wk = writes_key(account, day_of(now_ns()));
        if let Some(max) = q.writes_per_day {
            let used = self.store.counter(&wk)?;
            if used + writes > max as i64 {
                return Err(self.deny(
                    account,
                    "writes",
                    Error::Quota(format!(
                        "account {account} has {} of its {max} writes of today (UTC) left, \
                         fewer than this batch's nodes so far; try again tomorrow or raise \
                         writes_per_day",
                        (max as i64 - used).max(0)
                    )),
                ));
            }
        }
        if bytes > 0 {
            if let Some(max) = q.bytes {
                let used = self.stored_bytes(account)? as i64;
                if used + bytes > max as i64 {
                    return Err(self.deny(
                        account,
                        "bytes",
                        Error::Quota(format!(
                            "account {account} stores {used} of its {max} bytes; this batch's \
                             nodes so far add {bytes} (delete nodes or raise the quota)"
                        )),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The counter ops of one write of `node` that stores `new_bytes`.
    pub(super) fn write_quota_ops(&self, node: &str, new_bytes: u64) -> Result<Vec<Op>> {
        let account = place::account_of(node);
        let mut ops = vec![Op::Count {
            key: writes_key(account, day_of(now_ns())),
            delta: 1,
        }];
        if new_bytes > 0 {
            ops.push(Op::Count {
                key: bytes_key(account),
                delta: new_bytes as i64,
            });
        }
        Ok(ops)
    }

    /// One more search of `account`, unless its rate is used up (EAGAIN).
    pub(super) fn check_search_rate(&self, account: &str) -> Result<()> {
        let Some(max) = self.quota(account).and_then(|q| q.searches_per_minute) else {
            return Ok(());
        };
        if self.store.shared() {
            // Several daemons: one count per account and UTC minute, in the
            // store, so the limit is the account's, not each daemon's.
            let secs = now_ns() as u64 / 1_000_000_000;
            let n = self
                .store
                .alloc(&counters::searches_key(account, secs / 60), 1)?;
            if n > max as u64 {
                let wait = 60 - secs % 60;
                return Err(self.deny(
                    account,
                    "searches",
                    Error::RateLimited(format!(
                        "account {account} has made its {max} searches of this minute; retry in {wait} s"
                    )),
                ));
            }
            return Ok(());
        }
        let now = Instant::now();
        let mut m = lock(&self.limits.searches);
        let q = m.entry(account.to_string()).or_default();
        while q
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
        {
            q.pop_front();
        }
        if q.len() as u64 >= max as u64 {
            let wait = 60 - now.duration_since(q[0]).as_secs().min(59);
            drop(m);
            return Err(self.deny(
                account,
                "searches",
                Error::RateLimited(format!(
                    "account {account} has made its {max} searches of the last minute; retry in {wait} s"
                )),
            ));
        }
        q.push_back(now);
        Ok(())
    }

    fn searches_last_minute(&self, account: &str) -> usize {
        if self.store.shared() {
            let minute = now_ns() as u64 / 60_000_000_000;
            return self
                .store
                .high_water(&counters::searches_key(account, minute))
                .unwrap_or(0) as usize;
        }
        let now = Instant::now();
        lock(&self.limits.searches).get(account).map_or(0, |q| {
            q.iter()
                .filter(|t| now.duration_since(**t) < Duration::from_secs(60))
                .count()
        })
    }

    /// `accounts/{a}/.ctxfs/usage`: what the account uses, against its quota.
    pub(in crate::core) fn usage_json(&self, c: Caller, account: &str) -> Result<Vec<u8>> {
        self.gate(c, account, false)?;
        let q = self.quota(account).cloned().unwrap_or_default();
        let day = day_of(now_ns());
        let pair = |used: i64, limit: Option<u64>| json!({"used": used.max(0), "limit": limit});
        let v = json!({
            "account": account,
            "day": crate::schema::time::rfc3339(day as i128 * 86_400_000_000_000)[..10].to_string(),
            "bytes": pair(self.stored_bytes(account)? as i64, q.bytes),
            "conversation_bytes": self.store.counter(&counters::inbox_bytes_key(account))?.max(0),
            "writes_today": pair(self.store.counter(&writes_key(account, day))?, q.writes_per_day),
            "searches_last_minute": pair(
                self.searches_last_minute(account) as i64,
                q.searches_per_minute.map(u64::from)
            ),
            "embed_tokens_today": pair(
                self.store.counter(&tokens_key(account, day))?,
                q.embed_tokens_per_day
            ),
            "llm_tokens_today": pair(
                self.store.counter(&counters::llm_tokens_key(account, day))?,
                q.llm_tokens_per_day
            ),
        });
        let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
        out.push(b'\n');
        Ok(out)
    }
}
