//! Faithfulness: every sentence a memory gains must be supported by the
//! words it came from (the messages it cites, or the version a merge
//! replaces). A small model copies its prompt's worked example ("a
//! chemistry teacher in Leeds") or the other speaker's facts into a memory;
//! an agent trusts what it reads, so a sentence no source supports is
//! dropped, and a merge that would write one is refused.
//!
//! The check is lexical, so it is cheap and needs no second model call:
//! a sentence is supported when every *marked* word of it (a capitalised
//! word after the sentence's first, or a number) occurs in the sources,
//! and at least half of its other subject terms (stemmed, stopwords aside,
//! "user" aside) do.

use std::collections::HashSet;

/// Share of a sentence's subject terms its sources must hold (a third: a
/// paraphrase keeps its key words, "moved there" may become "new city").
pub const MIN_TERM_SHARE: f32 = 1.0 / 3.0;

/// Common first words of a memory's sentence, capitalised only by place.
const SENTENCE_STARTS: &[&str] = &[
    "the", "a", "an", "she", "he", "they", "her", "his", "their", "this", "that", "these", "those",
    "it", "its", "there", "when", "after", "before", "during", "on", "in", "at", "every", "each",
    "both", "to", "for", "from", "since", "while", "also",
];

/// Words a memory uses for its own frame, never evidence of anything.
const FRAME: &[&str] = &["user", "assist", "assistant", "memori", "memory"];

pub use crate::schema::words::sentences;

/// The names a speaker calls the other by: a capitalised word opening the
/// message or a clause before `!` or `,` ("Aiko! good to see you"), closing
/// one after a comma ("Congratulations on the job, Priya!"), or after a
/// greeting ("hi Sam", "nice to meet you, Caroline"). Not a speaker's own
/// name ("I'm Mel"): that follows no greeting and closes no clause.
pub fn vocatives(text: &str) -> Vec<String> {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(
            r"(?:^|[.!?]\s+)(?P<a>\p{Lu}\p{L}+)[!,]|,\s*(?P<b>\p{Lu}\p{L}+)\s*[!.?]|(?i:\b(?:hi|hey|hello|dear|thanks|thank you|welcome|congrats|congratulations|meet you|see you|bye))[,]?\s+(?P<c>\p{Lu}\p{L}+)",
        )
        .expect("the vocative pattern compiles")
    });
    let skip = [
        "I", "Hi", "Hey", "Hello", "Thanks", "Yes", "No", "Oh", "Wow", "Sure", "Ok", "Okay",
    ];
    re.captures_iter(text)
        .filter_map(|c| c.name("a").or(c.name("b")).or(c.name("c")))
        .map(|m| m.as_str().to_string())
        .filter(|w| !skip.contains(&w.as_str()))
        .collect()
}

/// Why `sentence`, a sentence of a memory about `topic`, states no fact,
/// or `None` when it does: none of its subject words is other than the
/// topic's and the memory's frame ("The user's family is the user's
/// family." under "family"), or it says one thing is itself ("The user's
/// friends are the user's friends.").
pub fn no_fact(sentence: &str, topic: &str) -> Option<String> {
    const ALSO_FRAME: &[&str] = &["speaker", "other", "person", "someon", "someth", "thing"];
    let content = |t: &str| -> HashSet<String> {
        crate::schema::words::terms(t)
            .into_iter()
            .filter(|t| !FRAME.contains(&t.as_str()) && !ALSO_FRAME.contains(&t.as_str()))
            .collect()
    };
    let topic_terms = content(topic);
    let own = content(sentence);
    if own.iter().all(|t| topic_terms.contains(t)) {
        return Some(format!(
            "it says nothing beyond its subject {topic:?}: no fact"
        ));
    }
    let low = sentence.to_lowercase();
    if low.starts_with("the user is")
        && (low.contains("friend of the user") || low.contains("the user's friend"))
    {
        return Some("it makes the user a friend of themselves: no fact".into());
    }
    const PERSONS: &[&str] = &[
        "i", "me", "my", "mine", "you", "your", "yours", "we", "our", "ours", "us",
    ];
    if let Some(w) = tokens(&low).find(|w| PERSONS.contains(w)) {
        return Some(format!(
            "it speaks in the first or second person ({w:?}): chat, not a fact in the third person"
        ));
    }
    for copula in [" is ", " are ", " was ", " were "] {
        if let Some((a, b)) = low.split_once(copula) {
            let (a, b) = (content(a), content(b));
            if !a.is_empty() && a == b {
                return Some("it says a thing is itself: no fact".into());
            }
        }
    }
    None
}

