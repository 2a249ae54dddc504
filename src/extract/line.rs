//! A memory line of quoted words: a quote found again in its message as
//! whole sentences, word for word (`locate`), and written with who said
//! it and when (`statement`); and back, the quoted words of a line
//! (`quoted`). Shared by the model's quotes (`quote.rs`) and the
//! statements kept without a model (`stated.rs`).

use super::Conversation;
use std::collections::HashSet;

/// Share of a message sentence's words the quote must hold for the
/// sentence to be taken (a quote of part of it takes it whole: what is
/// stored is always the message's sentences).
const MIN_SENTENCE: f32 = 0.5;

pub(super) fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// The words of `text` that say something (stopwords aside), or all of
/// them when none does ("Me too!").
fn content_words(text: &str) -> Vec<String> {
    let all = words(text);
    let some: Vec<String> = all
        .iter()
        .filter(|w| !crate::schema::words::is_stopword(w))
        .cloned()
        .collect();
    if some.is_empty() {
        all
    } else {
        some
    }
}

/// `text` without its `[…]` parts.
pub(crate) fn unbracketed(text: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// Words that open a sentence leaning on the one before it ("It has a
/// special mark on it."): a line that starts with one is read with that
/// sentence.
const LEANING: &[&str] = &[
    "it", "its", "this", "that", "these", "those", "they", "them", "their", "he", "she", "his",
    "her", "there", "which",
];

/// The sentences of `content` that `quote` copies, in their order and
/// word for word as the message has them, with the share of the quote's
/// words they hold; `None` when the quote copies no sentence of it. When
/// the first sentence taken leans on the one before it (it opens with
/// "it", "this", "they", …), that one is taken too: a line must say what
/// it is about.
pub(super) fn locate(quote: &str, content: &str) -> Option<(String, f32)> {
    let q: HashSet<String> = content_words(&unbracketed(quote)).into_iter().collect();
    if q.is_empty() {
        return None;
    }
    let sentences = super::support::sentences(content);
    let mut taken: Vec<usize> = (0..sentences.len())
        .filter(|&k| picks(&q, &sentences[k]))
        .collect();
    let first = *taken.first()?;
    if first > 0 && leans_back(&sentences[first]) {
        let before = &sentences[first - 1];
        if !content_words(&unbracketed(before)).is_empty() && !before.ends_with('?') {
            taken.insert(0, first - 1);
        }
    }
    let mut found = String::new();
    let mut held: HashSet<String> = HashSet::new();
    for (n, &k) in taken.iter().enumerate() {
        held.extend(words(&sentences[k]));
        // Sentences apart in the message are shown apart: "A. … C."
        if n > 0 {
            found.push_str(if k == taken[n - 1] + 1 { " " } else { " … " });
        }
        found.push_str(&sentences[k]);
    }
    let share = q.iter().filter(|x| held.contains(*x)).count() as f32 / q.len() as f32;
    Some((found, share))
}

/// `span` (as [`locate`] found it for `quote`) without a first sentence
/// taken only because the next one leans on it: the words the quote picked,
/// which name its memory.
pub(super) fn picked_part<'s>(quote: &str, span: &'s str) -> &'s str {
    let q: HashSet<String> = content_words(&unbracketed(quote)).into_iter().collect();
    let Some(first) = super::support::sentences(span).into_iter().next() else {
        return span;
    };
    match span.strip_prefix(first.as_str()) {
        Some(rest) if !picks(&q, &first) && !rest.trim().is_empty() => rest.trim_start(),
        _ => span,
    }
}

/// Does a quote of words `q` pick `sentence` (hold at least
/// `MIN_SENTENCE` of its words)? A bracket (a date resolved, a photo
/// described) is not the speaker's words: a quote may leave it out, and a
/// sentence of brackets alone is never picked.
fn picks(q: &HashSet<String>, sentence: &str) -> bool {
    let w = content_words(&unbracketed(sentence));
    let inside = w.iter().filter(|x| q.contains(*x)).count();
    !w.is_empty() && inside as f32 >= MIN_SENTENCE * w.len() as f32
}

/// Does `sentence` open with a word that leans on the sentence before it?
fn leans_back(sentence: &str) -> bool {
    words(sentence)
        .first()
        .is_some_and(|w| LEANING.contains(&w.as_str()))
}

/// Who said message `i`, for a memory: its `name`, and "the user" for the
/// user's side.
pub(super) fn speaker(conv: &Conversation, i: usize) -> String {
    let m = &conv.messages[i];
    match (&m.name, m.role.as_str()) {
        (Some(n), "user") => format!("{n} (the user)"),
        (Some(n), _) => n.clone(),
        (None, "user") => "The user".into(),
        (None, _) if conv.agent.is_some() => "The assistant".into(),
        (None, _) => "The other speaker".into(),
    }
}

/// The memory's line for `quote` of message `i`.
pub(super) fn statement(conv: &Conversation, i: usize, quote: &str) -> String {
    let who = speaker(conv, i);
    match conv.messages[i].ts.as_ref().and_then(super::when::day_of) {
        Some(day) => format!("{who} said on {day}: \"{quote}\""),
        None => format!("{who} said: \"{quote}\""),
    }
}

/// The quoted words of a memory's lines (what a line says, without who
/// said it and when), for comparing two memories.
pub(super) fn quoted(text: &str) -> String {
    text.lines()
        .map(|l| match l.split_once(": \"") {
            Some((_, q)) => q.trim_end_matches('"'),
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentence_leaning_on_the_one_before_is_read_with_it() {
        let msg = "My grandfather built this boat in 1987. It still sails every summer. Lovely!";
        // "It" needs its sentence before.
        assert_eq!(
            locate("It still sails every summer.", msg).unwrap().0,
            "My grandfather built this boat in 1987. It still sails every summer."
        );
        // A sentence that stands alone is taken alone.
        assert_eq!(
            locate("My grandfather built this boat in 1987.", msg)
                .unwrap()
                .0,
            "My grandfather built this boat in 1987."
        );
        // The first sentence of a message has nothing before it; a
        // question before is not a statement to lean on.
        assert_eq!(
            locate("They were late.", "They were late. We waited.")
                .unwrap()
                .0,
            "They were late."
        );
        assert_eq!(
            locate(
                "That was my first race.",
                "Did you run? That was my first race."
            )
            .unwrap()
            .0,
            "That was my first race."
        );
        // What names the memory is the part the quote picked.
        let (span, _) = locate("It still sails every summer.", msg).unwrap();
        assert_eq!(
            picked_part("It still sails every summer.", &span),
            "It still sails every summer."
        );
        assert_eq!(
            picked_part("They were late.", "They were late."),
            "They were late."
        );
        // The share counts the quote's words, whatever is added.
        let (_, share) = locate("It still sails every summer.", msg).unwrap();
        assert!((share - 1.0).abs() < 1e-6);
    }
}
