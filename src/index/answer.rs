//! Answers, not only hits: one call searches, judges how sure each hit is
//! and where in `content.md` the query matches, and when the best hit is
//! weak retries relaxed variants of the query (respelled from the indexed
//! words; keywords alone for learned embedders), keeping the best answer.
//! The decision table (tiers, when to retry, which answer wins) is pure and
//! tested below.

use super::{text, Hit, Index, Mode, Query};
use crate::error::Result;
use crate::schema::names::CONTENT;
use crate::schema::place;

/// Matching lines of `content.md` a result names at most.
const MAX_LINES: usize = 12;

/// How sure a result is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// A newer node supersedes this one: what was true, not what is.
    Superseded,
    Low,
    Medium,
    High,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Superseded => "superseded",
            Tier::Low => "low",
            Tier::Medium => "medium",
            Tier::High => "high",
        }
    }

    /// From the idf-weighted share of query terms the node holds
    /// (`coverage`), whether both channels found it, and (real embedding
    /// models only) the vector similarity.
    pub fn of(h: &Hit, coverage: f32, semantic: bool) -> Tier {
        let both = h.vector_rank.is_some() && h.lexical_rank.is_some();
        let sim = if semantic {
            h.vector_score.unwrap_or(0.0)
        } else {
            0.0
        };
        if h.superseded_by.is_some() {
            return Tier::Superseded;
        }
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
#[derive(Debug, Clone)]
pub struct Judged {
    pub hit: Hit,
    pub tier: Tier,
    /// 1-based lines of `content.md` holding query terms (or where the best
    /// matching passage starts).
    pub lines: Vec<u32>,
    /// Lines of `content.md` that hold a query term.
    pub hits: usize,
    pub coverage: f32,
    pub snippet: String,
}

/// One query tried on the way to the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Tried {
    pub query: String,
    pub results: usize,
    pub best: Option<Tier>,
}

/// The judged results of the query (or of the variant that answered better).
#[derive(Debug, Clone)]
pub struct Answer {
    pub judged: Vec<Judged>,
    pub tried: Vec<Tried>,
    pub answered_by: String,
    /// The best result is at least medium.
    pub answerable: bool,
    /// Time of the first search alone.
    pub first_search_us: u64,
}

/// No good hit: the relaxed variants are worth trying.
pub fn needs_retry(best: Option<Tier>) -> bool {
    best.is_none_or(|t| t <= Tier::Low)
}

/// Does an answer whose best hit is `again` beat one whose best is `now`?
pub fn better(now: Option<Tier>, again: Option<Tier>) -> bool {
    match (now, again) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(a), Some(b)) => b > a,
    }
}

/// The relaxed variants of `query`, in the order they are tried: its
/// respelling from the indexed words, then (learned embedders outside
/// lexical mode) its keywords alone. Keywords only help a learned embedder,
/// which reads the whole sentence: BM25 drops stopwords itself, and the
/// hashing embedder's vector barely moves without them.
pub fn variants(query: &str, respelled: Option<String>, semantic: bool, mode: Mode) -> Vec<String> {
    let keywords: String = text::words(query)
        .into_iter()
        .filter(|w| !text::is_stopword(w))
        .collect::<Vec<_>>()
        .join(" ");
    let keywords_help = semantic && mode != Mode::Lexical;
    [
        respelled,
        (keywords_help && !keywords.is_empty() && keywords != query.to_lowercase())
            .then_some(keywords),
    ]
    .into_iter()
    .flatten()
    .filter(|v| v != query)
    .collect()
}

fn best(j: &[Judged]) -> Option<Tier> {
    j.first().map(|j| j.tier)
}

