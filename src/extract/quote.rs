//! Quoted memories (`[llm] memories = "quoted"`, the default): the model
//! picks what is worth remembering and copies its words; the system writes
//! the memory. Each memory is whole sentences of one message, found again
//! in that message word for word, named with who said it (the message's
//! role and `name`) and when (its `ts`, relative times resolved):
//!
//! ```text
//! Audrey (the user) said on 2023-03-27: "Their names are Pepper, Precious and Panda."
//! ```
//!
//! A small model that writes its own sentences recombines true words into
//! false facts and gives one speaker's facts to the other; a copied and
//! re-found quote cannot, and who said it comes from the message, not from
//! the model. What the model still decides (which sentences, the kind, the
//! topic) is checked: a profile or preference is the user's own words, an
//! entity is named by its quote or speaks it, a quote must state something
//! (questions, greetings and thanks are not kept).

use super::chat::{says_something, statements_only, too_few_facts, topic_of};
use super::line::{locate, picked_part, quoted, statement, words};
use super::{Candidate, Conversation, Kind};
use serde_json::{json, Value};
use std::collections::HashSet;

/// Share of the quote's words the sentences found must hold: a quote may
/// drop a word or a bracketed date, not invent a clause.
const MIN_COVER: f32 = 0.75;
/// Characters of one quote line's quoted words: a longer run of sentences
/// is cut, marked with "…" (its message stays whole in the inbox).
pub const MAX_QUOTE_CHARS: usize = 1200;
pub const SYSTEM: &str = "You pick, from a conversation, what is worth remembering in later conversations, \
and copy it word for word. \
Worth remembering: facts about the speakers and the people, pets, places and things in their lives \
(names, jobs, family, where they live, what they have, did or plan to do and when, what they like or dislike, \
and for an assistant's work, problems solved and how). \
Not worth it: greetings, thanks, compliments, small talk, questions, and what is only true during this conversation. \
For each memory give: quote, one or two whole sentences copied exactly from one message that state \
the fact; kind; topic. Kinds:\n\
- profile: who the user is (name, job, where they live, family), from the user's own messages.\n\
- preference: what the user likes, dislikes or wants, from the user's own messages; topic = the subject.\n\
- entity: another person, a pet, project, company or place; topic = its name.\n\
- event: something that happened or is planned; topic = a short title.\n\
- case: a problem the assistant solved for the user and how.\n\
- pattern: a way of working that worked well with this user.\n\
- skill: a procedure the assistant can repeat; topic = the procedure's name.";

const EXAMPLE_USER: &str =
    "[0] Dana (user): hey Ruth! big news, I switched jobs, I teach chemistry in Leeds now.\n\
[1] Ruth (assistant): Dana! congrats! I'm still a pharmacist at the hospital.\n\
[2] Dana (user): I hate long emails, keep replies short. My cat Miso is sick, vet visit on 3 May.\n\
[3] Ruth (assistant): Sorry to hear that. Short replies it is.";

fn example_answer() -> Value {
    json!({"memories": [
        {"quote": "I switched jobs, I teach chemistry in Leeds now.", "kind": "profile", "topic": "job"},
        {"quote": "I'm still a pharmacist at the hospital.", "kind": "entity", "topic": "Ruth"},
        {"quote": "I hate long emails, keep replies short.", "kind": "preference", "topic": "reply length"},
        {"quote": "My cat Miso is sick, vet visit on 3 May.", "kind": "event", "topic": "Miso's vet visit"}
    ]})
}

/// The chat messages of a quoting request for messages `range`.
pub fn request(conv: &Conversation, range: std::ops::Range<usize>) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": EXAMPLE_USER}),
        json!({"role": "assistant", "content": example_text()}),
        json!({"role": "user", "content": super::prompt::transcript_of(conv, range)}),
    ]
}

/// The worked example's answer as the model is shown it: each memory's
/// fields in the order the schema has it write them, quote first (the
/// model picks the words, then says what they are).
fn example_text() -> String {
    super::llm::in_order(&example_answer(), &super::llm::required_order(&schema()))
}

/// The same request without its worked example: asked when the answer to
/// [`request`] quoted nothing of the conversation (a small model may copy
/// the example's answer instead of reading the transcript).
pub fn request_without_example(conv: &Conversation, range: std::ops::Range<usize>) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": super::prompt::transcript_of(conv, range)}),
    ]
}

