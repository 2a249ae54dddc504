//! Directory summaries written by the LLM (seed 002 `UPSERT_DIRECTORY`):
//! with `[llm]` configured, the `.abstract.md` and `.overview.md` of user,
//! agent and category directories are written by the model from the
//! directory's deterministic listing (its children's abstracts, at most
//! 20), checked sentence by sentence against that listing, and stored as
//! one scratch row `{dir}/.summary` keyed by a digest of the listing.
//!
//! A row is served only while the listing it was written from is the
//! current one, so a reader never sees a summary of other children than
//! the directory holds: between a change and the next summary the
//! deterministic summary is served. The indexer deletes the rows of a
//! changed node's directories in the transaction that indexes the change
//! (what a delete removed leaves the summaries with it) and tells the
//! extraction threads, which write the summary again once the directory
//! has been quiet for `summary_delay_s`, when no conversation waits.

use crate::core::agent::{is_category, Derived};
use crate::core::inbox::Inbox;
use crate::core::inbox::RESCAN;
use crate::core::Fs;
use crate::error::Result;
use crate::extract::llm;
use crate::extract::prompt;
use crate::extract::support::Sources;
use crate::locks::lock;
use crate::schema::counters::llm_tokens_key;
use crate::schema::names::SUMMARY_ROW;
use crate::schema::place;
use crate::schema::time::day_of;
use crate::schema::time::now_ns;
use crate::schema::time::rfc3339_ms;
use crate::store::Op;
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

/// Completion tokens of one summary request.
const SUMMARY_MAX_TOKENS: u32 = 320;
/// Share of a summary sentence's subject terms its listing must hold: a
/// summary only condenses its listing, so more than a memory's third.
const SUMMARY_TERM_SHARE: f32 = 0.5;
/// A directory changed without pause is summarised after this many delays.
const MAX_WAIT_DELAYS: u32 = 6;

/// The stored row of a directory's summary.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SummaryRow {
    /// SHA-256 (hex) of the deterministic overview it was written from.
    inputs: String,
    /// One line; empty when the check dropped the model's.
    #[serde(rename = "abstract")]
    abstract_line: String,
    /// The sentences the check kept; empty when it kept none.
    overview: String,
    model: String,
    written_at: String,
    tokens: u64,
    /// Sentences of the model dropped by the check, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    dropped: Vec<String>,
}

/// The scratch row of `dir`'s summary.
pub fn row_path(dir: &str) -> String {
    format!("{dir}/{SUMMARY_ROW}")
}

fn digest(listing: &str) -> String {
    super::files::sha256_hex(listing.as_bytes())
}

/// Directories waiting for a summary: (first change, last change).
pub(super) type Waiting = HashMap<String, (Instant, Instant)>;

/// Counts shown in `.ctxfs/status`.
#[derive(Default)]
pub(super) struct SummaryStats {
    pub written: AtomicUsize,
    pub failed: AtomicUsize,
    pub sentences_dropped: AtomicUsize,
}

impl Inbox {
    /// `dirs` changed (`changed`) or were read with a stale summary: queue
    /// them. A read does not push a queued directory's time back.
    pub fn touch(&self, dirs: &[String], changed: bool) {
        if !self.summaries {
            return;
        }
        let now = Instant::now();
        let mut w = lock(&self.waiting);
        for d in dirs {
            let e = w.entry(d.clone()).or_insert((now, now));
            if changed {
                e.1 = now;
            }
        }
        drop(w);
        self.notify();
    }

    /// When a directory first changed at `first` and last at `last` is
    /// due: quiet for the delay, or changing for `MAX_WAIT_DELAYS` of them.
    fn due_at(&self, (first, last): (Instant, Instant)) -> Instant {
        (last + self.summary_delay).min(first + self.summary_delay * MAX_WAIT_DELAYS)
    }

    /// The directory to summarise now (the one waiting longest of those
    /// due), taken off the queue.
    fn due_summary(&self) -> Option<String> {
        let now = Instant::now();
        let mut w = lock(&self.waiting);
        let d = w
            .iter()
            .filter(|(_, t)| self.due_at(**t) <= now)
            .min_by_key(|(_, t)| t.0)
            .map(|(d, _)| d.clone())?;
        w.remove(&d);
        Some(d)
    }

