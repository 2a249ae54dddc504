//! Merge policies (seed 002 `MergePolicy`): where a candidate memory goes
//! and how it meets what is already there. Pure: the core looks up the
//! existing node and asks the model to merge.

use super::{quote, Candidate, Kind, Style};

/// How a candidate meets an existing node at its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One node for the subject: a new version merges old and new.
    Merge,
    /// A new node every time, with a unique id (events, cases).
    Append,
}

/// Where a candidate goes: a node path under the account, and its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Node path relative to the account (`users/u/memories/preferences/tea`).
    pub node: String,
    /// The directory near-duplicates are searched in (relative to the account).
    pub category_dir: String,
    /// The subject's slug: candidates of one conversation with the same
    /// directory and subject are one memory.
    pub subject: String,
    pub mode: Mode,
}

/// A URL-safe slug of a topic: lower-case ASCII letters and digits joined
/// by `-`, at most 48 bytes; `memory` when nothing is left.
pub fn slug(topic: &str) -> String {
    let mut s = String::new();
    let mut dash = false;
    for ch in topic.chars().flat_map(|c| c.to_lowercase()) {
        if ch.is_ascii_alphanumeric() {
            if dash && !s.is_empty() {
                s.push('-');
            }
            dash = false;
            s.push(ch);
            if s.len() >= 48 {
                break;
            }
        } else {
            dash = true;
        }
    }
    if s.is_empty() {
        "memory".into()
    } else {
        s
    }
}

/// A short stable id for an appended node: from the inbox file and the
/// first message index, so re-running one job gives the same node.
pub fn append_id(source: &str, c: &Candidate) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in source
        .bytes()
        .chain(c.messages.first().copied().unwrap_or(0).to_le_bytes())
        .chain(c.text.bytes())
    {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    format!("{h:08x}")
}

/// The place of candidate `c` extracted for user `user` (and agent `agent`,
/// when the conversation names one); `Err` says why it has none.
pub fn target(
    c: &Candidate,
    user: &str,
    agent: Option<&str>,
    source: &str,
) -> Result<Target, String> {
    let mem = format!("users/{user}/memories");
    let s = slug(&c.topic);
    let subject = s.clone();
    let (dir, name, mode) = match c.kind {
        Kind::Profile => {
            return Ok(Target {
                node: format!("{mem}/profile"),
                category_dir: format!("{mem}/profile"),
                subject: "profile".into(),
                mode: Mode::Merge,
            })
        }
        Kind::Preference => (format!("{mem}/preferences"), s, Mode::Merge),
        Kind::Entity => (format!("{mem}/entities"), s, Mode::Merge),
        Kind::Event => (
            format!("{mem}/events"),
            format!("{}-{}", trim(&s, 39), append_id(source, c)),
            Mode::Append,
        ),
        Kind::Case | Kind::Pattern | Kind::Skill => {
            let Some(g) = agent else {
                return Err(format!(
                    "a {} belongs to an agent, and the conversation names none (\"agent\")",
                    c.kind.as_str()
                ));
            };
            match c.kind {
                Kind::Skill => (format!("agents/{g}/skills"), s, Mode::Merge),
                Kind::Pattern => (format!("agents/{g}/memories/patterns"), s, Mode::Merge),
                _ => (
                    format!("agents/{g}/memories/cases"),
                    format!("{}-{}", trim(&s, 39), append_id(source, c)),
                    Mode::Append,
                ),
            }
        }
    };
    Ok(Target {
        node: format!("{dir}/{name}"),
        category_dir: dir,
        subject,
        mode,
    })
}

/// Is `node` (under the account) an instruction to an agent: a skill or a
/// pattern, which an agent reads as what to do? Those extracted from a
/// conversation wait for a writer's review.
pub fn instructs_agent(node: &str) -> bool {
    let p: Vec<&str> = node.split('/').collect();
    matches!(
        p.as_slice(),
        ["agents", _, "skills", ..] | ["agents", _, "memories", "patterns", ..]
    )
}

