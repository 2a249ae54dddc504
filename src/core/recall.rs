//! Recall to a budget: search results packed into at most N tokens,
//! summary first. An agent's context window is the scarce thing, so a
//! budgeted search gives the best results' one-line abstracts first, then
//! their overviews, then the lines of `content.md` that match, each added
//! in rank order while it fits, and ends with a line saying what was left
//! out and how to get it. Tokens are estimated as everywhere else
//! ([`crate::schema::estimate_tokens`]); the packed text never estimates
//! over the budget.

use crate::schema::estimate_tokens;
use serde_json::{json, Value};

pub use crate::schema::budget::{MAX_BUDGET, MIN_BUDGET};

/// One search result as the packing sees it, in rank order.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// `accounts/...` path (a message: `…/NAME.json#N`).
    pub path: String,
    pub confidence: String,
    pub abstract_: String,
    /// `.overview.md` (none for a message).
    pub overview: Option<String>,
    /// Matching lines of `content.md`: (1-based number, text).
    pub lines: Vec<(u32, String)>,
}

/// What a budget let through.
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    pub text: String,
    /// Estimated tokens of `text` (≤ the budget).
    pub used: usize,
    pub shown: usize,
    pub results_left: usize,
    pub overviews_left: usize,
    pub lines_left: usize,
}

impl Packed {
    pub fn to_json(&self, budget: usize) -> Value {
        json!({
            "tokens": budget,
            "used": self.used,
            "shown": self.shown,
            "left_out": {"results": self.results_left, "overviews": self.overviews_left, "lines": self.lines_left},
        })
    }
}

fn heading(rank: usize, it: &Item) -> String {
    format!("## {rank}. {} ({})\n", it.path, it.confidence)
}

fn abstract_line(it: &Item) -> String {
    format!("{}\n", crate::index::text::one_line(&it.abstract_))
}

fn overview_block(o: &str) -> String {
    let mut s: String = o.trim_end().lines().map(|l| format!("> {l}\n")).collect();
    if s.is_empty() {
        s.push_str(">\n");
    }
    s
}

fn line_text(n: u32, t: &str) -> String {
    format!("L{n}: {}\n", t.trim_end())
}

/// The closing line: what was left out and how to get it.
fn closing(results: usize, overviews: usize, lines: usize) -> String {
    if results + overviews + lines == 0 {
        return "# nothing left out\n".into();
    }
    format!(
        "# left out: {results} results, {overviews} overviews, {lines} lines \
         (cat PATH/content.md, or a larger budget=)\n"
    )
}

