//! What in chat says something of someone: the greetings, thanks and
//! reactions that carry no fact, the first person and names that do, and
//! a quote cut to its statements. Pure rules over text, used to keep
//! quoted memories to what was said of someone.

use std::collections::HashSet;

/// Words a quote needs to state something: of three letters or more, not
/// stopwords, not the words of chat ("See you soon!" has none).
const MIN_FACT_WORDS: usize = 2;

/// The words of greetings, thanks and reactions.
const CHAT: &[&str] = &[
    "amazing",
    "awesome",
    "bye",
    "cheers",
    "congrats",
    "congratulations",
    "cool",
    "glad",
    "good",
    "great",
    "haha",
    "hello",
    "hey",
    "hope",
    "lol",
    "nice",
    "okay",
    "right",
    "see",
    "soon",
    "sounds",
    "sure",
    "thank",
    "thanks",
    "wow",
    "yeah",
    "yes",
];

/// The phrases of chat in the first person (regular expressions, matched
/// whole words, case aside): said to the other speaker, they tell nothing
/// of the one who says them.
const CHAT_PHRASES: &[&str] = &[
    // Asking and offering.
    r"(?:let|keep|tell|show|remind|text|ping|join|excuse)\s+(?:me|us)",
    r"i can help",
    r"(?:i'm|i am) (?:always )?here for you",
    r"(?:you can )?count on me",
    r"(?:if you need|anything you need)(?: anything| help| me)?",
    // Promises to the other.
    r"i'll (?:\w+ )?(?:catch up with you|(?:let|keep) you (?:know|posted|updated))",
    r"i'll (?:\w+ )?(?:keep|bear) (?:that|it|this) in mind",
    r"i'll (?:\w+ )?(?:give it a (?:go|try|shot)|try it(?: out)?|check it out|look into it|take your advice)",
    // Reactions.
    r"i (?:really )?appreciate",
    r"i agree",
    r"i hope",
    r"(?:i'm|i am) (?:so |really )?glad",
    r"(?:i'm|i am) sure",
    r"(?:i'm|i am) (?:so )?sorry to hear",
    r"(?:i'm|i am) (?:so |really )?(?:happy|proud) (?:for|of) you",
    r"i know,? right",
    r"i know what you mean",
    r"i (?:feel|hear|get) you",
    r"i see",
    r"i bet",
    r"i think so",
    r"i can't wait",
    r"i'd love to",
    r"me too",
    r"(?:it|they|that|this|something|which)(?: \w+)? (?:makes?|made|make) (?:me|us)(?: feel)?",
    r"thank(?:s| you) for \w+ (?:me|us)",
    r"(?:your support|that|it|this) means (?:a lot|so much|the world) to me",
    // Catching up.
    r"long time no (?:see|talk|chat|speak)",
    r"since (?:we|i) (?:last )?(?:talked|spoke|chatted|caught up)",
    r"(?:i've had |i had |we've had |there's been )?(?:a lot|lots)(?: of stuff)? (?:going on|(?:has )?happened|(?:has )?gone down)",
];

/// Does `span` say something of someone: a sentence in the first person
/// ("I", "my", "we", "our"; "me" and "us" but in "let me know", "keep us
/// posted"), or with a number, or a name inside it (a capitalised word
/// after the first that no one is greeted by and that is not one of the
/// conversation's `speakers`, who are addressed, not told about)? "It is
/// truly inspiring!", "Take care!", "Hey Jolene, nice to meet you!",
/// "Alright Sam, have fun!" (Sam speaking) are not.
pub(super) fn says_something(span: &str, speakers: &HashSet<&str>) -> bool {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(r"(?i)\b(?:i|i'm|i've|i'd|i'll|my|mine|myself|we|we're|we've|we'd|we'll|our|ours)\b|\b(?:me|us)\b|\d")
            .expect("the first-person pattern compiles")
    });
    // The first person of chat: "let me know", "I'll keep that in mind",
    // "I hope so", "I can help", "I'll give it a try", "thanks for showing
    // me", "long time no talk, lots going on": what one says to the other
    // in any conversation, of no one in particular.
    static CHAT: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let chat = CHAT.get_or_init(|| {
        regex::Regex::new(&format!(r"(?i)\b(?:{})\b", CHAT_PHRASES.join("|")))
            .expect("the chat pattern compiles")
    });
    // Names greeted ("Thanks, Deb!", "hey Jolene"), no subject.
    static GREETED: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let greeting = GREETED.get_or_init(|| {
        regex::Regex::new(
            r"(?i:\b(?:hi|hey|hello|thanks|thank you|cheers|congrats|congratulations|bye|dear|yo))[,!]?\s+(?P<a>\p{Lu}\p{L}+)|,\s*(?P<b>\p{Lu}\p{L}+)\s*[!.?,]",
        )
        .expect("the greeting pattern compiles")
    });
    let plain = super::line::unbracketed(span).replace('\u{2019}', "'");
    // (A word in its place, so the sentence still ends where it did.)
    let plain = chat.replace_all(&plain, "ok");
    let mut greeted: HashSet<String> = super::support::vocatives(span).into_iter().collect();
    greeted.extend(
        greeting
            .captures_iter(span)
            .filter_map(|c| c.name("a").or(c.name("b")))
            .map(|m| m.as_str().to_string()),
    );
    super::support::sentences(&plain).iter().any(|s| {
        re.is_match(s)
            || s.split(|c: char| !c.is_alphanumeric() && c != '\'')
                .filter(|w| !w.is_empty())
                .skip(1)
                .any(|w| {
                    w.chars().next().is_some_and(char::is_uppercase)
                        && w != "I"
                        && !w.starts_with("I'")
                        && !greeted.contains(w)
                        && !speakers
                            .iter()
                            .any(|sp| sp.split_whitespace().next() == Some(w))
                })
    })
}

