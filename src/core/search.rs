//! Search files (`DIR/.search/QUERY`), `.ctxfs/sync`, and the dead-letter
//! file operations of `.outbox/dlq/`.

use super::inodes::Key;
use super::{Caller, Fs};
use crate::error::{Error, Result};
use crate::index::answer::Answer;
use crate::index::{Index, Mode, Query};
use crate::schema::place;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Stored conversations by path, read once per search.
type Conversations = std::collections::HashMap<String, Option<crate::extract::Conversation>>;

/// Characters of a message a budgeted answer shows at most.
const MESSAGE_CHARS: usize = 1_200;

/// Results when the query name asks for no number.
pub const DEFAULT_K: usize = 10;

#[derive(Debug, Clone, PartialEq)]
pub struct QueryName {
    pub text: String,
    pub k: usize,
    pub json: bool,
    pub mode: Mode,
    pub expand: bool,
    /// Only results whose time (a message's `ts`, a node's last commit) is
    /// at or after this (ns since the epoch).
    pub since: Option<i128>,
    /// … and before this (a date: the end of that day).
    pub until: Option<i128>,
    /// Pack the results into at most this many tokens, summary first
    /// (`core::recall`).
    pub budget: Option<usize>,
}

/// `YYYY-MM-DD` (the day's first instant, or with `end` the next day's)
/// or an RFC 3339 time, as ns since the epoch.
fn time_bound(v: &str, end: bool) -> Option<i128> {
    if let Ok(d) = v.parse::<jiff::civil::Date>() {
        let d = if end { d.tomorrow().ok()? } else { d };
        let t = d.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
        return Some(t.as_nanosecond());
    }
    v.parse::<jiff::Timestamp>().ok().map(|t| t.as_nanosecond())
}

/// `QUERY` or `QUERY?k=20&format=json&mode=vector&expand=1`. The part after
/// the last `?` is read as options only when every `&`-separated piece has
/// an `=`; otherwise the whole name is the query.
/// One search's results and what is said about them, for [`Fs::render_results`].
pub(super) struct Results<'a> {
    pub judged: &'a [crate::index::answer::Judged],
    pub tried: Vec<Value>,
    pub answered_by: String,
    pub answerable: bool,
    pub more: bool,
    /// (the whole search, its first search) in µs.
    pub took_us: (u64, u64),
    pub packed: Option<(usize, crate::core::recall::Packed)>,
}

pub fn parse_query_name(name: &str) -> Result<QueryName> {
    let mut q = QueryName {
        text: name.to_string(),
        k: DEFAULT_K,
        json: false,
        mode: Mode::Hybrid,
        expand: false,
        since: None,
        until: None,
        budget: None,
    };
    if let Some(i) = name.rfind('?') {
        let opts = &name[i + 1..];
        if !opts.is_empty() && opts.split('&').all(|p| p.contains('=')) {
            q.text = name[..i].to_string();
            let mut seen: Vec<&str> = Vec::new();
            for p in opts.split('&') {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                let bad = || Error::Invalid(format!("search option {}", crate::schema::excerpt(p)));
                if seen.contains(&k) {
                    return Err(Error::Invalid(format!(
                        "search option {} given twice",
                        crate::schema::excerpt(k)
                    )));
                }
                seen.push(k);
                match k {
                    "k" => {
                        q.k = v.parse().map_err(|_| bad())?;
                        if !(1..=crate::index::MAX_K).contains(&q.k) {
                            return Err(bad());
                        }
                    }
                    "format" => {
                        q.json = match v {
                            "json" => true,
                            "tsv" => false,
                            _ => return Err(bad()),
                        }
                    }
                    "mode" => {
                        q.mode = match v {
                            "hybrid" => Mode::Hybrid,
                            "vector" => Mode::Vector,
                            "lexical" => Mode::Lexical,
                            "tree" => Mode::Tree,
                            _ => return Err(bad()),
                        }
                    }
                    "since" => q.since = Some(time_bound(v, false).ok_or_else(bad)?),
                    "until" => q.until = Some(time_bound(v, true).ok_or_else(bad)?),
                    "budget" => {
                        use super::recall::{MAX_BUDGET, MIN_BUDGET};
                        let n: usize = v.parse().map_err(|_| bad())?;
                        if !(MIN_BUDGET..=MAX_BUDGET).contains(&n) {
                            return Err(Error::Invalid(format!(
                                "search option budget={n}: a budget is {MIN_BUDGET} to {MAX_BUDGET} tokens"
                            )));
                        }
                        q.budget = Some(n);
                    }
                    "expand" => {
                        q.expand = match v {
                            "1" | "true" => true,
                            "0" | "false" => false,
                            _ => return Err(bad()),
                        }
                    }
                    _ => return Err(bad()),
                }
            }
        }
    }
    if q.text.trim().is_empty() {
        return Err(Error::Invalid("empty search query".into()));
    }
    Ok(q)
}

