//! Text handling shared by both search channels: word tokens for BM25 and
//! the hashing embedder, and the split of long content into chunks.

/// Largest chunk of `content.md` embedded as one L2 record (bytes). MiniLM
/// was trained on inputs of up to 128 word pieces, about 500 characters of
/// English; chunks of that size, cut at sentence ends, rank better than
/// chunks of its 256-piece limit cut anywhere (SciFact, vector channel
/// alone: nDCG@10 0.669 -> 0.683; BENCHMARKS journal, "Chunks of whole sentences").
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

/// Most views a message is embedded as besides its own text.
pub const MAX_MESSAGE_VIEWS: usize = 16;
/// Fewest words of a sentence embedded on its own, and of a message
/// embedded after the one before it.
pub const MIN_VIEW_WORDS: usize = 3;

/// The other texts a conversation's message is embedded as, each one more
/// vector of the message (its words are counted from its own text alone):
/// the message after the end of the one said before it (`before`, with
/// its speaker), so that a reply is found by the question it answers (a
/// reply of three words or more: "Lisbon, near the river."); the
/// message with its speaker's name (`Name: text`), so that a search that
/// names them finds their words; and, when it says more than one thing,
/// each of its sentences of three words or more, so that one fact among
/// small talk is not drowned by the rest. Its own text stays a vector of
/// its own. On the five LoCoMo dev conversations, all sessions, each
/// speaker's copy, the messages alone found the evidence of 0.741 of 985
/// questions in their top 10 with one vector a message, 0.780 with these
/// (BENCHMARKS journal, "A message seen four ways").
pub fn message_views(text: &str, before: Option<&str>, name: Option<&str>) -> Vec<String> {
    let text = text.trim();
    let mut out: Vec<String> = Vec::new();
    let named = crate::schema::event::said_by(name, text);
    // A reaction ("Noted.", "Haha yes") answers nothing: it would only
    // be found by the words of the message before it.
    let says_something = text.split_whitespace().count() >= MIN_VIEW_WORDS;
    if let Some(b) = before
        .map(str::trim)
        .filter(|b| !b.is_empty() && says_something)
    {
        out.push(format!("{b}\n{named}"));
    }
    if named != text {
        out.push(named);
    }
    let sentences = crate::schema::words::sentences(text);
    if sentences.len() > 1 {
        for s in sentences {
            if s.split_whitespace().count() >= MIN_VIEW_WORDS && !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out.truncate(MAX_MESSAGE_VIEWS);
    out
}

/// Does a message end by asking? Its last mark among letters, digits and
/// `.`, `!`, `?`, its notes in brackets set aside (a photo described in
/// words, the day a relative time means: "What's their name?
/// [2023-05-07]"), is a question mark. A smiley or a closing quote after
/// the question does not hide it.
pub fn asks(text: &str) -> bool {
    crate::extract::line::unbracketed(text)
        .chars()
        .rev()
        .find(|c| c.is_alphanumeric() || matches!(c, '.' | '!' | '?'))
        == Some('?')
}

/// A content's first non-empty line, its heading marks and the spaces
/// around it trimmed, at most 100 characters: the abstract of a document
/// that has none of its own.
pub fn first_line(content: &str) -> String {
    content
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim_start_matches('#')
        .trim()
        .chars()
        .take(100)
        .collect()
}

/// One line of text for a TSV column: tabs and line breaks become spaces.
pub fn one_line(s: &str) -> String {
    s.split(['\t', '\n', '\r'])
        .filter(|p| !p.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `query` as asked inside the user directory of `scope`
/// (`{a}/users/{u}/…`): a capitalised word that is the user's name (the
/// directory's name, or a part of it of three letters or more split at
/// `-`, `_` or `.`) reads as "the user", the words memories use for their
/// owner; consecutive ones become one. `None` outside a user directory or
/// when the query does not name its user. In a user's own memory the name
/// tells nothing about which memory answers, while the other party's
/// messages that greet the user by it ("Priya! good to see you") would
/// outrank the one that answers.
pub fn owner_neutral(scope: &str, query: &str) -> Option<String> {
    let mut c = scope.split('/');
    let (_, kind, user) = (c.next()?, c.next()?, c.next()?);
    if kind != "users" || user.is_empty() {
        return None;
    }
    let user = user.to_lowercase();
    let parts: Vec<&str> = user
        .split(['-', '_', '.'])
        .filter(|p| p.chars().count() >= 3)
        .collect();
    let is_name = |w: &str| {
        w.chars().next().is_some_and(char::is_uppercase) && {
            let l = w.to_lowercase();
            l == user || parts.contains(&l.as_str())
        }
    };
    let mut out = String::with_capacity(query.len() + 8);
    let mut named = false;
    let mut last_was_name = false;
    let mut rest = query;
    while !rest.is_empty() {
        let start = rest
            .find(|ch: char| ch.is_alphanumeric())
            .unwrap_or(rest.len());
        let gap = &rest[..start];
        let after = &rest[start..];
        let end = after
            .find(|ch: char| !ch.is_alphanumeric())
            .unwrap_or(after.len());
        let word = &after[..end];
        if !word.is_empty() && is_name(word) {
            named = true;
            if !(last_was_name && gap.trim().is_empty()) {
                out.push_str(gap);
                out.push_str("the user");
            }
            last_was_name = true;
        } else {
            out.push_str(gap);
            out.push_str(word);
            last_was_name = last_was_name && word.is_empty();
        }
        rest = &after[end..];
    }
    named.then_some(out)
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
    fn a_message_is_seen_after_what_was_said_before_and_sentence_by_sentence() {
        let t = "Oh nice! We went hiking at the lake on Sunday. Toby loved it. Ok";
        // "Oh nice!" and "Ok" are too short to be views of their own.
        assert_eq!(
            message_views(t, Some("Ann: What did you do this weekend?"), Some(" Bo ")),
            vec![
                format!("Ann: What did you do this weekend?\nBo: {t}"),
                format!("Bo: {t}"),
                "We went hiking at the lake on Sunday.".to_string(),
                "Toby loved it.".to_string(),
            ]
        );
        // One sentence, no name: its own text is its only view.
        assert!(message_views("We went hiking at the lake.", None, None).is_empty());
        assert!(message_views("  ", Some(" "), Some("")).is_empty());
        // A reaction is not found by what it reacts to.
        assert_eq!(
            message_views("Noted, thanks.", Some("Ann: Tea at five?"), Some("Bo")),
            vec!["Bo: Noted, thanks."]
        );
        let many = "We saw a heron today. ".repeat(40);
        assert_eq!(
            message_views(&many, None, None).len(),
            1,
            "the same sentence once"
        );
        let long: String = (0..40)
            .map(|i| format!("Fact number {i} is here. "))
            .collect();
        assert_eq!(
            message_views(&long, Some("q"), Some("Bo")).len(),
            MAX_MESSAGE_VIEWS
        );
    }

    #[test]
    fn a_message_asks_when_it_ends_with_a_question() {
        for t in [
            "Cool! Any book series you would recommend?",
            "What's their name? [shares a photo: a puppy on a rug]",
            "How was the hike yesterday [2023-05-06]?",
            "Where are you going to live? :)",
            "Did she say \"why not?\"",
        ] {
            assert!(asks(t), "{t}");
        }
        for t in [
            "Is it far? Anyway, we went there on Sunday.",
            "We went hiking.",
            "[shares a photo: who is this?]",
            "",
            "]]",
            "Yes! [a [nested] note",
        ] {
            assert!(!asks(t), "{t}");
        }
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

    #[test]
    fn the_users_name_reads_as_the_user_in_their_directory() {
        use super::owner_neutral as n;
        let u = "acme/users/priya/memories";
        assert_eq!(
            n(u, "What does Priya work as?").as_deref(),
            Some("What does the user work as?")
        );
        assert_eq!(
            n("acme/users/priya", "Where is Priya's dog?").as_deref(),
            Some("Where is the user's dog?")
        );
        assert_eq!(
            n("acme/users/priya-raman", "Did Priya Raman move?").as_deref(),
            Some("Did the user move?")
        );
        // Lower case, another name, another scope: as asked.
        assert_eq!(n(u, "what does priya work as"), None);
        assert_eq!(n(u, "What does Mel work as?"), None);
        assert_eq!(n("acme/agents/priya", "What does Priya do?"), None);
        assert_eq!(n("acme", "What does Priya do?"), None);
    }
}
