//! Preferences the user states outright, kept without the model.
//!
//! A small model asked to pick what is worth remembering sometimes passes
//! over the plainest thing a user can say to an assistant: "I prefer answers
//! with Python examples, and please never use Java in examples." Such a
//! sentence needs no judgement: it is the user's, in the first person or
//! the imperative, and it says what they want. So after the model's picks,
//! each statement of the user's own messages in the request's window that
//! says "I prefer …", "I'd rather …", "I hate …", "I don't want …",
//! "please never …", or opens "My favourite …", and names something (not "I
//! prefer that") becomes a quoted preference, unless a pick from that
//! message holds it already. Liking words ("I love", "I like") are left to
//! the model: in chat they are mostly reactions ("I love that!").
//!
//! The same holds for the plainest facts a user gives of themselves: "My
//! name is …", "I work as …" (or at, for), "I live in …", "I'm from …",
//! "I moved to …", "I grew up in …". A small model asked for quotes first
//! may quote the greeting that answers them instead ("Nice to meet you,
//! Priya!"); each such statement of the user's own that no pick holds
//! becomes a quoted profile memory.

use super::{Candidate, Conversation, Kind};

/// At most this many swept preferences a message: a long message of
/// opinions is the model's to pick from.
const MAX_A_MESSAGE: usize = 3;
/// Words of a swept preference's topic (the start of what it names).
const TOPIC_WORDS: usize = 5;

/// The opening of a stated preference: its end is where what it names
/// begins.
fn opening() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(
            r"(?i)\b(?:i(?:'d| would)? (?:much |really |strongly |always |usually )?(?:prefer|rather)|i (?:really |absolutely |just )?(?:hate|dislike|can't stand|cannot stand)|i (?:don't|do not|never) (?:like|want|use|eat|drink)|please (?:always|never|don't|do not|avoid|stop)|(?:always|never) (?:use|answer|reply|write|include|show|suggest|recommend|send)|^my (?:favou?rite|preferred))\b",
        )
        .expect("the preference pattern compiles")
    })
}

/// The opening of a fact the user states of themselves.
fn profile_opening() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(
            r"(?i)\b(?:my name is|i (?:work|worked) (?:as|at|for)|i (?:live|lived|grew up) in|i(?:'m| am) from|i (?:just )?moved to)\b",
        )
        .expect("the profile pattern compiles")
    })
}

/// Words that name nothing by themselves: "I prefer that", "please
/// never do it again".
const EMPTY: &[&str] = &[
    "again",
    "anything",
    "did",
    "done",
    "else",
    "everything",
    "lot",
    "much",
    "one",
    "ones",
    "so",
    "something",
    "stuff",
    "such",
    "that",
    "thing",
    "things",
    "this",
    "those",
    "too",
    "way",
];

/// What a statement's opening names: its words up to the clause's end,
/// or `None` when they name nothing.
fn named(rest: &str) -> Option<String> {
    let clause = rest
        .split([',', ';', ':', '.', '!', '(', '—'])
        .next()
        .unwrap_or("")
        .trim();
    let words: Vec<&str> = clause.split_whitespace().collect();
    let lower = |w: &str| {
        w.trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase()
    };
    let says = words.iter().any(|w| {
        let w = lower(w);
        w.chars().count() >= 3
            && !crate::schema::words::is_stopword(&w)
            && !EMPTY.contains(&w.as_str())
    });
    if !says {
        return None;
    }
    // The topic: the clause's first words, stopwords trimmed off its ends.
    let mut t: Vec<&str> = words.into_iter().take(TOPIC_WORDS).collect();
    while t
        .last()
        .is_some_and(|w| crate::schema::words::is_stopword(&lower(w)))
    {
        t.pop();
    }
    let start = t
        .iter()
        .position(|w| !crate::schema::words::is_stopword(&lower(w)))?;
    let topic = t[start..]
        .iter()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\''))
        .collect::<Vec<_>>()
        .join(" ");
    (!topic.is_empty()).then_some(topic)
}

