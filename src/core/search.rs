//! Search files (`DIR/.search/QUERY`), `.ctxfs/sync`, and the dead-letter
//! file operations of `.outbox/dlq/`.

use super::inodes::Key;
use super::place;
use super::{Caller, Fs};
use crate::error::{Error, Result};
use crate::index::{Hit, Index, Mode, Query};
use crate::store::Op;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The virtual search directory inside every directory of an account.
pub const SEARCH_DIR: &str = ".search";
/// Results when the query name asks for no number.
pub const DEFAULT_K: usize = 10;

#[derive(Debug, Clone, PartialEq)]
pub struct QueryName {
    pub text: String,
    pub k: usize,
    pub json: bool,
    pub mode: Mode,
    pub expand: bool,
}

/// `QUERY` or `QUERY?k=20&format=json&mode=vector&expand=1`. The part after
/// the last `?` is read as options only when every `&`-separated piece has
/// an `=`; otherwise the whole name is the query.
pub fn parse_query_name(name: &str) -> Result<QueryName> {
    let mut q = QueryName {
        text: name.to_string(),
        k: DEFAULT_K,
        json: false,
        mode: Mode::Hybrid,
        expand: false,
    };
    if let Some(i) = name.rfind('?') {
        let opts = &name[i + 1..];
        if !opts.is_empty() && opts.split('&').all(|p| p.contains('=')) {
            q.text = name[..i].to_string();
            for p in opts.split('&') {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                let bad = || Error::Invalid(format!("search option {p:?}"));
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
                            _ => return Err(bad()),
                        }
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

/// Matching lines of `content.md` a result names at most.
const MAX_LINES: usize = 12;

/// How sure a result is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    Low,
    Medium,
    High,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Low => "low",
            Tier::Medium => "medium",
            Tier::High => "high",
        }
    }

    /// From the idf-weighted share of query terms the node holds (`coverage`), whether
    /// both channels found it, and (real embedding models only) the
    /// vector similarity.
    pub fn of(h: &Hit, coverage: f32, semantic: bool) -> Tier {
        let both = h.vector_rank.is_some() && h.lexical_rank.is_some();
        let sim = if semantic {
            h.vector_score.unwrap_or(0.0)
        } else {
            0.0
        };
        if h.via.is_some() {
            return Tier::Low;
        }
        if (coverage >= 0.75 && (both || h.vector_rank.is_none())) || (both && sim >= 0.6) {
            Tier::High
        } else if coverage >= 0.5 || sim >= 0.45 || (both && coverage >= 0.25) {
            Tier::Medium
        } else {
            Tier::Low
        }
    }
}

/// A result with what the agent is told about it.
struct Judged {
    hit: Hit,
    tier: Tier,
    /// 1-based lines of `content.md` holding query terms (or where the best
    /// matching passage starts).
    lines: Vec<u32>,
    /// Lines of `content.md` that hold a query term.
    hits: usize,
    coverage: f32,
    snippet: String,
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

/// The file bytes of event `seq` among `events`: its JSON and a newline.
pub(super) fn event_file(events: Vec<crate::store::StoredEvent>, seq: u64) -> Result<Vec<u8>> {
    let e = events
        .into_iter()
        .find(|e| e.seq == seq)
        .ok_or(Error::NotFound)?;
    let mut j = e.json;
    j.push(b'\n');
    Ok(j)
}

/// `{event_id}.json` → sequence number.
pub fn event_seq(name: &str) -> Option<u64> {
    let h = name.strip_suffix(".json")?;
    (h.len() == 16).then(|| u64::from_str_radix(h, 16).ok())?
}

impl Fs {
    pub fn set_index(&self, index: Arc<Index>) {
        let _ = self.index.set(index);
    }

    pub fn index(&self) -> Option<&Arc<Index>> {
        self.index.get()
    }

    /// Wake the indexer after a change that wrote outbox events.
    pub(super) fn notify_index(&self) {
        if let Some(ix) = self.index.get() {
            ix.notify();
        }
    }

    fn indexer(&self) -> Result<&Arc<Index>> {
        self.index
            .get()
            .ok_or_else(|| Error::Unavailable("no indexer runs in this process".into()))
    }