/// What the sources of a memory say, ready to check sentences against.
pub struct Sources {
    /// Lower-case alphanumeric words, and every digit run on its own.
    words: HashSet<String>,
    /// Stemmed subject terms (as the search index stems them).
    terms: HashSet<String>,
    /// Lower-case words no supported sentence may hold, with why.
    forbidden: std::collections::HashMap<String, &'static str>,
    /// The other speaker's relations (relation, name), lower case.
    theirs: Vec<(String, String)>,
    /// Each source's own lower-case words: a relation and the name it is
    /// given to must be said together.
    each: Vec<HashSet<String>>,
}

/// Words of family and household a sentence may give the user.
const KIN: &[&str] = &[
    "son", "daughter", "child", "kid", "boy", "girl", "baby", "brother", "sister", "mother",
    "father", "mom", "dad", "parent", "grand", "great", "nephew", "niece", "cousin", "uncle",
    "aunt", "wife", "husband", "partner", "family",
];

/// Words that say how two people are related (kin, partners, work and
/// household): a sentence may hold one only where its sources say it
/// (stemmed), so "Melanie is the user's husband and a mentor" needs a
/// message saying husband and mentor. "friend" is not among them: two
/// people chatting about their lives are friends unless said otherwise.
const RELATION_WORDS: &[&str] = &[
    "son",
    "daughter",
    "child",
    "children",
    "kid",
    "kids",
    "boy",
    "girl",
    "baby",
    "brother",
    "sister",
    "sibling",
    "mother",
    "father",
    "mom",
    "dad",
    "parent",
    "grandmother",
    "grandfather",
    "grandparent",
    "grandchild",
    "nephew",
    "niece",
    "cousin",
    "uncle",
    "aunt",
    "wife",
    "husband",
    "spouse",
    "partner",
    "boyfriend",
    "girlfriend",
    "fiance",
    "fiancee",
    "mentor",
    "mentee",
    "colleague",
    "coworker",
    "boss",
    "roommate",
    "neighbor",
    "neighbour",
    "classmate",
    "ex",
];

/// "my son Maya", "my wife, Ana": (relation, name), lower case.
fn relations(text: &str) -> Vec<(String, String)> {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(r"\b(?i:my)\s+(\p{Ll}+),?\s+(\p{Lu}\p{L}+)")
            .expect("the relation pattern compiles")
    });
    re.captures_iter(text)
        .map(|c| (c[1].to_lowercase(), c[2].to_lowercase()))
        .collect()
}

fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
}

/// The digit runs of a token ("3rd" → "3", "2026-05-03" is three tokens).
fn digits(w: &str) -> Vec<String> {
    w.split(|c: char| !c.is_ascii_digit())
        .filter(|d| !d.is_empty())
        .map(|d| match d.trim_start_matches('0') {
            // "0" and "00" are the number 0, not an empty word.
            "" => "0".to_string(),
            n => n.to_string(),
        })
        .collect()
}

