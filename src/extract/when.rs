//! Relative times resolved against the message that says them: "last
//! Saturday" in a message of 2026-03-19 is followed by "[2026-03-14]", so
//! the model that extracts memories, the memory it writes, and the search
//! that finds the message all see the date the speaker meant. A small model
//! does not do calendar arithmetic; this does it once, deterministically.
//!
//! Resolved: today, yesterday, tomorrow, tonight, last night; last / this
//! past / next WEEKDAY; last / this / next week, weekend, month, year; N
//! days, weeks, months or years ago (or back); in N days or weeks. A message without a
//! time (`ts`) is left as it is.

use jiff::civil::{Date, Weekday};
use jiff::ToSpan;
use regex::{Captures, Regex};
use serde_json::Value;
use std::sync::OnceLock;

/// The calendar day of a message's `ts`: an RFC 3339 time or a date
/// (its first ten characters), or seconds since the epoch.
pub fn day_of(ts: &Value) -> Option<Date> {
    match ts {
        Value::String(s) => s.get(..10)?.parse::<Date>().ok(),
        Value::Number(n) => {
            let t = jiff::Timestamp::from_second(n.as_i64()?).ok()?;
            Some(t.to_zoned(jiff::tz::TimeZone::UTC).date())
        }
        _ => None,
    }
}

fn pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        let wd = "monday|tuesday|wednesday|thursday|friday|saturday|sunday";
        let n = r"\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|a couple of|a few";
        Regex::new(&format!(
            r"(?i)\b(?:(?P<rel>last|this past|next) (?P<wd>{wd})|(?P<lw>last|next|this) (?P<unit>week|weekend|month|year)|(?P<n>{n}) (?P<u2>day|week|month|year)s? (?:ago|back)|in (?P<n3>{n}) (?P<u3>day|week)s?|(?P<word>today|yesterday|tomorrow|tonight|last night))\b"
        ))
        .expect("the relative-time pattern compiles")
    })
}

fn number(s: &str) -> Option<i64> {
    Some(match s.to_lowercase().as_str() {
        "a" | "an" | "one" => 1,
        "two" | "a couple of" => 2,
        "three" | "a few" => 3,
        "four" => 4,
        "five" => 5,
        "six" => 6,
        "seven" => 7,
        "eight" => 8,
        "nine" => 9,
        "ten" => 10,
        "eleven" => 11,
        "twelve" => 12,
        d => d.parse().ok()?,
    })
}

fn weekday(s: &str) -> Option<Weekday> {
    Some(match s.to_lowercase().as_str() {
        "monday" => Weekday::Monday,
        "tuesday" => Weekday::Tuesday,
        "wednesday" => Weekday::Wednesday,
        "thursday" => Weekday::Thursday,
        "friday" => Weekday::Friday,
        "saturday" => Weekday::Saturday,
        "sunday" => Weekday::Sunday,
        _ => return None,
    })
}

/// The Monday of `d`'s week.
fn monday(d: Date) -> Date {
    d.checked_sub((d.weekday().to_monday_zero_offset() as i64).days())
        .unwrap_or(d)
}