/// Did the answer keep nothing, with at least one quote found in no
/// message of `range`? Then it answered something else (copied the
/// example, or looped on a word), and is worth asking again.
pub fn quotes_nothing_said(v: &Value, conv: &Conversation, range: std::ops::Range<usize>) -> bool {
    let Ok((list, _)) = super::answer_items(v, "request") else {
        return false;
    };
    let Ok((found, dropped)) = candidates(v, conv, range) else {
        return false;
    };
    let unfound = dropped.iter().filter(|d| d.contains(UNFOUND)).count();
    !list.is_empty() && found.is_empty() && unfound > 0
}

/// Is the last of an answer's items a quote written before (the same
/// words)? A small model that writes one item again goes on repeating it.
pub fn repeats(items: &[Value]) -> bool {
    let Some((last, before)) = items.split_last() else {
        return false;
    };
    let key = |v: &Value| words(v["quote"].as_str().unwrap_or(""));
    let k = key(last);
    !k.is_empty() && before.iter().any(|b| key(b) == k)
}

/// How a drop says a quote is in no message.
const UNFOUND: &str = "says it word for word";

/// Tokens of a quoting request before its transcript.
pub fn overhead() -> usize {
    use crate::schema::estimate_tokens;
    estimate_tokens(SYSTEM) + estimate_tokens(EXAMPLE_USER) + estimate_tokens(&example_text()) + 64
}

/// The JSON schema of an answer: quotes, each with its kind and topic.
/// The answer names no message: the system finds each quote in the
/// window's messages (a field for the message's number made the 1.5B
/// model count through the messages one item each, repeating a quote
/// until `max_tokens` on sessions of 30 messages; BENCHMARKS' journal,
/// run I). (A schema that enumerates each message's sentences, so a
/// grammar lets the model quote nothing else, was tried too: its memories
/// were single sentences out of context and helped answers less; run H.)
pub fn schema() -> Value {
    let kinds: Vec<&str> = super::prompt::KINDS.iter().map(|k| k.as_str()).collect();
    json!({
        "type": "object",
        "properties": {
            "memories": {
                "type": "array",
                "maxItems": super::prompt::MAX_CANDIDATES,
                "items": {
                    "type": "object",
                    "properties": {
                        "quote": {"type": "string", "maxLength": super::prompt::MAX_TEXT},
                        "kind": {"type": "string", "enum": kinds},
                        "topic": {"type": "string", "maxLength": 40}
                    },
                    "required": ["quote", "kind", "topic"]
                }
            }
        },
        "required": ["memories"]
    })
}

/// Does `topic` occur in `text` as a proper name (each of its words
/// there capitalised: "Fox Hollow", not "job")?
fn names_proper(text: &str, topic: &str) -> bool {
    let caps: HashSet<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
        .map(str::to_lowercase)
        .collect();
    let n = words(topic);
    !n.is_empty() && n.iter().all(|w| caps.contains(w))
}

/// Does `name` (a topic) occur in `text` as words?
fn names(text: &str, name: &str) -> bool {
    let t: HashSet<String> = words(text).into_iter().collect();
    let n = words(name);
    !n.is_empty() && n.iter().all(|w| t.contains(w))
}

/// Does the model's `topic` say only what its quote does? A node is named
/// by its topic, and a small model's topic may name someone or something
/// no message says ("Sam's new boat" over Lee's words about a lake). Each
/// speaker the topic names must speak the quote or be named in it; and a
/// topic that names a speaker must hold one of the quote's other words
/// (stemmed): "Lee's death" is not a title for Lee's words about an aunt.
/// A topic naming no speaker is the model's subject ("dogs", "job").
fn topic_holds(topic: &str, span: &str, speaker: Option<&str>, speakers: &HashSet<&str>) -> bool {
    use crate::schema::words::terms;
    let set = |t: &str| -> HashSet<String> { terms(t).into_iter().collect() };
    let quote = set(span);
    let said_by = speaker.map(set).unwrap_or_default();
    let names: HashSet<String> = speakers.iter().flat_map(|s| terms(s)).collect();
    let (mut named, mut other, mut shared) = (false, 0, 0);
    // One-letter terms are a possessive's "s".
    for t in terms(topic).into_iter().filter(|t| t.chars().count() > 1) {
        if names.contains(&t) {
            if !said_by.contains(&t) && !quote.contains(&t) {
                return false;
            }
            named = true;
        } else {
            other += 1;
            shared += usize::from(quote.contains(&t));
        }
    }
    !named || other == 0 || shared > 0
}

