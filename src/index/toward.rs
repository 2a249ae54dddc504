//! The rules a ranking of conversation messages gets after fusion, each
//! tested as a table: a message weighs more when the query names its
//! speaker or a day near when it was said, and gains a share of the scores
//! of the messages around it and of the question it answers. Memories do
//! not take part; `query.rs` applies them between fusion (`fusion.rs`)
//! and one result per source.

use super::{Hit, MESSAGE_LEVEL};
use std::collections::HashMap;

/// How much more a message weighs when the query names the one who said
/// it (and no other speaker among the candidates): on real two-person
/// chats the evidence of a question about one of them is that person's
/// own words five times in six (BENCHMARKS, "Memory from real
/// conversations").
pub(super) const NAMED_SPEAKER_WEIGHT: f32 = 1.5;

/// The one speaker among `speakers` whom `query` names: every word of the
/// name is a word of the query, in any case. `None` when it names none of
/// them, or several.
pub(super) fn named_speaker<'a>(
    query: &str,
    speakers: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let words = |t: &str| -> Vec<String> {
        t.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    let asked = words(query);
    let mut named: Option<&str> = None;
    for s in speakers {
        if named == Some(s) {
            continue;
        }
        let name = words(s);
        if name.is_empty() || !name.iter().all(|w| asked.contains(w)) {
            continue;
        }
        if named.is_some() {
            return None;
        }
        named = Some(s);
    }
    named
}

/// Messages said by the one speaker `query` names weigh
/// [`NAMED_SPEAKER_WEIGHT`] more; the ranking is sorted again.
pub(super) fn toward_named_speaker(hits: &mut [Hit], query: &str) {
    fn speaker(h: &Hit) -> Option<&str> {
        (h.level == MESSAGE_LEVEL)
            .then(|| crate::schema::event::label_speaker(&h.abstract_))
            .flatten()
    }
    let Some(who) = named_speaker(query, hits.iter().filter_map(speaker)) else {
        return;
    };
    let theirs: Vec<usize> = (0..hits.len())
        .filter(|&i| speaker(&hits[i]) == Some(who))
        .collect();
    for i in theirs {
        hits[i].score *= NAMED_SPEAKER_WEIGHT;
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.path.cmp(&b.path)));
}

/// How much more a message weighs when it was said within
/// [`NAMED_DAY_REACH`] days of a day or month the query names ("what did
/// she plan on 3 July, 2023?", "in August 2023"): the one who asks names
/// the day the words were said, or one near it ("the weekend before"). On
/// the real dev conversations, questions naming a date found their
/// evidence in the top 10 0.66 of the time against 0.80 for the rest
/// (BENCHMARKS' journal, "A day the question names; messages lifted by
/// their neighbours").
pub(super) const NAMED_DAY_WEIGHT: f32 = 2.0;
/// Days before a named span's first day and after its last within which
/// a message counts as said then.
pub(super) const NAMED_DAY_REACH: i32 = 7;

/// The calendar day of a message's label (its `ts`: RFC 3339 or a date,
/// or seconds since the epoch).
pub(super) fn message_day(label: &str) -> Option<jiff::civil::Date> {
    let t = crate::schema::event::label_time(label)?;
    let ts = match t.parse::<i64>() {
        Ok(secs) => serde_json::Value::from(secs),
        Err(_) => serde_json::Value::from(t),
    };
    crate::extract::when::day_of(&ts)
}

/// Is `day` within [`NAMED_DAY_REACH`] days of one of `spans`?
pub(super) fn near_named_days(
    day: jiff::civil::Date,
    spans: &[(jiff::civil::Date, jiff::civil::Date)],
) -> bool {
    let reach = jiff::Span::new().days(NAMED_DAY_REACH);
    spans.iter().any(|(first, last)| {
        let from = first.checked_sub(reach).unwrap_or(*first);
        let to = last.checked_add(reach).unwrap_or(*last);
        from <= day && day <= to
    })
}

/// Messages said near a day `spans` names weigh [`NAMED_DAY_WEIGHT`]
/// more; the ranking is sorted again. Nothing changes when `spans` is
/// empty.
pub(super) fn toward_named_days(
    hits: &mut [Hit],
    spans: &[(jiff::civil::Date, jiff::civil::Date)],
) {
    if spans.is_empty() {
        return;
    }
    for h in hits.iter_mut() {
        if h.level == MESSAGE_LEVEL
            && message_day(&h.abstract_).is_some_and(|d| near_named_days(d, spans))
        {
            h.score *= NAMED_DAY_WEIGHT;
        }
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.path.cmp(&b.path)));
}

