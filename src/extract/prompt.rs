//! The prompts and the JSON schemas of their answers. Schemas bound every
//! array and string (`maxItems`, `maxLength`): a server that constrains
//! decoding to the schema (llama.cpp, vLLM, hosted APIs) then cannot run
//! away, and every answer is checked again here whatever the server did.

use super::{Conversation, Kind};
use serde_json::{json, Value};

/// Candidates one conversation may yield.
pub const MAX_CANDIDATES: usize = 16;
/// Characters of one memory's text.
pub const MAX_TEXT: usize = 400;

pub const EXTRACT_SYSTEM: &str = "You extract long-term memories from a conversation of the user with an AI assistant \
or with another person (a friend, a colleague). \
Keep only facts worth remembering in later conversations, each stated on its own, in the third person (\"The user ...\"). \
Only the user's own messages say who the user is: the other speaker's job, family and plans are theirs, not the user's. \
A name the user greets (\"hey Ruth!\") is the other speaker's; a name the other speaker greets the user with is the user's. \
Kinds:\n\
- profile: who the user is (name, job, where they live, family).\n\
- preference: what the user likes, dislikes or wants; topic = the subject (\"coffee\", \"code style\").\n\
- entity: a named person, pet, project, company or place in the user's life, not the user themselves \
(the user's own name, job and city are profile); the other speaker is one, with what they said about themselves; topic = its name.\n\
- event: something that happened or is planned, with its date if said (a date in brackets, \
[2026-03-14], is what the relative time before it means: write that date); topic = a short title.\n\
- case: a problem the assistant solved for the user and how.\n\
- pattern: a way of working that worked well with this user.\n\
- skill: a procedure the assistant can repeat, as steps; topic = the procedure's name.\n\
For each memory give the numbers of the messages it comes from. \
Skip greetings, small talk, general-knowledge questions and anything only true during this conversation. \
If a later message corrects an earlier one, keep only the corrected fact.";

/// The names, places and jobs of the worked examples (extraction and
/// merge): a memory may hold one only where the conversation says it.
pub const EXAMPLE_MARKERS: &[&str] = &[
    "dana",
    "ruth",
    "leeds",
    "chemistry",
    "pharmacist",
    "miso",
    "tom",
    "lyon",
    "paris",
    "paramedic",
    "nurse",
];

/// The worked example: two people, each greeting the other by name, each
/// with a job, so the model sees whose facts are whose.
const EXAMPLE_USER: &str =
    "[0] user: hey Ruth! big news, I switched jobs, I teach chemistry in Leeds now.\n\
[1] assistant: Dana! congrats! still a pharmacist here.\n\
[2] user: I hate long emails, keep replies short. My cat Miso is sick, vet visit on 3 May.\n\
[3] assistant: Sorry to hear that. Short replies it is.";

fn example_answer() -> Value {
    json!({"memories": [
        {"kind": "profile", "topic": "profile", "text": "The user is Dana, a chemistry teacher in Leeds.", "messages": [0, 1]},
        {"kind": "preference", "topic": "reply length", "text": "The user wants short replies and dislikes long emails.", "messages": [2]},
        {"kind": "entity", "topic": "Ruth", "text": "Ruth is a friend of the user and a pharmacist.", "messages": [0, 1]},
        {"kind": "entity", "topic": "Miso", "text": "Miso is the user's cat.", "messages": [2]},
        {"kind": "event", "topic": "vet visit", "text": "The user's cat Miso is sick and has a vet visit on 3 May.", "messages": [2]}
    ]})
}

/// The conversation as numbered lines (`[i] role: content`).
pub fn transcript(conv: &Conversation) -> String {
    transcript_of(conv, 0..conv.messages.len())
}

/// Messages `range` of the conversation as numbered lines, numbered as in
/// the whole conversation.
pub fn transcript_of(conv: &Conversation, range: std::ops::Range<usize>) -> String {
    let mut out = String::new();
    for (i, m) in conv
        .messages
        .iter()
        .enumerate()
        .take(range.end)
        .skip(range.start)
    {
        let ts = match &m.ts {
            Some(Value::String(s)) => format!(" ({s})"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "[{i}] {}{ts}: {}\n",
            m.speaker(),
            m.content.replace('\n', " ")
        ));
    }
    out
}

/// The chat messages of an extraction request.
pub fn extract_messages(conv: &Conversation) -> Vec<Value> {
    extract_window(conv, 0..conv.messages.len())
}

/// The chat messages of an extraction request for messages `range`.
pub fn extract_window(conv: &Conversation, range: std::ops::Range<usize>) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": EXTRACT_SYSTEM}),
        json!({"role": "user", "content": EXAMPLE_USER}),
        json!({"role": "assistant", "content": example_answer().to_string()}),
        json!({"role": "user", "content": transcript_of(conv, range)}),
    ]
}