/// Does `topic` name only what the conversation says? Each word it
/// capitalises (a name: "Ruth", "Max's pet day") must be a word of some
/// message or speaker's name (`said`: their stemmed terms), and a topic the
/// worked example gave ("reply length", "Ruth") must share a word with its
/// own message or its speaker's name (`message`): a small model copies the
/// example's names and titles onto words that never say them.
fn topic_said(topic: &str, said: &HashSet<String>, message: &HashSet<String>) -> bool {
    use crate::schema::words::terms;
    let names_said = topic
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
        .flat_map(terms)
        .all(|t| said.contains(&t));
    let from_example = example_answer()["memories"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["topic"].as_str())
        .any(|t| t.eq_ignore_ascii_case(topic.trim()));
    names_said && (!from_example || terms(topic).iter().any(|t| message.contains(t)))
}

/// Check the model's `{"memories": [{message, quote, kind, topic}]}`
/// against messages `range` of the conversation: each quote found again in
/// its message (or, when the model numbered it wrong, in the one message
/// of the range that holds it), made a memory line; what is dropped says why.
pub fn candidates(
    v: &Value,
    conv: &Conversation,
    range: std::ops::Range<usize>,
) -> Result<(Vec<Candidate>, Vec<String>), String> {
    let (list, mut dropped) = super::answer_items(v, "request")?;
    let mut out = Vec::new();
    let speakers: HashSet<&str> = conv
        .messages
        .iter()
        .filter_map(|m| m.name.as_deref())
        .collect();
    let terms_of =
        |text: &str| -> HashSet<String> { crate::schema::words::terms(text).into_iter().collect() };
    let in_conv: HashSet<String> = conv
        .messages
        .iter()
        .flat_map(|m| [m.content.as_str(), m.name.as_deref().unwrap_or("")])
        .flat_map(crate::schema::words::terms)
        .collect();
    for (n, m) in list.iter().enumerate() {
        let quote = m["quote"].as_str().unwrap_or("").trim();
        let topic = m["topic"].as_str().unwrap_or("").trim().to_string();
        let Ok(mut kind) = serde_json::from_value::<Kind>(m["kind"].clone()) else {
            dropped.push(format!("memory {n}: unknown kind {}", m["kind"]));
            continue;
        };
        if quote.is_empty() {
            dropped.push(format!("memory {n}: empty quote"));
            continue;
        }
        let said = m["message"].as_u64().map(|x| x as usize);
        let at = |i: usize| {
            locate(quote, &conv.messages[i].content)
                .filter(|(_, share)| *share >= MIN_COVER)
                .map(|(span, share)| (i, span, share))
        };
        // The range's best holder (the schema asks for no message number:
        // one an answer names anyway is tried first).
        let hit = said.filter(|i| range.contains(i)).and_then(at).or_else(|| {
            range
                .clone()
                .filter_map(at)
                .max_by(|a, b| a.2.total_cmp(&b.2))
        });
        let Some((i, span, _)) = hit else {
            dropped.push(format!(
                "memory {n} ({}): no message{} {UNFOUND}",
                crate::schema::excerpt(quote),
                said.map(|i| format!(" (it named {i})")).unwrap_or_default()
            ));
            continue;
        };
        let span = crate::schema::clip(&statements_only(&span, &speakers), MAX_QUOTE_CHARS);
        if too_few_facts(&span) || !says_something(&span, &speakers) {
            dropped.push(format!(
                "memory {n} ({}): a question or small talk, no fact",
                crate::schema::excerpt(quote)
            ));
            continue;
        }
        let msg = &conv.messages[i];
        let mut topic = topic;
        // What the other side says of itself is theirs: a profile,
        // preference or entity from their message goes to the entity of
        // their name (unless its quote names it: "Fox Hollow"); a profile or
        // preference of a speaker with no name is dropped.
        if msg.role != "user"
            && (matches!(kind, Kind::Profile | Kind::Preference)
                || (kind == Kind::Entity && !names_proper(&span, &topic)))
        {
            match &msg.name {
                Some(name) => {
                    kind = Kind::Entity;
                    topic = name.clone();
                }
                None if kind != Kind::Entity => {
                    dropped.push(format!(
                        "memory {n} ({}): a {} from message {i}, which the user did not write",
                        crate::schema::excerpt(quote),
                        kind.as_str()
                    ));
                    continue;
                }
                None => {}
            }
        }
        // An entity that is one of the speakers is named by its quote or
        // speaks it: no one's words are filed under the other.
        if kind == Kind::Entity
            && speakers.iter().any(|s| names(s, &topic))
            && !names(&span, &topic)
            && !msg.name.as_deref().is_some_and(|s| names(s, &topic))
        {
            dropped.push(format!(
                "memory {n} ({}): the entity {topic:?} is neither named in it nor its speaker",
                crate::schema::excerpt(quote)
            ));
            continue;
        }
        let text = statement(conv, i, &span);
        // The same words picked again (under another kind or topic: a
        // small model repeats an item until its list is full) are one memory.
        if out.iter().any(|c: &Candidate| c.text == text) {
            dropped.push(format!(
                "memory {n} ({}): picked twice",
                crate::schema::excerpt(quote)
            ));
            continue;
        }
        // A topic that names nothing (empty, or a kind's name), or says
        // what its quote does not, is the quote's first words that can
        // carry a fact.
        if !topic_holds(&topic, &span, msg.name.as_deref(), &speakers)
            || !topic_said(
                &topic,
                &in_conv,
                &terms_of(&format!(
                    "{} {}",
                    msg.name.as_deref().unwrap_or(""),
                    msg.content
                )),
            )
        {
            topic.clear();
        }
        if topic.is_empty()
            || super::prompt::KINDS
                .iter()
                .any(|k| topic.eq_ignore_ascii_case(k.as_str()))
        {
            topic = topic_of(picked_part(quote, &span));
        }
        out.push(Candidate {
            kind,
            topic,
            text,
            messages: vec![i],
        });
    }
    Ok((out, dropped))
}

