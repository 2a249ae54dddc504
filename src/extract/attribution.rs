//! Who said what: a candidate memory's citation grounded in the messages
//! that hold its words, its sources (whose messages a profile, preference,
//! entity or event may draw on), and the checks that drop a sentence no
//! source says or that gives one speaker's facts to the other.

use super::{policy, prompt, support, Candidate, Conversation, Kind, Message};
use std::collections::HashSet;

/// Point a candidate at the messages its words are in. Small models cite
/// the wrong message often (the assistant's reply after the user's words,
/// a neighbour): a cited message that shares no subject word with the
/// memory is dropped, and the messages sharing the most are added (a
/// memory drawn from two messages, one cited, keeps both). Memories about
/// the user come from the user's messages when any of them holds the
/// words. A memory whose words are in no message keeps the model's
/// citation.
pub fn ground(c: &mut Candidate, conv: &Conversation) {
    let words = policy::subject_words(&c.text);
    let overlap: Vec<usize> = conv
        .messages
        .iter()
        .map(|m| {
            policy::subject_words(&m.content)
                .intersection(&words)
                .count()
        })
        .collect();
    // An entity may be the other speaker, whose words are theirs.
    let about_user = matches!(c.kind, Kind::Profile | Kind::Preference | Kind::Event);
    let mut pool: Vec<usize> = (0..overlap.len()).filter(|&i| overlap[i] > 0).collect();
    if about_user && pool.iter().any(|&i| conv.messages[i].role == "user") {
        pool.retain(|&i| conv.messages[i].role == "user");
    }
    if pool.is_empty() {
        return;
    }
    let cited: Vec<usize> = c
        .messages
        .iter()
        .copied()
        .filter(|i| pool.contains(i))
        .collect();
    let best = pool.iter().map(|&i| overlap[i]).max().unwrap_or(0);
    let mut messages = cited;
    messages.extend(pool.into_iter().filter(|&i| overlap[i] == best));
    messages.sort_unstable();
    messages.dedup();
    c.messages = messages;
}

/// The names (lower case) the user's messages (`by_user`) or the other
/// speaker's call the one they talk to (`support::vocatives`).
fn names_called(conv: &Conversation, by_user: bool) -> HashSet<String> {
    conv.messages
        .iter()
        .filter(|m| (m.role == "user") == by_user)
        .flat_map(|m| support::vocatives(&m.content))
        .map(|n| n.to_lowercase())
        .collect()
}

/// The lower-case alphanumeric words of `texts`.
fn words_of<'a>(texts: impl IntoIterator<Item = &'a str>) -> HashSet<String> {
    texts
        .into_iter()
        .flat_map(|t| t.split(|ch: char| !ch.is_alphanumeric()))
        .map(str::to_lowercase)
        .collect()
}

/// Why an entity candidate is the user under another name, if it is: its
/// topic is a name the other speaker calls the user by ("Priya! good to
/// see you") and the user calls no one so. A small model given a chat of
/// two people makes the user a friend of themselves.
pub fn entity_is_the_user(c: &Candidate, conv: &Conversation) -> Option<String> {
    if c.kind != Kind::Entity {
        return None;
    }
    let topic = c.topic.trim().to_lowercase();
    (names_called(conv, false).contains(&topic) && !names_called(conv, true).contains(&topic)).then(
        || {
            format!(
                "the entity {:?} is the user: the other speaker calls the user so",
                c.topic
            )
        },
    )
}

/// The texts a candidate may draw on: its cited messages (a profile only
/// the user's own: it describes its user, not the other party).
fn source_texts(c: &Candidate, conv: &Conversation) -> Vec<String> {
    let mut out: Vec<String> = c
        .messages
        .iter()
        .filter_map(|&i| conv.messages.get(i))
        .filter(|m| c.kind != Kind::Profile || m.role == "user")
        .map(|m| m.content.clone())
        .collect();
    if c.kind == Kind::Profile {
        // The other party calling the user by name ("Nice to meet you,
        // Caroline!") says the user's name; "I'm Mel" does not.
        let names: Vec<String> = conv
            .messages
            .iter()
            .filter(|m| m.role != "user")
            .flat_map(|m| support::vocatives(&m.content))
            .collect();
        if !names.is_empty() {
            out.push(names.join(" "));
        }
    }
    out
}

