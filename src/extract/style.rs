//! How a memory's text is made (`[llm] memories`): quoted, the messages'
//! own sentences picked by the model (`quote.rs`), or written, the model's
//! own sentences checked against the messages they cite. One request's
//! schema, prompt, stop rule and checked candidates for each.

use super::{candidates, ground, prompt, quote, stated, Candidate, Conversation};
use serde_json::Value;

/// How memories are written (`[llm] memories`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// The messages' own sentences, picked by the model (`quote.rs`).
    Quoted,
    /// The model's own sentences, checked against the messages they cite.
    Written,
}

impl Style {
    /// `[llm] memories`: `"quoted"` (the default) or `"written"`.
    pub fn parse(s: Option<&str>) -> Result<Style, String> {
        match s {
            None | Some("quoted") => Ok(Style::Quoted),
            Some("written") => Ok(Style::Written),
            Some(other) => Err(format!(
                "[llm] memories is \"quoted\" or \"written\", not {other:?}"
            )),
        }
    }

    /// The JSON schema of an answer about `n_messages` messages.
    pub fn schema(self, n_messages: usize) -> Value {
        match self {
            Style::Quoted => quote::schema(),
            Style::Written => prompt::extract_schema(n_messages),
        }
    }

    /// Tokens of a request before its transcript.
    pub fn overhead(self) -> usize {
        match self {
            Style::Quoted => quote::overhead(),
            Style::Written => prompt::extract_overhead(),
        }
    }

    /// The chat messages of a request for messages `range`.
    pub fn request(self, conv: &Conversation, range: std::ops::Range<usize>) -> Vec<Value> {
        match self {
            Style::Quoted => quote::request(conv, range),
            Style::Written => prompt::extract_window(conv, range),
        }
    }

    /// The request to ask again when the answer to [`Self::request`] quoted
    /// nothing of messages `range` (quoted memories: the same request
    /// without its worked example); `None` when it did quote, or in
    /// written mode.
    pub fn request_again(
        self,
        answer: &Value,
        conv: &Conversation,
        range: std::ops::Range<usize>,
    ) -> Option<Vec<Value>> {
        match self {
            Style::Quoted if quote::quotes_nothing_said(answer, conv, range.clone()) => {
                Some(quote::request_without_example(conv, range))
            }
            _ => None,
        }
    }

    /// When to stop the model's answer, from its items so far: quoted, at
    /// a quote written a second time (a small model that starts repeating
    /// an item goes on until `max_tokens`; BENCHMARKS' journal, run K).
    pub fn stop(self) -> Option<fn(&[Value]) -> bool> {
        match self {
            Style::Quoted => Some(quote::repeats),
            Style::Written => None,
        }
    }

    /// The candidates of the model's answer to the request for `range`,
    /// checked, and what was dropped. A written candidate's citation is
    /// grounded in the messages that hold its words; a quoted one cites the
    /// message it was found in, and the user's stated preferences and facts
    /// the model passed over (in this answer and `earlier` ones) are added
    /// (`stated.rs`).
    pub fn candidates(
        self,
        answer: &Value,
        conv: &Conversation,
        range: std::ops::Range<usize>,
        earlier: &[Candidate],
    ) -> Result<Answered, String> {
        match self {
            Style::Quoted => {
                let (mut found, dropped) = quote::candidates(answer, conv, range.clone())?;
                let resume = resume_at(answer, &found, range.clone());
                stated::settle_kinds(conv, &mut found);
                let mut picked = earlier.to_vec();
                picked.extend(found.iter().cloned());
                for swept in [
                    stated::preferences(conv, range.clone(), &picked),
                    stated::profile(conv, range, &picked),
                ] {
                    picked.extend(swept.iter().cloned());
                    found.extend(swept);
                }
                Ok(Answered {
                    found,
                    dropped,
                    resume,
                })
            }
            Style::Written => {
                let (mut found, dropped) = candidates(answer, conv.messages.len())?;
                for c in &mut found {
                    ground(c, conv);
                }
                Ok(Answered {
                    found,
                    dropped,
                    resume: None,
                })
            }
        }
    }

    /// What of a memory's text tells two memories apart: a quoted one's
    /// quoted words (every line of a speaker opens alike, "Audrey said on
    /// …"), a written one's whole text.
    pub fn comparable(self, text: &str) -> String {
        match self {
            Style::Quoted => super::line::quoted(text),
            Style::Written => text.to_string(),
        }
    }
}

/// The memories of one answer, checked.
#[derive(Debug)]
pub struct Answered {
    pub found: Vec<Candidate>,
    /// What was dropped, and why.
    pub dropped: Vec<String>,
    /// The answer was cut at `max_tokens`: the message after the last one
    /// it quoted, where a request for the rest of the range begins.
    pub resume: Option<usize>,
}

/// Where to ask again after `answer` for `range`, whose memories (before
/// any sweep) are `found`: past the last message they quote, when the
/// answer was cut at `max_tokens` and messages are left. An answer
/// stopped at a repeat is not followed: a model that starts repeating has
/// run out of what it finds worth keeping, and asked for the rest it
/// quoted the small talk (run K, BENCHMARKS' journal).
fn resume_at(answer: &Value, found: &[Candidate], range: std::ops::Range<usize>) -> Option<usize> {
    let early = answer.get("truncated") == Some(&Value::Bool(true));
    let next = found.iter().flat_map(|c| c.messages.iter()).max()? + 1;
    (early && next > range.start && next < range.end).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::Kind;
    use serde_json::json;

    #[test]
    fn an_answer_cut_short_resumes_past_its_last_quote_and_a_stopped_one_does_not() {
        let c = |m: usize| Candidate {
            kind: Kind::Event,
            topic: "t".into(),
            text: "x".into(),
            messages: vec![m],
        };
        let stopped = json!({"memories": [], "stopped": true});
        let cut = json!({"memories": [], "truncated": true});
        let whole = json!({"memories": []});
        // (answer, quoted messages, range) -> where to ask again
        type Row<'a> = (&'a Value, Vec<usize>, std::ops::Range<usize>, Option<usize>);
        let table: [Row; 7] = [
            (&stopped, vec![3, 5], 0..10, None),
            (&cut, vec![5, 3], 2..10, Some(6)),
            (&whole, vec![3], 0..10, None),
            (&cut, vec![], 0..10, None),
            (&cut, vec![9], 0..10, None),
            (&cut, vec![1], 4..10, None),
            (&cut, vec![4], 4..10, Some(5)),
        ];
        for (answer, quoted, range, want) in table {
            let found: Vec<Candidate> = quoted.iter().map(|&m| c(m)).collect();
            assert_eq!(
                resume_at(answer, &found, range.clone()),
                want,
                "{answer} {quoted:?} {range:?}"
            );
        }
    }
}
