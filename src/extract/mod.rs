//! Memory from conversations (seed 002): a conversation file in
//! `users/{u}/inbox/` becomes candidate memories (an LLM extracts them) and
//! each candidate a decision (a merge policy places it: create, merge,
//! append or skip). This module holds the parts without state: parsing the
//! conversation, who said what (`attribution.rs`: grounding, sources and
//! the faithfulness checks), the prompts and their JSON schemas
//! (`prompt.rs`), the policies (`policy.rs`), and the chat-completions
//! client (`llm.rs`, the only I/O here). The core runs the jobs and commits the results.

mod attribution;
mod chat;
pub(crate) mod line;
pub mod llm;
pub mod policy;
pub mod prompt;
pub mod quote;
mod stated;
mod style;
pub mod support;
pub mod when;

pub use attribution::{entity_is_the_user, faithful, ground, misattributed, sources};
pub use style::{Answered, Style};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A conversation file holds at most this many bytes.
pub const MAX_CONVERSATION_BYTES: usize = 1 << 20;
/// And at most this many messages.
pub const MAX_MESSAGES: usize = 1000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<Value>,
    /// Who spoke (`"name"`, as in the chat-completions format): memories
    /// and search results name the speaker by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Bytes of a speaker's `name`.
pub const MAX_NAME: usize = 64;

impl Message {
    /// Who said it, for a reader: `Audrey (user)`, or the role alone.
    pub fn speaker(&self) -> String {
        match &self.name {
            Some(n) => format!("{n} ({})", self.role),
            None => self.role.clone(),
        }
    }
}

/// A conversation as written to the inbox.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Conversation {
    pub messages: Vec<Message>,
    /// The agent the conversation was with: its procedures go to `agents/{agent}/skills`.
    pub agent: Option<String>,
    pub session: Option<String>,
    /// `"searchable": false` (in the object form) keeps its messages out
    /// of the index.
    pub unsearchable: bool,
}

/// Is `name` a conversation file name (`NAME.json` or `NAME.jsonl`)?
pub fn is_conversation_name(name: &str) -> bool {
    let stem = name
        .strip_suffix(".jsonl")
        .or_else(|| name.strip_suffix(".json"));
    stem.is_some_and(|s| !s.is_empty() && !s.contains('.'))
}

/// `NAME` of `NAME.json` / `NAME.jsonl`.
pub fn stem(name: &str) -> &str {
    name.strip_suffix(".jsonl")
        .or_else(|| name.strip_suffix(".json"))
        .unwrap_or(name)
}

fn message_of(i: usize, v: &Value) -> Result<Message, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("message {i} is not a JSON object"))?;
    let role = obj
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("message {i} has no \"role\""))?;
    if role != "user" && role != "assistant" {
        return Err(format!(
            "message {i}: role must be \"user\" or \"assistant\", not {}",
            crate::schema::excerpt(role)
        ));
    }
    let content = obj
        .get("content")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("message {i} has no string \"content\""))?;
    let name = match obj.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(n)) => {
            let n = n.trim();
            if n.len() > MAX_NAME || n.chars().any(char::is_control) {
                return Err(format!(
                    "message {i}: \"name\" is at most {MAX_NAME} bytes with no control characters"
                ));
            }
            (!n.is_empty()).then(|| n.to_string())
        }
        Some(_) => return Err(format!("message {i}: \"name\" must be a string")),
    };
    Ok(Message {
        role: role.to_string(),
        content: content.to_string(),
        ts: obj.get("ts").cloned(),
        name,
    })
}

fn name_field(obj: &serde_json::Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            if key == "agent" {
                crate::schema::place::check_name(s).map_err(|e| format!("\"agent\": {e}"))?;
            } else if s.len() > 256 {
                return Err(format!("\"{key}\" is longer than 256 bytes"));
            }
            Ok(Some(s.clone()))
        }
        Some(_) => Err(format!("\"{key}\" must be a string")),
    }
}