/// The words of `text` that can carry a fact: of three letters or more,
/// not stopwords, not the words of chat; brackets aside.
fn fact_words(text: &str) -> impl Iterator<Item = String> {
    super::line::words(&super::line::unbracketed(text))
        .into_iter()
        .filter(|w| {
            w.chars().count() >= 3
                && !crate::schema::words::is_stopword(w)
                && !CHAT.contains(&w.as_str())
        })
}

/// Too few words that can carry a fact to state anything ("See you soon!").
pub(super) fn too_few_facts(text: &str) -> bool {
    fact_words(text).count() < MIN_FACT_WORDS
}

/// A topic from a quote's own words: its first three that can carry a fact.
pub(super) fn topic_of(span: &str) -> String {
    fact_words(span).take(3).collect::<Vec<_>>().join(" ")
}

/// The statements of a quote: its questions cut away, and the greetings
/// and sign-offs at its edges ("Hey Ann!", "Have a good one!": chat that
/// names nothing and says nothing of anyone); a cut between two statements
/// is marked "…", once.
pub(super) fn statements_only(span: &str, speakers: &HashSet<&str>) -> String {
    let sentences = super::support::sentences(span);
    let question = |s: &str| s.trim_end().ends_with('?');
    let chat = |s: &str| {
        let t = s.trim();
        t.is_empty()
            || t.chars().all(|c| !c.is_alphanumeric())
            || (too_few_facts(t) && !says_something(t, speakers))
    };
    let body = |s: &str| !question(s) && !chat(s);
    let (Some(first), Some(last)) = (
        sentences.iter().position(|s| body(s)),
        sentences.iter().rposition(|s| body(s)),
    ) else {
        // Nothing but chat and questions: what is left for the checks to
        // refuse.
        return sentences
            .into_iter()
            .filter(|s| !question(s))
            .collect::<Vec<_>>()
            .join(" ");
    };
    let mut out = String::new();
    let mut cut = false;
    for s in &sentences[first..=last] {
        if question(s) || s.trim().chars().all(|c| !c.is_alphanumeric()) {
            cut = true;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if cut { " … " } else { " " });
        }
        out.push_str(s);
        cut = false;
    }
    while out.contains("… …") {
        out = out.replace("… …", "…");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_says_nothing_of_anyone() {
        let speakers: HashSet<&str> = ["Ann", "Bob Stone"].into_iter().collect();
        for s in [
            "It is truly inspiring!",
            "Take care and keep spreading those good vibes!",
            "Hey Jolene, nice to meet you!",
            "Looking forward to the next chat!",
            "No problem, John! Let me know whenever you need assistance. Take care!",
            "Pets bring so much happiness!",
            "Thanks, Deb! You too, take care. See ya!",
            "Cheers, James! Yeah, I'll keep that in mind. Appreciate the offer.",
            "A pet would truly be great for you! They bring so much love and companionship. \
             If you're interested, I can help find the perfect one for you - you'd make a great pet parent!",
            // The speakers' own names are the addressed, not a subject.
            "Alright Ann, have fun with it! Keep me updated!",
            "Take care, Ann! I'll catch up with you later.",
            "I'll let you know. Have a good one!",
            // Promises, reactions and catching up, in the first person.
            "I'll definitely give it a try. Appreciate the tip!",
            "I\u{2019}ll take your advice and let you know how it goes.",
            "Wow, what a view. Thanks for showing me!",
            "I'm always here for you. Anything you need, count on me!",
            "Your support means a lot to me.",
            "I'm so proud of you!",
            "Long time no talk - I had lots of stuff going on.",
            "It's been ages since we last spoke.",
            "Me too!",
            "Aww, it makes me happy just looking at them!",
        ] {
            assert!(!says_something(s, &speakers), "{s}");
        }
        for s in [
            "Eagles have always mesmerized me; they're so strong and graceful!",
            "Their names are Pepper, Precious and Panda.",
            "Fox Hollow is a great trail to hike on weekends.",
            "It was my mother's old house.",
            "We went there in 2019.",
            "I've had them for 3 years!",
            "Bob Marley was playing all night.",
            // A fact beside the chat is kept.
            "Long time no see! I moved to Oslo in May.",
            "I'll give it a try: my sister runs a bakery.",
            "Since we last talked, we adopted a second dog.",
            "Thanks for asking me! I sold the van.",
            "Painting makes me feel calm.",
        ] {
            assert!(says_something(s, &speakers), "{s}");
        }
    }

    #[test]
    fn greetings_and_sign_offs_leave_the_edges_of_a_quote() {
        let speakers: HashSet<&str> = ["Ann", "Bob Stone"].into_iter().collect();
        for (span, want) in [
            (
                "Hey Bob! My sister moved to Oslo in May. Talk soon!",
                "My sister moved to Oslo in May.",
            ),
            (
                "Hi Ann! How are you? I adopted a cat. Her name is Tofu. Bye!",
                "I adopted a cat. Her name is Tofu.",
            ),
            // Inside a quote a question is a cut, marked once.
            (
                "I sold the van. Why? … Did you hear? It needed a new engine.",
                "I sold the van. … It needed a new engine.",
            ),
            // Chat between two statements stays: it is their context.
            (
                "We went to the lake. Super fun! The kids swam all day.",
                "We went to the lake. Super fun! The kids swam all day.",
            ),
        ] {
            assert_eq!(statements_only(span, &speakers), want, "{span}");
        }
        // All chat: left for the checks to refuse.
        let s = statements_only("Hey Bob! Thanks!", &speakers);
        assert!(too_few_facts(&s) || !says_something(&s, &speakers), "{s}");
    }
}