/// `3,5-7,12`, or `-` for none.
pub fn line_ranges(lines: &[u32]) -> String {
    if lines.is_empty() {
        return "-".into();
    }
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let mut j = i;
        while j + 1 < lines.len() && lines[j + 1] == lines[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            lines[i].to_string()
        } else {
            format!("{}-{}", lines[i], lines[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Reads of `.ctxfs/sync` waiting at once, in the whole daemon and per uid:
/// each holds a FUSE worker (16 by default) for up to `sync_timeout_s`.
pub const MAX_SYNC_WAITERS: usize = 4;
pub const MAX_SYNC_WAITERS_PER_UID: usize = 2;

/// The `.ctxfs/sync` reads under way, by uid.
#[derive(Default)]
pub(super) struct SyncWaiters {
    by_uid: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
}

/// A place among the sync waiters, given back when dropped.
pub(super) struct SyncSlot<'a> {
    waiters: &'a SyncWaiters,
    uid: u32,
}

impl SyncWaiters {
    fn enter(&self, uid: u32) -> Result<SyncSlot<'_>> {
        let mut m = crate::locks::lock(&self.by_uid);
        let total: usize = m.values().sum();
        let mine = m.get(&uid).copied().unwrap_or(0);
        if total >= MAX_SYNC_WAITERS || mine >= MAX_SYNC_WAITERS_PER_UID {
            return Err(Error::RateLimited(format!(
                "{total} reads of .ctxfs/sync already wait ({mine} of uid {uid}); at most \
                 {MAX_SYNC_WAITERS} may wait at once, {MAX_SYNC_WAITERS_PER_UID} per uid: retry later"
            )));
        }
        *m.entry(uid).or_default() += 1;
        Ok(SyncSlot { waiters: self, uid })
    }
}

impl Drop for SyncSlot<'_> {
    fn drop(&mut self) {
        let mut m = crate::locks::lock(&self.waiters.by_uid);
        if let Some(n) = m.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.uid);
            }
        }
    }
}

impl Fs {
    pub fn set_index(&self, index: Arc<Index>) {
        self.services.set_index(index);
    }

    pub fn index(&self) -> Option<&Arc<Index>> {
        self.services.index()
    }

    /// Wake the indexer after a change that wrote outbox events.
    pub(super) fn notify_index(&self) {
        if let Some(ix) = self.services.index() {
            ix.notify();
        }
    }

    fn indexer(&self) -> Result<&Arc<Index>> {
        self.services
            .index()
            .ok_or_else(|| Error::Unavailable("no indexer runs in this process".into()))
    }

