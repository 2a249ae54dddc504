//! The commit's decision, as one pure function: what a node's files as they
//! stand (the committed version overlaid with the writer's draft) become,
//! for one intent, at one instant, under one redaction policy. No store, no
//! locks, no ids: `apply.rs` gathers the [`View`] and carries the [`Plan`]
//! out, so this file's decision table is tested without redb or a mount.

use super::rules::{self, Derived, MetaIntent};
use crate::core::transfer::Imported;
use crate::core::ttl;
use crate::schema::derive::{self, NODE_BUDGET_BYTES};
use crate::schema::event::{self, Change};
use crate::schema::names::{ABSTRACT, CONTENT, META, NODE_FILES, OVERVIEW, RELATIONS};
use crate::schema::redact::Redactor;
use crate::schema::time::rfc3339;
use crate::schema::Status;
use crate::store::{FileRec, NodeRec};
use serde_json::{json, Map, Value};

/// A file of a node as a commit sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// Written in the draft: bytes, mtime (ns), mode (0: the default).
    New(Vec<u8>, i128, u16),
    /// The committed version's file, unchanged.
    Keep(FileRec),
}

/// Why a commit happens.
#[derive(Debug, Clone, Copy)]
pub enum Intent<'a> {
    /// A writer closed `.meta.json` (or renamed a file onto it): commit if it
    /// asks for ACTIVE or ARCHIVED.
    Close,
    /// `NODE/.versions/restore`: an old version's files, its status asked again.
    Restore,
    /// The Repair Job: the files as they are become a BROKEN version.
    Broken(&'a str),
    /// `ctxfs import`: a node of an export keeps its version, times and
    /// summary marks.
    Import(&'a Imported),
}

/// What the commit sees of the node, gathered under its stripe.
#[derive(Debug, Clone)]
pub struct View<'a> {
    pub node: &'a str,
    /// The current committed record (`None` for a new node, and for an
    /// expired one, which this commit replaces).
    pub committed: Option<&'a NodeRec>,
    /// The node files as they stand, in protocol order.
    pub files: Vec<(&'static str, Content)>,
    /// The text of the kept `.abstract.md`, `.overview.md` and `content.md`.
    pub kept_text: Vec<(&'static str, String)>,
    /// The summary marks (`derived`) of the committed `.meta.json`.
    pub derived_before: Vec<String>,
    /// Who commits (`committed_by` of the new version).
    pub by: Option<rules::By>,
}

/// What the commit applies.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub status: Status,
    pub version: u32,
    pub created_at: String,
    pub updated_ns: i128,
    pub updated_at: String,
    /// The version's files in protocol order; `.meta.json` as rendered.
    pub files: Vec<(&'static str, Content)>,
    /// L0/L1/L2 texts (level, text) of the version.
    pub texts: Vec<(u8, String)>,
    /// When the node expires (ns since the epoch).
    pub expires: Option<u64>,
    /// The outbox events of the commit.
    pub events: Vec<Change>,
    /// Who commits (for the audit trail).
    pub by: Option<rules::By>,
}

/// Why a commit is refused; the reason is also what the writer reads in
/// `.commit-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Bad input (EINVAL).
    Invalid(String),
    /// The node is over its byte budget (EFBIG).
    TooBig(String),
    /// `.meta.json` said `if_version` and the node is at another version
    /// (ESTALE): `current` (0 when no node is).
    Stale { reason: String, current: u32 },
}

impl Refusal {
    pub fn reason(&self) -> &str {
        match self {
            Refusal::Invalid(r) | Refusal::TooBig(r) => r,
            Refusal::Stale { reason, .. } => reason,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Commit(Box<Plan>),
    /// No status, or `PENDING`, or no `.meta.json` written: the node stays a draft.
    StillPending,
    Refused(Refusal),
}

impl Plan {
    /// The commit's decision table (see the tests below).
    pub fn build(view: View, intent: Intent, now: i128, redactor: Option<&Redactor>) -> Outcome {
        match plan(view, intent, now, redactor) {
            Ok(Some(p)) => Outcome::Commit(Box::new(p)),
            Ok(None) => Outcome::StillPending,
            Err(r) => Outcome::Refused(r),
        }
    }
}

fn get<'v>(files: &'v [(&'static str, Content)], name: &str) -> Option<&'v Content> {
    files.iter().find(|(n, _)| *n == name).map(|(_, c)| c)
}

fn plan(
    view: View,
    intent: Intent,
    now: i128,
    redactor: Option<&Redactor>,
) -> Result<Option<Plan>, Refusal> {
    let View {
        node,
        committed,
        mut files,
        kept_text,
        derived_before,
        by,
    } = view;
    let asked = match intent {
        Intent::Broken(reason) => Asked {
            status: Status::Broken,
            obj: broken_meta(&files, reason),
            edges: None,
            redacted: 0,
        },
        _ => match asked(node, committed, &mut files, redactor)? {
            Some(a) => a,
            None => return Ok(None),
        },
    };
    let Asked {
        status,
        mut obj,
        edges,
        redacted,
    } = asked;
    let text_of = |files: &[(&'static str, Content)], name: &str| -> Option<String> {
        match get(files, name)? {
            Content::New(b, ..) => Some(String::from_utf8_lossy(b).into_owned()),
            Content::Keep(_) => kept_text
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| t.clone()),
        }
    };
    let mut expires = None;
    if !matches!(intent, Intent::Broken(_)) {
        expires = ttl::expiry_of(&mut obj, now).map_err(Refusal::Invalid)?;
        let content = text_of(&files, CONTENT);
        let derived = derive_summaries(&mut files, content.as_deref(), &derived_before, now);
        stamp(&mut obj, intent, derived, redacted, content.as_deref());
        check_size(&files)?;
    }

    let (version, created_at) = match (committed, intent) {
        (Some(r), _) => (r.version + 1, r.created_at.clone()),
        (None, Intent::Import(i)) => (i.version, i.created_at.clone()),
        (None, _) => (1, rfc3339(now)),
    };
    let (updated_ns, updated_at) = match intent {
        Intent::Import(i) => (i.updated_ns, i.updated_at.clone()),
        _ => (now, rfc3339(now)),
    };
    let searchable = obj.get("searchable").and_then(Value::as_bool) != Some(false);
    let meta = rules::render_meta(
        obj,
        &Derived {
            node,
            status,
            version,
            created_at: &created_at,
            updated_at: &updated_at,
            by,
        },
    );
    // `.meta.json` as rendered, when the draft wrote one (a BROKEN version
    // over a kept one keeps it as it was).
    for (name, c) in files.iter_mut() {
        if let (&mut META, Content::New(_, _, mode)) = (name, &mut *c) {
            *c = Content::New(meta.clone(), now, *mode);
        }
    }
    let texts: Vec<(u8, String)> = files
        .iter()
        .filter_map(|(name, _)| {
            let level = match *name {
                ABSTRACT => 0,
                OVERVIEW => 1,
                CONTENT => 2,
                _ => return None,
            };
            Some((level, text_of(&files, name).unwrap_or_default()))
        })
        .collect();
    let events = events_of(node, status, searchable, &texts, edges);
    Ok(Some(Plan {
        status,
        version,
        created_at,
        updated_ns,
        updated_at,
        files,
        texts,
        expires,
        events,
        by,
    }))
}

/// What a commit's `.meta.json` asks for, checked.
struct Asked {
    status: Status,
    /// The client's fields of `.meta.json`.
    obj: Map<String, Value>,
    /// The edges of a `.relations.json` written in this commit.
    edges: Option<Vec<Value>>,
    /// Secrets replaced in this commit.
    redacted: usize,
}

/// A BROKEN version's `.meta.json` fields: the draft's, if they parse, and
/// the reason.
fn broken_meta(files: &[(&'static str, Content)], reason: &str) -> Map<String, Value> {
    let mut obj = match get(files, META) {
        Some(Content::New(b, ..)) => match serde_json::from_slice::<Value>(b) {
            Ok(Value::Object(o)) => o,
            _ => Map::new(),
        },
        _ => Map::new(),
    };
    obj.insert("broken_reason".into(), Value::String(reason.to_string()));
    obj
}

/// The written `.meta.json` and files checked for a commit (`None`: the
/// node stays a draft), secrets replaced first.
fn asked(
    node: &str,
    committed: Option<&NodeRec>,
    files: &mut [(&'static str, Content)],
    redactor: Option<&Redactor>,
) -> Result<Option<Asked>, Refusal> {
    let invalid = Refusal::Invalid;
    let meta = match get(files, META) {
        Some(Content::New(b, ..)) => b.clone(),
        _ => return Ok(None),
    };
    let (status, mut obj) = match rules::parse_meta(&meta) {
        Ok(MetaIntent::Commit(s, o)) => (s, o),
        Ok(MetaIntent::Pending) => return Ok(None),
        Err(reason) => return Err(invalid(reason)),
    };
    // No lost update: a change made on version N lands only over N.
    if let Some(want) = rules::take_if_version(&mut obj).map_err(invalid)? {
        let have = committed.map_or(0, |r| r.version);
        let since = format!("version {want} was read");
        if let Some(reason) = rules::stale_reason(have, want, &since) {
            return Err(Refusal::Stale {
                reason,
                current: have,
            });
        }
    }
    match obj.get("searchable") {
        None | Some(Value::Bool(_)) => {}
        Some(_) => {
            return Err(invalid(
                "\"searchable\" in .meta.json is true or false".into(),
            ))
        }
    }
    rules::check_times(&mut obj).map_err(invalid)?;
    // Secrets leave before anything is checked, stored or indexed.
    let redacted = redactor.map_or(0, |r| redact(r, files, &mut obj));
    if get(files, CONTENT).is_none() {
        return Err(invalid(
            "content.md is missing: write it before .meta.json".into(),
        ));
    }
    let mut edges = None;
    for (name, c) in files.iter() {
        let Content::New(bytes, ..) = c else { continue };
        let checked = match *name {
            ABSTRACT => rules::check_abstract(bytes),
            RELATIONS => rules::check_relations(bytes, node).map(|e| {
                edges = Some(e);
            }),
            META => Ok(()),
            other => rules::check_utf8(other, bytes).map(|_| ()),
        };
        checked.map_err(invalid)?;
    }
    Ok(Some(Asked {
        status,
        obj,
        edges,
        redacted,
    }))
}

/// The daemon's marks in `.meta.json`: which summaries it wrote, how many
/// secrets it replaced, the content's hash.
fn stamp(
    obj: &mut Map<String, Value>,
    intent: Intent,
    mut derived: Vec<&'static str>,
    mut redacted: usize,
    content: Option<&str>,
) {
    obj.remove("derived");
    obj.remove("redacted");
    if let Intent::Import(i) = intent {
        for label in ["abstract", "overview"] {
            if i.derived.iter().any(|d| d == label) && !derived.contains(&label) {
                derived.push(label);
            }
        }
        redacted += i.redacted as usize;
    }
    if !derived.is_empty() {
        obj.insert("derived".into(), json!(derived));
    }
    if redacted > 0 {
        obj.insert("redacted".into(), redacted.into());
    }
    let hash = content.map(|c| content_hash(c.as_bytes()));
    obj.insert(
        "content_hash".into(),
        Value::String(hash.unwrap_or_default()),
    );
}

/// A node's files within its byte budget (`.meta.json` aside).
fn check_size(files: &[(&'static str, Content)]) -> Result<(), Refusal> {
    let size: u64 = files
        .iter()
        .filter(|(name, _)| *name != META)
        .map(|(_, c)| match c {
            Content::New(b, ..) => b.len() as u64,
            Content::Keep(f) => f.size,
        })
        .sum();
    if size > NODE_BUDGET_BYTES {
        return Err(Refusal::TooBig(format!(
            "the node's files hold {size} bytes; a node holds at most {NODE_BUDGET_BYTES} (split it into several nodes)"
        )));
    }
    Ok(())
}

/// The outbox events of a version.
fn events_of(
    node: &str,
    status: Status,
    searchable: bool,
    texts: &[(u8, String)],
    edges: Option<Vec<Value>>,
) -> Vec<Change> {
    let mut events = match status {
        Status::Archived => vec![Change::ArchiveContext {}],
        Status::Active if !searchable => vec![Change::UnindexContext {}],
        Status::Active => vec![Change::UpsertContext {
            records: event::records(node, texts),
        }],
        Status::Broken => Vec::new(),
    };
    if let Some(edges) = edges {
        events.push(Change::UpsertRelation { edges });
    }
    events
}

/// Replace secrets in the node files written in this commit and in the
/// client's `.meta.json` fields; how many values were replaced.
fn redact(
    r: &Redactor,
    files: &mut [(&'static str, Content)],
    obj: &mut Map<String, Value>,
) -> usize {
    let mut n = 0;
    for (name, c) in files.iter_mut() {
        let Content::New(bytes, ..) = c else { continue };
        match *name {
            CONTENT | ABSTRACT | OVERVIEW => {
                let Ok(text) = std::str::from_utf8(bytes) else {
                    continue;
                };
                let (t, k) = r.redact_text(text);
                if k > 0 {
                    *bytes = t.into_bytes();
                    n += k;
                }
            }
            RELATIONS => {
                let Ok(mut v) = serde_json::from_slice::<Value>(bytes) else {
                    continue;
                };
                let k = r.redact_json(&mut v);
                if k > 0 {
                    let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
                    out.push(b'\n');
                    *bytes = out;
                    n += k;
                }
            }
            _ => {}
        }
    }
    let mut v = Value::Object(std::mem::take(obj));
    n += r.redact_json(&mut v);
    if let Value::Object(o) = v {
        *obj = o;
    }
    n
}

/// Fill in the L0 and L1 a writer left out (absent or empty), or that were
/// derived before and whose content changed; returns which.
fn derive_summaries(
    files: &mut Vec<(&'static str, Content)>,
    content: Option<&str>,
    before: &[String],
    now: i128,
) -> Vec<&'static str> {
    let content_new = files
        .iter()
        .any(|(n, c)| *n == CONTENT && matches!(c, Content::New(..)));
    let Some(content) = content else {
        return Vec::new();
    };
    let mut derived = Vec::new();
    for (file, label) in [(ABSTRACT, "abstract"), (OVERVIEW, "overview")] {
        let was = before.iter().any(|x| x == label);
        let needed = match get(files, file) {
            None => true,
            Some(Content::New(b, ..)) => b.iter().all(u8::is_ascii_whitespace),
            // Derived before: derived again when the content changed, else
            // kept and still marked derived.
            Some(Content::Keep(_)) if was && !content_new => {
                derived.push(label);
                continue;
            }
            Some(Content::Keep(_)) => was,
        };
        if !needed {
            continue;
        }
        let mut text = if file == ABSTRACT {
            derive::derive_abstract(content, rules::MAX_ABSTRACT_CHARS)
        } else {
            derive::derive_overview(content)
        };
        if !text.ends_with('\n') {
            text.push('\n');
        }
        files.retain(|(n, _)| *n != file);
        files.push((file, Content::New(text.into_bytes(), now, 0o644)));
        derived.push(label);
    }
    files.sort_by_key(|(n, _)| NODE_FILES.iter().position(|x| x == n));
    derived
}

/// `content_hash` of `.meta.json`: what `sha256sum content.md` prints.
fn content_hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(bytes);
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: &str = "acme/users/alice/memories/events/e1";
    const NOW: i128 = 1_800_000_000_000_000_000;

    fn new(s: &str) -> Content {
        Content::New(s.as_bytes().to_vec(), 7, 0o600)
    }

    fn keep(name: &str, blob: u64, size: u64) -> Content {
        Content::Keep(FileRec {
            name: name.into(),
            blob,
            size,
            mtime_ns: 1,
            mode: 0o644,
        })
    }

    /// The committed record of node `N` at version 3.
    fn at_version_3() -> NodeRec {
        NodeRec {
            id: 9,
            path: N.into(),
            status: Status::Active,
            version: 3,
            created_at: "2020-01-01T00:00:00Z".into(),
            updated_at: String::new(),
            updated_ns: 0,
            files: Vec::new(),
        }
    }

    fn view(files: Vec<(&'static str, Content)>) -> View<'static> {
        View {
            by: None,
            node: N,
            committed: None,
            files,
            kept_text: Vec::new(),
            derived_before: Vec::new(),
        }
    }

    fn full(meta: &str) -> Vec<(&'static str, Content)> {
        vec![
            (CONTENT, new("Alice moved to Lyon. She likes trains.\n")),
            (RELATIONS, new("[]\n")),
            (ABSTRACT, new("Alice moved to Lyon\n")),
            (OVERVIEW, new("Moves\n")),
            (META, new(meta)),
        ]
    }

    fn build(v: View, intent: Intent) -> Outcome {
        Plan::build(v, intent, NOW, Some(&Redactor::default()))
    }

    fn planned(o: Outcome) -> Plan {
        match o {
            Outcome::Commit(p) => *p,
            other => panic!("expected a commit, got {other:?}"),
        }
    }

    fn refused(o: Outcome) -> Refusal {
        match o {
            Outcome::Refused(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn meta_of(p: &Plan) -> Value {
        match get(&p.files, META) {
            Some(Content::New(b, ..)) => serde_json::from_slice(b).unwrap(),
            other => panic!("no rendered meta: {other:?}"),
        }
    }

    /// Close: what `.meta.json` asks decides between draft, commit and refusal.
    #[test]
    fn close_decision_table() {
        let no_meta = full("")[..4].to_vec();
        assert_eq!(build(view(no_meta), Intent::Close), Outcome::StillPending);
        for pending in [r#"{"status":"PENDING"}"#, "{}", r#"{"tags":["x"]}"#] {
            assert_eq!(
                build(view(full(pending)), Intent::Close),
                Outcome::StillPending
            );
        }
        let invalid: &[(&str, Vec<(&'static str, Content)>)] = &[
            ("not valid JSON", full("{")),
            ("may not be set", full(r#"{"status":"BROKEN"}"#)),
            (
                "content.md is missing",
                full(r#"{"status":"ACTIVE"}"#)[1..].to_vec(),
            ),
            ("characters", {
                let mut f = full(r#"{"status":"ACTIVE"}"#);
                f[2].1 = new(&"x".repeat(101));
                f
            }),
            ("list of edges", {
                let mut f = full(r#"{"status":"ACTIVE"}"#);
                f[1].1 = new("{}");
                f
            }),
            ("not UTF-8", {
                let mut f = full(r#"{"status":"ACTIVE"}"#);
                f[0].1 = Content::New(vec![0xff, 0xfe], 0, 0);
                f
            }),
            (
                "in the past",
                full(r#"{"status":"ACTIVE","expires_at":"2001-01-01T00:00:00Z"}"#),
            ),
            (
                "ttl_seconds",
                full(r#"{"status":"ACTIVE","ttl_seconds":-4}"#),
            ),
        ];
        for (why, files) in invalid {
            match refused(build(view(files.clone()), Intent::Close)) {
                Refusal::Invalid(r) => assert!(r.contains(why), "{why}: {r}"),
                other => panic!("{why}: {other:?}"),
            }
        }
        let mut big = full(r#"{"status":"ACTIVE"}"#);
        big[0].1 = new(&"a".repeat(NODE_BUDGET_BYTES as usize + 1));
        assert!(matches!(
            refused(build(view(big), Intent::Close)),
            Refusal::TooBig(r) if r.contains("at most 300000")
        ));
    }

    #[test]
    fn a_new_active_node() {
        let p = planned(build(
            view(full(r#"{"status":"ACTIVE","ttl_seconds":60}"#)),
            Intent::Close,
        ));
        assert_eq!((p.status, p.version), (Status::Active, 1));
        assert_eq!(p.created_at, rfc3339(NOW));
        assert_eq!(
            (p.updated_ns, p.updated_at.as_str()),
            (NOW, rfc3339(NOW).as_str())
        );
        assert_eq!(p.expires, Some(NOW as u64 + 60_000_000_000));
        let m = meta_of(&p);
        assert_eq!(m["version"], 1);
        assert_eq!(m["uri"], format!("ctx://{N}"));
        assert!(m["content_hash"].as_str().unwrap().starts_with("sha256:"));
        assert!(m.get("ttl_seconds").is_none() && m["expires_at"].is_string());
        assert!(m.get("derived").is_none());
        // Texts in protocol order (content, abstract, overview) and one upsert.
        let levels: Vec<u8> = p.texts.iter().map(|t| t.0).collect();
        assert_eq!(levels, [2, 0, 1]);
        // A written `.relations.json` is announced even when empty.
        assert!(matches!(
            &p.events[..],
            [Change::UpsertContext { records }, Change::UpsertRelation { edges }]
                if records.len() == 3 && edges.is_empty()
        ));
        // The rendered meta is stamped now and keeps the writer's mode.
        assert!(matches!(get(&p.files, META), Some(Content::New(_, t, 0o600)) if *t == NOW));
    }

    #[test]
    fn status_and_relations_choose_the_events() {
        let p = planned(build(view(full(r#"{"status":"ARCHIVED"}"#)), Intent::Close));
        assert_eq!(p.status, Status::Archived);
        assert_eq!(
            p.events,
            vec![
                Change::ArchiveContext {},
                Change::UpsertRelation { edges: vec![] }
            ]
        );
        let kept_relations: Vec<_> = full(r#"{"status":"ARCHIVED"}"#)
            .into_iter()
            .filter(|(n, _)| *n != RELATIONS)
            .collect();
        let p = planned(build(view(kept_relations), Intent::Close));
        assert_eq!(p.events, vec![Change::ArchiveContext {}]);
        let mut f = full(r#"{"status":"ACTIVE"}"#);
        f[1].1 = new(&format!(
            r#"[{{"from_uri":"ctx://{N}","to_uri":"ctx://acme/users/alice/memories/events/e2","relation_type":"r"}}]"#
        ));
        let p = planned(build(view(f), Intent::Close));
        assert!(matches!(
            &p.events[..],
            [Change::UpsertContext { .. }, Change::UpsertRelation { edges }] if edges.len() == 1
        ));
    }

    #[test]
    fn summaries_left_out_are_derived() {
        let f: Vec<_> = full(r#"{"status":"ACTIVE"}"#)
            .into_iter()
            .filter(|(n, _)| *n != ABSTRACT)
            .map(|(n, c)| {
                if n == OVERVIEW {
                    (n, new("  \n"))
                } else {
                    (n, c)
                }
            })
            .collect();
        let p = planned(build(view(f), Intent::Close));
        assert_eq!(meta_of(&p)["derived"], json!(["abstract", "overview"]));
        let names: Vec<&str> = p.files.iter().map(|f| f.0).collect();
        assert_eq!(names, NODE_FILES, "files stay in protocol order");
        assert!(p
            .texts
            .iter()
            .any(|(l, t)| *l == 0 && t.starts_with("Alice moved to Lyon")));
    }

    /// `if_version`: a commit lands only over the version it was made on;
    /// the condition is never stored.
    #[test]
    fn if_version_lands_only_over_its_version() {
        let rec = &at_version_3();
        let at = |committed: Option<&NodeRec>, want: &str| {
            let v = View {
                committed,
                ..view(full(&format!(
                    r#"{{"status":"ACTIVE","if_version":{want}}}"#
                )))
            };
            build(v, Intent::Close)
        };
        for (committed, want, outcome) in [
            (Some(rec), "3", Ok(4)),
            (None, "0", Ok(1)),
            (None, "null", Ok(1)),
            (Some(rec), "2", Err((3, "the node is at version 3, not 2"))),
            (Some(rec), "0", Err((3, "the node was created since"))),
            (
                None,
                "3",
                Err((0, "the node was deleted since version 3 was read")),
            ),
        ] {
            match (at(committed, want), outcome) {
                (Outcome::Commit(p), Ok(v)) => {
                    assert_eq!(p.version, v, "{want}");
                    let meta = meta_of(&p);
                    assert!(meta.get("if_version").is_none(), "{meta}");
                }
                (Outcome::Refused(Refusal::Stale { reason, current }), Err((c, why))) => {
                    assert_eq!(current, c, "{want}");
                    assert!(reason.contains(why), "{want}: {reason}");
                }
                (got, want_) => panic!("if_version {want}: {got:?}, expected {want_:?}"),
            }
        }
        for bad in ["-1", "\"3\"", "1.5", "4294967296"] {
            match refused(at(Some(rec), bad)) {
                Refusal::Invalid(r) => assert!(r.contains("if_version"), "{bad}: {r}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_new_version_over_a_committed_one() {
        let rec = at_version_3();
        // Only .meta.json rewritten; the rest kept, the abstract derived before.
        let v = View {
            by: None,
            node: N,
            committed: Some(&rec),
            files: vec![
                (CONTENT, keep(CONTENT, 1, 30)),
                (RELATIONS, keep(RELATIONS, 2, 3)),
                (ABSTRACT, keep(ABSTRACT, 3, 10)),
                (OVERVIEW, keep(OVERVIEW, 4, 6)),
                (META, new(r#"{"status":"ACTIVE"}"#)),
            ],
            kept_text: vec![
                (CONTENT, "Kept body.".into()),
                (ABSTRACT, "Kept body.".into()),
                (OVERVIEW, "Over".into()),
            ],
            derived_before: vec!["abstract".into()],
        };
        let p = planned(build(v.clone(), Intent::Close));
        assert_eq!(
            (p.version, p.created_at.as_str()),
            (4, "2020-01-01T00:00:00Z")
        );
        assert!(matches!(get(&p.files, ABSTRACT), Some(Content::Keep(f)) if f.blob == 3));
        assert_eq!(meta_of(&p)["derived"], json!(["abstract"]));
        assert!(p.texts.contains(&(2, "Kept body.".into())));
        // The content changes: the derived abstract follows it.
        let mut v2 = v;
        v2.files[0].1 = new("Brand new text.");
        let p = planned(build(v2, Intent::Close));
        assert!(
            matches!(get(&p.files, ABSTRACT), Some(Content::New(b, ..)) if b == b"Brand new text.\n")
        );
    }

    #[test]
    fn broken_takes_the_files_as_they_are() {
        let mut f = full(r#"{"status":"ACTIVE","x":1}"#);
        f[0].1 = Content::New(vec![0xff], 0, 0);
        let p = planned(build(view(f), Intent::Broken("missing .overview.md")));
        assert_eq!((p.status, p.version), (Status::Broken, 1));
        assert!(p.events.is_empty());
        let m = meta_of(&p);
        assert_eq!(m["broken_reason"], "missing .overview.md");
        assert_eq!(m["status"], "BROKEN");
        assert_eq!(m["x"], 1);
        // Without a .meta.json at all, BROKEN still commits.
        let p = planned(build(view(full("")[..1].to_vec()), Intent::Broken("r")));
        assert_eq!(p.status, Status::Broken);
    }

    #[test]
    fn import_keeps_version_times_and_marks() {
        let i = Imported {
            version: 7,
            created_at: "2021-01-01T00:00:00Z".into(),
            updated_at: "2021-02-01T00:00:00Z".into(),
            updated_ns: 5,
            derived: vec!["overview".into()],
            redacted: 2,
        };
        let p = planned(build(
            view(full(r#"{"status":"ACTIVE"}"#)),
            Intent::Import(&i),
        ));
        assert_eq!((p.version, p.updated_ns), (7, 5));
        let m = meta_of(&p);
        assert_eq!(m["created_at"], "2021-01-01T00:00:00Z");
        assert_eq!(m["updated_at"], "2021-02-01T00:00:00Z");
        assert_eq!(m["derived"], json!(["overview"]));
        assert_eq!(m["redacted"], 2);
    }

    #[test]
    fn secrets_leave_before_the_checks() {
        let mut f = full(r#"{"status":"ACTIVE","api_key":"sk-123"}"#);
        f[0].1 = new("password: hunter2\n");
        let p = planned(build(view(f.clone()), Intent::Close));
        let m = meta_of(&p);
        assert_eq!(m["api_key"], "[REDACTED]");
        assert_eq!(m["redacted"], 2);
        assert!(p.texts.contains(&(2, "password: [REDACTED]\n".into())));
        // No policy: kept as written.
        let p = planned(Plan::build(view(f), Intent::Close, NOW, None));
        assert_eq!(meta_of(&p)["api_key"], "sk-123");
        // A restore is a close of the old files.
        let p = planned(build(view(full(r#"{"status":"ACTIVE"}"#)), Intent::Restore));
        assert_eq!(p.version, 1);
    }
}