fn trim(s: &str, n: usize) -> &str {
    let t = &s[..s.len().min(n)];
    t.trim_end_matches('-')
}

/// Candidates of one conversation with the same target become one: their
/// lines joined (each once, `quote::merge`), their messages united (a profile said in three turns is
/// one merge, not three).
pub fn combine(mut items: Vec<(Target, Candidate)>) -> Vec<(Target, Candidate)> {
    let mut out: Vec<(Target, Candidate)> = Vec::new();
    for (t, c) in items.drain(..) {
        let same = |o: &Target| {
            o.node == t.node || (o.category_dir == t.category_dir && o.subject == t.subject)
        };
        match out.iter_mut().find(|(o, _)| same(o)) {
            Some((_, prev)) => {
                // Each line once; a quote that holds another's sentences
                // takes its place.
                if let Some((text, _)) = super::quote::merge(&prev.text, &c.text) {
                    prev.text = text;
                }
                prev.messages.extend(c.messages);
                prev.messages.sort_unstable();
                prev.messages.dedup();
            }
            None => out.push((t, c)),
        }
    }
    out
}

/// Words that say nothing of a memory's subject.
const STOP: &[&str] = &[
    "user", "users", "their", "they", "them", "this", "that", "these", "with", "about", "from",
    "have", "has", "had", "likes", "like", "loves", "love", "prefers", "prefer", "wants", "want",
    "enjoys", "enjoy", "really", "very", "still", "also", "every", "some", "into", "when", "what",
    "which", "will", "would", "were", "been", "being", "does", "there", "here", "just", "more",
];

/// The subject words of a text: lower-case alphanumeric words of four or
/// more bytes, and capitalised ones of three (names: "Mel", "Ava"), stop
/// words aside.
pub fn subject_words(text: &str) -> std::collections::HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| {
            w.len() >= 4
                || (w.len() == 3
                    && w.chars().next().is_some_and(char::is_uppercase)
                    && !crate::schema::words::is_stopword(&w.to_lowercase()))
        })
        .map(str::to_lowercase)
        .filter(|w| !STOP.contains(&w.as_str()))
        .collect()
}

/// Do two memory texts share a subject word (beside being close in embedding)?
pub fn share_subject(a: &str, b: &str) -> bool {
    let a = subject_words(a);
    subject_words(b).iter().any(|w| a.contains(w))
}

/// The `content.md` of a node made from a candidate (or a merge).
pub fn content(topic: &str, kind: Kind, text: &str) -> String {
    let title = if kind == Kind::Profile {
        "Profile".to_string()
    } else if topic.trim().is_empty() {
        kind.as_str().to_string()
    } else {
        topic.trim().to_string()
    };
    format!("# {title}\n\n{}\n", text.trim())
}

/// The body of a node's `content.md`: without its `# title` line.
pub fn body(content: &str) -> &str {
    match content.strip_prefix("# ") {
        Some(rest) => rest.split_once('\n').map_or("", |(_, b)| b).trim(),
        None => content.trim(),
    }
}

/// What makes a new event, alike to a stored one, an update of it: a
/// number or date (a word with a digit, or a month's name) its text has and
/// the stored text does not ("the trip moved to June", "now on 14 May").
/// `None`: the same event told again.
pub fn update_of(new: &str, old: &str) -> Option<String> {
    const MONTHS: [&str; 12] = [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    ];
    let marks = |s: &str| -> Vec<String> {
        s.split(|c: char| !(c.is_alphanumeric() || c == '-'))
            .map(|w| w.trim_matches('-').to_lowercase())
            .filter(|w| w.chars().any(|c| c.is_ascii_digit()) || MONTHS.contains(&w.as_str()))
            .collect()
    };
    let before = marks(old);
    marks(new).into_iter().find(|m| !before.contains(m))
}