/// The topic of sentence `s` when it states a preference outright.
fn stated(s: &str) -> Option<String> {
    if s.trim_end().ends_with('?') {
        return None;
    }
    let m = opening().find(s)?;
    let rest = &s[m.end()..];
    if m.as_str().to_lowercase().ends_with("want") && rest.starts_with(" to ") {
        return None;
    }
    named(rest)
}

/// The model's picks from the user's own messages that state a preference
/// outright are preferences, whatever kind the model gave them (a small
/// model files "I prefer answers with Python examples" as an entity as
/// often as not): their kind and topic are set here.
pub fn settle_kinds(conv: &Conversation, picked: &mut [Candidate]) {
    for c in picked.iter_mut() {
        if c.kind == Kind::Preference
            || c.messages.len() != 1
            || conv
                .messages
                .get(c.messages[0])
                .is_none_or(|m| m.role != "user")
        {
            continue;
        }
        let quoted = super::line::quoted(&c.text);
        if let Some(topic) = super::support::sentences(&quoted)
            .iter()
            .find_map(|s| stated(s))
        {
            c.kind = Kind::Preference;
            c.topic = topic;
        }
    }
}

/// The preferences stated in the user's messages of `range` that none of
/// `picked` holds, as quoted memories.
pub fn preferences(
    conv: &Conversation,
    range: std::ops::Range<usize>,
    picked: &[Candidate],
) -> Vec<Candidate> {
    sweep(conv, range, picked, Kind::Preference, opening())
}

/// The facts the user states of themselves in their messages of `range`
/// that none of `picked` holds, as quoted profile memories.
pub fn profile(
    conv: &Conversation,
    range: std::ops::Range<usize>,
    picked: &[Candidate],
) -> Vec<Candidate> {
    sweep(conv, range, picked, Kind::Profile, profile_opening())
}