/// What the match means, as a date or a period, against `day`.
fn resolve(c: &Captures, day: Date) -> Option<String> {
    let ymd = |d: Date| d.strftime("%Y-%m-%d").to_string();
    if let (Some(rel), Some(wd)) = (c.name("rel"), c.name("wd")) {
        let w = weekday(wd.as_str())?;
        let d = if rel.as_str().eq_ignore_ascii_case("next") {
            day.nth_weekday(1, w).ok()?
        } else {
            day.nth_weekday(-1, w).ok()?
        };
        return Some(ymd(d));
    }
    if let (Some(lw), Some(unit)) = (c.name("lw"), c.name("unit")) {
        let sign = match lw.as_str().to_lowercase().as_str() {
            "next" => 1,
            "this" => 0,
            _ => -1,
        };
        return Some(match unit.as_str().to_lowercase().as_str() {
            "week" => format!(
                "week of {}",
                ymd(monday(day).checked_add((7 * sign).days()).ok()?)
            ),
            "weekend" => {
                let sat = match sign {
                    s if s < 0 => day.nth_weekday(-1, Weekday::Saturday).ok()?,
                    0 => monday(day).checked_add(5.days()).ok()?,
                    _ => day.nth_weekday(1, Weekday::Saturday).ok()?,
                };
                format!("weekend of {}", ymd(sat))
            }
            "month" => day
                .first_of_month()
                .checked_add(sign.months())
                .ok()?
                .strftime("%Y-%m")
                .to_string(),
            _ => (day.year() as i64 + sign).to_string(),
        });
    }
    if let (Some(n), Some(unit)) = (c.name("n"), c.name("u2")) {
        let n = number(n.as_str())?;
        let d = match unit.as_str().to_lowercase().as_str() {
            "day" => day.checked_sub(n.days()).ok()?,
            "week" => day.checked_sub((7 * n).days()).ok()?,
            "month" => {
                return Some(
                    day.checked_sub(n.months())
                        .ok()?
                        .strftime("%Y-%m")
                        .to_string(),
                )
            }
            _ => return Some((day.year() as i64 - n).to_string()),
        };
        return Some(ymd(d));
    }
    if let (Some(n), Some(unit)) = (c.name("n3"), c.name("u3")) {
        let n = number(n.as_str())?;
        let days = if unit.as_str().eq_ignore_ascii_case("week") {
            7 * n
        } else {
            n
        };
        return Some(ymd(day.checked_add(days.days()).ok()?));
    }
    let word = c.name("word")?.as_str().to_lowercase();
    let d = match word.as_str() {
        "yesterday" | "last night" => day.yesterday().ok()?,
        "tomorrow" => day.tomorrow().ok()?,
        _ => day,
    };
    Some(ymd(d))
}

/// `text` with each relative time followed by what it resolves to against
/// `day`, in brackets: "last Saturday [2026-03-14]". Text already followed
/// by a bracket is left alone, so annotating twice changes nothing.
pub fn annotate(text: &str, day: Date) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut last = 0;
    for c in pattern().captures_iter(text) {
        let m = c.get(0).expect("a match has group 0");
        if text[m.end()..].starts_with(" [") {
            continue;
        }
        if let Some(r) = resolve(&c, day) {
            out.push_str(&text[last..m.end()]);
            out.push_str(&format!(" [{r}]"));
            last = m.end();
        }
    }
    out.push_str(&text[last..]);
    out
}

/// Resolve the relative times of every message that has a time.
pub fn annotate_conversation(conv: &mut super::Conversation) {
    for m in &mut conv.messages {
        if let Some(day) = m.ts.as_ref().and_then(day_of) {
            m.content = annotate(&m.content, day);
        }
    }
}

/// The day the newest of `messages` (indexes into the conversation) was
/// said: when what they say became known. `None` when none has a time.
pub fn said_on(conv: &super::Conversation, messages: &[usize]) -> Option<Date> {
    messages
        .iter()
        .filter_map(|&i| conv.messages.get(i))
        .filter_map(|m| m.ts.as_ref().and_then(day_of))
        .max()
}

/// Month names and their short forms, as the date patterns match them.
const MONTHS: &str = "january|february|march|april|may|june|july|august|september|october|november|december|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec";

fn date_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        let month = MONTHS;
        Regex::new(&format!(
            r"(?i)\b(?P<iso>\d{{4}}-\d{{2}}-\d{{2}})\b|\b(?P<d1>\d{{1,2}})(?:st|nd|rd|th)? (?:of )?(?P<m1>{month})\.?,? (?P<y1>\d{{4}})\b|\b(?P<m2>{month})\.? (?P<d2>\d{{1,2}})(?:st|nd|rd|th)?,? (?P<y2>\d{{4}})\b"
        ))
        .expect("the date pattern compiles")
    })
}

fn month_number(s: &str) -> Option<i8> {
    let s = s.to_lowercase();
    let names = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    names
        .iter()
        .position(|m| s.starts_with(m))
        .map(|i| i as i8 + 1)
}

/// Does `text` say when something happened or will: a relative time
/// ([`annotate`] resolves it), a date or a month with its year
/// ([`named_days`]), a year after "in" or "since", or how long something
/// has lasted ("for three years", "for a month now").
pub fn tells_when(text: &str) -> bool {
    static SPAN: OnceLock<Regex> = OnceLock::new();
    let span = SPAN.get_or_init(|| {
        Regex::new(
            r"(?i)\b(?:for (?:about |almost |nearly |over |around )?(?:\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|a couple of|a few) (?:day|week|month|year)s?|(?:in|since) (?:19|20)\d{2})\b",
        )
        .expect("the span pattern compiles")
    });
    pattern().is_match(text) || span.is_match(text) || !named_days(text).is_empty()
}