/// What a candidate may say: its cited messages (`source_texts`) and
/// `known`, the current text of the node it joins.
pub fn sources(c: &Candidate, conv: &Conversation, known: Option<&str>) -> support::Sources {
    let mut texts = source_texts(c, conv);
    texts.extend(known.map(str::to_string));
    let mut s = support::Sources::new(texts.iter().map(String::as_str));
    // The worked examples' names, places and jobs, unless this
    // conversation (or the node's version) says them: a small model copies
    // them ("a pharmacist") into sentences whose other words are true.
    let said = words_of(
        conv.messages
            .iter()
            .map(|m| m.content.as_str())
            .chain(known),
    );
    s.forbid(
        prompt::EXAMPLE_MARKERS
            .iter()
            .copied()
            .filter(|w| !said.contains(*w)),
        "a word of the prompt's worked example, which the conversation does not say",
    );
    // The other speaker's "my son Maya" is not the user's son.
    let (user, other): (Vec<&Message>, Vec<&Message>) =
        conv.messages.iter().partition(|m| m.role == "user");
    s.forbid_their_relations(
        other.iter().map(|m| m.content.as_str()),
        user.iter().map(|m| m.content.as_str()).chain(known),
    );
    if c.kind == Kind::Profile {
        // A name the user greets is the other speaker's ("hey Sam!"),
        // unless the other speaker calls the user so too or the profile
        // already says it.
        let (greeted, greeting) = (names_called(conv, true), names_called(conv, false));
        let known_words = words_of(known);
        s.forbid(
            greeted
                .iter()
                .filter(|n| !greeting.contains(*n) && !known_words.contains(*n))
                .map(String::as_str),
            "the name the user calls the other speaker, not the user's",
        );
    }
    s
}

/// Why `sentence` gives one speaker what the other said of themselves,
/// if it does. It is about the other speaker when it opens with a name the
/// user greets ("Audrey is a financial analyst"), else about the user when
/// it names the user ("The user ran a charity race", "Pepper and Panda are
/// the user's dogs"); it is misattributed when a message of the *other* side
/// holds more of its subject words (the speakers' names aside) than any
/// message of its subject's side, and at least half of them: the other
/// said it of themselves ("I ran a charity race for ...", "I started a new
/// job as a Financial Analyst") and the subject only answered. A sentence
/// about the user that also names the one the user talks to is about both
/// and is not judged here.
pub fn misattributed(sentence: &str, conv: &Conversation) -> Option<String> {
    let low = sentence.trim_start().to_lowercase();
    let words = words_of([low.as_str()]);
    let greeted = names_called(conv, true);
    let greeting = names_called(conv, false);
    let first = low
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("");
    let subject_is_user = if greeted.contains(first) && !greeting.contains(first) {
        false
    } else if words.contains("user") {
        // "The user ran …", and "Pepper and Panda are the user's dogs".
        if greeted.iter().any(|n| words.contains(n)) {
            return None;
        }
        true
    } else {
        return None;
    };
    let names: HashSet<String> = greeted
        .iter()
        .chain(greeting.iter())
        .flat_map(|n| crate::schema::words::terms(n))
        .collect();
    let terms: HashSet<String> = crate::schema::words::terms(sentence)
        .into_iter()
        .filter(|t| t.len() > 1 && t != "user" && !names.contains(t))
        .collect();
    if terms.is_empty() {
        return None;
    }
    let held = |m: &Message| {
        crate::schema::words::terms(&m.content)
            .into_iter()
            .collect::<HashSet<_>>()
            .intersection(&terms)
            .count()
    };
    // The best message of the user's side (`user`) or the other's.
    let best = |user: bool| {
        conv.messages
            .iter()
            .enumerate()
            .filter(|(_, m)| (m.role == "user") == user)
            .map(|(i, m)| (held(m), i))
            .max()
            .unwrap_or((0, 0))
    };
    let ((theirs, i), (own, _)) = (best(!subject_is_user), best(subject_is_user));
    let (who, whom) = if subject_is_user {
        ("the other speaker", "the user's")
    } else {
        ("the user", "the other speaker's")
    };
    (theirs > own && theirs * 2 >= terms.len()).then(|| {
        format!(
            "{who} says it of themselves (message {i} holds {theirs} of its {} subject words, {whom} messages at most {own})",
            terms.len()
        )
    })
}

/// The candidate with only the sentences its sources support
/// (`support`): its cited messages (`source_texts`) and `known`, the
/// version of the node it would merge into (the user's name a profile
/// holds already). `None` when no sentence is left. Each sentence dropped
/// is said in `dropped`.
pub fn faithful(
    mut c: Candidate,
    conv: &Conversation,
    known: Option<&str>,
    dropped: &mut Vec<String>,
) -> Option<Candidate> {
    let (mut yes, mut no) = sources(&c, conv, known).split(&c.text);
    yes.retain(
        |s| match support::no_fact(s, &c.topic).or_else(|| misattributed(s, conv)) {
            Some(why) => {
                no.push((s.clone(), why));
                false
            }
            None => true,
        },
    );
    for (s, why) in &no {
        dropped.push(format!(
            "{} sentence {} is not supported by messages {:?}: {why}",
            c.kind.as_str(),
            crate::schema::excerpt(s),
            c.messages
        ));
    }
    if yes.is_empty() {
        return None;
    }
    if !no.is_empty() {
        c.text = yes.join(" ");
    }
    Some(c)
}
