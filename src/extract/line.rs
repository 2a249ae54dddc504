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
pub(super) fn unbracketed(text: &str) -> String {
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

/// The sentences of `content` that `quote` copies, in their order and
/// word for word as the message has them, with the share of the quote's
/// words they hold; `None` when the quote copies no sentence of it.
pub(super) fn locate(quote: &str, content: &str) -> Option<(String, f32)> {
    let q: HashSet<String> = content_words(&unbracketed(quote)).into_iter().collect();
    if q.is_empty() {
        return None;
    }
    let mut found = String::new();
    let mut last = None;
    let mut held: HashSet<String> = HashSet::new();
    for (k, s) in super::support::sentences(content).into_iter().enumerate() {
        // A bracket (a date resolved, a photo described) is not the
        // speaker's words: a quote may leave it out.
        let w = content_words(&unbracketed(&s));
        if w.is_empty() {
            continue;
        }
        let inside = w.iter().filter(|x| q.contains(*x)).count();
        if inside as f32 >= MIN_SENTENCE * w.len() as f32 {
            held.extend(words(&s));
            // Sentences apart in the message are shown apart: "A. … C."
            if let Some(l) = last {
                found.push_str(if k == l + 1 { " " } else { " … " });
            }
            found.push_str(&s);
            last = Some(k);
        }
    }
    let share = q.iter().filter(|x| held.contains(*x)).count() as f32 / q.len() as f32;
    (!found.is_empty()).then_some((found, share))
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
