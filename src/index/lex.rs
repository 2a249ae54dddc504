//! The lexical channel: BM25 (k1 = 1.2, b = 0.75) over one document per
//! node (abstract, overview and content), in memory, built from the term
//! counts stored with each node's index document in the store.

use std::collections::HashMap;

const K1: f32 = 1.2;
const B: f32 = 0.75;

#[derive(Default)]
pub struct Lex {
    post: HashMap<String, Vec<(u32, u32)>>,
    /// Length of each document (0: free slot).
    len: Vec<u32>,
    free: Vec<u32>,
    total: u64,
    n: u32,
}

/// Term counts of a text, sorted by term.
pub fn counts(terms: &[String]) -> Vec<(String, u32)> {
    let mut m: HashMap<&str, u32> = HashMap::new();
    for t in terms {
        *m.entry(t.as_str()).or_default() += 1;
    }
    let mut v: Vec<(String, u32)> = m.into_iter().map(|(t, n)| (t.to_string(), n)).collect();
    v.sort();
    v
}

impl Lex {
    pub fn docs(&self) -> u32 {
        self.n
    }

    /// Add a document; returns its id.
    pub fn add(&mut self, terms: &[(String, u32)]) -> u32 {
        let len: u32 = terms.iter().map(|t| t.1).sum::<u32>().max(1);
        let id = match self.free.pop() {
            Some(id) => {
                self.len[id as usize] = len;
                id
            }
            None => {
                self.len.push(len);
                (self.len.len() - 1) as u32
            }
        };
        for (t, n) in terms {
            self.post.entry(t.clone()).or_default().push((id, *n));
        }
        self.total += len as u64;
        self.n += 1;
        id
    }

    pub fn remove(&mut self, id: u32, terms: &[(String, u32)]) {
        let Some(len) = self.len.get_mut(id as usize) else {
            return;
        };
        if *len == 0 {
            return;
        }
        self.total -= *len as u64;
        *len = 0;
        self.n -= 1;
        self.free.push(id);
        for (t, _) in terms {
            if let Some(p) = self.post.get_mut(t) {
                if let Some(i) = p.iter().position(|x| x.0 == id) {
                    p.swap_remove(i);
                }
                if p.is_empty() {
                    self.post.remove(t);
                }
            }
        }
    }

    /// BM25's inverse document frequency of `term` (rarer: higher).
    pub fn idf(&self, term: &str) -> f32 {
        let df = self.post.get(term).map(|p| p.len()).unwrap_or(0) as f32;
        (1.0 + (self.n as f32 - df + 0.5) / (df + 0.5)).ln()
    }

    /// The indexed term with the same first letter nearest to `term` by edit
    /// distance (at most 1 for terms up to 5 bytes, else 2), the most
    /// frequent among equals; `None`
    /// when `term` itself is indexed or nothing is near.
    pub fn nearest(&self, term: &str) -> Option<String> {
        if self.post.contains_key(term) || term.len() < 3 {
            return None;
        }
        let max = if term.len() <= 5 { 1 } else { 2 };
        let mut best: Option<(usize, usize, &str)> = None;
        // Misspellings mostly keep the first letter; requiring it keeps this
        // scan of the vocabulary cheap (an edit distance for ~1/26 of it).
        let first = term.as_bytes()[0];
        for (t, p) in &self.post {
            if t.as_bytes().first() != Some(&first) || t.len().abs_diff(term.len()) > max {
                continue;
            }
            let d = edit_distance(term.as_bytes(), t.as_bytes(), max);
            if d > max {
                continue;
            }
            let better = match best {
                None => true,
                Some((bd, bn, bt)) => {
                    (d, std::cmp::Reverse(p.len()), t.as_str()) < (bd, std::cmp::Reverse(bn), bt)
                }
            };
            if better {
                best = Some((d, p.len(), t));
            }
        }
        best.map(|(_, _, t)| t.to_string())
    }

    /// Best `k` documents for the query terms among those `keep` accepts.
    pub fn search(
        &self,
        query: &[String],
        k: usize,
        keep: &dyn Fn(u32) -> bool,
    ) -> Vec<(u32, f32)> {
        if self.n == 0 || k == 0 {
            return Vec::new();
        }
        let avg = self.total as f32 / self.n as f32;
        let mut q: Vec<&String> = query.iter().collect();
        q.sort();
        q.dedup();
        let lists: Vec<&Vec<(u32, u32)>> = q.iter().filter_map(|t| self.post.get(*t)).collect();
        let postings: usize = lists.iter().map(|p| p.len()).sum();
        let score = |p: &Vec<(u32, u32)>| {
            let df = p.len() as f32;
            let idf = (1.0 + (self.n as f32 - df + 0.5) / (df + 0.5)).ln();
            move |&(d, tf): &(u32, u32)| {
                let tf = tf as f32;
                let dl = self.len[d as usize] as f32;
                (
                    d,
                    idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * dl / avg)),
                )
            }
        };
        // Scores add up term by term, in the same order either way. Long
        // postings (common words) go into an array by document id: a hash
        // map of every matching document cost more than the scoring.
        let mut v: Vec<(u32, f32)> = if postings * 16 >= self.len.len() {
            let mut acc = vec![0f32; self.len.len()];
            let mut touched: Vec<u32> = Vec::with_capacity(postings.min(self.len.len()));
            for p in &lists {
                for (d, s) in p.iter().map(score(p)) {
                    let a = &mut acc[d as usize];
                    // Every score is positive (idf > 0, tf > 0).
                    if *a == 0.0 {
                        touched.push(d);
                    }
                    *a += s;
                }
            }
            touched
                .into_iter()
                .filter(|d| keep(*d))
                .map(|d| (d, acc[d as usize]))
                .collect()
        } else {
            let mut acc: HashMap<u32, f32> = HashMap::with_capacity(postings);
            for p in &lists {
                for (d, s) in p.iter().map(score(p)) {
                    *acc.entry(d).or_default() += s;
                }
            }
            acc.into_iter().filter(|(d, _)| keep(*d)).collect()
        };
        let k = k.min(v.len());
        if k == 0 {
            return Vec::new();
        }
        v.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(k);
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