    /// The bytes of `DIR/.search/NAME` for `c`.
    pub(super) fn search_file(&self, c: Caller, dir: &Arc<str>, name: &str) -> Result<Vec<u8>> {
        // The directory must be there for the caller (readers: committed only).
        self.attr_of(c, &Key::Dir(dir.clone()), 0)?;
        let qn = parse_query_name(name)?;
        self.check_search_rate(Self::account_of(dir))?;
        let ix = self.indexer()?;
        let q = Query {
            text: qn.text.clone(),
            k: qn.k,
            mode: qn.mode,
            expand: qn.expand,
        };
        let t = std::time::Instant::now();
        let semantic = ix.embedder().kind() != "hash";
        let first = ix.search(dir, &q)?;
        let search_us = t.elapsed().as_micros() as u64;
        let mut judged = self.judge(ix, dir, first, &q.text, semantic)?;
        let mut tried = vec![json!({"query": q.text, "results": judged.len(),
                                    "best": judged.first().map(|j| j.tier.as_str())})];
        let mut answered_by = q.text.clone();
        // No good hit: retry with relaxed variants, the query respelled from
        // the indexed words, then (learned embedders) its keywords alone;
        // keep the best answer.
        if judged.first().is_none_or(|j| j.tier == Tier::Low) {
            let keywords: String = crate::index::text::words(&q.text)
                .into_iter()
                .filter(|w| !crate::index::text::is_stopword(w))
                .collect::<Vec<_>>()
                .join(" ");
            // Keywords alone only help a learned embedder, which reads the
            // whole sentence: BM25 drops stopwords itself, and the hashing
            // embedder's vector barely moves without them.
            let keywords_help = semantic && q.mode != Mode::Lexical;
            let variants = [
                ix.respell(Self::account_of(dir), &q.text)?,
                (keywords_help && !keywords.is_empty() && keywords != q.text.to_lowercase())
                    .then_some(keywords),
            ];
            let variants: Vec<String> = variants
                .into_iter()
                .flatten()
                .filter(|v| *v != q.text)
                .collect();
            // The variants' vectors in one pass of the model, before the
            // first of them is searched.
            if keywords_help && variants.len() > 1 {
                let texts: Vec<&str> = variants.iter().map(String::as_str).collect();
                if let Err(e) = ix.embed_queries(&texts) {
                    tracing::warn!("{e}");
                }
            }
            for text in variants {
                if judged.first().is_some_and(|j| j.tier > Tier::Low)
                    || tried.iter().any(|t| t["query"] == text.as_str())
                {
                    break;
                }
                let q2 = Query {
                    text: text.clone(),
                    ..q.clone()
                };
                let again = self.judge(ix, dir, ix.search(dir, &q2)?, &text, semantic)?;
                tried.push(json!({"query": text, "results": again.len(),
                                  "best": again.first().map(|j| j.tier.as_str())}));
                let better = match (judged.first(), again.first()) {
                    (_, None) => false,
                    (None, Some(_)) => true,
                    (Some(a), Some(b)) => b.tier > a.tier,
                };
                if better {
                    judged = again;
                    answered_by = text;
                }
            }
        }
        let answerable = judged.first().is_some_and(|j| j.tier >= Tier::Medium);
        let total_us = t.elapsed().as_micros() as u64;
        if qn.json {
            let mode = match qn.mode {
                Mode::Hybrid => "hybrid",
                Mode::Vector => "vector",
                Mode::Lexical => "lexical",
            };
            let v = json!({
                "query": qn.text,
                "answered_by": answered_by,
                "tried": tried,
                "answerable": answerable,
                "signal": if answerable { "ANSWERABLE" } else { "NOT_ANSWERABLE" },
                "scope": format!("accounts/{dir}"),
                "k": qn.k,
                "mode": mode,
                "model": ix.embedder().id(),
                "took_us": {"total": total_us, "first_search": search_us,
                            "query_embedding": ix.stats.last_embed_us.load(Ordering::Relaxed)},
                "results": judged.iter().enumerate().map(|(i, j)| {
                    let mut o = serde_json::to_value(&j.hit).unwrap_or(Value::Null);
                    o["rank"] = (i + 1).into();
                    o["confidence"] = j.tier.as_str().into();
                    o["lines"] = json!(j.lines);
                    o["hits"] = j.hits.into();
                    o["coverage"] = json!((j.coverage * 100.0).round() / 100.0);
                    o["snippet"] = j.snippet.clone().into();
                    o
                }).collect::<Vec<_>>(),
            });
            let mut out = serde_json::to_vec_pretty(&v).map_err(|e| Error::Store(e.to_string()))?;
            out.push(b'\n');
            return Ok(out);
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
            }
            out.push('\n');
        }
        Ok(out.into_bytes())
    }