pub use crate::schema::estimate_tokens;

/// Tokens of an extraction request before its transcript: the system
/// prompt, the worked example and the chat template's framing.
pub fn extract_overhead() -> usize {
    estimate_tokens(EXTRACT_SYSTEM)
        + estimate_tokens(EXAMPLE_USER)
        + estimate_tokens(&example_answer().to_string())
        + 64
}

/// The conversation cut into windows of whole consecutive messages, each
/// of whose extraction request fits `context` tokens with `answer` tokens
/// left for the reply: one window when it all fits. A message that cannot
/// fit even alone is an error naming it: nothing is ever cut silently.
pub fn windows(
    conv: &Conversation,
    context: usize,
    answer: usize,
    overhead: usize,
) -> Result<Vec<std::ops::Range<usize>>, String> {
    let room = context.saturating_sub(answer + overhead);
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0);
    for i in 0..conv.messages.len() {
        let t = estimate_tokens(&transcript_of(conv, i..i + 1));
        if t > room {
            return Err(format!(
                "message {i} alone is about {t} tokens, more than the {room} an extraction request \
                 has room for in the model's context of {context} tokens ([llm] context_tokens, \
                 with max_tokens {answer} for the answer): split the message"
            ));
        }
        if used + t > room {
            out.push(start..i);
            start = i;
            used = 0;
        }
        used += t;
    }
    if start < conv.messages.len() {
        out.push(start..conv.messages.len());
    }
    Ok(out)
}

/// Every kind, in the order the prompts name them.
pub const KINDS: [Kind; 7] = [
    Kind::Profile,
    Kind::Preference,
    Kind::Entity,
    Kind::Event,
    Kind::Case,
    Kind::Pattern,
    Kind::Skill,
];

pub fn extract_schema(n_messages: usize) -> Value {
    let kinds: Vec<&str> = KINDS.iter().map(|k| k.as_str()).collect();
    json!({
        "type": "object",
        "properties": {
            "memories": {
                "type": "array",
                "maxItems": MAX_CANDIDATES,
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": {"type": "string", "enum": kinds},
                        "topic": {"type": "string", "maxLength": 40},
                        "text": {"type": "string", "maxLength": MAX_TEXT},
                        "messages": {
                            "type": "array",
                            "maxItems": 8,
                            "items": {"type": "integer", "minimum": 0, "maximum": n_messages.saturating_sub(1)}
                        }
                    },
                    // The order the model writes them in (`llm::required_order`).
                    "required": ["kind", "messages", "text", "topic"]
                }
            }
        },
        "required": ["memories"]
    })
}

pub const MERGE_SYSTEM: &str = "You update one memory note about a user with new information from a later conversation. \
Rules: keep every fact of the note that the new information does not contradict; add new facts; \
when the new information contradicts a fact of the note (a new job, a new city, a changed preference), \
drop the old fact and write only the new one. Write short plain sentences. \
\"changed\" says in a few words what changed.";

const MERGE_EXAMPLE_USER: &str = "NOTE:\nThe user is Tom, a nurse in Lyon. Tom has two kids.\n\n\
NEW INFORMATION:\nThe user moved to Paris and works as a paramedic now.";

/// The chat messages of a merge request (with one worked example).
pub fn merge_messages(stored: &str, new: &str) -> Vec<Value> {
    let example = json!({
        "text": "The user is Tom, a paramedic in Paris. Tom has two kids.",
        "changed": "job nurse -> paramedic; city Lyon -> Paris"
    });
    vec![
        json!({"role": "system", "content": MERGE_SYSTEM}),
        json!({"role": "user", "content": MERGE_EXAMPLE_USER}),
        json!({"role": "assistant", "content": example.to_string()}),
        json!({"role": "user", "content": format!("NOTE:\n{}\n\nNEW INFORMATION:\n{}", stored.trim(), new.trim())}),
    ]
}

pub fn merge_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "text": {"type": "string", "maxLength": 2000},
            "changed": {"type": "string", "maxLength": 120}
        },
        "required": ["changed", "text"]
    })
}

pub const SUMMARY_SYSTEM: &str = "You summarise one directory of an AI agent's long-term memory for the agent, \
from the list of what the directory holds. Use only what the list says: add no name, place, date, number \
or fact that is not in it, and do not guess. Say \"the user\" for the person the memories are about \
(\"the agent\" in an agent's directory). \"abstract\" is one short line (at most 12 words) saying what \
the directory holds; \"overview\" is two to four short sentences with the most useful facts of the list first.";

