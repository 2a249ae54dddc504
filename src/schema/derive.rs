//! What the daemon writes into a node at commit on its own: the L0 abstract
//! and L1 overview a writer left out, derived from `content.md`. Pure
//! functions over text (the redaction of secrets is `redact.rs`).

/// Largest node (the five files together) a commit accepts, as in the
/// flat-file context design this follows: larger nodes are refused (EFBIG).
pub const NODE_BUDGET_BYTES: u64 = 300_000;
/// A derived overview stops at this many bytes.
pub const OVERVIEW_MAX_BYTES: usize = 2_000;

/// The L0 abstract of `content`: its first sentence (skipping headings and
/// markup), on one line, at most `max_chars` characters.
pub fn derive_abstract(content: &str, max_chars: usize) -> String {
    let mut text = String::new();
    for line in content.lines() {
        let l = line.trim();
        if l.is_empty() {
            if !text.is_empty() && !text.ends_with('\u{0}') {
                break;
            }
            continue;
        }
        if l.starts_with("```") || l.starts_with("---") || l.starts_with('|') {
            continue;
        }
        let l = strip_markup(l);
        if l.is_empty() {
            continue;
        }
        // A lone heading stands in only when no prose follows it.
        if line.trim_start().starts_with('#') {
            if text.is_empty() {
                text = l;
                text.push('\u{0}');
            }
            continue;
        }
        if text.ends_with('\u{0}') {
            text.clear();
        }
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&l);
        // The abstract is the first `max_chars` of the first sentence: past
        // a few times that, more text cannot change it (and scanning the
        // whole growing paragraph for each line was quadratic: a 64 KB
        // paragraph of short lines took 120 ms to commit).
        if sentence_end(&text).is_some() || text.len() > 4 * max_chars.max(25) {
            break;
        }
    }
    let text = text.trim_end_matches('\u{0}');
    let first = match sentence_end(text) {
        Some(i) => &text[..i],
        None => text,
    };
    bound_chars(first.trim(), max_chars)
}

/// Byte index just past the first sentence end (`.`, `!`, `?` then a space or the end).
fn sentence_end(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if matches!(c, b'.' | b'!' | b'?') && (i + 1 == b.len() || b[i + 1] == b' ') {
            // "e.g. " and single-letter initials are not sentence ends.
            let word_start = s[..i].rfind(' ').map(|j| j + 1).unwrap_or(0);
            let word = &s[word_start..i];
            if word.len() <= 1 || word.contains('.') || word.eq_ignore_ascii_case("e.g") {
                continue;
            }
            return Some(i + 1);
        }
    }
    None
}

/// Leading list and heading markers, emphasis and code ticks removed.
fn strip_markup(line: &str) -> String {
    let l = line
        .trim_start_matches('#')
        .trim_start_matches(['>', '-', '*', '+'])
        .trim();
    let l = l
        .split_once(". ")
        .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .map(|(_, rest)| rest)
        .unwrap_or(l);
    l.replace("**", "").replace('`', "")
}

/// At most `max` characters, cut at a word boundary with an ellipsis.
fn bound_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max.saturating_sub(1)).collect();
    let cut = match cut.rfind(' ') {
        Some(i) if i > max / 2 => cut[..i].trim_end().to_string(),
        _ => cut,
    };
    format!("{cut}…")
}

/// The L1 overview of `content`: each heading with the first line of its
/// section; without headings, the first lines. At most `OVERVIEW_MAX_BYTES`.
pub fn derive_overview(content: &str) -> String {
    let mut out = String::new();
    let mut want_line = false;
    let mut in_code = false;
    let mut headings = 0;
    for line in content.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code || t.is_empty() {
            continue;
        }
        if t.starts_with('#') {
            headings += 1;
            out.push_str(t);
            out.push('\n');
            want_line = true;
        } else if want_line {
            out.push_str(&bound_chars(t, 200));
            out.push('\n');
            want_line = false;
        }
        if out.len() > OVERVIEW_MAX_BYTES {
            break;
        }
    }
    if headings == 0 {
        out.clear();
        for t in content.lines().map(str::trim).filter(|t| !t.is_empty()) {
            out.push_str(&bound_chars(t, 200));
            out.push('\n');
            if out.lines().count() >= 5 || out.len() > OVERVIEW_MAX_BYTES {
                break;
            }
        }
    }
    if out.len() > OVERVIEW_MAX_BYTES {
        let mut cut = OVERVIEW_MAX_BYTES;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("…\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abstracts() {
        let c = "# Tea\n\nAlice likes green tea. She drinks it daily.\n";
        assert_eq!(derive_abstract(c, 100), "Alice likes green tea.");
        assert_eq!(derive_abstract("# Only a heading\n", 100), "Only a heading");
        assert_eq!(
            derive_abstract("- e.g. this one is long enough to matter. Next.", 100),
            "e.g. this one is long enough to matter."
        );
        let long = "word ".repeat(60);
        let a = derive_abstract(&long, 100);
        assert!(a.chars().count() <= 100 && a.ends_with('…'), "{a}");
        assert_eq!(derive_abstract("", 100), "");
        assert_eq!(
            derive_abstract("first line\nwraps here. Then more.", 100),
            "first line wraps here."
        );
    }

    #[test]
    fn overviews() {
        let c = "# Title\nintro line\nmore\n\n## Part A\n\nline a1\nline a2\n## Part B\n```\ncode\n```\nb1\n";
        assert_eq!(
            derive_overview(c),
            "# Title\nintro line\n## Part A\nline a1\n## Part B\nb1\n"
        );
        assert_eq!(derive_overview("a\n\nb\n"), "a\nb\n");
        assert!(derive_overview(&"# h\nx\n".repeat(1000)).len() <= OVERVIEW_MAX_BYTES + 8);
    }
}

#[cfg(test)]
mod long_paragraphs {
    use super::*;

    #[test]
    fn a_long_paragraph_gives_the_abstract_of_its_start() {
        let one = "version 9\n".repeat(6500);
        let a = derive_abstract(&one, 100);
        assert!(
            a.starts_with("version 9 version 9") && a.ends_with('…') && a.chars().count() <= 100,
            "{a}"
        );
        // A sentence end far in does not change what the start gives.
        let two = format!("{}The end. More.", "word ".repeat(5000));
        assert_eq!(
            derive_abstract(&two, 100),
            derive_abstract(&"word ".repeat(5000), 100)
        );
        // A short paragraph still gives its first sentence.
        assert_eq!(
            derive_abstract("Alice drinks tea. She likes it.", 100),
            "Alice drinks tea."
        );
    }
}