/// The statements of the user's own messages of `range` that `pattern`
/// opens and that name something, none of `picked` holds, as quoted
/// memories of `kind`.
fn sweep(
    conv: &Conversation,
    range: std::ops::Range<usize>,
    picked: &[Candidate],
    kind: Kind,
    pattern: &regex::Regex,
) -> Vec<Candidate> {
    let mut out = Vec::new();
    for i in range {
        let msg = &conv.messages[i];
        if msg.role != "user" {
            continue;
        }
        let held: Vec<String> = picked
            .iter()
            .filter(|c| c.messages.contains(&i))
            .map(|c| super::line::quoted(&c.text))
            .collect();
        let mut n = 0;
        for s in super::support::sentences(&msg.content) {
            if n == MAX_A_MESSAGE {
                break;
            }
            if s.trim_end().ends_with('?') || held.iter().any(|h| h.contains(s.as_str())) {
                continue;
            }
            let Some(m) = pattern.find(&s) else {
                continue;
            };
            let rest = &s[m.end()..];
            // "I don't want to …" is an intention, not a preference.
            if m.as_str().to_lowercase().ends_with("want") && rest.starts_with(" to ") {
                continue;
            }
            let Some(topic) = named(rest) else {
                continue;
            };
            let text = crate::schema::clip(&s, super::quote::MAX_QUOTE_CHARS);
            out.push(Candidate {
                kind,
                topic,
                text: super::line::statement(conv, i, &text),
                messages: vec![i],
            });
            n += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::Message;

    fn conv(msgs: &[(&str, &str)]) -> Conversation {
        Conversation {
            messages: msgs
                .iter()
                .map(|(role, content)| Message {
                    role: role.to_string(),
                    content: content.to_string(),
                    ts: None,
                    name: None,
                })
                .collect(),
            agent: Some("helper".into()),
            session: None,
            unsearchable: false,
        }
    }

    #[test]
    fn a_stated_preference_is_kept_in_the_users_words() {
        let c = conv(&[
            ("user", "Hi! I'm Priya."),
            (
                "user",
                "I prefer answers with Python examples, and please never use Java in examples.",
            ),
            ("assistant", "I prefer tea myself. Please never use tabs."),
        ]);
        let got = preferences(&c, 0..3, &[]);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].kind, Kind::Preference);
        assert_eq!(got[0].messages, vec![1]);
        assert_eq!(got[0].topic, "answers with Python examples");
        assert_eq!(
            got[0].text,
            "The user said: \"I prefer answers with Python examples, and please never use Java in examples.\""
        );
    }

    #[test]
    fn a_fact_the_user_states_of_themselves_is_their_profile() {
        let c = conv(&[
            (
                "user",
                "Hi! I'm Priya Raman. I work as a data engineer at a logistics startup in Austin.",
            ),
            ("assistant", "Nice to meet you! I live in the cloud."),
            (
                "user",
                "I'm from here. Where do you live in winter? I'm so happy.",
            ),
            ("user", "My name is Ada and I moved to Lyon last year."),
        ]);
        let got = profile(&c, 0..4, &[]);
        let texts: Vec<(&str, usize)> = got.iter().map(|c| (&*c.text, c.messages[0])).collect();
        assert_eq!(
            texts,
            [
                (
                    "The user said: \"I work as a data engineer at a logistics startup in Austin.\"",
                    0
                ),
                ("The user said: \"My name is Ada and I moved to Lyon last year.\"", 3),
            ],
            "the assistant's, a question and what names nothing are not kept"
        );
        assert!(got.iter().all(|c| c.kind == Kind::Profile));
        // A sentence a pick holds already is not swept again.
        assert_eq!(profile(&c, 0..4, &got).len(), 0);
    }

    #[test]
    fn a_pick_stating_a_preference_is_a_preference_whatever_its_kind() {
        let c = conv(&[
            (
                "user",
                "I prefer answers with Python examples, and please never use Java in examples.",
            ),
            ("assistant", "I prefer tea myself."),
            ("user", "My dog Biscuit turns 3 next week."),
        ]);
        let pick = |kind, i: usize, words: &str| Candidate {
            kind,
            topic: "model's".into(),
            text: super::super::line::statement(&c, i, words),
            messages: vec![i],
        };
        let mut picked = vec![
            pick(
                Kind::Entity,
                0,
                "I prefer answers with Python examples, and please never use Java in examples.",
            ),
            // The other speaker's preference is theirs: an entity stays one.
            pick(Kind::Entity, 1, "I prefer tea myself."),
            // Nothing stated: the model's kind stands.
            pick(Kind::Event, 2, "My dog Biscuit turns 3 next week."),
        ];
        settle_kinds(&c, &mut picked);
        let got: Vec<(Kind, &str)> = picked.iter().map(|p| (p.kind, p.topic.as_str())).collect();
        assert_eq!(
            got,
            vec![
                (Kind::Preference, "answers with Python examples"),
                (Kind::Entity, "model's"),
                (Kind::Event, "model's"),
            ]
        );
    }

    #[test]
    fn what_names_nothing_or_is_picked_already_is_not_swept() {
        let table = [
            "I prefer that.",
            "I'd rather not, thanks!",
            "Do you prefer tea?",
            "I love painting landscapes.",
            "Please never do that again!",
            "I don't want to.",
            "I don't want to spoil it, but just remember this!",
            "That's one of my favorite memories.",
        ];
        for t in table {
            let c = conv(&[("user", t)]);
            assert!(preferences(&c, 0..1, &[]).is_empty(), "{t}");
        }
        let kept = [
            ("I hate long emails, keep replies short.", "long emails"),
            ("My favourite book is Dune.", "book is Dune"),
            ("Please always cite sources.", "cite sources"),
            ("I don't want meetings before 10.", "meetings before 10"),
            (
                "I'd much rather take the train than fly.",
                "take the train than fly",
            ),
        ];
        for (t, topic) in kept {
            let c = conv(&[("user", t)]);
            let got = preferences(&c, 0..1, &[]);
            assert_eq!(got.len(), 1, "{t}");
            assert_eq!(got[0].topic, topic, "{t}");
        }
        // The model's pick from that message holds the sentence already.
        let c = conv(&[("user", "My cat is Miso. I hate long emails.")]);
        let picked = Candidate {
            kind: Kind::Profile,
            topic: "mail".into(),
            text: "The user said: \"I hate long emails.\"".into(),
            messages: vec![0],
        };
        assert!(preferences(&c, 0..1, &[picked]).is_empty());
    }
}
