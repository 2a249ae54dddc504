//! How search's two channels become one ranking, and the ranking one
//! result per source: pure decisions, each tested as a table. The
//! queries (`query.rs`, `past.rs`) gather the channels' candidates and
//! look documents up; what they score and keep is decided here.

use super::{Hit, Mode, MESSAGE_LEVEL, MESSAGE_WEIGHT, SUPERSEDED_WEIGHT};
use std::collections::{HashMap, HashSet};

pub(super) struct Scale {
    lo: f32,
    hi: f32,
}

impl Scale {
    pub(super) fn of(scores: impl Iterator<Item = f32>) -> Scale {
        scores.fold(
            Scale {
                lo: f32::INFINITY,
                hi: f32::NEG_INFINITY,
            },
            |s, x| Scale {
                lo: s.lo.min(x),
                hi: s.hi.max(x),
            },
        )
    }

    /// 1 for the channel's best candidate, 0 for its weakest (1 when all
    /// tie).
    pub(super) fn unit(&self, x: f32) -> f32 {
        let d = self.hi - self.lo;
        if d > 0.0 {
            ((x - self.lo) / d).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }
}

/// The hybrid score: a convex combination of the channels' scaled scores,
/// the vector channel weighing `wv` against the lexical channel's 1; a
/// node one channel did not return counts 0 there. Rank fusion (RRF)
/// ignores how far apart scores are, so a node both channels list low
/// beat a node one channel is sure of; the scores keep that distance
/// (BENCHMARKS: SciFact nDCG@10 0.720 -> 0.735, conversational recall@10
/// 0.70 -> 0.88).
pub(super) fn fuse(wv: f32, v: Option<f32>, l: Option<f32>) -> f32 {
    (wv * v.unwrap_or(0.0) + l.unwrap_or(0.0)) / (wv + 1.0)
}

/// One query's channels: its mode, the vector channel's weight and each
/// channel's scale.
pub(super) struct Channels {
    mode: Mode,
    wv: f32,
    v: Scale,
    l: Scale,
}

impl Channels {
    pub(super) fn of(
        mode: Mode,
        wv: f32,
        vector: impl Iterator<Item = f32>,
        lexical: impl Iterator<Item = f32>,
    ) -> Channels {
        Channels {
            mode,
            wv,
            v: Scale::of(vector),
            l: Scale::of(lexical),
        }
    }

    /// The same channels scaled from 0 instead of their weakest candidate
    /// (1 for the best, half for half its score): a search that names a
    /// day adds that day's messages however far down a channel ranks them,
    /// and on a scale from the weakest, the weakest of them would count as
    /// unmatched.
    pub(super) fn scaled_from_zero(self) -> Channels {
        let floor = |s: Scale| Scale {
            lo: s.lo.min(0.0),
            hi: s.hi,
        };
        Channels {
            v: floor(self.v),
            l: floor(self.l),
            ..self
        }
    }

    /// A document's score from what each channel gave it: one channel's
    /// own score in its mode, the fused scaled scores in hybrid.
    pub(super) fn score(&self, vector: Option<f32>, lexical: Option<f32>) -> f32 {
        match self.mode {
            Mode::Vector => vector.unwrap_or(0.0),
            Mode::Lexical => lexical.unwrap_or(0.0),
            Mode::Hybrid | Mode::Tree => fuse(
                self.wv,
                vector.map(|s| self.v.unit(s)),
                lexical.map(|s| self.l.unit(s)),
            ),
        }
    }
}

/// A score lowered by the document's place: a conversation's message
/// below a memory saying the same, a node a newer one supersedes below it.
pub(super) fn weighted(score: f32, message: bool, superseded: bool) -> f32 {
    let mut s = score;
    if message {
        s *= MESSAGE_WEIGHT;
    }
    if superseded {
        s *= SUPERSEDED_WEIGHT;
    }
    s
}

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

/// Is a message hit from the conversation stored under its name now
/// (`stored_now`: when that one was stored; `indexed_from`: when the one
/// the message was indexed from was)? Not when none is stored (the index
/// lags a delete) or another one was stored since; a message indexed
/// before the index kept its source is judged by the name alone.
pub(super) fn message_live(stored_now: Option<u64>, indexed_from: Option<u64>) -> bool {
    match (stored_now, indexed_from) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(n), Some(f)) => n == f,
    }
}