impl Index {
    /// Search `scope` for `q`, judge the hits, and retry relaxed variants
    /// while no hit is better than low. `is_live` drops hits the caller
    /// must not see any more (expired nodes).
    pub fn answer(&self, scope: &str, q: &Query, is_live: &dyn Fn(&str) -> bool) -> Result<Answer> {
        let semantic = self.embedder().kind() != "hash";
        // Asked inside a user's directory, the user's name reads as "the
        // user" (`text::owner_neutral`): searched, judged and varied so.
        let neutral =
            super::text::owner_neutral(scope, &q.text).map(|text| Query { text, ..q.clone() });
        let asked = q.text.as_str();
        let q = neutral.as_ref().unwrap_or(q);
        let t = std::time::Instant::now();
        let first = self.search_as(scope, q, asked)?;
        let first_search_us = t.elapsed().as_micros() as u64;
        let mut judged = self.judge(scope, first, &q.text, semantic, is_live)?;
        let mut tried = vec![Tried {
            query: q.text.clone(),
            results: judged.len(),
            best: best(&judged),
        }];
        let mut answered_by = q.text.clone();
        if needs_retry(best(&judged)) {
            let account = place::account_of(scope);
            let variants = variants(&q.text, self.respell(account, &q.text)?, semantic, q.mode);
            // The variants' vectors in one pass of the model, before the
            // first of them is searched.
            if semantic && q.mode != Mode::Lexical && variants.len() > 1 {
                let texts: Vec<&str> = variants.iter().map(String::as_str).collect();
                if let Err(e) = self.embed_queries(&texts) {
                    tracing::warn!("{e}");
                }
            }
            for text in variants {
                if !needs_retry(best(&judged)) || tried.iter().any(|t| t.query == text) {
                    break;
                }
                let q2 = Query {
                    text: text.clone(),
                    ..q.clone()
                };
                let again = self.judge(
                    scope,
                    self.search_as(scope, &q2, asked)?,
                    &text,
                    semantic,
                    is_live,
                )?;
                tried.push(Tried {
                    query: text.clone(),
                    results: again.len(),
                    best: best(&again),
                });
                if better(best(&judged), best(&again)) {
                    judged = again;
                    answered_by = text;
                }
            }
        }
        Ok(Answer {
            answerable: best(&judged).is_some_and(|t| t >= Tier::Medium),
            judged,
            tried,
            answered_by,
            first_search_us,
        })
    }

