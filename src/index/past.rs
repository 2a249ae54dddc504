//! Search over the past: an exact index of the node versions an as-of view
//! shows (`accounts/A/.as-of/T/…/.search/Q`). BM25 over the versions' own
//! texts, and cosine over the vectors stored for those texts: vectors are
//! kept by text hash, so a version the indexer embedded is found again
//! without the embedder. A version whose texts have no stored vector (one
//! the indexer skipped, or after `compact`) is searched by its words only.
//! Ranks fuse as in the live search, and results are judged the same way.

use super::answer::{judge_one, stems, Judged};
use super::fusion::Channels;
use super::lex::{self, Lex};
use crate::error::Result;
use crate::index::ann;
use crate::index::bytes_vec;
use crate::index::records;
use crate::index::text;
use crate::index::Hit;
use crate::index::Index;
use crate::index::Mode;
use crate::index::Query;
use crate::index::Texts;
use crate::index::MAX_K;
use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_128;

/// One node of a view to search: its path in the view (store form,
/// `acme/users/…`), the version's texts and the content's blob (to tell a
/// version redacted since).
pub struct PastDoc {
    pub path: Arc<str>,
    pub texts: Texts,
    pub content_blob: Option<u64>,
}

/// The exact index of one view's versions.
pub struct PastIndex {
    paths: Vec<Arc<str>>,
    abstracts: Vec<String>,
    contents: Vec<String>,
    blobs: Vec<Option<u64>>,
    /// Each document's term counts, sorted by term.
    terms: Vec<Vec<(String, u32)>>,
    lex: Lex,
    /// (document, level, first line, vector) of every record with a stored vector.
    recs: Vec<(u32, u8, u32, ann::Vector)>,
    /// Records searched by their words only (no stored vector).
    pub unembedded: usize,
    model: String,
}

impl PastIndex {
    /// The content blob document `path` was indexed with.
    pub fn blob_of(&self, path: &str) -> Option<Option<u64>> {
        let i = self.paths.iter().position(|p| &**p == path)?;
        Some(self.blobs[i])
    }

    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Texts and vectors held, in bytes (about).
    pub fn approx_bytes(&self) -> usize {
        let text: usize = self.contents.iter().map(String::len).sum::<usize>()
            + self.abstracts.iter().map(String::len).sum::<usize>();
        let terms: usize = self
            .terms
            .iter()
            .map(|t| t.iter().map(|(s, _)| s.len() + 8).sum::<usize>())
            .sum();
        let vecs: usize = self.recs.iter().map(|r| r.3.len() * 2 + 16).sum();
        text + 2 * terms + vecs
    }
}

impl Index {
    /// Build the exact index of `docs`, with the vectors stored for their
    /// texts (one read of the store for all of them).
    pub fn past_index(&self, docs: Vec<PastDoc>) -> Result<PastIndex> {
        let model = self.embedder.id().to_string();
        let dim = self.embedder.dim();
        let mut px = PastIndex {
            paths: Vec::with_capacity(docs.len()),
            abstracts: Vec::with_capacity(docs.len()),
            contents: Vec::with_capacity(docs.len()),
            blobs: Vec::with_capacity(docs.len()),
            terms: Vec::with_capacity(docs.len()),
            lex: Lex::default(),
            recs: Vec::new(),
            unembedded: 0,
            model: model.clone(),
        };
        let mut wanted: Vec<(u32, u8, u32, u128)> = Vec::new();
        for d in &docs {
            let i = px.paths.len() as u32;
            let mut all = String::new();
            let mut abstract_ = String::new();
            for (level, t) in &d.texts {
                all.push_str(t);
                all.push('\n');
                if *level == 0 {
                    abstract_ = text::one_line(t);
                }
            }
            let content = d
                .texts
                .iter()
                .find(|t| t.0 == 2)
                .map(|t| t.1.clone())
                .unwrap_or_default();
            if abstract_.is_empty() {
                abstract_ = text::first_line(&content);
            }
            let terms = lex::counts(&text::terms(&all));
            let lex_id = px.lex.add(&terms);
            debug_assert_eq!(lex_id, i);
            for (level, line, t) in records(&d.texts) {
                wanted.push((i, level, line, xxh3_128(t.as_bytes())));
            }
            px.paths.push(d.path.clone());
            px.abstracts.push(abstract_);
            px.contents.push(content);
            px.blobs.push(d.content_blob);
            px.terms.push(terms);
        }
        let asked: Vec<(&str, u128)> = wanted
            .iter()
            .map(|(i, _, _, h)| (&*px.paths[*i as usize], *h))
            .collect();
        let found = self.store.get_vecs_of(&model, &asked)?;
        for ((i, level, line, _), b) in wanted.iter().zip(found) {
            match b {
                Some(b) if b.len() == dim * 4 => {
                    px.recs.push((*i, *level, *line, ann::half(&bytes_vec(&b))));
                }
                _ => px.unembedded += 1,
            }
        }
        Ok(px)
    }

