//! Counters and latency histograms of the daemon, rendered in the Prometheus
//! text format (`MOUNT/.ctxfs/metrics`, and `--metrics-addr` over HTTP).
//! Lock-free on the request path: fixed arrays of atomics per operation.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::Stats;
use std::time::{Duration, Instant};

/// Log lines the daemon could not write (a full disk) and dropped; the
/// daemon's log writer counts them here.
pub static LOG_LINES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// The filesystem operations measured, as the FUSE adapter names them.
pub const OPS: &[&str] = &[
    "lookup",
    "getattr",
    "setattr",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "link",
    "rename",
    "open",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "readdir",
    "fsyncdir",
    "statfs",
    "access",
    "create",
    "ioctl",
    "setlk",
    // On the views (`--views`), which mostly the kernel answers.
    "view_lookup",
    "view_getattr",
    "view_read",
    "view_readdir",
    "view_access",
];

/// Upper bounds of the latency buckets, in seconds.
pub const BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

/// The errnos the daemon answers with (see `crate::error`).
const ERRNOS: &[i32] = &[
    libc::ENOENT,
    libc::EEXIST,
    libc::ENOTDIR,
    libc::EISDIR,
    libc::ENOTEMPTY,
    libc::EINVAL,
    libc::EACCES,
    libc::EROFS,
    libc::EPERM,
    libc::EXDEV,
    libc::EFBIG,
    libc::ENAMETOOLONG,
    libc::ENOTSUP,
    libc::EBADF,
    libc::EIO,
    libc::EBUSY,
    libc::EDQUOT,
    libc::ETIMEDOUT,
    libc::EAGAIN,
    libc::ENOSYS,
    libc::ENOSPC,
    libc::EINTR,
    libc::ENOLCK,
];

struct OpStats {
    count: AtomicU64,
    sum_ns: AtomicU64,
    buckets: Vec<AtomicU64>,
    errors: Vec<AtomicU64>,
}

pub struct Metrics {
    /// Commits, deletes, moves, repairs and expiries.
    pub nodes: Stats,
    ops: Vec<OpStats>,
    /// Refusals by tenancy: (account, "denied" | "read_only") → count.
    auth: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Refusals by quota: (account, "bytes" | "writes" | "searches") → count.
    quota: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Inbox jobs by how a try ended: (account, "done" | "review" | "retry" | "failed").
    extractions: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Directory summaries by the LLM: (account, "written" | "failed").
    summaries: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// LLM tokens: (account, "prompt" | "completion").
    llm_tokens: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            nodes: Stats::default(),
            ops: OPS
                .iter()
                .map(|_| OpStats {
                    count: AtomicU64::new(0),
                    sum_ns: AtomicU64::new(0),
                    buckets: BUCKETS.iter().map(|_| AtomicU64::new(0)).collect(),
                    errors: ERRNOS.iter().map(|_| AtomicU64::new(0)).collect(),
                })
                .collect(),
            auth: Mutex::new(BTreeMap::new()),
            quota: Mutex::new(BTreeMap::new()),
            extractions: Mutex::new(BTreeMap::new()),
            summaries: Mutex::new(BTreeMap::new()),
            llm_tokens: Mutex::new(BTreeMap::new()),
        }
    }
}

/// Records the latency of one request when dropped.
pub struct Timer<'a> {
    m: &'a Metrics,
    op: usize,
    t: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.m.observe(self.op, self.t.elapsed());
    }
}

fn op_index(op: &str) -> usize {
    OPS.iter().position(|o| *o == op).unwrap_or(0)
}