/// The search index's events for a conversation's messages, one per
/// non-empty message: (message number, change); none for a conversation
/// marked `"searchable": false`. `redactor` is the account's, so no secret
/// it catches reaches the index or an embedder; `stored_ns` is the stored
/// conversation's time, its identity in the index.
pub fn message_changes(
    conv: &Conversation,
    redactor: Option<&crate::schema::redact::Redactor>,
    stored_ns: u64,
) -> Vec<(usize, crate::schema::event::Change)> {
    if conv.unsearchable {
        return Vec::new();
    }
    let mut before: Option<String> = None;
    let mut out = Vec::new();
    for (i, m) in conv.messages.iter().enumerate() {
        if m.content.trim().is_empty() {
            continue;
        }
        let ts = match &m.ts {
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_string()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let text = message_text(m, redactor);
        let change = crate::schema::event::Change::UpsertMessage {
            message: i as u32,
            role: m.role.clone(),
            ts,
            text: text.clone(),
            name: m.name.clone(),
            stored_ns: Some(stored_ns),
            before: before.take(),
        };
        before = Some(crate::schema::event::said_by(
            m.name.as_deref(),
            crate::schema::event::said_before(&text),
        ));
        out.push((i, change));
    }
    out
}

/// A message's text as search reads it: its relative times followed by
/// the day they mean (against its `ts`), redacted by `redactor`.
pub fn message_text(m: &Message, redactor: Option<&crate::schema::redact::Redactor>) -> String {
    let text = match m.ts.as_ref().and_then(when::day_of) {
        Some(day) => when::annotate(&m.content, day),
        None => m.content.clone(),
    };
    match redactor {
        Some(r) => r.redact_text(&text).0,
        None => text,
    }
}

/// Parse a conversation file: `NAME.json` holds `{"messages": [...],
/// "agent"?, "session"?}` (or a bare array of messages); `NAME.jsonl` one
/// message per line (a line may also carry `agent` / `session`).
pub fn parse(name: &str, bytes: &[u8]) -> Result<Conversation, String> {
    if bytes.len() > MAX_CONVERSATION_BYTES {
        return Err(format!(
            "a conversation holds at most {MAX_CONVERSATION_BYTES} bytes, not {}",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut conv = Conversation::default();
    if name.ends_with(".jsonl") {
        for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            let v: Value = serde_json::from_str(line)
                .map_err(|e| format!("line {} is not JSON: {e}", i + 1))?;
            if let Some(obj) = v.as_object() {
                if conv.agent.is_none() {
                    conv.agent = name_field(obj, "agent")?;
                }
                if conv.session.is_none() {
                    conv.session = name_field(obj, "session")?;
                }
                if !obj.contains_key("role") && !obj.contains_key("content") {
                    continue;
                }
            }
            conv.messages.push(message_of(conv.messages.len(), &v)?);
        }
    } else {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let list = match &v {
            Value::Array(a) => a,
            Value::Object(obj) => {
                conv.agent = name_field(obj, "agent")?;
                conv.session = name_field(obj, "session")?;
                conv.unsearchable = match obj.get("searchable") {
                    None | Some(Value::Bool(true)) => false,
                    Some(Value::Bool(false)) => true,
                    Some(_) => return Err("\"searchable\" is true or false".into()),
                };
                obj.get("messages")
                    .and_then(Value::as_array)
                    .ok_or("a conversation object needs a \"messages\" array")?
            }
            _ => return Err("a conversation is an object with \"messages\" or an array".into()),
        };
        for (i, m) in list.iter().enumerate() {
            conv.messages.push(message_of(i, m)?);
        }
    }
    if conv.messages.is_empty() {
        return Err("the conversation has no messages".into());
    }
    if conv.messages.len() > MAX_MESSAGES {
        return Err(format!(
            "a conversation holds at most {MAX_MESSAGES} messages, not {}",
            conv.messages.len()
        ));
    }
    Ok(conv)
}

/// The kinds of candidate memories (seed 002's extractors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Who the user is: merged into the one profile node.
    Profile,
    /// What the user likes or wants: merged by topic.
    Preference,
    /// A person, project, place or thing the user deals with: merged by name.
    Entity,
    /// Something that happened, with its date when known: appended.
    Event,
    /// A problem the agent solved and how: appended (agent memory).
    Case,
    /// A recurring way of working that held: merged (agent memory).
    Pattern,
    /// A procedure the agent can repeat: one node per skill.
    Skill,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Profile => "profile",
            Kind::Preference => "preference",
            Kind::Entity => "entity",
            Kind::Event => "event",
            Kind::Case => "case",
            Kind::Pattern => "pattern",
            Kind::Skill => "skill",
        }
    }
}

/// One memory the LLM found, checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub kind: Kind,
    /// A short name of the subject (becomes the slug).
    pub topic: String,
    /// The memory itself, one or a few sentences.
    pub text: String,
    /// Indexes of the messages it came from.
    pub messages: Vec<usize>,
}