impl Sources {
    pub fn new<'a>(texts: impl IntoIterator<Item = &'a str>) -> Sources {
        let mut words = HashSet::new();
        let mut terms = HashSet::new();
        let mut each = Vec::new();
        for t in texts {
            let mut own = HashSet::new();
            for w in tokens(t) {
                own.insert(w.to_lowercase());
                words.insert(w.to_lowercase());
                words.extend(digits(w));
            }
            each.push(own);
            terms.extend(crate::schema::words::terms(t));
        }
        Sources {
            words,
            terms,
            forbidden: Default::default(),
            theirs: Vec::new(),
            each,
        }
    }

    /// The other speaker's own relations ("my son Maya": ("son", "maya")),
    /// which no sentence may give the user ("the user's son Maya", "Maya is
    /// the user's son"), unless `user_texts` claim the same.
    pub fn forbid_their_relations<'a>(
        &mut self,
        their_texts: impl IntoIterator<Item = &'a str>,
        user_texts: impl IntoIterator<Item = &'a str>,
    ) {
        let mine: HashSet<(String, String)> = user_texts.into_iter().flat_map(relations).collect();
        self.theirs.extend(
            their_texts
                .into_iter()
                .flat_map(relations)
                .filter(|r| !mine.contains(r)),
        );
    }

    /// No supported sentence may hold any of `words` (lower case), for
    /// `why`, whatever else its sources say.
    pub fn forbid<'a>(&mut self, words: impl IntoIterator<Item = &'a str>, why: &'static str) {
        for w in words {
            self.forbidden.insert(w.to_lowercase(), why);
        }
    }

    /// Whether the sources hold `word` (lower case), as itself, its
    /// stem or its plural.
    fn holds_word(&self, word: &str) -> bool {
        self.words.contains(word)
            || self.words.contains(&format!("{word}s"))
            || crate::schema::words::terms(word)
                .first()
                .is_some_and(|t| self.terms.contains(t))
    }

    /// Why `sentence` is not supported, or `None` when it is.
    pub fn unsupported(&self, sentence: &str) -> Option<String> {
        self.unsupported_at(sentence, MIN_TERM_SHARE)
    }

    /// [`Sources::unsupported`] with `share` of the subject terms to hold.
    pub fn unsupported_at(&self, sentence: &str, share: f32) -> Option<String> {
        for w in tokens(sentence) {
            if let Some(why) = self.forbidden.get(&w.to_lowercase()) {
                return Some(format!("{w} is {why}"));
            }
        }
        if !self.theirs.is_empty() {
            let low = sentence.to_lowercase();
            let words: HashSet<&str> = tokens(&low).collect();
            for (rel, name) in &self.theirs {
                // "the user's son Maya", and the kin a small model runs
                // on to ("Maya's sister is the user's sister").
                let given = std::iter::once(rel.as_str())
                    .chain(KIN.iter().copied())
                    .any(|k| low.contains(&format!("user's {k}")));
                if words.contains(name.as_str()) && given {
                    return Some(format!(
                        "{name} is the other speaker's {rel}, not the user's"
                    ));
                }
            }
        }
        // The names of the sentence: capitalised words but its first.
        let names: Vec<String> = tokens(sentence)
            .enumerate()
            .filter(|(i, w)| {
                let lower = w.to_lowercase();
                w.chars().next().is_some_and(char::is_uppercase)
                    && (*i > 0
                        || !(crate::schema::words::is_stopword(&lower)
                            || FRAME.contains(&lower.as_str())
                            || SENTENCE_STARTS.contains(&lower.as_str())))
            })
            .map(|(_, w)| w.to_lowercase())
            .collect();
        for w in tokens(sentence) {
            let lower = w.to_lowercase();
            if !RELATION_WORDS.contains(&lower.as_str()) {
                continue;
            }
            if !self.holds_word(&lower) {
                return Some(format!(
                    "the relation {lower:?} is in no source: a relation is stored only as said"
                ));
            }
            // "The user's husband is Jolene" from "my husband and I" and
            // "Hey Jolene": the relation and the name, never said together.
            let together = |own: &HashSet<String>| {
                (own.contains(&lower) || own.contains(&format!("{lower}s")))
                    && names.iter().any(|n| own.contains(n))
            };
            if !names.is_empty() && !self.each.iter().any(together) {
                return Some(format!(
                    "the relation {lower:?} and the name {} are said in no one source together",
                    names.join(", ")
                ));
            }
        }
        for (i, w) in tokens(sentence).enumerate() {
            let marked_number = w.chars().any(|c| c.is_ascii_digit());
            let lower = w.to_lowercase();
            // A capital marks a name, except on a sentence's first word when
            // that is a common word ("The", "She", "User").
            let marked_name = w.chars().next().is_some_and(char::is_uppercase)
                && (i > 0
                    || !(crate::schema::words::is_stopword(&lower)
                        || FRAME.contains(&lower.as_str())
                        || SENTENCE_STARTS.contains(&lower.as_str())));
            if marked_number {
                if let Some(d) = digits(w).into_iter().find(|d| !self.words.contains(d)) {
                    return Some(format!("{d} is in no source"));
                }
            } else if marked_name && !self.words.contains(&lower) {
                // A possessive or plural of a source word is that word.
                let base = lower.trim_end_matches('s');
                if !self.words.contains(base) {
                    return Some(format!("{w} is in no source"));
                }
            }
        }
        let terms: Vec<String> = crate::schema::words::terms(sentence)
            .into_iter()
            .filter(|t| t.len() > 1 && !FRAME.contains(&t.as_str()))
            .collect();
        if terms.is_empty() {
            return None;
        }
        let held = terms.iter().filter(|t| self.terms.contains(*t)).count();
        if (held as f32) < share * terms.len() as f32 {
            let missing: Vec<&str> = terms
                .iter()
                .filter(|t| !self.terms.contains(*t))
                .map(String::as_str)
                .collect();
            return Some(format!(
                "{held} of its {} subject words are in its sources (missing: {})",
                terms.len(),
                missing.join(", ")
            ));
        }
        None
    }

    /// The sentences of `text` these sources support, and the others with
    /// the reason.
    pub fn split(&self, text: &str) -> (Vec<String>, Vec<(String, String)>) {
        self.split_at(text, MIN_TERM_SHARE)
    }

    /// [`Sources::split`] with `share` of each sentence's subject terms to hold.
    pub fn split_at(&self, text: &str, share: f32) -> (Vec<String>, Vec<(String, String)>) {
        let mut yes = Vec::new();
        let mut no = Vec::new();
        for s in sentences(text) {
            match self.unsupported_at(&s, share) {
                None => yes.push(s),
                Some(why) => no.push((s, why)),
            }
        }
        (yes, no)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIYA: &str =
        "Hi! I'm Priya Raman. I work as a data engineer at a logistics startup in Austin.";
    const PREFS: &str =
        "I prefer answers with Python examples, and please never use Java in examples.";
    const DOG: &str = "My dog Biscuit is a golden retriever, he turns 3 next week.";

    #[test]
    fn the_other_party_naming_the_user_counts_their_own_name_does_not() {
        assert_eq!(vocatives("Aiko! good good. still working"), vec!["Aiko"]);
        assert_eq!(
            vocatives("Congratulations on the new job in Denver, Priya!"),
            vec!["Priya"]
        );
        assert_eq!(vocatives("Nice to meet you, Caroline."), vec!["Caroline"]);
        assert_eq!(vocatives("hey Sam how are you"), vec!["Sam"]);
        assert!(vocatives("I'm Mel, I love hiking too!").is_empty());
        assert!(vocatives("Hi, I'm Mel.").is_empty());
    }

    #[test]
    fn the_other_speakers_son_is_not_the_users() {
        let their = "that's amazing. my son Maya just started kindergarten";
        let mut s = Sources::new([their, "aww, say hi to Maya!"]);
        s.forbid_their_relations([their], ["aww, say hi to Maya!"]);
        for bad in [
            "The user's son Maya is excited about kindergarten.",
            "Maya is the user's son.",
            "Maya's sister is the user's sister.",
            "Maya's great-grandparent is the user's great-grandparent.",
        ] {
            let why = s.unsupported(bad).unwrap_or_default();
            assert!(why.contains("other speaker's son"), "{bad}: {why}");
        }
        assert_eq!(s.unsupported("Maya started kindergarten."), None);
        // The user's own son, said by the user too: theirs as well.
        let mut s = Sources::new([their]);
        s.forbid_their_relations([their], ["my son Maya loves it"]);
        assert_eq!(
            s.unsupported("The user's son Maya started kindergarten."),
            None
        );
    }

    #[test]
    fn a_sentence_must_state_a_fact() {
        for (s, topic) in [
            ("The user's family is the user's family.", "family"),
            ("The user's friends are the user's friends.", "social life"),
            ("Family.", "family"),
            ("Melanie is the other speaker.", "Melanie"),
            (
                "The user is Dave, a friend of the user and a musician.",
                "profile",
            ),
            ("The user and Sam will keep you posted.", "keep in touch"),
            ("See you soon!", "keep in touch"),
        ] {
            assert!(no_fact(s, topic).is_some(), "{s} under {topic}");
        }
        for (s, topic) in [
            ("The user likes coffee.", "coffee"),
            ("Melanie is a friend of the user.", "Melanie"),
            ("The user's family lives in Ohio.", "family"),
            ("The user is 35.", "profile"),
        ] {
            assert_eq!(no_fact(s, topic), None, "{s} under {topic}");
        }
    }

    #[test]
    fn the_number_zero_is_named_in_the_reason() {
        let s = Sources::new(["I have 3 cats"]);
        let why = s.unsupported("The user has 0 cats.").unwrap_or_default();
        assert_eq!(why, "0 is in no source");
        assert_eq!(
            Sources::new(["it ended 0-0"]).unsupported("It ended 0 to 0."),
            None
        );
    }

    #[test]
    fn a_relation_is_kept_only_as_said() {
        let s = Sources::new(["Melanie and I went hiking, she is such a good friend"]);
        let why = s
            .unsupported("Melanie is the user's husband and a mentor.")
            .unwrap_or_default();
        assert!(why.contains("husband"), "{why}");
        assert_eq!(s.unsupported("Melanie went hiking with the user."), None);
        let s = Sources::new(["my husband Tim and my kids love the beach"]);
        assert_eq!(s.unsupported("Tim is the user's husband."), None);
        assert_eq!(s.unsupported("The user's kid loves the beach."), None);
        // Relation and name from two messages: not said together.
        let s = Sources::new(["My husband and I are fine", "Hey Jolene!"]);
        let why = s
            .unsupported("The user's husband is Jolene.")
            .unwrap_or_default();
        assert!(why.contains("together"), "{why}");
        let s = Sources::new(["Tim, my husband, loves the beach"]);
        assert_eq!(s.unsupported("Tim is the user's husband."), None);
        let s = Sources::new(["my husband loves the beach", "Tim says hi"]);
        assert!(s.unsupported("Tim is the user's husband.").is_some());
    }

    #[test]
    fn paraphrases_of_the_sources_are_supported() {
        let s = Sources::new([PRIYA, PREFS, DOG]);
        for ok in [
            "The user is Priya Raman, a data engineer at a logistics startup in Austin.",
            "The user prefers Python examples and dislikes Java in examples.",
            "The user's dog Biscuit is a golden retriever who turns 3 next week.",
            "Priya's dog is Biscuit.",
        ] {
            assert_eq!(s.unsupported(ok), None, "{ok}");
        }
    }

    #[test]
    fn the_prompts_example_and_invented_facts_are_not() {
        let s = Sources::new([PRIYA, PREFS, DOG]);
        for (bad, why) in [
            ("The user is Dana, a chemistry teacher in Leeds.", "Dana"),
            (
                "The user is a chemistry teacher who likes opera.",
                "subject words",
            ),
            (
                "The user's dog Biscuit turns 4 next week.",
                "4 is in no source",
            ),
            ("The user's cat Miso is sick.", "Miso"),
            ("Miso is the user's cat.", "Miso is in no source"),
        ] {
            let why_not = s.unsupported(bad).unwrap_or_default();
            assert!(why_not.contains(why), "{bad}: {why_not:?}");
        }
        let (yes, no) =
            s.split("The user is Priya Raman. The user is a chemistry teacher in Leeds.");
        assert_eq!(yes, vec!["The user is Priya Raman."]);
        assert_eq!(no.len(), 1);
    }
}