/// The first calendar date `text` names: `2026-03-14` (as the resolved
/// relative times read), `14 March 2026` or `March 14, 2026`. When an event
/// memory says it happened.
pub fn first_date(text: &str) -> Option<Date> {
    date_pattern().captures_iter(text).find_map(|c| date_of(&c))
}

/// The date one match of [`date_pattern`] names, if it is one.
fn date_of(c: &Captures) -> Option<Date> {
    if let Some(iso) = c.name("iso") {
        return iso.as_str().parse::<Date>().ok();
    }
    let (d, m, y) = match (c.name("d1"), c.name("m1"), c.name("y1")) {
        (Some(d), Some(m), Some(y)) => (d, m, y),
        _ => (c.name("d2")?, c.name("m2")?, c.name("y2")?),
    };
    Date::new(
        y.as_str().parse().ok()?,
        month_number(m.as_str())?,
        d.as_str().parse().ok()?,
    )
    .ok()
}

/// The calendar spans a text (a search's query) names, first day and
/// last day: each date `first_date` reads (`2026-03-14`, `14 March 2026`,
/// `March 14, 2026`) as one day, and each month with its year (`March
/// 2026`, `in Mar. 2026`) as that month. A month without a year, or a year
/// alone, names no span: too wide to tell one conversation from another.
pub fn named_days(text: &str) -> Vec<(Date, Date)> {
    let mut out = Vec::new();
    let mut taken = Vec::new();
    for c in date_pattern().captures_iter(text) {
        let whole = c.get(0).expect("a match has its whole");
        taken.push(whole.range());
        if let Some(d) = date_of(&c) {
            out.push((d, d));
        }
    }
    for c in month_pattern().captures_iter(text) {
        let whole = c.get(0).expect("a match has its whole");
        if taken
            .iter()
            .any(|r| r.start < whole.end() && whole.start() < r.end)
        {
            continue;
        }
        let (Some(m), Ok(y)) = (month_number(&c["m"]), c["y"].parse::<i16>()) else {
            continue;
        };
        if let Ok(first) = Date::new(y, m, 1) {
            out.push((first, first.last_of_month()));
        }
    }
    out
}