    /// The best `q.k` documents of `px` under `scope` (a store path), judged.
    pub fn past_search(&self, px: &PastIndex, scope: &str, q: &Query) -> Result<Vec<Judged>> {
        let k = q.k.clamp(1, MAX_K);
        let inside = |i: u32| {
            let p = &px.paths[i as usize];
            p.strip_prefix(scope)
                .is_some_and(|r| r.is_empty() || r.starts_with('/'))
        };
        let qv = match q.mode {
            Mode::Lexical | Mode::Tree => None,
            _ if px.model != self.embedder.id() => None,
            Mode::Vector => Some(self.query_vec(&q.text)?),
            Mode::Hybrid => self.query_vec(&q.text).ok(),
        };
        let cand = super::Candidates::of(k).exact;
        // Vector channel: the best record per document, exactly.
        let mut vec_hits: Vec<(u32, f32, usize)> = Vec::new();
        if let Some(qv) = &qv {
            let raw = ann::exact(
                qv,
                cand * 4,
                px.recs
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| inside(r.0))
                    .map(|(n, r)| (n, &r.3[..])),
            );
            let mut seen = HashSet::new();
            for (n, s) in raw {
                let doc = px.recs[n].0;
                if seen.insert(doc) {
                    vec_hits.push((doc, s, n));
                    if vec_hits.len() >= cand {
                        break;
                    }
                }
            }
        }
        let mut qterms = text::terms(&q.text);
        let lex_hits: Vec<(u32, f32)> = if q.mode == Mode::Vector {
            Vec::new()
        } else {
            px.lex.search(&qterms, cand, &inside)
        };
        // Fusion, as the live search weighs its channels.
        let mut by: HashMap<u32, Hit> = HashMap::new();
        let blank = |i: u32| Hit {
            abstract_: px.abstracts[i as usize].clone(),
            ..Hit::blank(&px.paths[i as usize])
        };
        for (r, (i, s, n)) in vec_hits.iter().enumerate() {
            let h = by.entry(*i).or_insert_with(|| blank(*i));
            h.vector_rank = Some(r + 1);
            h.vector_score = Some(*s);
            h.level = px.recs[*n].1;
            h.line = px.recs[*n].2;
        }
        for (r, (i, s)) in lex_hits.iter().enumerate() {
            let h = by.entry(*i).or_insert_with(|| blank(*i));
            h.lexical_rank = Some(r + 1);
            h.lexical_score = Some(*s);
        }
        let channels = Channels::of(
            q.mode,
            self.vector_weight(),
            vec_hits.iter().map(|h| h.1),
            lex_hits.iter().map(|h| h.1),
        );
        let mut hits: Vec<(u32, Hit)> = by
            .into_iter()
            .map(|(i, mut h)| {
                h.score = channels.score(h.vector_score, h.lexical_score);
                (i, h)
            })
            .collect();
        hits.sort_by(|a, b| {
            b.1.score
                .total_cmp(&a.1.score)
                .then(a.1.path.cmp(&b.1.path))
        });
        hits.truncate(k);
        qterms.sort();
        qterms.dedup();
        let weights: Vec<f32> = qterms.iter().map(|t| px.lex.idf(t)).collect();
        let stems = stems(&qterms);
        let semantic = self.embedder.kind() != "hash";
        Ok(hits
            .into_iter()
            .map(|(i, h)| {
                let terms = &px.terms[i as usize];
                let held: Vec<bool> = qterms
                    .iter()
                    .map(|t| terms.binary_search_by(|(x, _)| x.as_str().cmp(t)).is_ok())
                    .collect();
                judge_one(
                    h,
                    &px.contents[i as usize],
                    &held,
                    &weights,
                    &stems,
                    semantic,
                )
            })
            .collect())
    }
}
