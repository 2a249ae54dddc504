//! One node's change to an account index: the document after it, the
//! store operations that record it, and its application to the in-memory
//! state (BM25 postings, graph slots).

use crate::index::AccountIndex;
use xxhash_rust::xxh3::xxh3_128;

use std::sync::Arc;

use crate::index::Doc;

use std::collections::HashSet;

use crate::index::IxDoc;

use crate::index::LabeledVec;

use crate::index::State;

use crate::index::text;

use crate::index::wlock;

use crate::index::MESSAGE_LEVEL;

use crate::store::Op;

/// (level, first line, text) of every record an upsert makes: L0, L1, the
/// chunks of L2, and a message's views (`MESSAGE_LEVEL`,
/// `text::message_views`). An overview the daemon derived from a content of one
/// chunk is made of that chunk's own lines: it gets no record of its own,
/// as its vector would only repeat the chunk's (and cost as much to embed).
pub(super) fn records(texts: &[(u8, String)]) -> Vec<(u8, u32, String)> {
    let content = texts.iter().find(|(l, _)| *l == 2).map(|(_, t)| t.as_str());
    let chunks = content.map(text::chunks).unwrap_or_default();
    let mut out = Vec::new();
    for (level, t) in texts {
        if *level == 2 {
            for c in &chunks {
                out.push((2, c.line, c.text.clone()));
            }
        } else if *level == MESSAGE_LEVEL {
            out.push((MESSAGE_LEVEL, 0, t.clone()));
        } else if !t.trim().is_empty() {
            let t = t.trim();
            if *level == 1
                && chunks.len() == 1
                && content.is_some_and(|c| crate::schema::derive::derive_overview(c).trim() == t)
            {
                continue;
            }
            out.push((*level, 0, t.to_string()));
        }
    }
    out
}

pub(super) fn record_texts(texts: &[(u8, String)]) -> Vec<(u128, String)> {
    records(texts)
        .into_iter()
        .map(|(_, _, t)| (xxh3_128(t.as_bytes()), t))
        .collect()
}

/// A change to one account's index, planned before the store transaction
/// and applied to memory after it.
pub(super) enum Change {
    None,
    Put {
        path: String,
        doc: IxDoc,
        vecs: Vec<LabeledVec>,
    },
    Del {
        path: String,
    },
    Move {
        from: String,
        to: String,
        doc: IxDoc,
        /// The node's embeddings stored again for its new scope.
        copies: Vec<Op>,
    },
}

impl Change {
    /// The document at `path` after this change, if it touches `path`.
    pub(super) fn doc_after(&self, path: &str) -> Option<Option<IxDoc>> {
        match self {
            Change::Put { path: p, doc, .. } if p == path => Some(Some(doc.clone())),
            Change::Del { path: p } if p == path => Some(None),
            Change::Move { from, .. } if from == path => Some(None),
            Change::Move { to, doc, .. } if to == path => Some(Some(doc.clone())),
            _ => None,
        }
    }

    pub(super) fn ops(&self, ops: &mut Vec<Op>) {
        match self {
            Change::None => {}
            Change::Put { path, doc, .. } => ops.push(Op::PutIx {
                path: path.clone(),
                data: doc.encode(),
            }),
            Change::Del { path } => ops.push(Op::DelIx { path: path.clone() }),
            Change::Move {
                from,
                to,
                doc,
                copies,
            } => {
                ops.extend(copies.iter().cloned());
                ops.push(Op::DelIx { path: from.clone() });
                ops.push(Op::PutIx {
                    path: to.clone(),
                    data: doc.encode(),
                });
            }
        }
    }

    pub(super) fn apply(self, ai: &AccountIndex) {
        match self {
            Change::None => {}
            Change::Put { path, doc, vecs } => {
                // The vectors are already in the graph (`process`).
                let mut st = wlock(&ai.st);
                // Labels the new document keeps (a relations-only change)
                // stay live.
                let keep: HashSet<usize> = doc.recs.iter().map(|r| r.label as usize).collect();
                remove_doc(&mut st, &path, &keep);
                let path: Arc<str> = Arc::from(path);
                for (i, r) in doc.recs.iter().enumerate() {
                    st.slots.insert(r.label as usize, (path.clone(), i as u16));
                    st.next_label = st.next_label.max(r.label as usize + 1);
                }
                for (l, v) in vecs {
                    st.vecs.insert(l, v);
                }
                let lex_id = st.lex.add(&doc.terms);
                set_lex_path(&mut st.lex_path, lex_id, Some(path.clone()));
                st.put_doc(path, Doc { ix: doc, lex_id });
                st.dirty = true;
            }
            Change::Del { path } => {
                let mut st = wlock(&ai.st);
                remove_doc(&mut st, &path, &HashSet::new());
                st.dirty = true;
            }
            Change::Move { from, to, doc, .. } => {
                let mut st = wlock(&ai.st);
                let Some(old) = st.take_doc(from.as_str()) else {
                    return;
                };
                let to: Arc<str> = Arc::from(to);
                for (i, r) in doc.recs.iter().enumerate() {
                    st.slots.insert(r.label as usize, (to.clone(), i as u16));
                }
                set_lex_path(&mut st.lex_path, old.lex_id, Some(to.clone()));
                st.put_doc(
                    to,
                    Doc {
                        ix: doc,
                        lex_id: old.lex_id,
                    },
                );
            }
        }
    }
}

/// Forget the document at `path`; its vectors become tombstones in the
/// graph (if the account has one), except the labels in `keep`.
pub(super) fn remove_doc(st: &mut State, path: &str, keep: &HashSet<usize>) {
    let Some(old) = st.take_doc(path) else {
        return;
    };
    for r in &old.ix.recs {
        let l = r.label as usize;
        if keep.contains(&l) {
            continue;
        }
        st.slots.remove(&l);
        if st.vecs.remove(&l).is_some() && st.graphed {
            st.dead.insert(l);
        }
    }
    st.lex.remove(old.lex_id, &old.ix.terms);
    set_lex_path(&mut st.lex_path, old.lex_id, None);
}

pub(super) fn set_lex_path(v: &mut Vec<Option<Arc<str>>>, id: u32, p: Option<Arc<str>>) {
    let i = id as usize;
    if v.len() <= i {
        v.resize(i + 1, None);
    }
    v[i] = p;
}
