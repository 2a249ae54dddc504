//! Where search's candidates come from, each channel by itself: the
//! vector channel (the graph, or exactly over a small scope), the lexical
//! channel (BM25), and the messages said near a day the query names. The
//! queries (`query.rs`) ask them and fuse what they give (`fusion.rs`).

use super::toward::{message_day, near_named_days};
use super::{ann, in_scope, Candidates, Graph, Index, Mode, State};
use std::collections::HashSet;
use std::sync::Arc;

impl Index {
    /// The vector channel: the best record of each document `inside` the
    /// scope, best first: `cand.exact` at most exactly over the scope's
    /// records when they are few (or the account has no graph), else
    /// `cand.graph` at most from the graph's search, filtered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn vector_channel(
        &self,
        st: &State,
        graph: &Graph,
        qv: &[ann::Half],
        scope: &str,
        whole: bool,
        cand: Candidates,
        inside: &dyn Fn(&str) -> bool,
    ) -> Vec<(Arc<str>, f32, u16)> {
        let mut vec_hits: Vec<(Arc<str>, f32, u16)> = Vec::new();
        let scoped_recs: Option<Vec<usize>> = if whole {
            // Up to EXACT_SCOPE records an account has no graph and is
            // searched exactly (also the hashing fallback's sparse
            // vectors are hard for HNSW: recall@10 0.744 at its
            // defaults, BENCHMARKS).
            (!st.graphed || st.vecs.len() <= self.cfg.exact_scope)
                .then(|| st.vecs.keys().copied().collect())
        } else {
            let start: Arc<str> = Arc::from(scope);
            let mut labels = Vec::new();
            for (p, d) in st.docs.range(start..) {
                if !in_scope(p, scope) || !inside(p) {
                    if p.as_ref() > scope && !p.starts_with(scope) {
                        break;
                    }
                    continue;
                }
                labels.extend(d.ix.recs.iter().map(|r| r.label as usize));
                if labels.len() > self.cfg.exact_scope {
                    break;
                }
            }
            (labels.len() <= self.cfg.exact_scope).then_some(labels)
        };
        let (raw, cand) = match scoped_recs {
            Some(labels) => (
                ann::exact(
                    qv,
                    cand.exact * 2,
                    labels
                        .iter()
                        .filter_map(|l| st.vecs.get(l).map(|v| (*l, &v[..]))),
                ),
                cand.exact,
            ),
            None if whole && st.dead.len() * 10 <= st.vecs.len() => {
                // Few tombstones: an unfiltered search for a little more,
                // filtered after (hnsw_rs's filtered search is slower).
                let extra = st.dead.len().min(cand.graph * 2);
                let raw = ann::search(graph, &self.cfg.ann, qv, cand.graph * 2 + extra, None);
                (raw, cand.graph)
            }
            None => {
                let keep = |l: usize| {
                    !st.dead.contains(&l) && st.slots.get(&l).is_some_and(|(p, _)| inside(p))
                };
                let raw = ann::search(graph, &self.cfg.ann, qv, cand.graph * 2, Some(&keep));
                (raw, cand.graph)
            }
        };
        let mut seen: HashSet<Arc<str>> = HashSet::new();
        for (l, s) in raw {
            if let Some((p, i)) = st.slots.get(&l) {
                if !st.dead.contains(&l) && seen.insert(p.clone()) {
                    vec_hits.push((p.clone(), s, *i));
                    if vec_hits.len() >= cand {
                        break;
                    }
                }
            }
        }
        vec_hits
    }
}

/// Candidates of the messages said near a day the query names, found
/// apart from the channels' own: each channel's scores of them, best
/// first.
#[derive(Default)]
pub(super) struct Dated {
    pub(super) vector: Vec<VecHit>,
    pub(super) lexical: Vec<LexHit>,
}

/// A vector channel's candidate: its document, score and best record.
pub(super) type VecHit = (Arc<str>, f32, u16);
/// A lexical channel's candidate: its document and BM25 score.
pub(super) type LexHit = (Arc<str>, f32);

/// Messages a named day's channel looks at, at most: the newest dated
/// messages of a busy scope beyond it are left to the two channels.
const DATED_MAX: usize = 5_000;

/// The messages `inside` the scope said near one of `days`
/// ([`near_named_days`], by the day their label shows), scored by each
/// channel the mode asks for: exactly against the query's vector (a
/// message by its best record) and by BM25 over them alone; `cand` at
/// most each.
#[allow(clippy::too_many_arguments)]
pub(super) fn dated_channel(
    st: &State,
    days: &[(jiff::civil::Date, jiff::civil::Date)],
    qv: Option<&[ann::Half]>,
    qterms: &[String],
    mode: Mode,
    scope: &str,
    whole: bool,
    cand: usize,
    inside: &dyn Fn(&str) -> bool,
) -> Dated {
    let start: Arc<str> = Arc::from(scope);
    let docs: Box<dyn Iterator<Item = (&Arc<str>, &super::Doc)>> = if whole {
        Box::new(st.docs.iter())
    } else {
        Box::new(
            st.docs
                .range(start..)
                .take_while(|(p, _)| p.starts_with(scope)),
        )
    };
    let near: Vec<(&Arc<str>, &super::Doc)> = docs
        .filter(|(p, d)| {
            p.contains('#')
                && inside(p)
                && message_day(&d.ix.abstract_).is_some_and(|day| near_named_days(day, days))
        })
        .take(DATED_MAX)
        .collect();
    let mut out = Dated::default();
    if near.is_empty() {
        return out;
    }
    if let (Some(qv), false) = (qv, mode == Mode::Lexical) {
        let labels = near
            .iter()
            .flat_map(|(_, d)| d.ix.recs.iter().map(|r| r.label as usize));
        let raw = ann::exact(
            qv,
            cand * 8,
            labels.filter_map(|l| st.vecs.get(&l).map(|v| (l, &v[..]))),
        );
        let mut seen: HashSet<&Arc<str>> = HashSet::new();
        for (l, s) in raw {
            if let Some((p, i)) = st.slots.get(&l) {
                if seen.insert(p) {
                    out.vector.push((p.clone(), s, *i));
                    if out.vector.len() >= cand {
                        break;
                    }
                }
            }
        }
    }
    if mode != Mode::Vector {
        let ids: HashSet<u32> = near.iter().map(|(_, d)| d.lex_id).collect();
        for (d, s) in st.lex.search(qterms, cand, &|d| ids.contains(&d)) {
            if let Some(Some(p)) = st.lex_path.get(d as usize) {
                out.lexical.push((p.clone(), s));
            }
        }
    }
    out
}

/// The lexical channel: BM25 over the documents `inside` the scope, `cand`
/// at most, best first.
pub(super) fn lexical_channel(
    st: &State,
    qterms: &[String],
    cand: usize,
    inside: &dyn Fn(&str) -> bool,
) -> Vec<(Arc<str>, f32)> {
    let mut lex_hits: Vec<(Arc<str>, f32)> = Vec::new();
    let keep = |d: u32| {
        st.lex_path
            .get(d as usize)
            .and_then(|p| p.as_ref())
            .is_some_and(|p| inside(p))
    };
    for (d, s) in st.lex.search(qterms, cand, &keep) {
        if let Some(Some(p)) = st.lex_path.get(d as usize) {
            lex_hits.push((p.clone(), s));
        }
    }
    lex_hits
}