/// How much more a message that says when (`Hit::tells_when`: a relative
/// time, a date, how long) weighs for a query that asks when
/// ([`asks_when`]). A question of when is answered by the message that
/// dates the event ("we adopted him last week"), and the messages that go
/// on about it without a time match its words as well; on the real dev
/// conversations the rule found the evidence of 6 more of 157 such
/// questions and lost none, with any weight from 1.3 to 3 (BENCHMARKS'
/// journal, "A question of when lifts the messages that say when").
pub(super) const TOLD_WHEN_WEIGHT: f32 = 1.5;

/// Does `query` ask when: "When did…", "which year…", "how long…", "how
/// many months…".
pub(super) fn asks_when(query: &str) -> bool {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(
            r"(?i)^\W*when\b|\b(?:what|which) (?:year|month|day|date|time|week|weekend)\b|\bhow long\b|\bhow many (?:days|weeks|months|years)\b",
        )
        .expect("the when pattern compiles")
    })
    .is_match(query)
}

/// Messages that say when weigh [`TOLD_WHEN_WEIGHT`] more when the query
/// asks when; the ranking is sorted again.
pub(super) fn toward_told_when(hits: &mut [Hit], query: &str) {
    if !asks_when(query) {
        return;
    }
    for h in hits.iter_mut() {
        if h.level == MESSAGE_LEVEL && h.tells_when {
            h.score *= TOLD_WHEN_WEIGHT;
        }
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.path.cmp(&b.path)));
}

/// Shares of the best neighbour's score a message gains: of the message
/// just before or after it in its conversation, then of those two away.
/// A fact is often said in passing ("yes, twice!"), between the question
/// that names its subject and the reply that goes on about it; the
/// messages around it match the query, and lift it (BENCHMARKS' journal,
/// "A day the question names; messages lifted by their neighbours").
pub(super) const NEIGHBOUR_SHARES: [f32; 2] = [0.5, 0.25];

/// The share of a question's score that the message after it, its
/// answer, gains besides [`NEIGHBOUR_SHARES`]. A question names its
/// subject in the words a later search uses ("any book series you would
/// recommend?") and holds no answer; the reply that does says "The Name
/// of the Wind" (BENCHMARKS' journal, "A question lifts its answer").
pub(super) const ANSWER_SHARE: f32 = 0.25;