/// A merge without a model: `old`'s lines, then each line of `new` whose
/// quote `old` does not hold yet; `None` when every one is there. A new
/// line that holds an old line's whole quote (more sentences of the same
/// message) takes that line's place: no sentence is kept twice.
pub fn merge(old: &str, new: &str) -> Option<(String, usize)> {
    let mut lines: Vec<String> = old.trim_end().lines().map(str::to_string).collect();
    let mut added = 0;
    for l in new.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let q = quoted(l);
        if lines.iter().any(|o| quoted(o).contains(&q)) {
            continue;
        }
        // The old lines this one holds whole go; it takes the first one's place.
        let held: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                let oq = quoted(o);
                o.contains(": \"") && !oq.trim().is_empty() && q.contains(&oq)
            })
            .map(|(i, _)| i)
            .collect();
        match held.first() {
            Some(&first) => {
                lines[first] = l.to_string();
                for &i in held[1..].iter().rev() {
                    lines.remove(i);
                }
            }
            None => lines.push(l.to_string()),
        }
        added += 1;
    }
    (added > 0).then(|| (lines.join("\n"), added))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::line::speaker;
    use crate::extract::Message;

    fn m(role: &str, name: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            ts: Some(json!("2023-05-08T13:56:00Z")),
            name: Some(name.into()),
        }
    }

    fn conv() -> Conversation {
        Conversation {
            messages: vec![
                m("user", "Audrey", "Hey Andrew! We adopted another puppy called Pixie. Isn't she cute?"),
                m("assistant", "Andrew", "Congrats! I started a new job as a Financial Analyst last week [week of 2023-05-01]."),
                m("user", "Audrey", "Thanks! See you soon!"),
                m("user", "Audrey", "I've had them for 3 years! Their names are Pepper, Precious and Panda."),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_topic_says_only_what_its_quote_does() {
        let speakers: HashSet<&str> = ["Maya", "Tom"].into_iter().collect();
        let holds =
            |topic: &str, span: &str, by: &str| topic_holds(topic, span, Some(by), &speakers);
        // Named in the quote, or its speaker; and the quote's own words.
        assert!(holds(
            "Miso's vet visit",
            "My cat Miso is sick, vet visit on 3 May.",
            "Tom"
        ));
        assert!(holds(
            "reply length",
            "I hate long emails, keep replies short.",
            "Tom"
        ));
        assert!(holds(
            "Tom",
            "I'm still a pharmacist at the hospital.",
            "Tom"
        ));
        assert!(holds(
            "job",
            "I switched jobs, I teach chemistry in Leeds now.",
            "Maya"
        ));
        // The other speaker, who neither says nor is named in it.
        assert!(!holds(
            "Maya's eagles",
            "Eagles mesmerize me, so majestic.",
            "Tom"
        ));
        assert!(!holds(
            "Maya's new boat",
            "We walked around the lake all day.",
            "Tom"
        ));
        // The speaker, with a word the quote does not hold.
        assert!(!holds(
            "Tom's death",
            "My mother passed away last year.",
            "Tom"
        ));
        assert!(holds(
            "Tom's mother",
            "My mother passed away last year.",
            "Tom"
        ));
        // Naming no speaker, a topic is the model's subject.
        assert!(holds(
            "dogs",
            "Their names are Pepper, Precious and Panda.",
            "Tom"
        ));
        assert!(holds("Pepper", "She is so playful.", "Tom"));
    }

    #[test]
    fn a_pick_made_twice_is_one_memory_and_a_kind_is_no_topic() {
        let c = conv();
        let item = |kind: &str, topic: &str| json!({"quote": "Their names are Pepper, Precious and Panda.", "kind": kind, "topic": topic});
        let (found, dropped) = candidates(
            &json!({"memories": [item("entity", "entity"), item("preference", "dogs"), item("event", "")]}),
            &c,
            0..c.messages.len(),
        )
        .unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].topic, "names pepper precious");
        assert_eq!(dropped.len(), 2, "{dropped:?}");
        assert!(
            dropped.iter().all(|d| d.ends_with("picked twice")),
            "{dropped:?}"
        );
    }

    #[test]
    fn a_topic_names_only_what_the_conversation_says() {
        let c = conv();
        let quote = "Their names are Pepper, Precious and Panda.";
        let topic_for = |topic: &str| {
            let item = json!({"quote": quote, "kind": "entity", "topic": topic});
            let (found, _) =
                candidates(&json!({"memories": [item]}), &c, 0..c.messages.len()).unwrap();
            found[0].topic.clone()
        };
        // The worked example's names and titles, copied onto words that
        // never say them, name nothing.
        assert_eq!(topic_for("Ruth"), "names pepper precious");
        assert_eq!(topic_for("reply length"), "names pepper precious");
        assert_eq!(topic_for("Max's dogs"), "names pepper precious");
        // A name another message of the conversation says, a subject in
        // the model's words, an example's title its message holds.
        assert_eq!(topic_for("Pixie's sisters"), "Pixie's sisters");
        assert_eq!(topic_for("dog names"), "dog names");
        assert_eq!(topic_for("Puppy names"), "Puppy names");
        // The example's own topics hold over the example.
        let mut example = Conversation::default();
        for line in EXAMPLE_USER.lines() {
            let (head, text) = line.split_once("): ").unwrap();
            let (name, role) = head[4..].split_once(" (").unwrap();
            example.messages.push(m(role, name, text));
        }
        let (found, dropped) = candidates(&example_answer(), &example, 0..4).unwrap();
        assert!(dropped.is_empty(), "{dropped:?}");
        let topics: Vec<_> = found.iter().map(|c| c.topic.as_str()).collect();
        assert_eq!(topics, ["job", "Ruth", "reply length", "Miso's vet visit"]);
    }

    #[test]
    fn the_model_is_shown_the_quote_first() {
        let order = crate::extract::llm::required_order(&schema());
        assert_eq!(order, ["memories", "quote", "kind", "topic"]);
        let text = example_text();
        assert!(
            text.starts_with(r#"{"memories":[{"quote":"I switched jobs"#),
            "{text}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            example_answer()
        );
        let sent = crate::extract::llm::in_order(&schema(), &order);
        let (q, k) = (
            sent.find(r#""quote":{"#).unwrap(),
            sent.find(r#""kind":{"#).unwrap(),
        );
        assert!(q < k, "{sent}");
    }

    #[test]
    fn the_answer_names_no_message() {
        let item = &schema()["properties"]["memories"]["items"];
        assert_eq!(item["required"], json!(["quote", "kind", "topic"]));
        assert!(item["properties"].get("message").is_none());
        assert!(example_answer()["memories"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.get("message").is_none()));
    }

    fn one(v: Value) -> (Vec<Candidate>, Vec<String>) {
        let c = conv();
        candidates(&json!({ "memories": [v] }), &c, 0..c.messages.len()).unwrap()
    }

    #[test]
    fn a_quote_becomes_its_messages_own_words_with_speaker_and_day() {
        let (c, d) = one(json!({"quote": "we adopted another puppy called Pixie",
                               "kind": "event", "topic": "new puppy"}));
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(
            c[0].text,
            "Audrey (the user) said on 2023-05-08: \"We adopted another puppy called Pixie.\""
        );
        assert_eq!(c[0].messages, [0]);
    }

    #[test]
    fn a_wrong_message_number_is_found_again_and_invented_words_are_not() {
        let (c, _) = one(json!({"message": 0, "quote": "Pepper, Precious and Panda.",
                               "kind": "entity", "topic": "Pepper"}));
        assert_eq!(c[0].messages, [3]);
        // Part of a sentence quoted takes the sentence whole, and the one
        // before, which "Their" leans on.
        assert!(
            c[0].text.ends_with(
                ": \"I've had them for 3 years! Their names are Pepper, Precious and Panda.\""
            ),
            "{}",
            c[0].text
        );
        // Recombined: true words, a fact no message says.
        let (c, d) = one(
            json!({"message": 0, "quote": "Pixie and Pepper adopted a puppy called Panda.",
                               "kind": "event", "topic": "puppy"}),
        );
        assert!(c.is_empty(), "{c:?}");
        assert!(d[0].contains("word for word"), "{d:?}");
    }

    #[test]
    fn the_other_speakers_facts_stay_theirs_and_chat_is_not_kept() {
        // A "profile" in Andrew's words is Andrew's, as an entity.
        let (c, _) = one(
            json!({"message": 1, "quote": "I started a new job as a Financial Analyst last week.",
                               "kind": "profile", "topic": "job"}),
        );
        assert_eq!(c[0].kind, Kind::Entity);
        assert_eq!(c[0].topic, "Andrew");
        assert!(
            c[0].text
                .starts_with("Andrew said on 2023-05-08: \"I started"),
            "{}",
            c[0].text
        );
        assert!(c[0].text.contains("[week of 2023-05-01]"), "{}", c[0].text);
        // A question between two statements is cut, and the cut shown.
        assert_eq!(
            statements_only("I love it. Do you? We go every week.", &HashSet::new()),
            "I love it. … We go every week."
        );
        assert_eq!(
            locate(
                "I love it. We go every week.",
                "I love it. Do you? We go every week."
            )
            .unwrap()
            .0,
            "I love it. … We go every week."
        );
        // Thanks and goodbyes; a question alone.
        for (i, q) in [(2, "See you soon!"), (0, "Isn't she cute?")] {
            let (c, d) = one(json!({"message": i, "quote": q, "kind": "event", "topic": "x"}));
            assert!(c.is_empty(), "{q}: {c:?}");
            assert!(d[0].contains("no fact"), "{d:?}");
        }
        // An entity its quote does not name, said by someone else.
        let (c, d) = one(
            json!({"message": 0, "quote": "We adopted another puppy called Pixie.",
                               "kind": "entity", "topic": "Andrew"}),
        );
        assert!(c.is_empty() && d[0].contains("neither named"), "{d:?}");
        // A subject that is no name files the quote under it.
        let (c, _) = one(
            json!({"message": 3, "quote": "Their names are Pepper, Precious and Panda.",
                               "kind": "entity", "topic": "dogs"}),
        );
        assert_eq!(c[0].topic, "dogs");
        // The other side's subject is theirs.
        let (c, _) = one(
            json!({"message": 1, "quote": "I started a new job as a Financial Analyst.",
                               "kind": "entity", "topic": "job"}),
        );
        assert_eq!((c[0].kind, c[0].topic.as_str()), (Kind::Entity, "Andrew"));
    }

    #[test]
    fn without_names_the_roles_speak() {
        let mut c = conv();
        for m in &mut c.messages {
            m.name = None;
        }
        assert_eq!(speaker(&c, 0), "The user");
        assert_eq!(speaker(&c, 1), "The other speaker");
        c.agent = Some("helper".into());
        assert_eq!(speaker(&c, 1), "The assistant");
        // A preference from the other side has no owner to give it to.
        let (got, d) = candidates(
            &json!({"memories": [{"message": 1, "quote": "I started a new job as a Financial Analyst.",
                                   "kind": "preference", "topic": "job"}]}),
            &c,
            0..4,
        )
        .unwrap();
        assert!(got.is_empty() && d[0].contains("did not write"), "{d:?}");
    }

    #[test]
    fn a_described_photo_in_the_quote_is_no_invented_word() {
        let mut c = conv();
        c.messages[3]
            .content
            .push_str(" [shares a photo: two dogs on a lawn]");
        let (got, d) = candidates(
            &json!({"memories": [{"message": 3, "kind": "event", "topic": "dogs",
                "quote": "I can't live without them! [shares a photo: two dogs on a lawn]"}]}),
            &c,
            0..4,
        )
        .unwrap();
        assert!(got.is_empty(), "no sentence says it: {got:?} {d:?}");
        let (got, _) = candidates(
            &json!({"memories": [{"message": 3, "kind": "event", "topic": "dogs",
                "quote": "Their names are Pepper, Precious and Panda. [shares a photo: two dogs on a lawn]"}]}),
            &c,
            0..4,
        )
        .unwrap();
        assert!(got[0].text.contains("Panda."), "{got:?}");
    }

    #[test]
    fn an_answer_quoting_only_the_example_is_asked_again() {
        let c = conv();
        let n = c.messages.len();
        // The worked example's own answer: nothing of this conversation.
        assert!(quotes_nothing_said(&example_answer(), &c, 0..n));
        // One real quote among the example's: kept, not asked again.
        let mut mixed = example_answer();
        let real = c.messages[0].content.clone();
        mixed["memories"]
            .as_array_mut()
            .unwrap()
            .push(json!({"message": 0, "quote": real, "kind": "event", "topic": "x"}));
        assert!(!quotes_nothing_said(&mixed, &c, 0..n));
        // The example's quotes beside a loop on a name (seen on a real
        // session): nothing kept, asked again.
        let mut looped = example_answer();
        for _ in 0..12 {
            looped["memories"].as_array_mut().unwrap().push(
                json!({"message": 0, "quote": "Andrew", "kind": "entity", "topic": "Andrew"}),
            );
        }
        assert!(quotes_nothing_said(&looped, &c, 0..n));
        // Nothing picked, or only small talk picked: nothing to ask again.
        assert!(!quotes_nothing_said(&json!({"memories": []}), &c, 0..n));
        let chat = json!({"memories": [{"message": 0, "quote": "Thanks!", "kind": "event", "topic": "x"}]});
        assert!(!quotes_nothing_said(&chat, &c, 0..n));
        let again = request_without_example(&c, 0..n);
        assert_eq!(again.len(), 2);
        assert!(!again
            .iter()
            .any(|m| m["content"].as_str().unwrap_or("").contains("Miso")));
    }

    #[test]
    fn a_quote_written_again_stops_the_answer() {
        let q = |t: &str| json!({"quote": t, "kind": "event", "topic": "x"});
        assert!(!repeats(&[]));
        assert!(!repeats(&[q("I sail.")]));
        assert!(!repeats(&[q("I sail."), q("I swim.")]));
        // The same words under another kind or case are the same quote.
        let again = json!({"quote": "i SAIL", "kind": "profile", "topic": "y"});
        assert!(repeats(&[q("I sail."), q("I swim."), again]));
        assert!(!repeats(&[q(""), q("")]), "an empty quote is no loop");
    }

    #[test]
    fn a_merge_adds_only_new_quotes() {
        let old = "A said on 2023-05-08: \"x y z\"";
        assert_eq!(merge(old, "A said on 2023-06-01: \"x y z\""), None);
        let (text, n) = merge(old, "A said on 2023-06-01: \"new words\"").unwrap();
        assert_eq!(n, 1);
        assert_eq!(text, format!("{old}\nA said on 2023-06-01: \"new words\""));
        assert_eq!(quoted(&text), "x y z\nnew words");
        // A quote inside an old one adds nothing; one holding old ones
        // takes their place.
        let old = "# Audrey\n\nA said on 2023-03-27: \"I can't live without them!\"\nA said on 2023-03-28: \"Other.\"";
        assert_eq!(
            merge(old, "A said on 2023-03-27: \"live without them\""),
            None
        );
        let (text, n) = merge(
            old,
            "A said on 2023-03-27: \"Their names are Pepper and Panda. I can't live without them!\"",
        )
        .unwrap();
        assert_eq!(n, 1);
        assert_eq!(
            text,
            "# Audrey\n\nA said on 2023-03-27: \"Their names are Pepper and Panda. I can't live without them!\"\nA said on 2023-03-28: \"Other.\""
        );
    }
}