/// The chat messages asking for the summary of the directory `dir`
/// (under `accounts/`), from its deterministic listing. No worked example:
/// a small model copies one into what it writes.
pub fn summary_messages(dir: &str, category: bool, listing: &str) -> Vec<Value> {
    let rel = dir.split_once('/').map(|(_, r)| r).unwrap_or(dir);
    let what = if category {
        "a category of memories"
    } else {
        "everything kept about one owner, by category"
    };
    vec![
        json!({"role": "system", "content": SUMMARY_SYSTEM}),
        json!({"role": "user", "content": format!("Directory: {rel} ({what})\n\n{}", listing.trim())}),
    ]
}

pub fn summary_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "abstract": {"type": "string", "maxLength": 100},
            "overview": {"type": "string", "maxLength": 700}
        },
        "required": ["abstract", "overview"]
    })
}

/// Texts equal but for case, spacing and punctuation.
pub fn same_text(a: &str, b: &str) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect()
    };
    norm(a) == norm(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::Message;

    #[test]
    fn a_long_conversation_is_cut_into_windows_of_whole_messages() {
        let msg = |i: usize| Message {
            role: if i.is_multiple_of(2) {
                "user"
            } else {
                "assistant"
            }
            .into(),
            content: format!("message {i} ") + &"word ".repeat(60),
            ts: None,
            name: None,
        };
        let conv = Conversation {
            messages: (0..40).map(msg).collect(),
            ..Default::default()
        };
        // All of it fits a large context: one window.
        assert_eq!(
            windows(&conv, 100_000, 1024, extract_overhead()).unwrap(),
            vec![0..40]
        );
        // A small one: consecutive windows covering every message once,
        // each request within the context.
        let w = windows(&conv, 4096, 1024, extract_overhead()).unwrap();
        assert!(w.len() > 1, "{w:?}");
        assert_eq!(w.first().unwrap().start, 0);
        assert_eq!(w.last().unwrap().end, 40);
        for pair in w.windows(2) {
            assert_eq!(pair[0].end, pair[1].start);
        }
        for r in &w {
            let request: usize = extract_window(&conv, r.clone())
                .iter()
                .map(|m| estimate_tokens(m["content"].as_str().unwrap()))
                .sum();
            assert!(request + 1024 <= 4096, "{r:?}: {request}");
            // Numbered as in the whole conversation.
            assert!(transcript_of(&conv, r.clone()).starts_with(&format!("[{}] ", r.start)));
        }
        // A message that cannot fit alone is named, not cut.
        let mut huge = conv.clone();
        huge.messages[7].content = "x".repeat(20_000);
        let e = windows(&huge, 4096, 1024, extract_overhead()).unwrap_err();
        assert!(e.contains("message 7"), "{e}");
    }

    #[test]
    fn transcript_numbers_messages() {
        let conv = Conversation {
            messages: vec![
                Message {
                    role: "user".into(),
                    content: "a\nb".into(),
                    ts: Some(json!("2026-05-01")),
                    name: None,
                },
                Message {
                    role: "assistant".into(),
                    content: "c".into(),
                    ts: None,
                    name: None,
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            transcript(&conv),
            "[0] user (2026-05-01): a b\n[1] assistant: c\n"
        );
        assert_eq!(extract_messages(&conv).len(), 4);
        assert_eq!(
            extract_schema(2)["properties"]["memories"]["items"]["properties"]["messages"]["items"]
                ["maximum"],
            1
        );
        // The example answer passes the same checks as a real one.
        let (c, dropped) = crate::extract::candidates(&example_answer(), 4).unwrap();
        assert_eq!((c.len(), dropped.len()), (5, 0));
        // Every marker is a word of an example.
        let examples = format!(
            "{EXAMPLE_USER} {} {MERGE_EXAMPLE_USER} {}",
            example_answer(),
            merge_messages("", "")[2]
        )
        .to_lowercase();
        for m in EXAMPLE_MARKERS {
            assert!(examples.contains(m), "{m}");
        }
        // ... and is true to its own conversation by the daemon's check.
        let lines: Vec<Value> = EXAMPLE_USER
            .lines()
            .map(|l| {
                let (role, text) = l.split_once("] ").unwrap().1.split_once(": ").unwrap();
                json!({"role": role, "content": text})
            })
            .collect();
        let conv = crate::extract::parse("x.json", &serde_json::to_vec(&lines).unwrap()).unwrap();
        let mut why = Vec::new();
        for cand in c {
            let text = cand.text.clone();
            let kept = crate::extract::faithful(cand, &conv, None, &mut why);
            assert_eq!(kept.map(|k| k.text), Some(text), "{why:?}");
        }
    }
}
