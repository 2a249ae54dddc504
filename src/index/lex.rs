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
        let mut acc: HashMap<u32, f32> = HashMap::new();
        for t in q {
            let Some(p) = self.post.get(t) else { continue };
            let df = p.len() as f32;
            let idf = (1.0 + (self.n as f32 - df + 0.5) / (df + 0.5)).ln();
            for &(d, tf) in p {
                let tf = tf as f32;
                let dl = self.len[d as usize] as f32;
                let s = idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * dl / avg));
                *acc.entry(d).or_default() += s;
            }
        }
        let mut v: Vec<(u32, f32)> = acc.into_iter().filter(|(d, _)| keep(*d)).collect();
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
    }
}