impl Metrics {
    pub fn start(&self, op: &'static str) -> Timer<'_> {
        Timer {
            m: self,
            op: op_index(op),
            t: Instant::now(),
        }
    }

    fn observe(&self, op: usize, d: Duration) {
        let s = &self.ops[op];
        s.count.fetch_add(1, Ordering::Relaxed);
        s.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            s.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request of `op` failed with `errno`.
    pub fn error(&self, op: &str, errno: i32) {
        if let Some(i) = ERRNOS.iter().position(|e| *e == errno) {
            self.ops[op_index(op)].errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The tenancy refused `account` to a caller.
    pub fn auth_failure(&self, account: &str, kind: &'static str) {
        bump(&self.auth, account, kind);
    }

    /// A quota refused a request of `account` (`kind`: bytes, writes, searches).
    pub fn quota_denial(&self, account: &str, kind: &'static str) {
        bump(&self.quota, account, kind);
    }

    /// One try of an inbox job of `account` ended (`how`: done, review,
    /// retry, failed) after spending these tokens.
    pub fn extraction(&self, account: &str, how: &'static str, prompt: u64, completion: u64) {
        bump(&self.extractions, account, how);
        let mut t = crate::locks::lock(&self.llm_tokens);
        if t.len() < 10_000 || t.contains_key(&(account.to_string(), "prompt")) {
            *t.entry((account.to_string(), "prompt")).or_default() += prompt;
            *t.entry((account.to_string(), "completion")).or_default() += completion;
        }
    }

    /// One directory summary by the LLM for `account` ended (`how`:
    /// written, failed) after spending these tokens.
    pub fn summary(&self, account: &str, how: &'static str, prompt: u64, completion: u64) {
        bump(&self.summaries, account, how);
        let mut t = crate::locks::lock(&self.llm_tokens);
        if t.len() < 10_000 || t.contains_key(&(account.to_string(), "prompt")) {
            *t.entry((account.to_string(), "prompt")).or_default() += prompt;
            *t.entry((account.to_string(), "completion")).or_default() += completion;
        }
    }

    /// The request metrics in Prometheus text format.
    /// Auth failures only of `accounts` (all when `None`).
    pub fn render(&self, out: &mut String, accounts: Option<&[String]>) {
        out.push_str("# HELP ctxfs_requests_total Filesystem requests by operation.\n");
        out.push_str("# TYPE ctxfs_requests_total counter\n");
        for (i, op) in OPS.iter().enumerate() {
            let n = self.ops[i].count.load(Ordering::Relaxed);
            let _ = writeln!(out, "ctxfs_requests_total{{op=\"{op}\"}} {n}");
        }
        out.push_str(
            "# HELP ctxfs_request_duration_seconds Time from a request's arrival in the daemon to its reply.\n",
        );
        out.push_str("# TYPE ctxfs_request_duration_seconds histogram\n");
        for (i, op) in OPS.iter().enumerate() {
            let s = &self.ops[i];
            let mut cum = 0;
            for (b, le) in BUCKETS.iter().enumerate() {
                cum += s.buckets[b].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "ctxfs_request_duration_seconds_bucket{{op=\"{op}\",le=\"{le}\"}} {cum}"
                );
            }
            let n = s.count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "ctxfs_request_duration_seconds_bucket{{op=\"{op}\",le=\"+Inf\"}} {n}"
            );
            let sum = s.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(
                out,
                "ctxfs_request_duration_seconds_sum{{op=\"{op}\"}} {sum}"
            );
            let _ = writeln!(
                out,
                "ctxfs_request_duration_seconds_count{{op=\"{op}\"}} {n}"
            );
        }
        out.push_str("# HELP ctxfs_errors_total Failed requests by operation and errno.\n");
        out.push_str("# TYPE ctxfs_errors_total counter\n");
        for (i, op) in OPS.iter().enumerate() {
            for (j, &errno) in ERRNOS.iter().enumerate() {
                let name = crate::error::errno_name(errno);
                let n = self.ops[i].errors[j].load(Ordering::Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "ctxfs_errors_total{{op=\"{op}\",errno=\"{name}\"}} {n}"
                    );
                }
            }
        }
        out.push_str(
            "# HELP ctxfs_auth_failures_total Requests refused by tenancy: another account (denied) or a reader writing (read_only).\n",
        );
        out.push_str("# TYPE ctxfs_auth_failures_total counter\n");
        labelled(out, "ctxfs_auth_failures_total", &self.auth, accounts);
        out.push_str(
            "# HELP ctxfs_quota_denials_total Requests refused by an account quota (bytes, writes, searches).\n",
        );
        out.push_str("# TYPE ctxfs_quota_denials_total counter\n");
        labelled(out, "ctxfs_quota_denials_total", &self.quota, accounts);
        out.push_str(
            "# HELP ctxfs_extractions_total Tries of inbox jobs by how they ended (done, review, retry, failed).\n",
        );
        out.push_str("# TYPE ctxfs_extractions_total counter\n");
        labelled(out, "ctxfs_extractions_total", &self.extractions, accounts);
        out.push_str(
            "# HELP ctxfs_summaries_total Directory summaries asked of the LLM, by how they ended (written, failed).\n",
        );
        out.push_str("# TYPE ctxfs_summaries_total counter\n");
        labelled(out, "ctxfs_summaries_total", &self.summaries, accounts);
        out.push_str(
            "# HELP ctxfs_llm_tokens_total Tokens the LLM spent on inbox jobs and directory summaries (prompt, completion).\n",
        );
        out.push_str("# TYPE ctxfs_llm_tokens_total counter\n");
        labelled(out, "ctxfs_llm_tokens_total", &self.llm_tokens, accounts);
    }
}

type ByAccount = Mutex<BTreeMap<(String, &'static str), u64>>;

fn bump(m: &ByAccount, account: &str, kind: &'static str) {
    let mut a = crate::locks::lock(m);
    // Names are validated before the gate in most paths; bound the label
    // set anyway against made-up account names.
    if a.len() < 10_000 || a.contains_key(&(account.to_string(), kind)) {
        *a.entry((account.to_string(), kind)).or_default() += 1;
    }
}

/// One counter line per (account, kind), only of `accounts` (all when `None`).
fn labelled(out: &mut String, name: &str, m: &ByAccount, accounts: Option<&[String]>) {
    let a = crate::locks::lock(m);
    for ((account, kind), n) in a.iter() {
        if accounts.is_some_and(|v| !v.iter().any(|x| x == account)) {
            continue;
        }
        let _ = writeln!(
            out,
            "{name}{{account=\"{}\",kind=\"{kind}\"}} {n}",
            escape(account)
        );
    }
}

/// Log lines a client can cause at will (refused commits, quota denials)
/// per account per minute; the rest are counted and said with the next line
/// logged. Metrics still count every refusal.
pub const LOG_LINES_PER_MINUTE: u32 = 10;

/// The per-account budget of [`LOG_LINES_PER_MINUTE`].
#[derive(Default)]
pub struct LogBudget {
    /// By account: start of the minute, lines logged in it, lines suppressed
    /// since the last one logged.
    by_account: Mutex<HashMap<String, (Instant, u32, u64)>>,
}

impl LogBudget {
    /// May a line of `account` be logged now? `Some(n)`: yes, and `n` lines
    /// were suppressed since the last one logged.
    pub fn take(&self, account: &str) -> Option<u64> {
        let now = Instant::now();
        let mut m = crate::locks::lock(&self.by_account);
        let e = m.entry(account.to_string()).or_insert((now, 0, 0));
        if now.duration_since(e.0) >= Duration::from_secs(60) {
            e.0 = now;
            e.1 = 0;
        }
        if e.1 >= LOG_LINES_PER_MINUTE {
            e.2 += 1;
            return None;
        }
        e.1 += 1;
        Some(std::mem::take(&mut e.2))
    }
}

/// A label value with `\`, `"` and newlines escaped.
pub fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl super::Fs {
    /// `.ctxfs/metrics` for `caller`, or with `None` for the operator's HTTP
    /// endpoint. Every figure is scoped to what the caller may see: the
    /// series of its accounts (BROKEN counts only where it may write), and
    /// daemon-wide figures (requests, errors, commits, the indexer's
    /// counters) only for uid 0 and the endpoint.
    pub fn metrics_text(&self, caller: Option<super::Caller>) -> crate::error::Result<String> {
        let accounts = match caller {
            Some(c) => self.accounts_visible(c)?,
            None => self.all_accounts()?,
        };
        let admin = caller.is_none_or(|c| c.uid == 0);
        let known = caller.is_none_or(|c| self.tenancy.knows(c.uid));
        let shown = |a: &str, st: crate::store::Status| match caller {
            Some(c) => Self::shows(st, self.access_of(c, a)),
            None => true,
        };
        let mut out = String::new();
        if admin {
            self.metrics
                .render(&mut out, caller.is_some().then_some(&accounts[..]));
        }
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let s = &self.metrics.nodes;
        for (name, help, v) in [
            (
                "ctxfs_commits_total",
                "Committed node versions.",
                &s.commits,
            ),
            (
                "ctxfs_commit_failures_total",
                "Refused commits.",
                &s.commit_failures,
            ),
            ("ctxfs_deletes_total", "Deleted nodes.", &s.deletes),
            ("ctxfs_moves_total", "Moved nodes.", &s.moves),
            ("ctxfs_repairs_total", "Repair Job actions.", &s.repairs),
            (
                "ctxfs_expired_total",
                "Expired nodes removed by the TTL sweeper.",
                &s.expired,
            ),
            (
                "ctxfs_log_lines_dropped_total",
                "Log lines that could not be written (a full disk) and were dropped.",
                &LOG_LINES_DROPPED,
            ),
        ] {
            if admin {
                counter(&mut out, name, help, v.load(Ordering::Relaxed));
            }
        }
        out.push_str(
            "# HELP ctxfs_nodes Committed nodes by account and status.\n# TYPE ctxfs_nodes gauge\n",
        );
        let mut depth = 0;
        for a in &accounts {
            for st in crate::store::Status::all() {
                if !shown(a, st) {
                    continue;
                }
                let n = self
                    .store
                    .counter(&crate::schema::counters::nodes_key(a, st))?;
                let _ = writeln!(
                    out,
                    "ctxfs_nodes{{account=\"{}\",status=\"{}\"}} {n}",
                    escape(a),
                    st.as_str()
                );
            }
        }
        out.push_str("# HELP ctxfs_outbox_depth Index events waiting, by account.\n# TYPE ctxfs_outbox_depth gauge\n");
        for a in &accounts {
            let n = self
                .store
                .counter(&crate::schema::counters::outbox_key(a))?;
            depth += n;
            let _ = writeln!(out, "ctxfs_outbox_depth{{account=\"{}\"}} {n}", escape(a));
        }
        out.push_str("# HELP ctxfs_dead_letters Index events that exhausted their retries, by account.\n# TYPE ctxfs_dead_letters gauge\n");
        for a in &accounts {
            let n = self.store.counter(&crate::schema::counters::dlq_key(a))?;
            let _ = writeln!(out, "ctxfs_dead_letters{{account=\"{}\"}} {n}", escape(a));
        }
        let _ = writeln!(
            out,
            "# HELP ctxfs_embedding_jobs_queued Index events (embedding jobs) waiting.\n\
             # TYPE ctxfs_embedding_jobs_queued gauge\nctxfs_embedding_jobs_queued {depth}"
        );
        if let Some(ix) = self.index().filter(|_| known) {
            if admin {
                let st = &ix.stats;
                out.push_str("# HELP ctxfs_embeddings_total Texts embedded (computed), served from the vector store (cached), or failed.\n# TYPE ctxfs_embeddings_total counter\n");
                for (result, v) in [
                    ("computed", &st.embedded),
                    ("cached", &st.embed_cache_hits),
                    ("failed", &st.embed_failures),
                ] {
                    let _ = writeln!(
                        out,
                        "ctxfs_embeddings_total{{result=\"{result}\"}} {}",
                        v.load(Ordering::Relaxed)
                    );
                }
                counter(
                    &mut out,
                    "ctxfs_index_events_total",
                    "Index events applied.",
                    st.events_done.load(Ordering::Relaxed),
                );
                counter(
                    &mut out,
                    "ctxfs_index_dead_lettered_total",
                    "Index events moved to the dead-letter queue.",
                    st.dead_lettered.load(Ordering::Relaxed),
                );
                counter(
                    &mut out,
                    "ctxfs_searches_total",
                    "Search files answered.",
                    st.searches.load(Ordering::Relaxed),
                );
            }
            let status = ix.status(&accounts, false);
            let secs = |v: &serde_json::Value| v.as_u64().map(|ms| ms as f64 / 1000.0);
            let _ = writeln!(
                out,
                "# HELP ctxfs_index_lag_seconds Age of the oldest index event waiting.\n\
                 # TYPE ctxfs_index_lag_seconds gauge\nctxfs_index_lag_seconds {}",
                secs(&status["index_lag_ms"]).unwrap_or(0.0)
            );
            out.push_str("# HELP ctxfs_index_recent_lag_seconds Commit-to-searchable delay of the last 1,000 events.\n# TYPE ctxfs_index_recent_lag_seconds gauge\n");
            for q in ["p50", "p95"] {
                if let Some(v) = secs(&status["recent_lag_ms"][q]) {
                    let quantile = if q == "p50" { "0.5" } else { "0.95" };
                    let _ = writeln!(
                        out,
                        "ctxfs_index_recent_lag_seconds{{quantile=\"{quantile}\"}} {v}"
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP ctxfs_uptime_seconds Seconds since the daemon started.\n\
             # TYPE ctxfs_uptime_seconds gauge\nctxfs_uptime_seconds {}",
            self.shown.uptime_s()
        );
        Ok(out)
    }

    /// Every account the config defines or the store holds.
    pub(super) fn all_accounts(&self) -> crate::error::Result<Vec<String>> {
        let mut all = self.tenancy.configured();
        all.extend(self.store.list_dirs("")?);
        all.sort();
        all.dedup();
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        drop(m.start("lookup"));
        m.observe(op_index("lookup"), Duration::from_millis(30));
        m.observe(op_index("lookup"), Duration::from_secs(10));
        m.error("lookup", libc::ENOENT);
        m.auth_failure("acme", "denied");
        let mut s = String::new();
        m.render(&mut s, None);
        assert!(s.contains("ctxfs_requests_total{op=\"lookup\"} 3"));
        assert!(s.contains("ctxfs_request_duration_seconds_bucket{op=\"lookup\",le=\"0.05\"} 2"));
        assert!(s.contains("ctxfs_request_duration_seconds_bucket{op=\"lookup\",le=\"+Inf\"} 3"));
        assert!(s.contains("ctxfs_errors_total{op=\"lookup\",errno=\"ENOENT\"} 1"));
        assert!(s.contains("ctxfs_auth_failures_total{account=\"acme\",kind=\"denied\"} 1"));
    }
}
