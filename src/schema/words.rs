//! Words as both search channels and the faithfulness check count them:
//! lowercase tokens, English stopwords, Snowball stems. Pure: shared by
//! `index` (BM25, the hashing embedder) and `extract` (a memory's words
//! against its sources).

use rust_stemmers::{Algorithm, Stemmer};
use std::sync::OnceLock;

pub const STOPWORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "all", "am", "an", "and", "any", "are", "as", "at",
    "be", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could",
    "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had",
    "has", "have", "having", "he", "her", "here", "hers", "him", "his", "how", "i", "if", "in",
    "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "no", "nor", "not",
    "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "out", "over", "own",
    "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs",
    "them", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under",
    "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who",
    "whom", "why", "will", "with", "would", "you", "your", "yours",
];

fn stemmer() -> &'static Stemmer {
    static S: OnceLock<Stemmer> = OnceLock::new();
    S.get_or_init(|| Stemmer::create(Algorithm::English))
}

pub fn is_stopword(w: &str) -> bool {
    STOPWORDS.binary_search(&w).is_ok()
}

/// Raw lowercase words: runs of letters and digits (ids such as `ab-12` stay
/// findable as their parts and, joined by `_`/`-`, as a whole).
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut joined = String::new();
    let flush = |cur: &mut String, out: &mut Vec<String>| {
        if !cur.is_empty() {
            out.push(std::mem::take(cur));
        }
    };
    for ch in text.chars() {
        if ch.is_alphanumeric() {
            cur.extend(ch.to_lowercase());
            joined.extend(ch.to_lowercase());
        } else if (ch == '-' || ch == '_' || ch == '.') && !cur.is_empty() {
            flush(&mut cur, &mut out);
            joined.push(ch);
        } else {
            let had_parts = joined.contains(['-', '_', '.']);
            flush(&mut cur, &mut out);
            let j = joined.trim_end_matches(['-', '_', '.']);
            if had_parts && j.contains(['-', '_', '.']) && j.len() <= 64 {
                out.push(j.to_string());
            }
            joined.clear();
        }
    }
    let had_parts = joined.contains(['-', '_', '.']);
    flush(&mut cur, &mut out);
    let j = joined.trim_end_matches(['-', '_', '.']);
    if had_parts && j.contains(['-', '_', '.']) && j.len() <= 64 {
        out.push(j.to_string());
    }
    out
}

/// BM25 terms: words without stopwords, stemmed (English Snowball).
pub fn terms(text: &str) -> Vec<String> {
    let st = stemmer();
    words(text)
        .into_iter()
        .filter(|w| !is_stopword(w) && w.len() <= 64)
        .map(|w| {
            if w.chars().all(|c| c.is_ascii_alphabetic()) {
                st.stem(&w).into_owned()
            } else {
                w
            }
        })
        .collect()
}