/// What one-per-source knows of the hit at one place of a ranking.
pub(super) enum Source {
    /// A message of a conversation stored now.
    Message,
    /// A memory extracted from the messages at these paths.
    Memory(HashSet<String>),
    /// A result that is its own source (a memory written by hand or from
    /// elsewhere; any node when no message ranks).
    Own,
    /// Not shown: no longer ACTIVE, or a message of a conversation gone.
    Gone,
}

/// Places in a ranking: the sources placed in order, and the memories
/// drawn above their messages with the message paths they cite.
pub(super) type Picked = (Vec<usize>, Vec<(usize, HashSet<String>)>);

/// One result per source, as places in a ranking of `paths`: the sources
/// placed (messages and results of their own, at most `k`), in order, and
/// the memories to draw above one of their messages ([`draw`]). A memory
/// extracted from messages still stored takes no place: the messages of
/// the ranking are placed in their own order, and the memory is shown
/// above the first of its messages placed, or not at all. So memories add
/// to what the messages find and never push one out (where memories crowd
/// the ranking, fewer than `k` sources may be placed). `source` is asked
/// once per place, in order, and only as far as needed.
pub(super) fn pick_sources<E>(
    paths: &[&str],
    k: usize,
    mut source: impl FnMut(usize) -> std::result::Result<Source, E>,
) -> std::result::Result<Picked, E> {
    let mut placed: Vec<usize> = Vec::new();
    let mut drawn: Vec<(usize, HashSet<String>)> = Vec::new();
    for i in 0..paths.len() {
        if placed.len() >= k {
            break;
        }
        match source(i)? {
            Source::Gone => {}
            Source::Message | Source::Own => placed.push(i),
            Source::Memory(cited) => drawn.push((i, cited)),
        }
    }
    Ok((placed, drawn))
}