    /// How sure each hit is, and where in `content.md` the query matches.
    fn judge(
        &self,
        ix: &Index,
        dir: &str,
        hits: Vec<Hit>,
        query: &str,
        semantic: bool,
    ) -> Result<Vec<Judged>> {
        // Expired nodes leave search the instant they expire.
        let mut hits = hits;
        hits.retain(|h| !self.expired(h.path.strip_prefix("accounts/").unwrap_or(&h.path)));
        let mut qterms = crate::index::text::terms(query);
        qterms.sort();
        qterms.dedup();
        // Coverage counts rare terms more: a name found in every node says little.
        let weights = ix.idf(Self::account_of(dir), &qterms)?;
        let total: f32 = weights.iter().sum();
        let mut out = Vec::with_capacity(hits.len());
        // A line matches when it holds a query term's stem as a substring
        // (stems mostly prefix their words; no stemming per line).
        let stems: Vec<String> = qterms
            .iter()
            .map(|t| match t.strip_suffix('i') {
                Some(s) if s.len() >= 3 => s.to_string(),
                _ => t.clone(),
            })
            .collect();
        for hit in hits {
            let node = &hit.path["accounts/".len()..];
            let rec = self.store.get_node(node)?;
            let content = match rec.as_ref().and_then(|r| r.file(place::CONTENT)) {
                Some(f) => {
                    String::from_utf8_lossy(&self.store.read_blob(f.blob, f.size)?).into_owned()
                }
                None => String::new(),
            };
            let mut lines = Vec::new();
            let mut snippet = (0usize, String::new());
            if !stems.is_empty() {
                for (i, line) in content.lines().enumerate() {
                    let lower = line.to_lowercase();
                    let here = stems.iter().filter(|s| lower.contains(s.as_str())).count();
                    if here == 0 {
                        continue;
                    }
                    lines.push(i as u32 + 1);
                    if here > snippet.0 {
                        snippet = (here, crate::index::text::one_line(line));
                    }
                }
            }
            let held = ix.holds(node, &qterms)?;
            let coverage = if total <= 0.0 {
                0.0
            } else {
                held.iter()
                    .zip(&weights)
                    .filter(|(h, _)| **h)
                    .map(|(_, w)| w)
                    .sum::<f32>()
                    / total
            };
            let hits_n = lines.len();
            if lines.is_empty() && hit.level == 2 && hit.line > 0 {
                lines.push(hit.line);
            }
            lines.truncate(MAX_LINES);
            if snippet.1.is_empty() {
                snippet.1 = hit.abstract_.clone();
            }
            let snippet: String = snippet.1.chars().take(200).collect();
            let tier = Tier::of(&hit, coverage, semantic);
            out.push(Judged {
                hit,
                tier,
                lines,
                hits: hits_n,
                coverage,
                snippet,
            });
        }
        Ok(out)
    }

    /// `.ctxfs/sync`: wait until everything committed so far is searchable.
    pub(super) fn sync_file(&self) -> Result<Vec<u8>> {
        let target = self.next_event.load(Ordering::SeqCst).saturating_sub(1);
        self.indexer()?.sync(target)?;
        Ok(b"ok\n".to_vec())
    }

    pub(super) fn dead_event_json(&self, c: Caller, node: &str, seq: u64) -> Result<Vec<u8>> {
        self.gate(c, Self::account_of(node), false)?;
        event_file(self.store.dead_events(node)?, seq)
    }

    /// `mv NODE/.outbox/dlq/ID.json NODE/.outbox/`: try the event again.
    pub(super) fn revive_dead(
        &self,
        c: Caller,
        src_node: &str,
        name: &str,
        dst_node: &str,
        newname: &str,
    ) -> Result<()> {
        self.gate(c, Self::account_of(src_node), true)?;
        if src_node != dst_node || name != newname {
            return Err(Error::Invalid(
                "a dead letter can only move back to its own node's .outbox/, under its name"
                    .into(),
            ));
        }
        let seq = event_seq(name).ok_or(Error::NotFound)?;
        let e = self
            .store
            .dead_events(src_node)?
            .into_iter()
            .find(|e| e.seq == seq)
            .ok_or(Error::NotFound)?;
        let mut j: Value = serde_json::from_slice(&e.json).unwrap_or(Value::Null);
        if let Some(o) = j.as_object_mut() {
            o.insert("status".into(), "PENDING".into());
            o.insert("retry_count".into(), 0.into());
            o.remove("next_retry_ms");
        }
        self.store.apply(
            vec![Op::ReviveEvent {
                seq,
                node_path: src_node.to_string(),
                account: Self::account_of(src_node).to_string(),
                json: serde_json::to_vec(&j).unwrap_or(e.json),
            }],
            true,
        )?;
        self.notify_index();
        Ok(())
    }

    /// `rm NODE/.outbox/dlq/ID.json`: give up on the event.
    pub(super) fn drop_dead(&self, c: Caller, node: &str, name: &str) -> Result<()> {
        self.gate(c, Self::account_of(node), true)?;
        let seq = event_seq(name).ok_or(Error::NotFound)?;
        if !self.store.dead_events(node)?.iter().any(|e| e.seq == seq) {
            return Err(Error::NotFound);
        }
        self.store.apply(
            vec![Op::DropDead {
                seq,
                node_path: node.to_string(),
                account: Self::account_of(node).to_string(),
            }],
            true,
        )
    }

    /// The indexer's part of `.ctxfs/status`, and the dead letters of `accounts`.
    pub(super) fn index_status(&self, accounts: &[String]) -> Result<(i64, Value)> {
        let mut dead = 0;
        for a in accounts {
            dead += self.store.counter(&format!("dlq:{a}"))?;
        }
        let v = match self.index.get() {
            Some(ix) => ix.status(accounts),
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
        assert!(parse_query_name("  ").is_err());
        let q = parse_query_name("x?mode=lexical&expand=1").unwrap();
        assert_eq!((q.mode, q.expand), (Mode::Lexical, true));
        assert_eq!(event_seq("000000000000000a.json"), Some(10));
        assert_eq!(event_seq("a.json"), None);
        assert_eq!(line_ranges(&[3, 5, 6, 7, 12]), "3,5-7,12");
        assert_eq!(line_ranges(&[]), "-");
    }
}