/// Each message of the ranking gains [`NEIGHBOUR_SHARES`] of the best
/// score of the messages one and two away from it in its conversation,
/// and [`ANSWER_SHARE`] of the score of the message before it when that
/// one asks (`Hit::asks`), among the ranking's candidates (their scores
/// before this); memories do not lift or gain. The ranking is sorted
/// again.
pub(super) fn toward_neighbours(hits: &mut [Hit]) {
    // Each hit's (conversation, message number) when it is a message.
    let keys: Vec<Option<(&str, u32)>> = hits
        .iter()
        .map(|h| {
            (h.level == MESSAGE_LEVEL)
                .then(|| crate::schema::event::message_of(&h.path))
                .flatten()
        })
        .collect();
    let at: HashMap<(&str, u32), (f32, bool)> = keys
        .iter()
        .zip(hits.iter())
        .filter_map(|(k, h)| Some(((*k)?, (h.score, h.asks))))
        .collect();
    if at.len() < 2 {
        return;
    }
    let gains: Vec<f32> = keys
        .iter()
        .map(|k| {
            let Some((conv, i)) = *k else {
                return 0.0;
            };
            let score = |j: Option<u32>| j.and_then(|j| at.get(&(conv, j)).map(|a| a.0));
            let asked = i
                .checked_sub(1)
                .and_then(|j| at.get(&(conv, j)))
                .filter(|a| a.1)
                .map_or(0.0, |a| ANSWER_SHARE * a.0);
            asked
                + NEIGHBOUR_SHARES
                    .iter()
                    .zip(1u32..)
                    .map(|(share, d)| {
                        let best = score(i.checked_sub(d))
                            .into_iter()
                            .chain(score(i.checked_add(d)))
                            .fold(0.0f32, f32::max);
                        share * best
                    })
                    .sum::<f32>()
        })
        .collect();
    for (h, g) in hits.iter_mut().zip(gains) {
        h.score += g;
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.path.cmp(&b.path)));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hit on `path` scored `score`, its best record of `level`.
    fn scored(path: &str, score: f32, level: u8) -> Hit {
        let mut h = Hit::blank(path);
        h.score = score;
        h.level = level;
        h
    }

    #[test]
    fn the_speaker_a_query_names_as_a_table() {
        // (query, speakers among the candidates) -> the one it names
        let rows: &[(&str, &[&str], Option<&str>)] = &[
            ("What did Ann adopt?", &["Ann", "Bob"], Some("Ann")),
            ("what is ann's dog called", &["Ann", "Bob"], Some("Ann")),
            ("Did Ann and Bob meet?", &["Ann", "Bob"], None),
            ("Who adopted a dog?", &["Ann", "Bob"], None),
            ("What did Annette adopt?", &["Ann"], None),
            (
                "What did Ann Lee say?",
                &["Ann Lee", "Bob"],
                Some("Ann Lee"),
            ),
            ("What did Ann say?", &["Ann Lee"], None),
            ("What did Ann say?", &["Ann", "Ann"], Some("Ann")),
        ];
        for (query, speakers, named) in rows {
            assert_eq!(
                named_speaker(query, speakers.iter().copied()),
                *named,
                "{query} {speakers:?}"
            );
        }
        let hit = |path: &str, score: f32, label: &str, level: u8| {
            let mut h = Hit::blank(path);
            h.score = score;
            h.abstract_ = label.to_string();
            h.level = level;
            h
        };
        let mut hits = vec![
            hit(
                "a/users/u/inbox/c.json#1",
                0.6,
                "#1 Bob (assistant) t: dogs",
                MESSAGE_LEVEL,
            ),
            hit("a/users/u/memories/m", 0.55, "Ann adopted a dog", 2),
            hit(
                "a/users/u/inbox/c.json#0",
                0.5,
                "#0 Ann (user) t: my dog",
                MESSAGE_LEVEL,
            ),
        ];
        toward_named_speaker(&mut hits, "What dog did Ann adopt?");
        let order: Vec<&str> = hits.iter().map(|h| h.abstract_.as_str()).collect();
        assert_eq!(
            order,
            [
                "#0 Ann (user) t: my dog",
                "#1 Bob (assistant) t: dogs",
                "Ann adopted a dog"
            ]
        );
        assert_eq!(hits[0].score, 0.5 * NAMED_SPEAKER_WEIGHT);
    }

    #[test]
    fn messages_near_a_named_day_as_a_table() {
        let d = |s: &str| s.parse::<jiff::civil::Date>().unwrap();
        let july3 = [(d("2023-07-03"), d("2023-07-03"))];
        let august = [(d("2023-08-01"), d("2023-08-31"))];
        // (day said, spans named) -> near
        type Span = (jiff::civil::Date, jiff::civil::Date);
        let rows: &[(&str, &[Span], bool)] = &[
            ("2023-07-03", &july3, true),
            ("2023-06-26", &july3, true),
            ("2023-07-10", &july3, true),
            ("2023-06-25", &july3, false),
            ("2023-07-11", &july3, false),
            ("2023-08-15", &august, true),
            ("2023-07-25", &august, true),
            ("2023-09-08", &august, false),
            ("2023-08-15", &[], false),
        ];
        for (day, spans, near) in rows {
            assert_eq!(near_named_days(d(day), spans), *near, "{day} {spans:?}");
        }
        // The day a label shows: RFC 3339, a date, seconds since the epoch.
        assert_eq!(
            message_day("#1 Bo (user) 2023-07-03T10:00:00Z: hi"),
            Some(d("2023-07-03"))
        );
        assert_eq!(message_day("#1 user 2023-07-03: hi"), Some(d("2023-07-03")));
        assert_eq!(message_day("#1 user 1688378400: hi"), Some(d("2023-07-03")));
        assert_eq!(message_day("#1 Bo (user): hi"), None);
        assert_eq!(message_day("#1 Bo (user) soon: hi"), None);

        let hit = |path: &str, score: f32, label: &str, level: u8| {
            let mut h = Hit::blank(path);
            h.score = score;
            h.abstract_ = label.to_string();
            h.level = level;
            h
        };
        let ranking = || {
            vec![
                hit(
                    "c.json#1",
                    0.6,
                    "#1 Bo (user) 2023-05-01T10:00:00Z: a",
                    MESSAGE_LEVEL,
                ),
                hit("m", 0.55, "2023-07-03 a memory", 2),
                hit(
                    "c2.json#0",
                    0.4,
                    "#0 Bo (user) 2023-07-04T10:00:00Z: b",
                    MESSAGE_LEVEL,
                ),
            ]
        };
        let mut hits = ranking();
        toward_named_days(&mut hits, &july3);
        let order: Vec<&str> = hits.iter().map(|h| &h.abstract_[..3]).collect();
        assert_eq!(order, ["#0 ", "#1 ", "202"]);
        assert_eq!(hits[0].score, 0.4 * NAMED_DAY_WEIGHT);
        let mut hits = ranking();
        toward_named_days(&mut hits, &[]);
        let order: Vec<&str> = hits.iter().map(|h| &h.abstract_[..3]).collect();
        assert_eq!(order, ["#1 ", "202", "#0 "]);
    }

    #[test]
    fn a_question_of_when_lifts_the_messages_that_say_when() {
        for q in [
            "When did Ann adopt Rex?",
            "when is the party",
            "Which year did Bob move to Oslo?",
            "In what month did they meet?",
            "How long has Ann played the cello?",
            "How many months passed between the two trips?",
        ] {
            assert!(asks_when(q), "{q}");
        }
        for q in [
            "What did Ann do when she moved?",
            "How many dogs does Ann have?",
            "What did Bob adopt in May 2023?",
            "Where did they meet?",
        ] {
            assert!(!asks_when(q), "{q}");
        }
        let hit = |path: &str, score: f32, level: u8, tells_when: bool| Hit {
            tells_when,
            ..scored(path, score, level)
        };
        let ranking = || {
            vec![
                hit("a/users/u/inbox/c.json#1", 0.6, MESSAGE_LEVEL, false),
                hit("a/users/u/memories/m", 0.55, 2, true),
                hit("a/users/u/inbox/c.json#0", 0.5, MESSAGE_LEVEL, true),
            ]
        };
        let order = |hits: &[Hit]| -> Vec<String> {
            hits.iter()
                .map(|h| h.path.rsplit('/').next().unwrap().to_string())
                .collect()
        };
        let mut hits = ranking();
        toward_told_when(&mut hits, "When did Ann adopt Rex?");
        assert_eq!(order(&hits), ["c.json#0", "c.json#1", "m"]);
        assert_eq!(hits[0].score, 0.5 * TOLD_WHEN_WEIGHT);
        // A question of what: nothing moves.
        let mut hits = ranking();
        toward_told_when(&mut hits, "What did Ann adopt?");
        assert_eq!(order(&hits), ["c.json#1", "m", "c.json#0"]);
    }

    #[test]
    fn a_message_is_lifted_by_its_neighbours() {
        let hit = scored;
        let mut hits = vec![
            hit("a/users/u/inbox/c.json#0", 0.6, MESSAGE_LEVEL),
            hit("a/users/u/inbox/d.json#9", 0.5, MESSAGE_LEVEL),
            hit("a/users/u/memories/m", 0.45, 2),
            hit("a/users/u/inbox/c.json#2", 0.4, MESSAGE_LEVEL),
            hit("a/users/u/inbox/c.json#1", 0.3, MESSAGE_LEVEL),
        ];
        toward_neighbours(&mut hits);
        let got: Vec<(&str, f32)> = hits
            .iter()
            .map(|h| (h.path.rsplit('/').next().unwrap(), h.score))
            .collect();
        let (half, quarter) = (NEIGHBOUR_SHARES[0], NEIGHBOUR_SHARES[1]);
        // #1 sits between #0 and #2: half the better of them. #0 and #2
        // gain half of #1 and a quarter of each other; d.json#9 has no
        // neighbour among the candidates; the memory neither gains nor
        // lifts.
        let want = [
            ("c.json#0", 0.6 + half * 0.3 + quarter * 0.4),
            ("c.json#2", 0.4 + half * 0.3 + quarter * 0.6),
            ("c.json#1", 0.3 + half * 0.6),
            ("d.json#9", 0.5),
            ("m", 0.45),
        ];
        assert_eq!(got.len(), want.len());
        for ((gp, gs), (wp, ws)) in got.iter().zip(want) {
            assert_eq!(*gp, wp);
            assert!((gs - ws).abs() < 1e-6, "{gp}: {gs} against {ws}");
        }
    }

    #[test]
    fn a_question_lifts_its_answer() {
        let hit = |path: &str, score: f32, asks: bool| Hit {
            asks,
            ..scored(path, score, MESSAGE_LEVEL)
        };
        // The same scores in two conversations; in `c` the first message
        // asks, in `d` it states.
        let mut hits = vec![
            hit("a/users/u/inbox/c.json#0", 0.6, true),
            hit("a/users/u/inbox/d.json#0", 0.6, false),
            hit("a/users/u/inbox/c.json#1", 0.3, false),
            hit("a/users/u/inbox/d.json#1", 0.3, false),
            // A question's answer that is no candidate gains nothing; a
            // question gains nothing from the message after it.
            hit("a/users/u/inbox/e.json#1", 0.2, true),
        ];
        toward_neighbours(&mut hits);
        let score = |p: &str| hits.iter().find(|h| h.path.ends_with(p)).unwrap().score;
        let half = NEIGHBOUR_SHARES[0];
        assert!((score("c.json#1") - (0.3 + half * 0.6 + ANSWER_SHARE * 0.6)).abs() < 1e-6);
        assert!((score("d.json#1") - (0.3 + half * 0.6)).abs() < 1e-6);
        assert!((score("c.json#0") - (0.6 + half * 0.3)).abs() < 1e-6);
        assert_eq!(score("e.json#1"), 0.2);
    }
}
