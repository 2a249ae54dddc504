//! The vocabulary every layer shares, with no state and no I/O: the tree's
//! places and names, node status, the outbox event, counter keys, time, the
//! summaries a commit derives and the redaction of secrets. It imports
//! nothing of ours but `error`.

pub mod budget;
pub mod counters;
pub mod derive;
pub mod event;
pub mod names;
pub mod place;
pub mod redact;
pub mod time;
pub mod words;

use serde::{Deserialize, Serialize};

/// Client text quoted in a refusal's reason (and so in `.commit-error` and
/// the log): at most this many characters of it.
pub const EXCERPT_CHARS: usize = 64;

/// Tokens `text` may take, estimated high, the same everywhere (prompts
/// fitted to a model's context, recall packed to a budget): a byte of
/// UTF-8 at most a third of a token is about right for English and over
/// for most else (tokenizers of the models in use average 3.5-4.5 bytes a
/// token). Summing the estimates of parts never gives less than the
/// estimate of their concatenation.
pub fn estimate_tokens(text: &str) -> usize {
    text.len().div_ceil(3)
}

/// `s` as quoted in a reason: escaped as a Rust string literal (quotes,
/// control characters and newlines shown, never written raw), cut to
/// [`EXCERPT_CHARS`] characters with the full length said when cut.
pub fn excerpt(s: &str) -> String {
    match cut(s) {
        None => format!("{s:?}"),
        Some(head) => format!("{head:?}… ({} bytes)", s.len()),
    }
}

/// `text` on one line (runs of whitespace as one space), at most `max`
/// characters: cut with an ellipsis when longer.
pub fn clip(text: &str, max: usize) -> String {
    let one: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= max {
        return one;
    }
    let mut out: String = one.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `q` cut to at most `max` bytes, at a word's end where one is near (and
/// whether it was cut).
pub fn fit_name(q: &str, max: usize) -> (&str, bool) {
    if q.len() <= max {
        return (q, false);
    }
    let mut end = max;
    while !q.is_char_boundary(end) {
        end -= 1;
    }
    let head = &q[..end];
    let head = match head.rfind(char::is_whitespace) {
        Some(i) if i > end / 2 => &head[..i],
        _ => head,
    };
    (head.trim_end(), true)
}

/// A JSON value as quoted in a reason: its JSON text, cut as [`excerpt`] does.
pub fn excerpt_json(v: &serde_json::Value) -> String {
    let text = v.to_string();
    match cut(&text) {
        None => text,
        Some(head) => format!("{head}… ({} bytes)", text.len()),
    }
}

/// The first [`EXCERPT_CHARS`] characters of `s`, when it has more.
fn cut(s: &str) -> Option<&str> {
    s.char_indices().nth(EXCERPT_CHARS).map(|(i, _)| &s[..i])
}

/// The status of a committed node version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
pub enum Status {
    Active,
    Archived,
    Broken,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "ACTIVE",
            Status::Archived => "ARCHIVED",
            Status::Broken => "BROKEN",
        }
    }
    pub fn all() -> [Status; 3] {
        [Status::Active, Status::Archived, Status::Broken]
    }
}

/// The address of `endpoint` (`embeddings`, `chat/completions`, `models`)
/// of an OpenAI-compatible server, from a configured URL that is the
/// server's base (`http://h:8080`), its `/v1`, or already a full endpoint
/// address (which stays as given when it ends in `endpoint`).
pub fn openai_endpoint(url: &str, endpoint: &str) -> String {
    let base = url.trim_end_matches('/');
    if base.ends_with(&format!("/{endpoint}")) {
        base.to_string()
    } else if base.ends_with("/v1") {
        format!("{base}/{endpoint}")
    } else {
        format!("{base}/v1/{endpoint}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_query_is_cut_at_a_word_to_fit_a_file_name() {
        assert_eq!(fit_name("short", 10), ("short", false));
        let (q, cut) = fit_name("alpha beta gamma delta", 13);
        assert_eq!((q, cut), ("alpha beta", true));
        // No char is split, and a word longer than half is cut inside.
        let (q, cut) = fit_name("ééééé", 5);
        assert!(cut && q == "éé", "{q}");
        let long = "word ".repeat(100);
        let (q, _) = fit_name(&long, 235);
        assert!(q.len() <= 235 && q.ends_with("word"), "{q}");
    }

    #[test]
    fn excerpts_are_short_and_escaped() {
        assert_eq!(excerpt("ACTIVE"), "\"ACTIVE\"");
        assert_eq!(excerpt("a\nb\u{1b}[2J"), "\"a\\nb\\u{1b}[2J\"");
        let long = "B".repeat(65_000);
        let e = excerpt(&long);
        assert!(e.len() < 100 && e.ends_with("(65000 bytes)"), "{e}");
        let e = excerpt_json(&serde_json::Value::String(long));
        assert!(e.len() < 100 && e.ends_with("(65002 bytes)"), "{e}");
    }
}
