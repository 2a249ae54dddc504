//! What a commit must satisfy (CONTRACT §4), as pure functions over bytes.

use crate::schema::place;
use crate::schema::{excerpt, excerpt_json};
use crate::store::Status;
use serde_json::{Map, Value};

pub const MAX_ABSTRACT_CHARS: usize = 100;
pub const MAX_META_BYTES: usize = 64 * 1024;
/// A `.relations.json` larger than the node budget could never commit.
pub const MAX_RELATIONS_BYTES: usize = crate::schema::derive::NODE_BUDGET_BYTES as usize;
pub const MAX_RELATIONS: usize = 10_000;

/// What `.meta.json` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaIntent {
    /// `"status": "ACTIVE"` or `"ARCHIVED"`: commit.
    Commit(Status, Map<String, Value>),
    /// No status, or `"PENDING"`: the node stays a draft.
    Pending,
}

pub fn parse_meta(bytes: &[u8]) -> Result<MetaIntent, String> {
    if bytes.len() > MAX_META_BYTES {
        return Err(format!(
            ".meta.json is {} bytes; at most {MAX_META_BYTES} are accepted",
            bytes.len()
        ));
    }
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| format!(".meta.json is not valid JSON: {e}"))?;
    let Value::Object(obj) = v else {
        return Err(".meta.json must be a JSON object".into());
    };
    match obj.get("status") {
        None => Ok(MetaIntent::Pending),
        Some(Value::String(s)) => match s.as_str() {
            "PENDING" => Ok(MetaIntent::Pending),
            "ACTIVE" => Ok(MetaIntent::Commit(Status::Active, obj)),
            "ARCHIVED" => Ok(MetaIntent::Commit(Status::Archived, obj)),
            other => Err(format!(
                "status {} may not be set by a client (use ACTIVE, ARCHIVED or PENDING)",
                excerpt(other)
            )),
        },
        Some(other) => Err(format!(
            "status must be a string, not {}",
            excerpt_json(other)
        )),
    }
}

/// The `if_version` a client's `.meta.json` asks for, taken out of it (it
/// is a condition of this commit, never stored): commit only over that
/// version of the node, `0` only where no node is.
pub fn take_if_version(obj: &mut Map<String, Value>) -> Result<Option<u32>, String> {
    match obj.remove("if_version") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => Err(format!(
                "\"if_version\" in .meta.json is the version the change was made on (0 for a new node), not {}",
                excerpt_json(&v)
            )),
        },
    }
}

/// Why a commit planned on version `want` of a node (0: no node) may not
/// land when the node is at `have` (0: none), or `None` when it may.
/// `since` says when the version was taken: "this line was planned",
/// "version 3 was read".
pub fn stale_reason(have: u32, want: u32, since: &str) -> Option<String> {
    if have == want {
        return None;
    }
    Some(if have == 0 {
        format!("the node was deleted since {since} on its version {want}")
    } else if want == 0 {
        format!(
            "the node was created since {since} (now at version {have}; its files are in .versions/{have}/)"
        )
    } else {
        format!(
            "the node is at version {have}, not {want}: it changed since {since} (version {have}'s files are in .versions/{have}/)"
        )
    })
}

pub fn check_utf8<'a>(name: &str, bytes: &'a [u8]) -> Result<&'a str, String> {
    std::str::from_utf8(bytes).map_err(|e| format!("{name} is not UTF-8: {e}"))
}

pub fn check_abstract(bytes: &[u8]) -> Result<(), String> {
    let text = check_utf8(place::ABSTRACT, bytes)?;
    let n = text.trim_end().chars().count();
    if n > MAX_ABSTRACT_CHARS {
        return Err(format!(
            ".abstract.md has {n} characters; the L0 abstract holds at most {MAX_ABSTRACT_CHARS}"
        ));
    }
    Ok(())
}