/// What a placed candidate meets where it lands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Meets<'a> {
    /// No node on the subject, and no near-duplicate.
    Nothing,
    /// For appends: the same event or case is already at `path`
    /// (similarity `sim`), its `content.md` `stored`.
    Same {
        path: &'a str,
        sim: f32,
        stored: &'a str,
    },
    /// An ACTIVE node at `path` (the target's, or a near-duplicate's), its
    /// `content.md` `stored`; `taken`: an earlier candidate of this
    /// conversation already writes it.
    Node {
        path: &'a str,
        stored: &'a str,
        taken: bool,
    },
}

/// What a candidate does to the memory: decided from what it meets, before
/// any model call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A new node, `created` (nothing on the subject yet) or `appended`;
    /// with `supersedes`, an update of the same event at that path.
    New {
        action: &'static str,
        why: String,
        supersedes: Option<String>,
    },
    /// The node it meets becomes `text` (quotes added, no model).
    Merged { text: String, why: String },
    /// The model merges it into the node it meets.
    AskModel,
    /// Nothing is written; `at` names the node it meets, if any.
    Skip { at: Option<String>, why: String },
}

/// The step of a candidate of `kind` and `text`, placed with `mode`, that
/// meets `meets`, in memories of `style`.
pub fn step(mode: Mode, style: Style, kind: Kind, text: &str, meets: Meets) -> Step {
    let kind = kind.as_str();
    match (mode, meets) {
        (Mode::Append, Meets::Same { path, sim, stored }) => {
            let new = style.comparable(text);
            match update_of(&new, &style.comparable(body(stored))) {
                // The same event told again with a new date or number: what
                // changed is a new node that supersedes the old one, which
                // stays (what was planned then) but ranks below it.
                Some(new) => Step::New {
                    action: "appended",
                    why: format!(
                        "an update of {path} (similarity {sim:.2}; {} is new): supersedes it",
                        crate::schema::excerpt(&new)
                    ),
                    supersedes: Some(path.to_string()),
                },
                None => Step::Skip {
                    at: Some(path.to_string()),
                    why: format!("the same {kind} is already in {path} (similarity {sim:.2})"),
                },
            }
        }
        (Mode::Append, _) => Step::New {
            action: "appended",
            why: format!("a new {kind}"),
            supersedes: None,
        },
        (Mode::Merge, Meets::Nothing | Meets::Same { .. }) => Step::New {
            action: "created",
            why: format!("no {kind} on this subject yet"),
            supersedes: None,
        },
        (
            Mode::Merge,
            Meets::Node {
                path, taken: true, ..
            },
        ) => Step::Skip {
            at: Some(path.to_string()),
            why: "merged with another memory of this conversation".into(),
        },
        // Quotes are merged without a model: the new ones added.
        (Mode::Merge, Meets::Node { path, stored, .. }) if style == Style::Quoted => {
            let old = body(stored);
            match quote::merge(old, text) {
                Some((text, n)) => Step::Merged {
                    text,
                    why: format!("{n} new quote{}", if n == 1 { "" } else { "s" }),
                },
                None => Step::Skip {
                    at: Some(path.to_string()),
                    why: format!("already known: {}", crate::schema::excerpt(old)),
                },
            }
        }
        (Mode::Merge, Meets::Node { .. }) => Step::AskModel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The merge decisions, one row each: mode, style, what the candidate
    /// meets, its text, and the step (its action, or what it skips on).
    #[test]
    fn steps_as_a_table() {
        let node = |stored, taken| Meets::Node {
            path: "users/u/memories/preferences/tea",
            stored,
            taken,
        };
        let same = |stored| Meets::Same {
            path: "users/u/memories/events/trip-1",
            sim: 0.93,
            stored,
        };
        let q_old = "# Tea\n\nAnn said on 2023-05-01: \"I drink green tea\"\n";
        let w_old = "# Tea\n\nThe user drinks green tea.\n";
        let rows: Vec<(Mode, Style, Meets, &str, &str)> = vec![
            // Merge mode: a new subject is created whatever the style.
            (
                Mode::Merge,
                Style::Quoted,
                Meets::Nothing,
                "Ann said on 2023-05-02: \"x\"",
                "created",
            ),
            (
                Mode::Merge,
                Style::Written,
                Meets::Nothing,
                "The user drinks tea.",
                "created",
            ),
            // A near-duplicate event met by a merge-mode candidate: created.
            (
                Mode::Merge,
                Style::Written,
                same(w_old),
                "The user drinks tea.",
                "created",
            ),
            // A node an earlier candidate of this conversation writes: skipped.
            (
                Mode::Merge,
                Style::Quoted,
                node(q_old, true),
                "Ann said on 2023-05-02: \"x\"",
                "skip:merged with another",
            ),
            (
                Mode::Merge,
                Style::Written,
                node(w_old, true),
                "The user drinks tea.",
                "skip:merged with another",
            ),
            // Quotes merge without a model: new ones added, known ones skipped.
            (
                Mode::Merge,
                Style::Quoted,
                node(q_old, false),
                "Ann said on 2023-05-02: \"I like oolong\"",
                "merged:1 new quote",
            ),
            (
                Mode::Merge,
                Style::Quoted,
                node(q_old, false),
                "Ann said on 2023-05-09: \"I drink green tea\"",
                "skip:already known",
            ),
            // Written memories ask the model to merge.
            (
                Mode::Merge,
                Style::Written,
                node(w_old, false),
                "The user likes oolong.",
                "ask",
            ),
            // Append mode: always a new node, unless the same event is there.
            (
                Mode::Append,
                Style::Written,
                Meets::Nothing,
                "The user flew to Rome.",
                "appended",
            ),
            (
                Mode::Append,
                Style::Written,
                node(w_old, false),
                "The user flew to Rome.",
                "appended",
            ),
            (
                Mode::Append,
                Style::Written,
                same("# Trip\n\nThe user flies to Rome.\n"),
                "The user flies to Rome.",
                "skip:the same event",
            ),
            // The same event with a new date supersedes the old one.
            (
                Mode::Append,
                Style::Written,
                same("# Trip\n\nThe user flies to Rome.\n"),
                "The user flies to Rome in June.",
                "supersedes",
            ),
            (
                Mode::Append,
                Style::Quoted,
                same("# Trip\n\nAnn said on 2023-05-01: \"I fly to Rome\"\n"),
                "Ann said on 2023-05-03: \"I fly to Rome\"",
                "skip:the same event",
            ),
            (
                Mode::Append,
                Style::Quoted,
                same("# Trip\n\nAnn said on 2023-05-01: \"I fly to Rome\"\n"),
                "Ann said on 2023-05-03: \"I fly to Rome on 4 June\"",
                "supersedes",
            ),
        ];
        for (i, (mode, style, meets, text, want)) in rows.into_iter().enumerate() {
            let got = step(mode, style, Kind::Event, text, meets);
            let ok = match (&got, want.split_once(':')) {
                (
                    Step::New {
                        action,
                        supersedes: None,
                        ..
                    },
                    None,
                ) => *action == want,
                (
                    Step::New {
                        supersedes: Some(p),
                        ..
                    },
                    None,
                ) => want == "supersedes" && p.ends_with("trip-1"),
                (Step::Merged { why, .. }, Some(("merged", w))) => why.starts_with(w),
                (Step::AskModel, None) => want == "ask",
                (Step::Skip { why, at }, Some(("skip", w))) => why.starts_with(w) && at.is_some(),
                _ => false,
            };
            assert!(ok, "row {i}: want {want}, got {got:?}");
        }
    }

    fn cand(kind: Kind, topic: &str, text: &str, m: &[usize]) -> Candidate {
        Candidate {
            kind,
            topic: topic.into(),
            text: text.into(),
            messages: m.to_vec(),
        }
    }

    #[test]
    fn places() {
        assert_eq!(slug("Green Tea, hot!"), "green-tea-hot");
        assert_eq!(slug("  "), "memory");
        assert_eq!(slug("Über café"), "ber-caf");
        let p = target(&cand(Kind::Profile, "x", "y", &[0]), "u", None, "f").unwrap();
        assert_eq!(p.node, "users/u/memories/profile");
        assert_eq!(p.mode, Mode::Merge);
        let t = target(&cand(Kind::Preference, "Tea", "y", &[0]), "u", None, "f").unwrap();
        assert_eq!(t.node, "users/u/memories/preferences/tea");
        let e1 = target(&cand(Kind::Event, "Trip", "went", &[2]), "u", None, "f").unwrap();
        let e2 = target(&cand(Kind::Event, "Trip", "went", &[2]), "u", None, "f").unwrap();
        let e3 = target(&cand(Kind::Event, "Trip", "went", &[4]), "u", None, "f").unwrap();
        assert_eq!(e1, e2);
        assert_ne!(e1.node, e3.node);
        assert!(e1.node.starts_with("users/u/memories/events/trip-"));
        assert!(target(&cand(Kind::Skill, "deploy", "x", &[0]), "u", None, "f").is_err());
        let s = target(&cand(Kind::Skill, "Deploy", "x", &[0]), "u", Some("g"), "f").unwrap();
        assert_eq!(s.node, "agents/g/skills/deploy");
        // Every place is a node place of the tree.
        for t in [p, t, e1, s] {
            let full = format!("acme/{}", t.node);
            let comps = crate::schema::place::split(&full);
            assert_eq!(
                crate::schema::place::classify_dir(&comps).unwrap(),
                crate::schema::place::DirPlace::Node
            );
        }
    }

    #[test]
    fn subjects() {
        assert!(share_subject(
            "The user loves green tea every morning.",
            "# Green tea\n\nThe user still drinks green tea."
        ));
        assert!(!share_subject(
            "The user loves green tea.",
            "The user prefers short answers."
        ));
    }

    #[test]
    fn combines_by_target() {
        let t = |n: &str| Target {
            node: n.into(),
            category_dir: "d".into(),
            subject: n.into(),
            mode: Mode::Merge,
        };
        let out = combine(vec![
            (t("p"), cand(Kind::Profile, "", "Lives in Lyon", &[0])),
            (t("q"), cand(Kind::Preference, "", "tea", &[1])),
            (t("p"), cand(Kind::Profile, "", "Is a nurse", &[3, 0])),
        ]);
        assert_eq!(out.len(), 2);
        // Two events of one subject in one conversation are one event.
        let e = |m: usize| {
            let c = cand(Kind::Event, "Outage", &format!("part {m}"), &[m]);
            (target(&c, "u", None, "f").unwrap(), c)
        };
        let ev = combine(vec![e(6), e(7)]);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].1.messages, vec![6, 7]);
        assert_eq!(out[0].1.text, "Lives in Lyon\nIs a nurse");
        assert_eq!(out[0].1.messages, vec![0, 3]);
        assert_eq!(
            body(&content("Tea", Kind::Preference, "likes it")),
            "likes it"
        );
    }

    #[test]
    fn an_event_told_again_with_a_new_date_is_an_update() {
        let old = "The user plans a trip to Lisbon in May [2026-05-02].";
        assert_eq!(
            update_of("The user's Lisbon trip moved to June [2026-06-06].", old).as_deref(),
            Some("june")
        );
        assert_eq!(
            update_of("The user plans a Lisbon trip in May [2026-05-02]", old),
            None
        );
        assert_eq!(
            update_of("Trip to Lisbon for 3 nights", old).as_deref(),
            Some("3")
        );
    }
}
