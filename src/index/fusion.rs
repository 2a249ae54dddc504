//! How search's two channels become one ranking, and the ranking one
//! result per source: pure decisions, each tested as a table. The
//! queries (`query.rs`, `past.rs`) gather the channels' candidates and
//! look documents up; what they score and keep is decided here.

use super::{Hit, Mode, MESSAGE_LEVEL, MESSAGE_WEIGHT, SUPERSEDED_WEIGHT};
use std::collections::HashSet;

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