    /// The bytes of `DIR/.search/NAME` for `c`.
    pub(super) fn search_file(&self, c: Caller, dir: &Arc<str>, name: &str) -> Result<Vec<u8>> {
        // The directory must be there for the caller (readers: committed only).
        self.attr_of(c, &Key::Dir(dir.clone()), 0)?;
        let qn = parse_query_name(name)?;
        self.check_search_rate(place::account_of(dir))?;
        let ix = self.indexer()?;
        // One more than asked, to say whether more results exist; with a
        // time range, more candidates, filtered below.
        let ranged = qn.since.is_some() || qn.until.is_some();
        // A user's or an agent's uid searching from above its part: the
        // others' hits are dropped below, so more candidates.
        let scoped = self.tenancy.scope(c.uid, place::account_of(dir)).is_some();
        let above_part = scoped && self.per_caller_dir(&crate::schema::place::split(dir));
        let q = Query {
            text: qn.text.clone(),
            k: if ranged || above_part {
                (qn.k + 1) * 4
            } else {
                qn.k + 1
            },
            mode: qn.mode,
            expand: qn.expand,
            tenant: Some(c.uid),
        };
        let t = std::time::Instant::now();
        let Answer {
            mut judged,
            tried,
            answered_by,
            answerable,
            first_search_us: search_us,
        } = ix.answer(dir, &q, &|node| {
            !self.expired(node)
                && (!scoped || self.access_of(c, node) != crate::config::Access::None)
        })?;
        if scoped {
            // A hit brought in by a relation of a node this uid may not
            // read says that node matched: dropped; a newer node it may not
            // read is not named.
            let readable = |p: &str| {
                self.access_of(c, crate::schema::place::store_path(p))
                    != crate::config::Access::None
            };
            judged.retain(|j| {
                j.hit
                    .via
                    .as_deref()
                    .and_then(|v| v.split_once("<-"))
                    .is_none_or(|(_, src)| readable(src))
            });
            for j in &mut judged {
                if j.hit.superseded_by.as_deref().is_some_and(|b| !readable(b)) {
                    j.hit.superseded_by = None;
                }
            }
        }
        // The stored conversations read so far (a time range and a budget
        // both read messages; several results come from one conversation).
        let mut convs = std::collections::HashMap::new();
        if ranged {
            let mut kept = Vec::with_capacity(judged.len());
            for j in judged {
                let path = crate::schema::place::store_path(&j.hit.path);
                let at = self.time_of_result(path, &mut convs)?;
                if at.is_some_and(|t| {
                    qn.since.is_none_or(|s| t >= s) && qn.until.is_none_or(|u| t < u)
                }) {
                    kept.push(j);
                }
            }
            judged = kept;
        }
        // k counts sources: a memory shown with its message (`with`) is
        // kept or cut with it.
        let cut = crate::index::cut_after_sources(&judged, qn.k, |j| j.hit.with.is_some());
        let more = judged.len() > cut;
        judged.truncate(cut);
        let tried: Vec<Value> = tried
            .iter()
            .map(|t| json!({"query": t.query, "results": t.results, "best": t.best.map(|b| b.as_str())}))
            .collect();
        let packed = match qn.budget {
            Some(b) => Some((b, self.pack_results(dir, &qn.text, b, &judged, &mut convs)?)),
            None => None,
        };
        let total_us = t.elapsed().as_micros() as u64;
        self.render_results(
            &qn,
            &crate::schema::place::mount_path(dir),
            Results {
                judged: &judged,
                tried,
                answered_by,
                answerable,
                more,
                took_us: (total_us, search_us),
                packed,
            },
        )
    }

    /// Search results as the file shows them: TSV lines, the packed text
    /// of a budget, or the JSON object (`format=json`).
    pub(super) fn render_results(
        &self,
        qn: &QueryName,
        scope: &str,
        r: Results<'_>,
    ) -> Result<Vec<u8>> {
        let ix = self.indexer()?;
        let Results {
            judged,
            tried,
            answered_by,
            answerable,
            more,
            took_us: (total_us, search_us),
            packed,
        } = r;
        if qn.json {
            let mut texts = MessageTexts::default();
            let mode = match qn.mode {
                Mode::Hybrid => "hybrid",
                Mode::Vector => "vector",
                Mode::Lexical => "lexical",
                Mode::Tree => "tree",
            };
            let v = json!({
                "query": qn.text,
                "answered_by": answered_by,
                "tried": tried,
                "answerable": answerable,
                "signal": if answerable { "ANSWERABLE" } else { "NOT_ANSWERABLE" },
                "scope": scope,
                "k": qn.k,
                "more": more,
                "mode": mode,
                "model": ix.embedder().id(),
                "took_us": {"total": total_us, "first_search": search_us,
                            "query_embedding": ix.stats.last_embed_us.load(Ordering::Relaxed)},
                "results": judged.iter().enumerate().map(|(i, j)| {
                    let message = crate::schema::event::message_of(&j.hit.path);
                    let mut o = serde_json::to_value(&j.hit).unwrap_or(Value::Null);
                    o["rank"] = (i + 1).into();
                    o["confidence"] = j.tier.as_str().into();
                    o["lines"] = json!(j.lines);
                    o["hits"] = j.hits.into();
                    o["coverage"] = json!((j.coverage * 100.0).round() / 100.0);
                    o["snippet"] = j.snippet.clone().into();
                    if let Some((conv, m)) = message {
                        o["conversation"] = conv.into();
                        o["message"] = m.into();
                        if let Some(t) = texts.text(self, conv, m as usize) {
                            o["text"] = t.into();
                        }
                    }
                    o
                }).collect::<Vec<_>>(),
            });
            let mut v = v;
            if let Some((b, p)) = &packed {
                v["budget"] = p.to_json(*b);
                v["packed"] = p.text.clone().into();
            }
            let mut out = serde_json::to_vec_pretty(&v)
                .map_err(|e| Error::store_from("rendering search results", e))?;
            out.push(b'\n');
            return Ok(out);
        }
        if let Some((_, p)) = packed {
            return Ok(p.text.into_bytes());
        }
        let mut out = String::new();
        for (i, j) in judged.iter().enumerate() {
            let h = &j.hit;
            out.push_str(&format!(
                "{}\t{:.4}\t{}\t{}\t{}\t{}\t{}\t{}",
                i + 1,
                h.score,
                h.path,
                h.uri,
                crate::index::text::one_line(&h.abstract_),
                j.tier.as_str(),
                line_ranges(&j.lines),
                j.hits,
            ));
            if let Some(v) = &h.via {
                out.push_str(&format!("\trelated:{v}"));
            } else if let Some(by) = &h.superseded_by {
                out.push_str(&format!("\tsuperseded-by:{by}"));
            }
            out.push('\n');
        }
        Ok(out.into_bytes())
    }