/// Pack `items` (best first) for `query` into `budget` tokens. Their
/// paths are given relative to `base`, the searched directory, which the
/// first line names once (a path repeated ten times costs a result).
pub fn pack(query: &str, budget: usize, base: &str, items: &[Item]) -> Packed {
    let head = format!(
        "# memory for {:?} within {budget} tokens; paths under {base}/\n",
        crate::index::text::one_line(query)
    );
    // The closing line at its longest (everything left out), kept aside
    // from the start: its numbers only shrink.
    let all_lines = items.iter().map(|it| it.lines.len()).sum();
    let tail_max = estimate_tokens(&closing(items.len(), items.len(), all_lines));
    let mut left = budget.saturating_sub(estimate_tokens(&head) + tail_max);
    let mut take = |text: &str| -> bool {
        let t = estimate_tokens(text);
        if t <= left {
            left -= t;
            true
        } else {
            false
        }
    };
    // Per item: shown, overview shown, lines shown.
    let mut shown = vec![false; items.len()];
    let mut with_overview = vec![false; items.len()];
    let mut lines_shown: Vec<usize> = vec![0; items.len()];
    // First every abstract that fits, in rank order (ranks counted over
    // the results shown).
    let mut rank = 0;
    for (i, it) in items.iter().enumerate() {
        if take(&(heading(rank + 1, it) + &abstract_line(it))) {
            shown[i] = true;
            rank += 1;
        }
    }
    // Then overviews, then matching lines, best results first.
    for (i, it) in items.iter().enumerate() {
        if let (true, Some(o)) = (shown[i], &it.overview) {
            with_overview[i] = take(&overview_block(o));
        }
    }
    for (i, it) in items.iter().enumerate() {
        if !shown[i] {
            continue;
        }
        for (n, t) in &it.lines {
            if !take(&line_text(*n, t)) {
                break;
            }
            lines_shown[i] += 1;
        }
    }
    let mut text = head;
    let mut rank = 0;
    let (mut overviews_left, mut lines_left) = (0, 0);
    for (i, it) in items.iter().enumerate() {
        if !shown[i] {
            continue;
        }
        rank += 1;
        text.push_str(&heading(rank, it));
        text.push_str(&abstract_line(it));
        match &it.overview {
            Some(o) if with_overview[i] => text.push_str(&overview_block(o)),
            Some(_) => overviews_left += 1,
            None => {}
        }
        for (n, t) in it.lines.iter().take(lines_shown[i]) {
            text.push_str(&line_text(*n, t));
        }
        lines_left += it.lines.len() - lines_shown[i];
    }
    let results_left = items.len() - rank;
    // Left-out results' overviews and lines are counted with them.
    text.push_str(&closing(results_left, overviews_left, lines_left));
    Packed {
        used: estimate_tokens(&text),
        text,
        shown: rank,
        results_left,
        overviews_left,
        lines_left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(i: usize, lines: usize) -> Item {
        Item {
            path: format!("accounts/acme/users/alice/memories/notes/n{i}"),
            confidence: "high".into(),
            abstract_: format!("Note {i}: what alice said about topic {i}"),
            overview: Some(format!("# Note {i}\nfirst line of note {i}")),
            lines: (1..=lines as u32)
                .map(|n| {
                    let line = format!(
                        "line {n} of note {i}, with some words in it, as long as a \
                         result's heading and abstract together"
                    );
                    (n, line)
                })
                .collect(),
        }
    }

    #[test]
    fn never_over_the_budget_and_summary_first() {
        let items: Vec<Item> = (0..10).map(|i| item(i, 6)).collect();
        let mut last_shown = 0;
        for budget in [MIN_BUDGET, 150, 300, 600, 1_000, 5_000] {
            let p = pack("what did alice say", budget, "accounts/acme", &items);
            assert!(p.used <= budget, "{budget}: used {}", p.used);
            assert_eq!(p.used, estimate_tokens(&p.text));
            assert!(
                p.shown >= last_shown,
                "{budget}: a larger budget shows fewer"
            );
            last_shown = p.shown;
            // Summary first: lines only take room no abstract or overview
            // could use (a line here is as large as a result's heading
            // and abstract, and larger than an overview).
            if p.text.contains("\nL1: ") {
                assert_eq!((p.shown, p.overviews_left), (10, 0), "{budget}: {}", p.text);
            }
            assert!(p.text.ends_with('\n') && p.text.lines().last().unwrap().starts_with("# "));
            assert_eq!(p.results_left, 10 - p.shown);
        }
        let all = pack("what did alice say", 5_000, "accounts/acme", &items);
        assert_eq!(
            (all.results_left, all.overviews_left, all.lines_left),
            (0, 0, 0)
        );
        assert!(all.text.ends_with("# nothing left out\n"), "{}", all.text);
        assert!(all
            .text
            .contains("## 1. accounts/acme/users/alice/memories/notes/n0 (high)\n"));
        assert!(all.text.contains("L6: line 6 of note 9"));
        let small = pack("what did alice say", 150, "accounts/acme", &items);
        assert!(small.shown >= 1 && small.shown < 10, "{}", small.text);
        assert!(small.text.contains("# left out: "), "{}", small.text);
    }

    #[test]
    fn the_best_result_comes_first_and_ranks_count_what_is_shown() {
        let mut items: Vec<Item> = (0..3).map(|i| item(i, 1)).collect();
        items[1].abstract_ = "x".repeat(2_000);
        let p = pack("q", 200, "accounts/acme", &items);
        assert_eq!(p.shown, 2, "{}", p.text);
        assert!(p
            .text
            .contains("## 1. accounts/acme/users/alice/memories/notes/n0"));
        assert!(p
            .text
            .contains("## 2. accounts/acme/users/alice/memories/notes/n2"));
        // Nothing at all: the heading and the closing line.
        let none = pack("q", MIN_BUDGET, "accounts/acme", &[]);
        assert!(none.used <= MIN_BUDGET);
        assert!(none.text.ends_with("# nothing left out\n"));
    }
}