/// Levenshtein distance of `a` and `b`, or `max + 1` once it exceeds `max`.
fn edit_distance(a: &[u8], b: &[u8], max: usize) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        let mut row_min = cur[0];
        for j in 1..=b.len() {
            let sub = prev[j - 1] + usize::from(a[i - 1] != b[j - 1]);
            cur[j] = sub.min(prev[j] + 1).min(cur[j - 1] + 1);
            row_min = row_min.min(cur[j]);
        }
        if row_min > max {
            return max + 1;
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()].min(max + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::text::terms;

    #[test]
    fn ranks_rare_terms_higher_and_forgets_removed() {
        let mut l = Lex::default();
        let docs = [
            "rust async runtime tokio",
            "python asyncio event loop",
            "rust borrow checker lifetimes",
            "gardening tomatoes in summer",
        ];
        let ids: Vec<(u32, Vec<(String, u32)>)> = docs
            .iter()
            .map(|d| {
                let c = counts(&terms(d));
                (l.add(&c), c)
            })
            .collect();
        let r = l.search(&terms("tokio runtime"), 10, &|_| true);
        assert_eq!(r[0].0, ids[0].0);
        assert_eq!(r.len(), 1);
        let r = l.search(&terms("rust"), 10, &|_| true);
        assert_eq!(r.len(), 2);
        l.remove(ids[0].0, &ids[0].1);
        let r = l.search(&terms("rust"), 10, &|_| true);
        assert_eq!(r, vec![(ids[2].0, r[0].1)]);
        assert!(l.search(&terms("tokio"), 10, &|_| true).is_empty());
        // Slot reuse.
        let c = counts(&terms("new tokio doc"));
        let id = l.add(&c);
        assert_eq!(id, ids[0].0);
        assert_eq!(l.docs(), 4);
        assert!(l
            .search(&terms("tomatoes"), 10, &|d| d != ids[3].0)
            .is_empty());
        assert_eq!(l.nearest("tomatos").as_deref(), Some("tomato"));
        assert_eq!(l.nearest("tokio"), None);
        assert_eq!(l.nearest("zzzzzzzz"), None);
        assert_eq!(edit_distance(b"kitten", b"sitting", 5), 3);
    }

    /// Common words (postings over a sixteenth of the documents: scored
    /// into an array) and rare ones (a hash map) rank exactly as BM25 by
    /// hand, with removed documents and a filter.
    #[test]
    fn dense_and_sparse_scoring_agree_with_bm25_by_hand() {
        let words = ["common", "usual", "rare", "odd", "plain"];
        let mut l = Lex::default();
        let mut docs: Vec<Vec<(String, u32)>> = Vec::new();
        for i in 0..400u32 {
            let mut t = vec!["common".to_string(); 1 + (i % 3) as usize];
            if i % 2 == 0 {
                t.push("usual".into());
            }
            if i % 97 == 0 {
                t.push("rare".into());
            }
            t.extend((0..i % 5).map(|j| words[(j as usize + 3) % 5].to_string()));
            let c = counts(&t);
            assert_eq!(l.add(&c), i);
            docs.push(c);
        }
        for i in (0..400u32).step_by(7) {
            l.remove(i, &docs[i as usize]);
        }
        let live = |d: u32| !d.is_multiple_of(7);
        let by_hand = |q: &[&str], keep: &dyn Fn(u32) -> bool| {
            let n = (0..400u32).filter(|d| live(*d)).count() as f32;
            let len = |d: u32| docs[d as usize].iter().map(|t| t.1).sum::<u32>() as f32;
            let avg = (0..400u32).filter(|d| live(*d)).map(len).sum::<f32>() / n;
            let mut out: Vec<(u32, f32)> = Vec::new();
            for d in (0..400u32).filter(|d| live(*d) && keep(*d)) {
                let mut s = 0.0;
                for w in q {
                    let df = (0..400u32)
                        .filter(|e| live(*e) && docs[*e as usize].iter().any(|t| t.0 == *w))
                        .count() as f32;
                    if let Some(t) = docs[d as usize].iter().find(|t| t.0 == *w) {
                        let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                        let tf = t.1 as f32;
                        s += idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len(d) / avg));
                    }
                }
                if s > 0.0 {
                    out.push((d, s));
                }
            }
            out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            out.truncate(10);
            out
        };
        for (q, keep) in [
            (vec!["common", "usual"], &(|_| true) as &dyn Fn(u32) -> bool),
            (vec!["common"], &|d: u32| d % 2 == 1),
            (vec!["rare"], &|_| true),
            (vec!["rare", "odd"], &|d: u32| d > 50),
        ] {
            let got = l.search(
                &q.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
                10,
                keep,
            );
            let want = by_hand(&q, keep);
            assert_eq!(got.len(), want.len(), "{q:?}");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.0, w.0, "{q:?}: {got:?} against {want:?}");
                assert!((g.1 - w.1).abs() < 1e-4, "{q:?}: {got:?} against {want:?}");
            }
        }
    }
}