    /// How sure each hit is, and where in `content.md` the query matches.
    fn judge(
        &self,
        scope: &str,
        mut hits: Vec<Hit>,
        query: &str,
        semantic: bool,
        is_live: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Judged>> {
        hits.retain(|h| is_live(crate::schema::place::store_path(&h.path)));
        let mut qterms = text::terms(query);
        qterms.sort();
        qterms.dedup();
        let account = place::account_of(scope);
        let weights = self.idf(account, &qterms)?;
        let stems = stems(&qterms);
        let mut out = Vec::with_capacity(hits.len());
        for hit in hits {
            let node = crate::schema::place::store_path(&hit.path);
            let rec = self.store.get_node(node)?;
            let content = match rec.as_ref().and_then(|r| r.file(CONTENT)) {
                Some(f) => String::from_utf8_lossy(&self.store.read_blob(
                    place::account_of(node),
                    f.blob,
                    f.size,
                )?)
                .into_owned(),
                None => String::new(),
            };
            let held = self.holds(node, &qterms)?;
            out.push(judge_one(hit, &content, &held, &weights, &stems, semantic));
        }
        Ok(out)
    }
}

/// The stems a line of `content.md` is matched by: a query term's stem as
/// a substring (stems mostly prefix their words; no stemming per line).
pub(super) fn stems(qterms: &[String]) -> Vec<String> {
    qterms
        .iter()
        .map(|t| match t.strip_suffix('i') {
            Some(s) if s.len() >= 3 => s.to_string(),
            _ => t.clone(),
        })
        .collect()
}

/// How sure one hit is, and where in its `content` the query matches:
/// `held` says which query terms (sorted, deduplicated) the node holds,
/// `weights` their idf, so coverage counts rare terms more (a name found
/// in every node says little).
pub(super) fn judge_one(
    hit: Hit,
    content: &str,
    held: &[bool],
    weights: &[f32],
    stems: &[String],
    semantic: bool,
) -> Judged {
    let total: f32 = weights.iter().sum();
    // Each line holding a query term, weighed by the idf of the terms it
    // holds: a name on every line of a long node weighs little.
    let mut held_lines: Vec<(u32, f32)> = Vec::new();
    let mut snippet = (0.0f32, String::new());
    if !stems.is_empty() {
        for (i, line) in content.lines().enumerate() {
            let lower = line.to_lowercase();
            // A term with no weight (no idf yet) still counts a little, so
            // a line holding any term weighs more than nothing.
            let weight: f32 = stems
                .iter()
                .enumerate()
                .filter(|(_, s)| lower.contains(s.as_str()))
                .map(|(k, _)| weights.get(k).copied().unwrap_or(0.0).max(1e-3))
                .sum();
            if weight == 0.0 {
                continue;
            }
            held_lines.push((i as u32 + 1, weight));
            if weight > snippet.0 {
                snippet = (weight, text::one_line(line));
            }
        }
    }
    let hits_n = held_lines.len();
    let mut lines = heaviest_lines(held_lines, MAX_LINES);
    let coverage = if total <= 0.0 {
        0.0
    } else {
        held.iter()
            .zip(weights)
            .filter(|(h, _)| **h)
            .map(|(_, w)| w)
            .sum::<f32>()
            / total
    };
    if lines.is_empty() && hit.level == 2 && hit.line > 0 {
        lines.push(hit.line);
    }
    if snippet.1.is_empty() {
        snippet.1 = hit.abstract_.clone();
    }
    let snippet: String = snippet.1.chars().take(200).collect();
    let tier = Tier::of(&hit, coverage, semantic);
    Judged {
        hit,
        tier,
        lines,
        hits: hits_n,
        coverage,
        snippet,
    }
}

/// The `max` heaviest of `(line, weight)`, earlier lines first among
/// equals, in line order.
fn heaviest_lines(mut held: Vec<(u32, f32)>, max: usize) -> Vec<u32> {
    if held.len() > max {
        held.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        held.truncate(max);
    }
    let mut lines: Vec<u32> = held.into_iter().map(|(l, _)| l).collect();
    lines.sort_unstable();
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_node_names_its_lines_holding_the_rare_terms() {
        // Line n holds the name (weight 0.1); lines 20 and 30 also a rare term.
        let mut held: Vec<(u32, f32)> = (1..=40).map(|l| (l, 0.1)).collect();
        held[19].1 = 2.1;
        held[29].1 = 2.1;
        let got = heaviest_lines(held, 12);
        assert_eq!(got.len(), 12);
        assert!(got.contains(&20) && got.contains(&30), "{got:?}");
        assert_eq!(
            &got[..10],
            &(1..=10).collect::<Vec<_>>()[..],
            "then the first"
        );
        // Fewer than the limit: all of them, in order.
        assert_eq!(heaviest_lines(vec![(5, 0.1), (2, 3.0)], 12), vec![2, 5]);
    }

    #[test]
    fn judging_a_long_node_weighs_its_lines_by_idf() {
        let content: String = (1..=30)
            .map(|i| {
                if i == 25 {
                    "Andrew said: I started a new job as a financial analyst.\n".to_string()
                } else {
                    format!("Andrew said: line {i} about birds.\n")
                }
            })
            .collect();
        let qterms = vec!["andrew".to_string(), "job".to_string()];
        let j = judge_one(
            hit(None, true, false),
            &content,
            &[true, true],
            &[0.05, 3.0],
            &stems(&qterms),
            false,
        );
        assert!(j.lines.contains(&25), "{:?}", j.lines);
        assert_eq!(j.lines.len(), MAX_LINES);
        assert_eq!(j.hits, 30);
        assert!(j.snippet.contains("financial analyst"), "{}", j.snippet);
    }

    fn hit(vector: Option<f32>, lexical: bool, via: bool) -> Hit {
        Hit {
            path: "accounts/a/users/u/memories/c/n".into(),
            uri: "ctx://a/users/u/memories/c/n".into(),
            score: 1.0,
            abstract_: String::new(),
            vector_rank: vector.map(|_| 1),
            vector_score: vector,
            lexical_rank: lexical.then_some(1),
            lexical_score: lexical.then_some(3.0),
            level: 2,
            line: 1,
            via: via.then(|| "related<-x".into()),
            superseded_by: None,
            with: None,
            asks: false,
            tells_when: false,
        }
    }

    /// (vector similarity, lexical hit, via relation, coverage, semantic) → tier.
    type Row = (Option<f32>, bool, bool, f32, bool, Tier);

    #[test]
    fn tier_decision_table() {
        use Tier::*;
        let table: &[Row] = &[
            // Most query terms held: high when both channels agree or only BM25 found it.
            (Some(0.1), true, false, 0.75, true, High),
            (None, true, false, 0.80, false, High),
            (Some(0.9), false, false, 0.80, true, Medium),
            // Both channels and a close vector: high even with few terms.
            (Some(0.6), true, false, 0.0, true, High),
            (Some(0.6), true, false, 0.0, false, Low),
            // Medium: half the terms, a fair vector, or both channels with a quarter.
            (Some(0.1), false, false, 0.5, true, Medium),
            (Some(0.45), false, false, 0.0, true, Medium),
            (Some(0.45), false, false, 0.0, false, Low),
            (Some(0.1), true, false, 0.25, true, Medium),
            (Some(0.1), true, false, 0.24, true, Low),
            (Some(0.1), false, false, 0.49, false, Low),
            // Found through a relation: always low.
            (Some(0.99), true, true, 1.0, true, Low),
        ];
        for (i, (v, lex, via, cov, sem, want)) in table.iter().enumerate() {
            assert_eq!(Tier::of(&hit(*v, *lex, *via), *cov, *sem), *want, "row {i}");
        }
        // Superseded by a newer node: says so, however well it matches.
        let mut h = hit(Some(0.99), true, false);
        h.superseded_by = Some("accounts/a/users/u/memories/c/m".into());
        assert_eq!(Tier::of(&h, 1.0, true), Superseded);
    }

    #[test]
    fn retry_decision_table() {
        use Tier::*;
        assert!(needs_retry(None));
        assert!(needs_retry(Some(Low)));
        assert!(needs_retry(Some(Superseded)));
        assert!(!needs_retry(Some(Medium)));
        assert!(!needs_retry(Some(High)));
        // A variant's answer replaces the first only when its best is better.
        let table = [
            (None, None, false),
            (None, Some(Low), true),
            (Some(Low), None, false),
            (Some(Low), Some(Low), false),
            (Some(Low), Some(Medium), true),
            (Some(Superseded), Some(Low), true),
            (Some(Low), Some(Superseded), false),
            (Some(Medium), Some(High), true),
            (Some(High), Some(Medium), false),
        ];
        for (now, again, want) in table {
            assert_eq!(better(now, again), want, "{now:?} vs {again:?}");
        }
    }

    #[test]
    fn variants_in_order() {
        let q = "Where does the team deploy services";
        // Learned embedder: respelling first, then the keywords.
        assert_eq!(
            variants(
                q,
                Some("where does the team deploy service".into()),
                true,
                Mode::Hybrid
            ),
            ["where does the team deploy service", "team deploy services"]
        );
        // Hashing embedder or lexical mode: no keywords variant.
        assert_eq!(variants(q, None, false, Mode::Hybrid), Vec::<String>::new());
        assert_eq!(variants(q, None, true, Mode::Lexical), Vec::<String>::new());
        // A respelling equal to the query, or keywords equal to it, are dropped.
        assert_eq!(
            variants("deploy", Some("deploy".into()), true, Mode::Vector),
            Vec::<String>::new()
        );
    }
}