/// `.relations.json`: a list of edges from this node to nodes of its account.
pub fn check_relations(bytes: &[u8], node: &str) -> Result<Vec<Value>, String> {
    if bytes.len() > MAX_RELATIONS_BYTES {
        return Err(format!(
            ".relations.json is {} bytes; at most {MAX_RELATIONS_BYTES} are accepted (the node's budget)",
            bytes.len()
        ));
    }
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!(".relations.json is not valid JSON: {e}"))?;
    let Value::Array(edges) = v else {
        return Err(".relations.json must be a JSON list of edges".into());
    };
    if edges.len() > MAX_RELATIONS {
        return Err(format!("more than {MAX_RELATIONS} edges"));
    }
    let uri = place::uri_of(node);
    let account = place::account_of(node);
    for (i, e) in edges.iter().enumerate() {
        let Value::Object(o) = e else {
            return Err(format!("edge {i} is not an object"));
        };
        match o.get("from_uri") {
            Some(Value::String(f)) if *f == uri => {}
            Some(other) => {
                return Err(format!(
                    "edge {i}: from_uri {} is not this node ({uri})",
                    excerpt_json(other)
                ))
            }
            None => return Err(format!("edge {i}: from_uri missing")),
        }
        let to = o
            .get("to_uri")
            .and_then(Value::as_str)
            .ok_or(format!("edge {i}: to_uri must be a string"))?;
        let to_node = place::node_of_client_uri(to).map_err(|e| match e {
            crate::error::Error::Invalid(why) => format!("edge {i}: to_uri: {why}"),
            other => format!("edge {i}: to_uri {}: {other}", excerpt(to)),
        })?;
        if crate::schema::place::account_of(to_node) != account {
            return Err(format!(
                "edge {i}: to_uri {} is in another account",
                excerpt(to)
            ));
        }
        match o.get("relation_type") {
            Some(Value::String(t)) if !t.is_empty() => {}
            _ => {
                return Err(format!(
                    "edge {i}: relation_type must be a non-empty string"
                ))
            }
        }
        if let Some(w) = o.get("weight") {
            match w.as_f64() {
                Some(x) if (0.0..=1.0).contains(&x) => {}
                _ => return Err(format!("edge {i}: weight must be a number in [0, 1]")),
            }
        }
        if let Some(r) = o.get("reason") {
            if !r.is_string() {
                return Err(format!("edge {i}: reason must be a string"));
            }
        }
    }
    Ok(edges)
}

/// Rewrite the edges of a moved node so they start at its new URI.
pub fn rebase_relations(bytes: &[u8], new_node: &str) -> Option<Vec<u8>> {
    let Ok(Value::Array(mut edges)) = serde_json::from_slice::<Value>(bytes) else {
        return None;
    };
    for e in edges.iter_mut() {
        if let Value::Object(o) = e {
            o.insert("from_uri".into(), Value::String(place::uri_of(new_node)));
        }
    }
    let mut out = serde_json::to_vec_pretty(&Value::Array(edges)).ok()?;
    out.push(b'\n');
    Some(out)
}

/// The fields of `.meta.json` that say when a fact held: when it became
/// true (`valid_from`), stopped (`valid_until`), or happened (an event).
pub const TIME_FIELDS: [&str; 3] = ["valid_from", "valid_until", "happened"];

/// Each time field a date (`YYYY-MM-DD`) or an RFC 3339 time; and
/// `superseded_by`, which the daemon derives when a version is read from
/// `.versions/` (a copy of an old version's file carries it), dropped.
pub fn check_times(obj: &mut Map<String, Value>) -> Result<(), String> {
    obj.remove("superseded_by");
    for k in TIME_FIELDS {
        match obj.get(k) {
            None => {}
            Some(Value::String(s)) if time_value(s).is_some() => {}
            Some(v) => {
                return Err(format!(
                    "\"{k}\" in .meta.json is a date (YYYY-MM-DD) or an RFC 3339 time, not {}",
                    crate::schema::excerpt(&v.to_string())
                ))
            }
        }
    }
    Ok(())
}

/// A time field's value as nanoseconds since the epoch (a date: its day's
/// start, UTC).
pub fn time_value(s: &str) -> Option<i128> {
    if s.len() == 10 {
        let d: jiff::civil::Date = s.parse().ok()?;
        let t = d.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
        return Some(t.as_nanosecond());
    }
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_nanosecond())
}

/// Fields of `.meta.json` the daemon owns.
pub struct Derived<'a> {
    pub node: &'a str,
    pub status: Status,
    pub version: u32,
    pub created_at: &'a str,
    pub updated_at: &'a str,
    /// Who made this version, through what (`committed_by`).
    pub by: Option<By>,
}