fn month_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        let month = MONTHS;
        Regex::new(&format!(r"(?i)\b(?P<m>{month})\.?,? (?P<y>\d{{4}})\b"))
            .expect("the month pattern compiles")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn on(text: &str, day: &str) -> String {
        annotate(text, day.parse().unwrap())
    }

    #[test]
    fn a_text_that_says_when() {
        for t in [
            "We adopted him last week.",
            "I've had them for 3 years!",
            "Been playing it for a month now.",
            "I bought it a year ago in Paris.",
            "We met on 14 March 2023.",
            "The trip was in August 2023.",
            "I have lived here since 2019.",
            "Yesterday [2023-05-01] we went out.",
        ] {
            assert!(tells_when(t), "{t}");
        }
        for t in [
            "We adopted a beagle.",
            "I played for three hours.",
            "See you in a bit!",
            "It was the best month ever.",
        ] {
            assert!(!tells_when(t), "{t}");
        }
    }

    #[test]
    fn a_query_names_days_and_months_with_their_year() {
        let d = |s: &str| s.parse::<Date>().unwrap();
        let spans = |t: &str| named_days(t);
        assert_eq!(
            spans("What did Ann eat on October 24, 2023?"),
            vec![(d("2023-10-24"), d("2023-10-24"))]
        );
        assert_eq!(
            spans("the weekend before 4th October, 2023"),
            vec![(d("2023-10-04"), d("2023-10-04"))]
        );
        assert_eq!(
            spans("said on 2026-03-14 or 1 May 2026"),
            vec![
                (d("2026-03-14"), d("2026-03-14")),
                (d("2026-05-01"), d("2026-05-01"))
            ]
        );
        assert_eq!(
            spans("Where did she go in August 2023?"),
            vec![(d("2023-08-01"), d("2023-08-31"))]
        );
        assert_eq!(
            spans("as of Feb, 2024"),
            vec![(d("2024-02-01"), d("2024-02-29"))]
        );
        // A day's month is not named again as a month.
        assert_eq!(spans("on March 14, 2026").len(), 1);
        // No year, a year alone, a day that is not one: no span.
        for t in ["in August", "in 2023", "May I ask", "on February 30, 2023"] {
            assert!(spans(t).is_empty(), "{t}");
        }
    }

    #[test]
    fn relative_times_resolve_against_the_message_day() {
        // 2026-03-19 is a Thursday.
        let d = "2026-03-19";
        assert_eq!(
            on("guess what, last Saturday I ran my first half marathon!", d),
            "guess what, last Saturday [2026-03-14] I ran my first half marathon!"
        );
        assert_eq!(
            on("two weeks ago I started pottery classes", d),
            "two weeks ago [2026-03-05] I started pottery classes"
        );
        assert_eq!(
            on("we moved last month, back next Monday", d),
            "we moved last month [2026-02], back next Monday [2026-03-23]"
        );
        assert_eq!(
            on("Yesterday was long", d),
            "Yesterday [2026-03-18] was long"
        );
        assert_eq!(
            on("see you next week", d),
            "see you next week [week of 2026-03-23]"
        );
        assert_eq!(on("3 days ago", d), "3 days ago [2026-03-16]");
        assert_eq!(on("in 2 weeks", d), "in 2 weeks [2026-04-02]");
        assert_eq!(
            on("last weekend was fun", d),
            "last weekend [weekend of 2026-03-14] was fun"
        );
        assert_eq!(on("a year ago", d), "a year ago [2025]");
        assert_eq!(
            on("I took it up a few years back", d),
            "I took it up a few years back [2023]"
        );
        assert_eq!(
            on("this year I started, this month I moved", d),
            "this year [2026] I started, this month [2026-03] I moved"
        );
        assert_eq!(
            on("busy this week and this weekend", d),
            "busy this week [week of 2026-03-16] and this weekend [weekend of 2026-03-21]"
        );
        // No relative time, or one resolved already: unchanged.
        assert_eq!(on("I like tea on Saturdays", d), "I like tea on Saturdays");
        let once = on("last Friday", d);
        assert_eq!(annotate(&once, "2026-03-19".parse().unwrap()), once);
    }

    #[test]
    fn message_times_in_each_form() {
        assert_eq!(
            day_of(&json!("2026-03-19T19:02:00Z")),
            Some("2026-03-19".parse().unwrap())
        );
        assert_eq!(
            day_of(&json!("2026-03-19")),
            Some("2026-03-19".parse().unwrap())
        );
        assert_eq!(
            day_of(&json!(1773946920)),
            Some("2026-03-19".parse().unwrap())
        );
        assert_eq!(day_of(&json!("yesterday")), None);
        assert_eq!(day_of(&json!(null)), None);
    }

    #[test]
    fn dates_in_a_memory_and_the_day_it_was_said() {
        let d = |s: &str| Some(s.parse::<Date>().unwrap());
        assert_eq!(
            first_date("ran a half marathon last Saturday [2026-03-14]"),
            d("2026-03-14")
        );
        assert_eq!(
            first_date("The user moves on 3 May 2026 to York."),
            d("2026-05-03")
        );
        assert_eq!(first_date("flies out on March 14th, 2026"), d("2026-03-14"));
        assert_eq!(
            first_date("the week of [2026-02-30] then 2026-04-01"),
            d("2026-04-01")
        );
        assert_eq!(first_date("likes tea, has 2 cats"), None);
        let conv = super::super::Conversation {
            messages: vec![
                super::super::Message {
                    role: "user".into(),
                    content: "a".into(),
                    ts: Some(json!("2026-03-19T10:00:00Z")),
                    name: None,
                },
                super::super::Message {
                    role: "user".into(),
                    content: "b".into(),
                    ts: None,
                    name: None,
                },
                super::super::Message {
                    role: "user".into(),
                    content: "c".into(),
                    ts: Some(json!("2026-01-02")),
                    name: None,
                },
            ],
            ..Default::default()
        };
        assert_eq!(said_on(&conv, &[0, 1, 2]), d("2026-03-19"));
        assert_eq!(said_on(&conv, &[1]), None);
        assert_eq!(said_on(&conv, &[2, 7]), d("2026-01-02"));
    }
}