    /// Message `n` of stored conversation `conv`, each conversation read
    /// once per search (`convs`).
    fn message<'c>(
        &self,
        conv: &str,
        n: u32,
        convs: &'c mut Conversations,
    ) -> Result<Option<&'c crate::extract::Message>> {
        if !convs.contains_key(conv) {
            convs.insert(conv.to_string(), self.stored_conversation(conv)?);
        }
        Ok(convs
            .get(conv)
            .and_then(Option::as_ref)
            .and_then(|c| c.messages.get(n as usize)))
    }

    /// The results packed into `budget` tokens, summary first: each node's
    /// abstract, overview and matching lines of `content.md`; a message's
    /// text.
    fn pack_results(
        &self,
        dir: &str,
        query: &str,
        budget: usize,
        judged: &[crate::index::answer::Judged],
        convs: &mut Conversations,
    ) -> Result<super::recall::Packed> {
        use crate::schema::names::{CONTENT, OVERVIEW};
        let redactor = self
            .services
            .redaction()
            .for_account(place::account_of(dir));
        let base = crate::schema::place::mount_path(dir);
        let under = format!("{base}/");
        let mut items = Vec::with_capacity(judged.len());
        for j in judged {
            let path = crate::schema::place::store_path(&j.hit.path);
            let mut it = super::recall::Item {
                path: j
                    .hit
                    .path
                    .strip_prefix(&under)
                    .unwrap_or(&j.hit.path)
                    .to_string(),
                confidence: j.tier.as_str().to_string(),
                abstract_: j.hit.abstract_.clone(),
                overview: None,
                lines: Vec::new(),
            };
            if let Some((conv, n)) = crate::schema::event::message_of(path) {
                // A message whole (its result's abstract is cut at 160
                // characters), redacted as the index holds it.
                if let Some(m) = self.message(conv, n, convs)? {
                    let text = match &redactor {
                        Some(r) => r.redact_text(&m.content).0,
                        None => m.content.clone(),
                    };
                    let ts = match &m.ts {
                        Some(Value::String(t)) => format!(" {t}"),
                        Some(Value::Number(t)) => format!(" {t}"),
                        _ => String::new(),
                    };
                    let text = crate::schema::clip(&text, MESSAGE_CHARS);
                    it.abstract_ = format!("#{n} {}{ts}: {text}", m.speaker());
                }
            } else {
                if let Some(rec) = self.store.get_node(path)? {
                    let text = |name: &str| -> Result<Option<String>> {
                        Ok(self
                            .store
                            .read_file(&rec, name)?
                            .map(|b| String::from_utf8_lossy(&b).into_owned()))
                    };
                    it.overview = text(OVERVIEW)?;
                    if let Some(content) = text(CONTENT)? {
                        let all: Vec<&str> = content.lines().collect();
                        it.lines = j
                            .lines
                            .iter()
                            .filter_map(|n| {
                                all.get((*n as usize).checked_sub(1)?)
                                    .map(|t| (*n, t.to_string()))
                            })
                            .collect();
                    }
                }
            }
            items.push(it);
        }
        Ok(super::recall::pack(query, budget, &base, &items))
    }

    /// When a result is from: a message's `ts` (its day's start when it
    /// is a date); a node's `happened`, else its `valid_from`, else its
    /// last commit; `None` when unknown (a message without a time). `convs` keeps the conversations read so far.
    fn time_of_result(&self, path: &str, convs: &mut Conversations) -> Result<Option<i128>> {
        if let Some((conv, n)) = crate::schema::event::message_of(path) {
            let ts = self.message(conv, n, convs)?.and_then(|m| m.ts.clone());
            return Ok(match ts {
                Some(Value::String(t)) => time_bound(&t, false),
                Some(Value::Number(x)) => x.as_i64().map(|s| s as i128 * 1_000_000_000),
                _ => None,
            });
        }
        let Some(rec) = self.store.get_node(path)? else {
            return Ok(None);
        };
        // When its fact happened or became true, as its `.meta.json` says;
        // else its last commit.
        let said = self
            .store
            .read_file(&rec, crate::schema::names::META)?
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|m| {
                ["happened", "valid_from"]
                    .iter()
                    .find_map(|k| m[*k].as_str().and_then(super::commit::rules::time_value))
            });
        Ok(Some(said.unwrap_or(rec.updated_ns)))
    }

    /// `.ctxfs/sync`: wait until everything committed before is searchable.
    /// A wait holds a FUSE worker, so only callers with an account may wait,
    /// and only a few at once (see [`SyncWaiters`]).
    pub(super) fn sync_file(&self, c: Caller) -> Result<Vec<u8>> {
        if !self.tenancy.knows(c.uid) {
            return Err(Error::AccessDenied);
        }
        let ix = self.indexer()?;
        let _slot = self.services.sync_waiters.enter(c.uid)?;
        let target = self.ids.last_event()?;
        ix.sync(target, &|| c.interrupted())?;
        // Several daemons: what the indexer did elsewhere has reached this one.
        self.store.caught_up()?;
        Ok(b"ok\n".to_vec())
    }

    /// The indexer's part of `.ctxfs/status`, and the dead letters of `accounts`.
    pub(super) fn index_status(&self, accounts: &[String], full: bool) -> Result<(i64, Value)> {
        let mut dead = 0;
        for a in accounts {
            dead += self.store.counter(&crate::schema::counters::dlq_key(a))?;
        }
        let v = match self.services.index() {
            Some(ix) => ix.status(accounts, full),
            None => json!({"running": false, "note": "no indexer in this process"}),
        };
        Ok((dead, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_names() {
        let q = parse_query_name("rust async?k=25&format=json").unwrap();
        assert_eq!((q.text.as_str(), q.k, q.json), ("rust async", 25, true));
        let q = parse_query_name("what is rust?").unwrap();
        assert_eq!((q.text.as_str(), q.k), ("what is rust?", 10));
        let q = parse_query_name("a?b").unwrap();
        assert_eq!(q.text, "a?b");
        assert!(parse_query_name("x?k=0").is_err());
        assert!(parse_query_name("x?k=abc").is_err());
        assert!(parse_query_name("x?color=red").is_err());
        assert!(parse_query_name("?k=3").is_err());
        assert!(parse_query_name("x?k=1&k=2").is_err());
        assert!(parse_query_name("x?mode=vector&format=json&mode=lexical").is_err());
        assert!(parse_query_name("  ").is_err());
        let q = parse_query_name("x?since=2026-03-01&until=2026-03-31").unwrap();
        assert_eq!(q.since, Some(1_772_323_200_000_000_000));
        assert_eq!(
            q.until,
            Some(1_775_001_600_000_000_000),
            "the end of the 31st"
        );
        let q = parse_query_name("x?since=2026-03-01T12:00:00Z").unwrap();
        assert_eq!(q.since, Some(1_772_366_400_000_000_000));
        assert!(parse_query_name("x?since=last week").is_err());
        let q = parse_query_name("x?mode=lexical&expand=1").unwrap();
        assert_eq!((q.mode, q.expand), (Mode::Lexical, true));
        assert_eq!(line_ranges(&[3, 5, 6, 7, 12]), "3,5-7,12");
        assert_eq!(line_ranges(&[]), "-");
    }
}

/// The messages of one rendering's results whole, as the index read them
/// (`extract::message_text`: relative times followed by the day they mean,
/// redacted as the account's search is), each conversation read and its
/// account's redactor made once.
#[derive(Default)]
struct MessageTexts {
    by_conv: std::collections::HashMap<String, Option<Stored>>,
}

/// A conversation of the results as stored, with its account's redactor.
struct Stored {
    conv: crate::extract::Conversation,
    redactor: Option<crate::schema::redact::Redactor>,
}

impl MessageTexts {
    /// Message `m` of conversation `conv` (a path under the mount);
    /// `None` when the conversation cannot be read now.
    fn text(&mut self, fs: &Fs, conv: &str, m: usize) -> Option<String> {
        let s = self
            .by_conv
            .entry(conv.to_string())
            .or_insert_with(|| {
                let node = place::store_path(conv);
                Some(Stored {
                    conv: fs.stored_conversation(node).ok()??,
                    redactor: fs.services.redaction().for_account(place::account_of(node)),
                })
            })
            .as_ref()?;
        if s.conv.unsearchable {
            return None;
        }
        let msg = s.conv.messages.get(m)?;
        Some(crate::extract::message_text(msg, s.redactor.as_ref()))
    }
}
