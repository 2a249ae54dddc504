//! A follower's index (several daemons on one store): the documents another
//! daemon's indexer changed are applied to the loaded account in place —
//! read from the store, their new vectors inserted into the graph, the old
//! ones' labels tombstoned — instead of reloading the account. The cost of
//! a remote commit is that of its own documents, whatever the account's
//! size.

use super::change::{remove_doc, Change};
use super::{ann, bytes_vec, AccountIndex, Index, IxDoc, LabeledVec};
use crate::error::Result;
use crate::locks::{lock, read as rlock, write as wlock};
use crate::schema::place;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;

impl Index {
    /// Apply the index documents at `paths` (store paths, `ACCOUNT/…`) as
    /// they are in the store now, to the accounts this daemon has loaded.
    /// An account still loading its documents is dropped instead (its load
    /// may have read a document before the change): the next use loads it.
    pub fn apply_remote(&self, paths: &[String]) {
        let mut by_account: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for p in paths {
            let a = place::account_of(p);
            by_account.entry(a).or_default().push(p);
        }
        for (account, paths) in by_account {
            let cell = lock(&self.accounts).get(account).cloned();
            let Some(cell) = cell else {
                continue;
            };
            let Some(ai) = cell.get().cloned() else {
                self.evict(account);
                continue;
            };
            if let Err(e) = self.apply_to(&ai, &paths) {
                tracing::warn!(account, error = %e.report(), "applying remote index changes failed; reloading the account");
                self.evict(account);
            }
        }
    }

    fn apply_to(&self, ai: &AccountIndex, paths: &[&str]) -> Result<()> {
        // Phase two (the graph) of this account waits, or is waited for.
        let _g = lock(&ai.loading);
        let ready = ai.ready.load(Ordering::Acquire);
        let model = self.embedder.id().to_string();
        let dim = self.embedder.dim();
        let mut docs: Vec<(&str, Option<IxDoc>)> = Vec::with_capacity(paths.len());
        for p in paths {
            let doc = match self.store.get_ix(p)? {
                Some(b) => Some(IxDoc::decode(&b)?),
                None => None,
            };
            docs.push((p, doc));
        }
        // Labels that stay live: a moved document keeps its labels, and
        // its removal at the old path must not tombstone them.
        let keep: HashSet<usize> = docs
            .iter()
            .filter_map(|(_, d)| d.as_ref())
            .flat_map(|d| d.recs.iter().map(|r| r.label as usize))
            .collect();
        // The vectors of labels new to this daemon (before the graph is
        // loaded, phase two takes them from the store).
        let mut fresh: Vec<(String, IxDoc, Vec<LabeledVec>)> = Vec::new();
        let mut gone: Vec<&str> = Vec::new();
        {
            let st = rlock(&ai.st);
            for (p, d) in docs {
                let Some(d) = d else {
                    gone.push(p);
                    continue;
                };
                let mut vecs = Vec::new();
                if ready && d.model == model {
                    for r in &d.recs {
                        let l = r.label as usize;
                        if st.vecs.contains_key(&l) {
                            continue;
                        }
                        if let Some(b) = self.store.get_vec_of(p, &model, r.hash)? {
                            let v = bytes_vec(&b);
                            if v.len() == dim {
                                vecs.push((l, ann::half(&v)));
                            }
                        }
                    }
                }
                fresh.push((p.to_string(), d, vecs));
            }
        }
        let graphed = rlock(&ai.st).graphed;
        if ready && graphed {
            let g = rlock(&ai.graph).clone();
            let all: Vec<LabeledVec> = fresh
                .iter()
                .flat_map(|(_, _, v)| v.iter().cloned())
                .collect();
            ann::insert(&g, &all);
        }
        {
            let mut st = wlock(&ai.st);
            for p in gone {
                remove_doc(&mut st, p, &keep);
            }
            for (_, _, vecs) in &fresh {
                for (l, _) in vecs {
                    // A label tombstoned by a move that came in two batches
                    // is live again.
                    st.dead.remove(l);
                }
            }
        }
        for (path, doc, vecs) in fresh {
            Change::Put { path, doc, vecs }.apply(ai);
        }
        // A follower keeps its graph as the indexer keeps its own: built
        // when the account passes the exact-search size, rebuilt or
        // dropped by its tombstones (under the loading lock, which every
        // other change of this account's graph on a follower holds).
        if ready {
            self.tidy_graph(ai, true);
        }
        self.stats
            .remote_applied
            .fetch_add(paths.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}
