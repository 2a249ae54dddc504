//! Words as both search channels and the faithfulness check count them:
//! lowercase tokens, English stopwords, Snowball stems, and sentences.
//! Pure: shared by `index` (BM25, the hashing embedder, a message's
//! sentences embedded apart) and `extract` (a memory's words against its
//! sources).

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

/// The sentences of `text`: cut after `.`, `!` or `?` followed by a space
/// or the end, and at line ends; blank ones and `# title` lines left out.
pub fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut start = 0;
        let b = line.as_bytes();
        for i in 0..b.len() {
            let end = matches!(b[i], b'.' | b'!' | b'?')
                && (i + 1 == b.len() || b[i + 1] == b' ')
                // "e.g." and "3.5" stay whole: a cut needs a word (or a
                // closing bracket or quote) before it.
                && i > 0
                && (b[i - 1].is_ascii_alphanumeric() || matches!(b[i - 1], b']' | b')' | b'"'))
                && !(i >= 2 && b[i - 2] == b'.');
            if end {
                let s = line[start..=i].trim();
                if !s.is_empty() {
                    out.push(s.to_string());
                }
                start = i + 1;
            }
        }
        let s = line[start..].trim();
        if !s.is_empty() {
            out.push(s.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_are_cut_after_their_end() {
        assert_eq!(
            sentences(
                "# Profile\n\nThe user is Ann. She likes tea, e.g. sencha 2.5 times a day!\nNo end"
            ),
            vec![
                "The user is Ann.",
                "She likes tea, e.g. sencha 2.5 times a day!",
                "No end"
            ]
        );
        // A resolved date or a quote closes a sentence too.
        assert_eq!(
            sentences("He turns 3 next week [week of 2026-03-23]. See you! She said \"hi\". Bye"),
            vec![
                "He turns 3 next week [week of 2026-03-23].",
                "See you!",
                "She said \"hi\".",
                "Bye"
            ]
        );
    }
}