/// The items of the model's `{"memories": [...]}`, at most
/// `prompt::MAX_CANDIDATES`, and what was lost before checking them (an
/// answer cut at `max_tokens`, items past the bound; `per`: "conversation"
/// or "request", for the reason).
fn answer_items<'a>(v: &'a Value, per: &str) -> Result<(&'a [Value], Vec<String>), String> {
    let list = v
        .get("memories")
        .and_then(Value::as_array)
        .ok_or("the model's answer has no \"memories\" array")?;
    let mut dropped = Vec::new();
    if v.get("stopped") == Some(&Value::Bool(true)) {
        dropped.push(format!(
            "the model began writing a memory again after {} memories: its answer was stopped there",
            list.len()
        ));
    }
    if v.get("truncated") == Some(&Value::Bool(true)) {
        dropped.push(format!(
            "the model's answer was cut at [llm] max_tokens: its {} complete memories are kept, \
             the one it was writing is lost",
            list.len()
        ));
    }
    let max = prompt::MAX_CANDIDATES;
    if list.len() > max {
        dropped.push(format!(
            "memories {max}..{}: at most {max} are taken from one {per}",
            list.len() - 1
        ));
    }
    Ok((&list[..list.len().min(max)], dropped))
}

/// Check the LLM's `{"memories": [...]}` against the conversation: unknown
/// kinds, empty texts and message indexes out of range are dropped (with
/// the reason), never trusted.
pub fn candidates(v: &Value, n_messages: usize) -> Result<(Vec<Candidate>, Vec<String>), String> {
    let (list, mut dropped) = answer_items(v, "conversation")?;
    let mut out = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let kind = match serde_json::from_value::<Kind>(m["kind"].clone()) {
            Ok(k) => k,
            Err(_) => {
                dropped.push(format!("memory {i}: unknown kind {}", m["kind"]));
                continue;
            }
        };
        let text = m["text"].as_str().unwrap_or("").trim().to_string();
        let topic = m["topic"].as_str().unwrap_or("").trim().to_string();
        if text.is_empty() {
            dropped.push(format!("memory {i}: empty text"));
            continue;
        }
        let mut messages: Vec<usize> = m["messages"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as usize)
                    .filter(|&x| x < n_messages)
                    .collect()
            })
            .unwrap_or_default();
        messages.sort_unstable();
        messages.dedup();
        if messages.is_empty() {
            dropped.push(format!(
                "memory {i} ({}): names no message of the conversation",
                crate::schema::excerpt(&text)
            ));
            continue;
        }
        out.push(Candidate {
            kind,
            topic,
            text,
            messages,
        });
    }
    Ok((out, dropped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_speakers_name_is_kept_and_checked() {
        let c = parse(
            "c.json",
            br#"[{"role":"user","name":" Audrey ","content":"hi"},{"role":"assistant","content":"yo"}]"#,
        )
        .unwrap();
        assert_eq!(c.messages[0].name.as_deref(), Some("Audrey"));
        assert_eq!(c.messages[0].speaker(), "Audrey (user)");
        assert_eq!(c.messages[1].speaker(), "assistant");
        let long = format!(
            r#"[{{"role":"user","name":"{}","content":"x"}}]"#,
            "a".repeat(65)
        );
        assert!(parse("c.json", long.as_bytes())
            .unwrap_err()
            .contains("at most 64 bytes"));
        let e = parse("c.json", br#"[{"role":"user","name":7,"content":"x"}]"#).unwrap_err();
        assert!(e.contains("\"name\" must be a string"), "{e}");
    }

    #[test]
    fn messages_become_redacted_labelled_index_events() {
        let c = parse(
            "c.json",
            br#"[{"role":"user","content":"my key sk-abcdefghijklmnopqrstuvwx","ts":"2026-03-04"},
                 {"role":"assistant","content":"  "},
                 {"role":"assistant","content":"ok","ts":1700000000}]"#,
        )
        .unwrap();
        let ch = message_changes(&c, Some(&crate::schema::redact::Redactor::default()), 7);
        assert_eq!(ch.len(), 2, "the blank message is left out");
        assert_eq!(ch[1].0, 2, "numbers are the conversation's");
        let crate::schema::event::Change::UpsertMessage { text, ts, .. } = &ch[0].1 else {
            panic!("{:?}", ch[0].1)
        };
        assert_eq!(
            (text.as_str(), ts.as_deref()),
            ("my key [REDACTED]", Some("2026-03-04"))
        );
        assert_eq!(
            crate::schema::event::message_label(0, "user", None, Some("2026-03-04"), "a\n  b"),
            "#0 user 2026-03-04: a b"
        );
        let named = crate::schema::event::message_label(
            3,
            "assistant",
            Some("Ann (Lee)\n"),
            Some("2026-03-04"),
            "hi (there): x",
        );
        assert_eq!(named, "#3 Ann Lee (assistant) 2026-03-04: hi (there): x");
        assert_eq!(crate::schema::event::label_speaker(&named), Some("Ann Lee"));
        for unnamed in [
            "#0 user 2026-03-04: a (b) c",
            "#7 assistant: word (x)",
            "plain",
        ] {
            assert_eq!(
                crate::schema::event::label_speaker(unnamed),
                None,
                "{unnamed}"
            );
        }
        let off = parse(
            "c.json",
            br#"{"searchable": false, "messages": [{"role":"user","content":"x"}]}"#,
        )
        .unwrap();
        assert!(off.unsearchable && !c.unsearchable);
        assert!(parse("c.json", br#"{"searchable": 0, "messages": []}"#).is_err());
        let long =
            crate::schema::event::message_label(7, "assistant", None, None, &"word ".repeat(100));
        assert!(long.starts_with("#7 assistant: word"));
        assert_eq!(long.chars().count(), 160);
        assert!(long.ends_with('…'));
    }
    use serde_json::json;

    #[test]
    fn parses_both_shapes() {
        let c = parse(
            "a.json",
            br#"{"agent":"coder","session":"s1","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello","ts":"2026-01-01"}]}"#,
        )
        .unwrap();
        assert_eq!(c.messages.len(), 2);
        assert_eq!(c.agent.as_deref(), Some("coder"));
        let c = parse(
            "a.jsonl",
            b"{\"role\":\"user\",\"content\":\"x\",\"agent\":\"g\"}\n\n{\"role\":\"assistant\",\"content\":\"y\"}\n",
        )
        .unwrap();
        assert_eq!(c.messages.len(), 2);
        assert_eq!(c.agent.as_deref(), Some("g"));
        assert!(parse("a.json", b"[]").is_err());
        assert!(parse("a.json", br#"[{"role":"system","content":"x"}]"#)
            .unwrap_err()
            .contains("role"));
        assert!(parse(
            "a.json",
            br#"{"agent":"../x","messages":[{"role":"user","content":"x"}]}"#
        )
        .is_err());
        assert!(parse("a.json", b"not json").is_err());
        assert!(is_conversation_name("chat-1.json") && is_conversation_name("c.jsonl"));
        assert!(!is_conversation_name(".json") && !is_conversation_name("a.status"));
        assert!(!is_conversation_name("a.b.json"));
    }

    #[test]
    fn grounding_moves_citations_to_the_words() {
        let conv = parse(
            "c.json",
            br#"[{"role":"user","content":"Hi, I'm Aiko, a nurse in Osaka."},
                 {"role":"assistant","content":"Nice to meet you!"},
                 {"role":"user","content":"My dog Juno keeps me busy."},
                 {"role":"assistant","content":"Juno sounds like great company!"},
                 {"role":"user","content":"What's the capital of Australia?"}]"#,
        )
        .unwrap();
        let cand = |kind, text: &str, m: &[usize]| Candidate {
            kind,
            topic: String::new(),
            text: text.into(),
            messages: m.to_vec(),
        };
        // The assistant's reply cited: the user's words are the source of
        // a memory about the user; an entity keeps both speakers' words.
        let mut c = cand(Kind::Event, "Juno keeps the user busy.", &[3]);
        ground(&mut c, &conv);
        assert_eq!(c.messages, vec![2]);
        let mut c = cand(Kind::Entity, "Juno is the user's dog.", &[3]);
        ground(&mut c, &conv);
        assert_eq!(c.messages, vec![2, 3]);
        // A wrong neighbour: moved to the message holding the words.
        let mut c = cand(Kind::Profile, "The user is Aiko, a nurse in Osaka.", &[1]);
        ground(&mut c, &conv);
        assert_eq!(c.messages, vec![0]);
        // A right citation stays; words in no message keep the citation.
        let mut c = cand(Kind::Profile, "Aiko works as a nurse.", &[0]);
        ground(&mut c, &conv);
        assert_eq!(c.messages, vec![0]);
        let mut c = cand(Kind::Event, "Something else entirely.", &[4]);
        ground(&mut c, &conv);
        assert_eq!(c.messages, vec![4]);
        // The other speaker greeting the user names the user: not an entity.
        let two = parse(
            "c.json",
            br#"[{"role":"user","content":"hey Mel! long time"},
                 {"role":"assistant","content":"Priya! good. still a florist"}]"#,
        )
        .unwrap();
        let e = |topic: &str| Candidate {
            kind: Kind::Entity,
            topic: topic.into(),
            text: format!("{topic} is a friend of the user."),
            messages: vec![0, 1],
        };
        assert!(entity_is_the_user(&e("Priya"), &two).is_some());
        assert!(entity_is_the_user(&e("Mel"), &two).is_none());
        // A three-letter name is a subject word: the friend's entity cites
        // the greeting too, whoever spoke it.
        let mut c = e("Mel");
        c.text = "Mel is a friend of the user, a florist.".into();
        c.messages = vec![1];
        ground(&mut c, &two);
        assert_eq!(c.messages, vec![0, 1]);
        // A cited message sharing a word, the one holding the most
        // uncited: both.
        let mut c = cand(
            Kind::Event,
            "The user, a nurse, keeps busy with the dog Juno.",
            &[0],
        );
        ground(&mut c, &conv);
        assert_eq!(c.messages, vec![0, 2]);
    }

    #[test]
    fn a_profile_holds_neither_the_greeted_name_nor_the_examples_words() {
        let conv = parse(
            "c.json",
            br#"[{"role":"user","content":"hey Sam! we moved to Tallinn last month"},
                 {"role":"assistant","content":"Marcus! wow, Tallinn!"}]"#,
        )
        .unwrap();
        let profile = |text: &str| Candidate {
            kind: Kind::Profile,
            topic: "profile".into(),
            text: text.into(),
            messages: vec![0],
        };
        let mut why = Vec::new();
        let kept =
            |t: &str, why: &mut Vec<String>| faithful(profile(t), &conv, None, why).map(|c| c.text);
        assert_eq!(
            kept("The user is Marcus and moved to Tallinn.", &mut why).as_deref(),
            Some("The user is Marcus and moved to Tallinn.")
        );
        assert_eq!(kept("The user is Sam, living in Tallinn.", &mut why), None);
        assert!(
            why.last().unwrap().contains("the name the user calls"),
            "{why:?}"
        );
        assert_eq!(kept("The user is a pharmacist in Tallinn.", &mut why), None);
        assert!(why.last().unwrap().contains("worked example"), "{why:?}");
        // Said in the conversation, an example's word is the user's own.
        let nurse = parse(
            "c.json",
            br#"[{"role":"user","content":"I work as a nurse in Tallinn"}]"#,
        )
        .unwrap();
        assert!(faithful(
            profile("The user is a nurse in Tallinn."),
            &nurse,
            None,
            &mut why
        )
        .is_some());
    }

    #[test]
    fn the_other_speakers_own_facts_are_not_the_users() {
        let conv = parse(
            "c.json",
            br#"[{"role":"assistant","content":"Hey Caroline! I ran a charity race for mental health last Saturday."},
                 {"role":"user","content":"Hey Mel, a charity race! I started a pottery class myself."},
                 {"role":"assistant","content":"A pottery class, how fun!"}]"#,
        )
        .unwrap();
        let why = misattributed("The user ran a charity race for mental health.", &conv)
            .unwrap_or_default();
        assert!(why.contains("message 0"), "{why}");
        // The user's own fact, echoed by the other: the user's.
        assert_eq!(
            misattributed("The user started a pottery class.", &conv),
            None
        );
        // The other speaker's own fact given to them: theirs; the user's
        // given to the other: not.
        assert_eq!(
            misattributed("Mel ran a charity race for mental health.", &conv),
            None
        );
        let why = misattributed("Mel started a pottery class.", &conv).unwrap_or_default();
        assert!(why.contains("the user says it"), "{why}");
        // Given to the user by a possessive: the same.
        let why =
            misattributed("Mental health races are the user's thing.", &conv).unwrap_or_default();
        assert!(why.contains("message 0"), "{why}");
        // About both: not judged here.
        assert_eq!(
            misattributed(
                "The user cheered Mel's charity race for mental health.",
                &conv
            ),
            None
        );
    }

    #[test]
    fn candidates_are_checked() {
        let v = json!({"memories": [
            {"kind": "preference", "topic": "tea", "text": "Likes green tea", "messages": [1, 1, 9]},
            {"kind": "bogus", "topic": "x", "text": "y", "messages": [0]},
            {"kind": "event", "topic": "x", "text": "", "messages": [0]},
            {"kind": "event", "topic": "x", "text": "z", "messages": [42]},
        ]});
        let (c, dropped) = candidates(&v, 3).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].messages, vec![1]);
        assert_eq!(dropped.len(), 3);
        assert!(candidates(&json!({}), 3).is_err());
    }
}