/// One result per source: each memory of `drawn` (with the message paths
/// it cites) is shown right above the first of its messages among `out`,
/// taking no place of its own ([`pick_sources`] placed one of them for
/// it); one with none of them in `out` is not shown.
pub(super) fn draw(out: Vec<Hit>, mut drawn: Vec<(Hit, HashSet<String>)>) -> Vec<Hit> {
    if drawn.is_empty() {
        return out;
    }
    let mut placed = Vec::with_capacity(out.len() + drawn.len());
    for h in out {
        if h.level == MESSAGE_LEVEL {
            let mut i = 0;
            while i < drawn.len() {
                if drawn[i].1.contains(&h.path) {
                    let mut m = drawn.remove(i).0;
                    m.with = Some(h.path.clone());
                    placed.push(m);
                } else {
                    i += 1;
                }
            }
        }
        placed.push(h);
    }
    placed
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

    #[test]
    fn one_result_per_source_as_a_table() {
        // A ranking as (path, what it is): "mem>x" is a memory citing
        // message x; "-x" a message of a conversation gone; "own" a node of
        // its own.
        fn pick(ranking: &[&str], k: usize) -> (Vec<String>, Vec<String>) {
            let paths: Vec<&str> = ranking.iter().map(|r| r.trim_start_matches('-')).collect();
            let (placed, drawn) = pick_sources::<()>(&paths, k, |i| {
                let r = ranking[i];
                Ok(if let Some(x) = r.strip_prefix("mem>") {
                    Source::Memory(x.split(',').map(String::from).collect())
                } else if r == "own" {
                    Source::Own
                } else if r.starts_with('-') {
                    Source::Gone
                } else {
                    Source::Message
                })
            })
            .unwrap();
            (
                placed.iter().map(|&i| paths[i].to_string()).collect(),
                drawn.iter().map(|(i, _)| paths[*i].to_string()).collect(),
            )
        }
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // (ranking, k) -> (sources placed in order, memories drawn)
        type Row<'a> = (&'a [&'a str], usize, &'a [&'a str], &'a [&'a str]);
        let rows: &[Row] = &[
            // Its message placed before it: drawn above it.
            (&["m1", "mem>m1", "m2"], 2, &["m1", "m2"], &["mem>m1"]),
            // Ranked above all its messages: the messages keep their own
            // places, the memory waits for one of its own (`draw` shows it
            // above m3 if m3 is placed, else not at all).
            (&["mem>m3", "m1", "m2", "m3"], 1, &["m1"], &["mem>m3"]),
            (
                &["mem>m3,m2", "m1", "m2", "m3"],
                2,
                &["m1", "m2"],
                &["mem>m3,m2"],
            ),
            (
                &["mem>m2", "m1", "m2", "m3"],
                3,
                &["m1", "m2", "m3"],
                &["mem>m2"],
            ),
            // A memory whose conversation is gone is its own source.
            (&["own", "m1"], 1, &["own"], &[]),
            // Nodes of their own and results gone.
            (&["own", "-m1", "m2", "m3"], 2, &["own", "m2"], &[]),
            // Memories are not counted: the k messages are still placed.
            (
                &["mem>m1", "mem>m2", "m1", "m2"],
                2,
                &["m1", "m2"],
                &["mem>m1", "mem>m2"],
            ),
        ];
        for (ranking, k, placed, drawn) in rows {
            assert_eq!(
                pick(ranking, *k),
                (s(placed), s(drawn)),
                "{ranking:?} k={k}"
            );
        }
    }

    #[test]
    fn a_sure_channel_beats_two_lukewarm_ones() {
        // Vector: A 0.80 (best), B 0.50, C 0.48 (weakest).
        let v = Scale::of([0.80, 0.50, 0.48].into_iter());
        // Lexical: B 9.0 (best), C 8.6, D 2.0 (weakest).
        let l = Scale::of([9.0, 8.6, 2.0].into_iter());
        let a = fuse(1.0, Some(v.unit(0.80)), None);
        let b = fuse(1.0, Some(v.unit(0.50)), Some(l.unit(9.0)));
        let c = fuse(1.0, Some(v.unit(0.48)), Some(l.unit(8.6)));
        assert!(b > a, "best lexical and fair vector: {b} vs {a}");
        assert!(a > c, "best vector alone beats two weak places: {a} vs {c}");
        // Rank 1 in both channels scores 1.
        assert_eq!(fuse(1.0, Some(v.unit(0.80)), Some(l.unit(9.0))), 1.0);
        // A channel with a single candidate gives it full marks.
        assert_eq!(Scale::of([0.3].into_iter()).unit(0.3), 1.0);
        // The weight moves the balance: at 0.25 lexical decides.
        assert!(fuse(0.25, Some(1.0), None) < fuse(0.25, None, Some(0.5)));
        // Scaled from 0 (a search that names a day), the weakest keeps
        // its share of the best: lexical 2.0 of 9.0, vector 0.24 of 0.80.
        let ch = Channels::of(
            Mode::Hybrid,
            1.0,
            [0.80, 0.50, 0.48].into_iter(),
            [9.0, 8.6, 2.0].into_iter(),
        );
        assert_eq!(ch.score(Some(0.48), Some(2.0)), 0.0);
        let ch = ch.scaled_from_zero();
        let want = (0.24 / 0.80 + 2.0 / 9.0) / 2.0;
        assert!((ch.score(Some(0.24), Some(2.0)) - want).abs() < 1e-6);
        assert_eq!(ch.score(Some(0.80), Some(9.0)), 1.0);
    }

    #[test]
    fn a_documents_score_by_mode_and_place_as_a_table() {
        // Vector scores 0.9 (best) .. 0.5; lexical 12 (best) .. 2.
        // (mode, vector score, lexical score, a message, superseded, score)
        type Row = (Mode, Option<f32>, Option<f32>, bool, bool, f32);
        let rows: Vec<Row> = vec![
            (Mode::Vector, Some(0.7), Some(12.0), false, false, 0.7),
            (Mode::Vector, None, Some(12.0), false, false, 0.0),
            (Mode::Lexical, Some(0.9), Some(7.0), false, false, 7.0),
            (Mode::Hybrid, Some(0.9), Some(12.0), false, false, 1.0),
            (Mode::Hybrid, Some(0.9), None, false, false, 0.5),
            (Mode::Hybrid, None, Some(2.0), false, false, 0.0),
            (Mode::Tree, Some(0.7), Some(7.0), false, false, 0.5),
            // A message, a superseded node, both.
            (
                Mode::Hybrid,
                Some(0.9),
                Some(12.0),
                true,
                false,
                MESSAGE_WEIGHT,
            ),
            (
                Mode::Hybrid,
                Some(0.9),
                Some(12.0),
                false,
                true,
                SUPERSEDED_WEIGHT,
            ),
            (
                Mode::Hybrid,
                Some(0.9),
                Some(12.0),
                true,
                true,
                MESSAGE_WEIGHT * SUPERSEDED_WEIGHT,
            ),
        ];
        for (i, (mode, v, l, message, superseded, want)) in rows.into_iter().enumerate() {
            let c = Channels::of(mode, 1.0, [0.9, 0.5].into_iter(), [12.0, 2.0].into_iter());
            let got = weighted(c.score(v, l), message, superseded);
            assert!((got - want).abs() < 1e-6, "row {i}: {got} != {want}");
        }
    }

    #[test]
    fn a_message_is_live_only_from_the_conversation_stored_now() {
        for (now, from, want) in [
            (None, None, false),
            (None, Some(5), false),
            (Some(5), None, true),
            (Some(5), Some(5), true),
            (Some(7), Some(5), false),
        ] {
            assert_eq!(message_live(now, from), want, "{now:?} {from:?}");
        }
    }

    #[test]
    fn a_memory_shows_above_its_first_message_and_never_alone() {
        let hit = |p: &str, message: bool| {
            let mut h = Hit::blank(p);
            if message {
                h.level = MESSAGE_LEVEL;
            }
            h
        };
        let m = |p: &str| format!("accounts/{p}");
        let cites = |ps: &[&str]| ps.iter().map(|p| m(p)).collect::<HashSet<String>>();
        let out = vec![
            hit("a/users/u/inbox/c.json#3", true),
            hit("a/users/u/memories/n", false),
            hit("a/users/u/inbox/c.json#7", true),
        ];
        let drawn = vec![
            // Cites #7 and #3: above #3, the first of them.
            (
                hit("a/users/u/memories/x", false),
                cites(&["a/users/u/inbox/c.json#7", "a/users/u/inbox/c.json#3"]),
            ),
            // Cites #7 only.
            (
                hit("a/users/u/memories/y", false),
                cites(&["a/users/u/inbox/c.json#7"]),
            ),
            // Cites a message that did not make it: not shown.
            (
                hit("a/users/u/memories/z", false),
                cites(&["a/users/u/inbox/c.json#9"]),
            ),
        ];
        let got: Vec<(String, Option<String>)> = draw(out, drawn)
            .into_iter()
            .map(|h| (h.path, h.with))
            .collect();
        let want = vec![
            (
                m("a/users/u/memories/x"),
                Some(m("a/users/u/inbox/c.json#3")),
            ),
            (m("a/users/u/inbox/c.json#3"), None),
            (m("a/users/u/memories/n"), None),
            (
                m("a/users/u/memories/y"),
                Some(m("a/users/u/inbox/c.json#7")),
            ),
            (m("a/users/u/inbox/c.json#7"), None),
        ];
        assert_eq!(got, want);
        // Nothing drawn: the results as they were.
        assert_eq!(draw(vec![hit("a/n", false)], vec![]).len(), 1);
    }
}