    /// How long an idle extraction thread may sleep.
    pub(super) fn idle_wait(&self) -> Duration {
        let now = Instant::now();
        let w = lock(&self.waiting);
        w.values()
            .map(|t| self.due_at(*t).saturating_duration_since(now))
            .min()
            .map_or(RESCAN, |d| d.min(RESCAN))
    }

    pub(super) fn summary_status(&self) -> Value {
        if !self.summaries {
            return json!({"enabled": false});
        }
        json!({
            "enabled": true,
            "waiting": lock(&self.waiting).len(),
            "written": self.summary_stats.written.load(Ordering::Relaxed),
            "failed": self.summary_stats.failed.load(Ordering::Relaxed),
            "sentences_dropped": self.summary_stats.sentences_dropped.load(Ordering::Relaxed),
        })
    }
}

impl Fs {
    fn summary_row(&self, dir: &str) -> Result<Option<SummaryRow>> {
        Ok(self
            .store
            .get_scratch(&row_path(dir))?
            .and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// The text of `dir`'s `.abstract.md` (`overview` false) or
    /// `.overview.md`: the LLM's while it was written from the current
    /// listing `d`, else the deterministic one (and the directory is
    /// queued for a summary).
    pub(in crate::core) fn summary_text(
        &self,
        dir: &str,
        d: &Derived,
        overview: bool,
    ) -> Result<String> {
        if d.nodes > 0 {
            let row = self
                .summary_row(dir)?
                .filter(|r| r.inputs == digest(&d.overview));
            match row {
                Some(r) if overview && !r.overview.is_empty() => {
                    let (head, list) = d.overview.split_once("\n\n").unwrap_or(("", &d.overview));
                    return Ok(format!(
                        "{head}\n\n{}\n\n_Summary written by {} at {} from the list below; \
                         every sentence checked against it._\n\n{list}",
                        r.overview, r.model, r.written_at
                    ));
                }
                Some(r) if !overview && !r.abstract_line.is_empty() => {
                    return Ok(format!("{}\n", r.abstract_line));
                }
                Some(_) => {}
                None => {
                    if let Some(ib) = self.services.inbox() {
                        ib.touch(&[dir.to_string()], false);
                    }
                }
            }
        }
        Ok(if overview {
            d.overview.clone()
        } else {
            format!("{}\n", d.abstract_line)
        })
    }
}

/// What the model answered, checked against the listing: the row to store.
fn checked(answer: &Value, listing: &str, dir: &str) -> SummaryRow {
    let name = dir.rsplit('/').next().unwrap_or(dir);
    let sources = Sources::new([listing, name]);
    let mut dropped = Vec::new();
    let line = answer["abstract"]
        .as_str()
        .unwrap_or("")
        .lines()
        .next()
        .unwrap_or("")
        .trim();
    let abstract_line = match sources.unsupported_at(line, SUMMARY_TERM_SHARE) {
        _ if line.is_empty() => String::new(),
        None => crate::schema::clip(line, crate::core::agent::SUMMARY_ABSTRACT_CHARS),
        Some(why) => {
            dropped.push(format!("abstract {line:?}: {why}"));
            String::new()
        }
    };
    let (kept, no) = sources.split_at(
        answer["overview"].as_str().unwrap_or(""),
        SUMMARY_TERM_SHARE,
    );
    dropped.extend(no.into_iter().map(|(s, why)| format!("{s:?}: {why}")));
    SummaryRow {
        inputs: String::new(),
        abstract_line,
        overview: kept.join(" "),
        model: String::new(),
        written_at: String::new(),
        tokens: 0,
        dropped,
    }
}

/// Summarise the directory due next, if one is; false when none is.
pub(super) fn run_due_summary(ib: &Inbox) -> bool {
    let Some(dir) = ib.due_summary() else {
        return false;
    };
    let account = place::account_of(&dir).to_string();
    // The listing, unless the stored summary is current or the account's
    // LLM tokens of today are spent.
    let plan = ib.with_fs(|fs| -> Result<Option<Derived>> {
        let d = fs.derived_summary(&dir)?;
        if d.nodes == 0
            || fs
                .summary_row(&dir)?
                .is_some_and(|r| r.inputs == digest(&d.overview))
        {
            return Ok(None);
        }
        if let Some(why) = fs.llm_budget_spent(&account, 0) {
            tracing::debug!(dir, why, "summary: not written");
            return Ok(None);
        }
        Ok(Some(d))
    });
    let d = match plan {
        Some(Ok(Some(d))) => d,
        Some(Ok(None)) | None => return true,
        Some(Err(e)) => {
            tracing::warn!(dir, error = %e.report(), "summary: cannot read the directory");
            return true;
        }
    };
    let inputs = digest(&d.overview);
    let t0 = Instant::now();
    let mut spent = llm::Usage::default();
    let answer = ib.client.chat_json_within(
        prompt::summary_messages(&dir, is_category(&dir), &d.overview),
        &prompt::summary_schema(),
        SUMMARY_MAX_TOKENS,
        &mut spent,
    );
    let done = ib.with_fs(|fs| -> Result<&'static str> {
        let now = now_ns();
        let count = Op::Count {
            key: llm_tokens_key(&account, day_of(now)),
            delta: spent.total() as i64,
        };
        let v = match answer {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(dir, error = %e, "summary: the LLM gave none");
                fs.store.apply(vec![count], false)?;
                return Ok("failed");
            }
        };
        let mut row = checked(&v, &d.overview, &dir);
        row.inputs = inputs.clone();
        row.model = ib.client.model().to_string();
        row.written_at = rfc3339_ms(now);
        row.tokens = spent.total();
        ib.summary_stats
            .sentences_dropped
            .fetch_add(row.dropped.len(), Ordering::Relaxed);
        let path = row_path(&dir);
        fs.store.apply(
            vec![
                Op::PutScratch {
                    path: path.clone(),
                    data: serde_json::to_vec(&row).unwrap_or_default(),
                },
                count,
            ],
            true,
        )?;
        // A change committed while the model wrote: its text may be gone
        // from the directory (a delete), so the row goes too; the indexer
        // may have deleted the old row before this one was written.
        if digest(&fs.derived_summary(&dir)?.overview) != inputs {
            fs.store.apply(vec![Op::DelScratch { path }], true)?;
            ib.touch(std::slice::from_ref(&dir), true);
        }
        Ok("written")
    });
    let how = match done {
        Some(Ok(h)) => h,
        Some(Err(e)) => {
            tracing::warn!(dir, error = %e.report(), "summary: cannot store it");
            "failed"
        }
        None => return true,
    };
    let stat = if how == "written" {
        &ib.summary_stats.written
    } else {
        &ib.summary_stats.failed
    };
    stat.fetch_add(1, Ordering::Relaxed);
    ib.with_fs(|fs| {
        fs.metrics
            .summary(&account, how, spent.prompt, spent.completion)
    });
    tracing::info!(
        dir,
        how,
        tokens = spent.total(),
        ms = t0.elapsed().as_millis() as u64,
        "summary"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "# preferences/\n\n2 memories, 0 archived; newest first (NAME/: ABSTRACT (vVERSION, UPDATED)).\n\n\
        - coffee/: The user drinks oat-milk flat whites every morning. (v2, 2026-03-01T10:00:00.000Z)\n\
        - editor/: The user writes code in Helix with a dark theme. (v1, 2026-02-11T09:00:00.000Z)\n";

    #[test]
    fn what_the_listing_does_not_say_is_dropped() {
        let answer = json!({
            "abstract": "The user's coffee and editor preferences",
            "overview": "The user drinks oat-milk flat whites every morning. The user codes in Helix. \
                         The user is Dana, a chemistry teacher in Leeds."
        });
        let row = checked(&answer, LISTING, "a/users/u/memories/preferences");
        assert_eq!(
            row.abstract_line,
            "The user's coffee and editor preferences"
        );
        assert_eq!(
            row.overview,
            "The user drinks oat-milk flat whites every morning. The user codes in Helix."
        );
        assert_eq!(row.dropped.len(), 1, "{:?}", row.dropped);
        assert!(row.dropped[0].contains("Dana"));
        let invented = json!({"abstract": "Preferences of Tom in Lyon", "overview": ""});
        let row = checked(&invented, LISTING, "a/users/u/memories/preferences");
        assert!(row.abstract_line.is_empty() && row.overview.is_empty());
        // Half its subject words, not a third: a deleted child's subject
        // ("tea") is not carried by the others.
        let row = checked(
            &json!({"abstract": "Tea, coffee and editor choices", "overview": ""}),
            LISTING,
            "a/users/u/memories/preferences",
        );
        assert!(row.abstract_line.is_empty(), "{row:?}");
    }

    #[test]
    fn a_digest_changes_with_the_listing() {
        assert_ne!(digest(LISTING), digest(&LISTING.replace("v2", "v3")));
        assert_eq!(digest(LISTING).len(), 64);
    }
}
