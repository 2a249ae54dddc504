//! Text handling shared by both search channels: word tokens for BM25 and
//! the hashing embedder, and the split of long content into chunks.

/// Largest chunk of `content.md` embedded as one L2 record (bytes). MiniLM
/// was trained on inputs of up to 128 word pieces, about 500 characters of
/// English; chunks of that size, cut at sentence ends, rank better than
/// chunks of its 256-piece limit cut anywhere (SciFact, vector channel
/// alone: nDCG@10 0.669 -> 0.683; BENCHMARKS "Chunks of whole sentences").
pub const CHUNK_BYTES: usize = 500;
/// Most chunks taken from one node (the rest is still found by BM25).
pub const MAX_CHUNKS: usize = 128;

pub use crate::schema::words::{is_stopword, terms, words};

/// A piece of `content.md` with the 1-based line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub line: u32,
    pub text: String,
}

/// Split content into chunks of at most about `CHUNK_BYTES`, at blank lines
/// when possible, else at line ends, else inside a line: after a sentence's
/// end, else after a space, else at a char boundary.
pub fn chunks(content: &str) -> Vec<Chunk> {
    let mut out: Vec<Chunk> = Vec::new();
    let mut cur = String::new();
    let mut cur_line = 1u32;
    let mut line_no = 0u32;
    for line in content.split_inclusive('\n') {
        line_no += 1;
        let blank = line.trim().is_empty();
        if !cur.is_empty()
            && (cur.len() + line.len() > CHUNK_BYTES || (blank && cur.len() > CHUNK_BYTES / 2))
        {
            push_chunk(&mut out, &mut cur, cur_line);
        }
        if cur.is_empty() {
            if blank {
                continue;
            }
            cur_line = line_no;
        }
        let mut rest = line;
        while rest.len() > CHUNK_BYTES {
            let mut cut = CHUNK_BYTES;
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            // Prefer a sentence's end, else a space, near the cut.
            if let Some(end) = sentence_end(&rest[..cut]).filter(|&i| i > CHUNK_BYTES / 4) {
                cut = end;
            } else if let Some(sp) = rest[..cut].rfind(' ').filter(|&i| i > CHUNK_BYTES / 2) {
                cut = sp + 1;
            }
            cur.push_str(&rest[..cut]);
            push_chunk(&mut out, &mut cur, cur_line);
            cur_line = line_no;
            rest = &rest[cut..];
        }
        cur.push_str(rest);
        if out.len() >= MAX_CHUNKS {
            break;
        }
    }
    push_chunk(&mut out, &mut cur, cur_line);
    out.truncate(MAX_CHUNKS);
    out
}

/// Where the last sentence in `s` ends (after its `.`, `?` or `!` and the
/// space that follows).
fn sentence_end(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (1..b.len())
        .rev()
        .find(|&i| b[i] == b' ' && matches!(b[i - 1], b'.' | b'?' | b'!'))
        .map(|i| i + 1)
}

fn push_chunk(out: &mut Vec<Chunk>, cur: &mut String, line: u32) {
    let t = cur.trim();
    if !t.is_empty() {
        out.push(Chunk {
            line,
            text: t.to_string(),
        });
    }
    cur.clear();
}

/// One line of text for a TSV column: tabs and line breaks become spaces.
pub fn one_line(s: &str) -> String {
    s.split(['\t', '\n', '\r'])
        .filter(|p| !p.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopwords_sorted() {
        let mut s = crate::schema::words::STOPWORDS.to_vec();
        s.sort();
        assert_eq!(s, crate::schema::words::STOPWORDS);
    }

    #[test]
    fn words_and_terms() {
        assert_eq!(
            words("Rust's async-io, ID ab-12."),
            ["rust", "s", "async", "io", "async-io", "id", "ab", "12", "ab-12"]
        );
        assert_eq!(terms("The cats are running"), ["cat", "run"]);
    }

    #[test]
    fn chunking_keeps_lines() {
        let text = "# Title\n\nfirst para\n\n".to_string() + &"word ".repeat(400) + "\nlast\n";
        let c = chunks(&text);
        assert!(c.len() >= 2);
        assert_eq!(c[0].line, 1);
        assert!(c.iter().all(|c| c.text.len() <= CHUNK_BYTES));
        assert!(c.last().unwrap().text.ends_with("last"));
        assert!(chunks("").is_empty());
        assert_eq!(chunks("é".repeat(2000).as_str()).len(), 8);
    }

    #[test]
    fn long_lines_are_cut_after_sentences() {
        let s = "This sentence has some words in it and ends here. ".repeat(30);
        let c = chunks(&s);
        assert!(c.len() >= 3);
        for x in &c {
            assert!(x.text.len() <= CHUNK_BYTES);
            assert!(
                x.text.starts_with("This") && x.text.ends_with("here."),
                "{:?}",
                x.text
            );
        }
        // Without sentence ends, a cut still falls after a space.
        let w = "word ".repeat(300);
        assert!(chunks(&w).iter().all(|x| x.text.ends_with("word")));
    }
}
