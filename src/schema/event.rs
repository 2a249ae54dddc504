//! The outbox event (seed 000 `OutboxEvent`): written by the core in the
//! transaction of the change it describes, read by the indexer, shown to
//! writers as `.outbox/{event_id}.json`. One type, serde on both sides.

use crate::schema::place;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One outbox event as stored (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEvent {
    /// The sequence number in 16 hex digits.
    pub event_id: String,
    #[serde(flatten)]
    pub change: Change,
    /// `ctx://` URI of the node (before a move).
    pub uri: String,
    pub status: EventStatus,
    pub retry_count: u32,
    /// RFC 3339 with milliseconds: when the change committed.
    pub created_at: String,
    /// Why the last try failed (or why the event waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Not before this time (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retry_ms: Option<u64>,
}

/// What changed, with its payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "event_type",
    content = "payload",
    rename_all = "SCREAMING_SNAKE_CASE"
)]
pub enum Change {
    /// A new version: its L0/L1/L2 texts as index records.
    UpsertContext {
        records: Vec<IndexRecord>,
    },
    /// The node's `.relations.json` as committed (client edges, checked).
    UpsertRelation {
        edges: Vec<Value>,
    },
    ArchiveContext {},
    DeleteContext {},
    /// The node is ACTIVE but not searchable (`"searchable": false` in its
    /// `.meta.json`, or under a prefix the account keeps out of the index):
    /// whatever the index holds of it goes, and no text of it is embedded.
    UnindexContext {},
    MoveContext {
        new_uri: String,
    },
    /// A message of a stored conversation (`users/U/inbox/NAME.json`),
    /// indexed so that what was said is found even where no memory holds
    /// it. The event's URI is the conversation's with `#MESSAGE`.
    UpsertMessage {
        /// Message number in the conversation, from 0.
        message: u32,
        role: String,
        /// The message's `ts` as written, when it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ts: Option<String>,
        /// The message's text, after the account's redaction.
        text: String,
        /// Who spoke (the message's `name`), when it says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// When the conversation was stored (ns since the epoch): which
        /// conversation of its name the message was indexed from. A search
        /// shows the message only while that conversation is the one stored
        /// (a name deleted and written again names another).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stored_ns: Option<u64>,
        /// The end of the message said before it (after redaction), when
        /// there is one: embedded with this message's text as one more of
        /// its vectors, so that a reply is found by the question it answers
        /// (`index::text::message_views`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventStatus {
    Pending,
    /// Failed, retried after `next_retry_ms`.
    Failed,
    /// The account's embedding budget is spent: retried the next UTC day.
    Deferred,
    /// Retries exhausted: a dead letter.
    Dead,
}

/// An IndexRecord of seed 000: one level of a node's text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexRecord {
    pub id: String,
    pub uri: String,
    /// 0 abstract, 1 overview, 2 content.
    pub level: u8,
    pub text: String,
    #[serde(default)]
    pub filters: Map<String, Value>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The L0/L1/L2 index records of node `node` for its texts (level, text).
pub fn records(node: &str, texts: &[(u8, String)]) -> Vec<IndexRecord> {
    let comps = place::split(node);
    let uri = place::uri_of(node);
    texts
        .iter()
        .map(|(level, text)| {
            let mut filters = Map::new();
            filters.insert("account_id".into(), comps[0].into());
            filters.insert("owner_space".into(), place::owner_space(&comps).into());
            let mut metadata = Map::new();
            metadata.insert("category".into(), place::category(&comps).into());
            metadata.insert("context_type".into(), place::context_type(&comps).into());
            IndexRecord {
                id: format!("{:016x}", fnv(&format!("{uri}#{level}"))),
                uri: uri.clone(),
                level: *level,
                text: text.clone(),
                filters,
                metadata,
            }
        })
        .collect()
}

impl OutboxEvent {
    /// A new event of `node`, pending, created at `created_at` (RFC 3339 ms).
    pub fn new(seq: u64, node: &str, change: Change, created_at: String) -> OutboxEvent {
        OutboxEvent {
            event_id: event_id(seq),
            change,
            uri: place::uri_of(node),
            status: EventStatus::Pending,
            retry_count: 0,
            created_at,
            last_error: None,
            next_retry_ms: None,
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<OutboxEvent, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not an outbox event: {e}"))
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serialising plain strings, numbers and JSON values cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The node path the event names (before a move).
    pub fn node(&self) -> Option<&str> {
        place::node_of_uri(&self.uri)
    }

    pub fn account(&self) -> Option<&str> {
        self.node().map(place::account_of)
    }

    /// The type as written in `event_type`.
    pub fn type_name(&self) -> &'static str {
        match self.change {
            Change::UpsertContext { .. } => "UPSERT_CONTEXT",
            Change::UpsertRelation { .. } => "UPSERT_RELATION",
            Change::ArchiveContext {} => "ARCHIVE_CONTEXT",
            Change::DeleteContext {} => "DELETE_CONTEXT",
            Change::UnindexContext {} => "UNINDEX_CONTEXT",
            Change::MoveContext { .. } => "MOVE_CONTEXT",
            Change::UpsertMessage { .. } => "UPSERT_MESSAGE",
        }
    }
}

/// The index path of message `i` of the conversation stored at `conv`
/// (`{a}/users/{u}/inbox/NAME.json`): `{conv}#{i}`.
pub fn message_path(conv: &str, i: usize) -> String {
    format!("{conv}#{i}")
}

/// How a message shows in search results (its abstract there): number,
/// the speaker's name with the role in parentheses (the role alone when
/// the message has no name), and time, then the start of its text, on one
/// line.
pub fn message_label(
    i: u32,
    role: &str,
    name: Option<&str>,
    ts: Option<&str>,
    text: &str,
) -> String {
    let who = match name.map(speaker_name).filter(|n| !n.is_empty()) {
        Some(n) => format!("{n} ({role})"),
        None => role.to_string(),
    };
    let head = match ts {
        Some(t) => format!("#{i} {who} {t}: "),
        None => format!("#{i} {who}: "),
    };
    let room = 160usize.saturating_sub(head.chars().count()).max(40);
    head + &super::clip(text, room)
}

/// A message as its speaker said it, `Name: text` (the text alone when
/// it names no one): how the index embeds a message with its speaker.
pub fn said_by(name: Option<&str>, text: &str) -> String {
    match name.map(str::trim).filter(|n| !n.is_empty()) {
        Some(n) => format!("{n}: {text}"),
        None => text.to_string(),
    }
}

/// Most of a message kept as the `before` of the message after it.
pub const SAID_BEFORE_BYTES: usize = 300;

/// The end of a message that the next one is indexed with: its last
/// `SAID_BEFORE_BYTES` at most, from a word's start (a question closes a
/// message more often than it opens one).
pub fn said_before(text: &str) -> &str {
    let t = text.trim();
    if t.len() <= SAID_BEFORE_BYTES {
        return t;
    }
    let mut cut = t.len() - SAID_BEFORE_BYTES;
    while !t.is_char_boundary(cut) {
        cut += 1;
    }
    match t[cut..].find(char::is_whitespace) {
        Some(sp) if sp + 1 < t.len() - cut => t[cut + sp..].trim_start(),
        _ => &t[cut..],
    }
}

/// A speaker's name as a label shows it: one line, no parentheses.
fn speaker_name(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .filter(|c| !matches!(c, '(' | ')'))
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The speaker's name a message's label shows, if any.
pub fn label_speaker(label: &str) -> Option<&str> {
    let (name, _) = label_head(label)?.split_once(" (")?;
    Some(name)
}

/// A message label's head, between its number and its text: `NAME (ROLE)
/// TS`, `NAME (ROLE)`, `ROLE TS` or `ROLE`.
fn label_head(label: &str) -> Option<&str> {
    let (_, rest) = label.strip_prefix('#')?.split_once(' ')?;
    Some(rest.split_once(": ").map_or(rest, |(h, _)| h))
}

/// The time a message's label shows (its `ts` as written), if any.
pub fn label_time(label: &str) -> Option<&str> {
    let head = label_head(label)?;
    let t = match head.rsplit_once(") ") {
        Some((_, t)) => t,
        // No name: `role ts`.
        None if !head.ends_with(')') => head.split_once(' ')?.1,
        None => return None,
    };
    (!t.is_empty()).then_some(t)
}

/// A message's index path → (conversation path, message number).
pub fn message_of(path: &str) -> Option<(&str, u32)> {
    let (conv, i) = path.rsplit_once('#')?;
    Some((conv, i.parse().ok()?))
}

/// `{seq:016x}`: the event's id and its file name stem.
pub fn event_id(seq: u64) -> String {
    format!("{seq:016x}")
}

/// `{event_id}.json` → sequence number.
pub fn event_seq(name: &str) -> Option<u64> {
    let h = name.strip_suffix(".json")?;
    (h.len() == 16).then(|| u64::from_str_radix(h, 16).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "acme/users/alice/memories/events/e1";

    #[test]
    fn what_was_said_before_is_the_end_of_a_message_from_a_word() {
        assert_eq!(said_before("  Where do you live?  "), "Where do you live?");
        let long = format!(
            "{}So, where do you live now?",
            "très long récit ".repeat(40)
        );
        let end = said_before(&long);
        assert!(end.len() <= SAID_BEFORE_BYTES, "{}", end.len());
        assert!(end.ends_with("where do you live now?"), "{end}");
        assert!(long.contains(&format!(" {end}")), "starts at a word: {end}");
        let word = "x".repeat(400);
        assert_eq!(
            said_before(&word).len(),
            SAID_BEFORE_BYTES,
            "no space: cut anyway"
        );
    }

    #[test]
    fn a_label_shows_its_speaker_and_time() {
        let named = message_label(
            12,
            "assistant",
            Some("Ann Lee"),
            Some("2023-10-13T16:34:00Z"),
            "Hi: there",
        );
        assert_eq!(label_speaker(&named), Some("Ann Lee"));
        assert_eq!(label_time(&named), Some("2023-10-13T16:34:00Z"));
        let role_only = message_label(3, "user", None, Some("1700000000"), "hello");
        assert_eq!(label_time(&role_only), Some("1700000000"));
        assert_eq!(
            label_time(&message_label(3, "user", None, None, "a: b")),
            None
        );
        assert_eq!(
            label_time(&message_label(3, "user", Some("Bo"), None, "a: b")),
            None
        );
    }

    #[test]
    fn round_trips_in_the_stored_shape() {
        let e = OutboxEvent::new(
            26,
            N,
            Change::UpsertContext {
                records: records(N, &[(0, "abs".into()), (2, "body".into())]),
            },
            "2026-01-01T00:00:00.000Z".into(),
        );
        let v: Value = serde_json::from_slice(&e.encode()).unwrap();
        assert_eq!(v["event_id"], "000000000000001a");
        assert_eq!(v["event_type"], "UPSERT_CONTEXT");
        assert_eq!(v["status"], "PENDING");
        assert_eq!(v["retry_count"], 0);
        assert_eq!(v["payload"]["records"][1]["level"], 2);
        assert_eq!(
            v["payload"]["records"][0]["filters"]["owner_space"],
            "user:alice"
        );
        assert!(v.get("last_error").is_none());
        assert_eq!(OutboxEvent::decode(&e.encode()).unwrap(), e);
        assert_eq!(e.account(), Some("acme"));
        assert_eq!(event_seq("000000000000001a.json"), Some(26));
        assert_eq!(event_seq("1a.json"), None);
    }

    #[test]
    fn message_paths_name_the_conversation_and_the_number() {
        let p = message_path("acme/users/u/inbox/c1.json", 12);
        assert_eq!(p, "acme/users/u/inbox/c1.json#12");
        assert_eq!(message_of(&p), Some(("acme/users/u/inbox/c1.json", 12)));
        assert_eq!(message_of(N), None);
        assert_eq!(message_of("a/b#x"), None);
    }

    #[test]
    fn reads_events_written_before_the_type() {
        // As the core wrote them with json!() before: empty payloads as `{}`.
        let old = br#"{"event_id":"0000000000000001","event_type":"DELETE_CONTEXT","uri":"ctx://acme/users/alice/memories/events/e1","payload":{},"status":"PENDING","retry_count":0,"created_at":"2026-01-01T00:00:00.000Z"}"#;
        let e = OutboxEvent::decode(old).unwrap();
        assert_eq!(e.change, Change::DeleteContext {});
        let mv = br#"{"event_id":"0000000000000002","event_type":"MOVE_CONTEXT","uri":"ctx://a/users/u/memories/d/n","payload":{"new_uri":"ctx://a/users/u/memories/d/m"},"status":"FAILED","retry_count":2,"last_error":"x","next_retry_ms":5,"created_at":"t"}"#;
        let e = OutboxEvent::decode(mv).unwrap();
        assert_eq!(e.status, EventStatus::Failed);
        assert_eq!(e.next_retry_ms, Some(5));
        assert!(matches!(e.change, Change::MoveContext { ref new_uri } if new_uri.ends_with("/m")));
        assert!(OutboxEvent::decode(br#"{"event_type":"NOPE"}"#).is_err());
    }
}
