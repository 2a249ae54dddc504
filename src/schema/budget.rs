//! Budgets in tokens: what a search, a memory map, a header or a memory
//! tool view may take of an agent's context window (`?budget=N`). Tokens
//! are estimated as everywhere ([`super::estimate_tokens`]).

use super::estimate_tokens;

/// The smallest budget taken: a search's heading, one abstract and its
/// closing line.
pub const MIN_BUDGET: usize = 128;
/// The largest budget taken (a context window of a million tokens).
pub const MAX_BUDGET: usize = 1_000_000;

/// `text` cut at a whole line to at most `budget` tokens, with a last line
/// saying how many lines were left out (a memory map, a header, a memory
/// tool view); `text` itself when it fits.
pub fn cut_lines(text: String, budget: usize) -> String {
    if estimate_tokens(&text) <= budget {
        return text;
    }
    let lines: Vec<&str> = text.lines().collect();
    let note = |left: usize| {
        format!("... {left} more lines left out to keep within {budget} tokens (a larger budget shows more)\n")
    };
    let mut room = budget.saturating_sub(estimate_tokens(&note(lines.len())));
    let mut out = String::new();
    let mut kept = 0;
    for l in &lines {
        // A line's estimate with its newline is at most this.
        let t = estimate_tokens(l) + 1;
        if t > room {
            break;
        }
        room -= t;
        out.push_str(l);
        out.push('\n');
        kept += 1;
    }
    out.push_str(&note(lines.len() - kept));
    out
}

/// `NAME?budget=N` of a generated file: (`NAME`, N); `None` when the name
/// has no options. A bad budget is an error naming the range.
pub fn budget_option(name: &str) -> crate::error::Result<Option<(&str, usize)>> {
    let Some((base, opts)) = name.split_once('?') else {
        return Ok(None);
    };
    let bad = || {
        crate::error::Error::Invalid(format!(
            "{}: the one option of a generated file is budget=N, N from {MIN_BUDGET} to {MAX_BUDGET} tokens",
            crate::schema::excerpt(name)
        ))
    };
    let n: usize = opts
        .strip_prefix("budget=")
        .and_then(|v| v.parse().ok())
        .ok_or_else(bad)?;
    if !(MIN_BUDGET..=MAX_BUDGET).contains(&n) {
        return Err(bad());
    }
    Ok(Some((base, n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_file_takes_one_budget_option() {
        assert_eq!(budget_option("README.md").unwrap(), None);
        assert_eq!(
            budget_option("README.md?budget=300").unwrap(),
            Some(("README.md", 300))
        );
        for bad in [
            "README.md?budget=3",
            "README.md?k=3",
            "README.md?budget=x",
            "README.md?",
        ] {
            assert!(budget_option(bad).is_err(), "{bad}");
        }
    }
}