/// Who made a version: the uid of the request that committed it, and the
/// front it came through (`shell`: a process on the mount; `mcp`,
/// `memtool`: those fronts; `batch`, `inbox`, `restore`, `move`,
/// `repair`, `import`: the daemon's own paths, on that uid's behalf).
/// Every `via` a version may say.
pub const VIAS: &[&str] = &[
    "shell", "mcp", "memtool", "batch", "inbox", "restore", "move", "repair", "import", "daemon",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct By {
    pub uid: u32,
    pub via: &'static str,
}

/// `.meta.json` as stored: the client's fields with the derived ones filled in.
pub fn render_meta(mut obj: Map<String, Value>, d: &Derived) -> Vec<u8> {
    let comps = place::split(d.node);
    let set = |o: &mut Map<String, Value>, k: &str, v: Value| {
        o.insert(k.to_string(), v);
    };
    set(&mut obj, "uri", Value::String(place::uri_of(d.node)));
    set(
        &mut obj,
        "owner_space",
        Value::String(place::owner_space(&comps)),
    );
    set(
        &mut obj,
        "category",
        Value::String(place::category(&comps).into()),
    );
    set(
        &mut obj,
        "context_type",
        Value::String(place::context_type(&comps).into()),
    );
    set(&mut obj, "status", Value::String(d.status.as_str().into()));
    set(&mut obj, "version", Value::from(d.version));
    set(&mut obj, "created_at", Value::String(d.created_at.into()));
    set(&mut obj, "updated_at", Value::String(d.updated_at.into()));
    // The daemon's word, never the client's.
    match d.by {
        Some(b) => set(
            &mut obj,
            "committed_by",
            serde_json::json!({"uid": b.uid, "via": b.via}),
        ),
        None => {
            obj.remove("committed_by");
        }
    }
    let mut out = serde_json::to_vec_pretty(&Value::Object(obj)).unwrap_or_default();
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "acme/users/alice/memories/events/e1";

    #[test]
    fn time_fields_are_dates_or_times() {
        let mut o = serde_json::json!({
            "valid_from": "2026-03-14",
            "happened": "2026-03-14T10:00:00Z",
            "superseded_by": 3
        });
        let m = o.as_object_mut().unwrap();
        assert_eq!(check_times(m), Ok(()));
        assert!(!m.contains_key("superseded_by"), "derived: dropped");
        assert_eq!(time_value("2026-03-14"), time_value("2026-03-14T00:00:00Z"));
        for bad in [
            serde_json::json!("last May"),
            serde_json::json!(20260314),
            serde_json::json!("2026-13-01"),
        ] {
            let mut o = serde_json::json!({"valid_until": bad});
            let e = check_times(o.as_object_mut().unwrap()).unwrap_err();
            assert!(e.contains("valid_until"), "{e}");
        }
    }

    #[test]
    fn meta_intent() {
        assert!(matches!(
            parse_meta(br#"{"status":"ACTIVE"}"#),
            Ok(MetaIntent::Commit(Status::Active, _))
        ));
        assert!(matches!(
            parse_meta(br#"{"status":"ARCHIVED","tags":[]}"#),
            Ok(MetaIntent::Commit(Status::Archived, _))
        ));
        assert_eq!(
            parse_meta(br#"{"status":"PENDING"}"#),
            Ok(MetaIntent::Pending)
        );
        assert_eq!(parse_meta(br#"{}"#), Ok(MetaIntent::Pending));
        for bad in [
            &br#"{"status":"BROKEN"}"#[..],
            b"[1]",
            b"{",
            b"",
            br#"{"status":1}"#,
        ] {
            assert!(
                parse_meta(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let huge = format!("{{\"status\":\"ACTIVE\",\"x\":\"{}\"}}", "a".repeat(70_000));
        assert!(parse_meta(huge.as_bytes()).is_err());
    }

    #[test]
    fn abstract_limit() {
        assert!(check_abstract(format!("{}\n", "é".repeat(100)).as_bytes()).is_ok());
        assert!(check_abstract("é".repeat(101).as_bytes()).is_err());
        assert!(check_abstract(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn relations() {
        assert!(check_relations(b"[]\n", N).is_ok());
        let ok = format!(
            r#"[{{"from_uri":"ctx://{N}","to_uri":"ctx://acme/users/alice/memories/events/e2","relation_type":"related_to","weight":0.5}}]"#
        );
        assert_eq!(check_relations(ok.as_bytes(), N).unwrap().len(), 1);
        let other_from = ok.replace("events/e1", "events/zz");
        assert!(check_relations(other_from.as_bytes(), N).is_err());
        let other_acct = ok.replace("ctx://acme/users/alice/memories/events/e2", "ctx://evil/x");
        assert!(check_relations(other_acct.as_bytes(), N).is_err());
        assert!(check_relations(ok.replace("0.5", "7").as_bytes(), N).is_err());
        assert!(check_relations(b"{}", N).is_err());
        assert!(check_relations(b"[1]", N).is_err());
        // A to_uri is a node place of this account, by the rules of paths.
        let e2 = "ctx://acme/users/alice/memories/events/e2";
        for bad in [
            "ctx://acme/../globex/users/bob/memories/work/w1",
            "ctx://acme/users/alice/memories/events/../../../../../globex/users/b/memories/c/s",
            "ctx://acme//globex/users/b/memories/c/s",
            "ctx://acme/users/alice/memories/events/e 2",
            "ctx://acme/users/alice/memories/events/e2#frag?k=1",
            "ctx://acme/users/alice/memories/events/./e2",
            "ctx://acme/users/alice/memories/events",
            "ctx://acme/users/alice/memories/events/e2/",
        ] {
            let r = check_relations(ok.replace(e2, bad).as_bytes(), N);
            assert!(r.is_err(), "{bad} was accepted");
        }
        let profile = ok.replace(e2, "ctx://acme/users/alice/memories/profile");
        assert!(check_relations(profile.as_bytes(), N).is_ok());
        let skill = ok.replace(e2, "ctx://acme/agents/bot/skills/deploy");
        assert!(check_relations(skill.as_bytes(), N).is_ok());
        let moved = rebase_relations(ok.as_bytes(), "acme/users/bob/memories/x/y").unwrap();
        assert!(check_relations(&moved, "acme/users/bob/memories/x/y").is_ok());
    }

    #[test]
    fn render_fills_derived() {
        let MetaIntent::Commit(st, obj) =
            parse_meta(br#"{"status":"ACTIVE","version":99,"uri":"x","tags":["a"]}"#).unwrap()
        else {
            panic!()
        };
        let out = render_meta(
            obj,
            &Derived {
                by: None,
                node: N,
                status: st,
                version: 3,
                created_at: "c",
                updated_at: "u",
            },
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["uri"], format!("ctx://{N}"));
        assert_eq!(v["version"], 3);
        assert_eq!(v["owner_space"], "user:alice");
        assert_eq!(v["category"], "events");
        assert_eq!(v["tags"][0], "a");
        assert_eq!(v["status"], "ACTIVE");
    }

    proptest::proptest! {
        /// Hostile bytes never panic a parser: each answers Ok or a reason.
        #[test]
        fn parsers_take_any_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let _ = parse_meta(&bytes);
            let _ = check_relations(&bytes, N);
            let _ = check_abstract(&bytes);
            let files = vec![
                ("content.md".to_string(), bytes.clone()),
                (".meta.json".to_string(), bytes.clone()),
                (".relations.json".to_string(), bytes.clone()),
            ];
            let _ = crate::core::transfer::check_import(N, files);
        }

        /// JSON-shaped input (the interesting part of the space).
        #[test]
        fn parsers_take_any_json(v in json_value()) {
            let b = serde_json::to_vec(&v).unwrap();
            let _ = parse_meta(&b);
            let _ = check_relations(&b, N);
            if let Value::Object(mut o) = v {
                let _ = crate::core::ttl::expiry_of(&mut o, 0);
            }
        }
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
                .map(Value::Number)
                .unwrap_or(Value::Null)),
            prop_oneof![
                Just("ACTIVE".to_string()),
                Just("ctx://acme/users/alice/memories/events/e1".to_string()),
                Just("2001-01-01T00:00:00Z".to_string()),
                ".{0,20}",
            ]
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("status".to_string()),
                        Just("from_uri".to_string()),
                        Just("to_uri".to_string()),
                        Just("relation_type".to_string()),
                        Just("weight".to_string()),
                        Just("expires_at".to_string()),
                        Just("ttl_seconds".to_string()),
                        "[a-z]{1,8}",
                    ],
                    inner,
                    0..8
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
