//! The documents' links work: every relative link of `README.md` and
//! `docs/*.md` names a file of the repository, and a `#anchor` names a
//! heading of that file (as GitHub makes an anchor of a heading).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// GitHub's anchor of a heading: lower case, punctuation dropped (not
/// `-` or `_`), spaces made `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of a Markdown text outside its code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut code = false;
    text.lines().filter(move |line| {
        if line.starts_with("```") {
            code = !code;
            return false;
        }
        !code
    })
}

/// The anchors of a Markdown file's headings (code blocks aside).
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

/// The targets of `[text](target)` links of a Markdown text, code aside.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(j) = after.find(')') else { break };
            out.push(after[..j].to_string());
            rest = &after[j..];
        }
    }
    out
}

fn documents() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
    out
}

fn check(doc: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(doc).unwrap();
    let mut bad = Vec::new();
    for target in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
            continue;
        }
        let (file, frag) = target.split_once('#').unwrap_or((&target, ""));
        let path = if file.is_empty() {
            doc.to_path_buf()
        } else {
            doc.parent().unwrap().join(file)
        };
        if !path.exists() {
            bad.push(format!("{}: {target}: no such file", doc.display()));
            continue;
        }
        if !frag.is_empty() && path.extension().is_some_and(|x| x == "md") {
            let there = anchors(&std::fs::read_to_string(&path).unwrap());
            if !there.contains(frag) {
                bad.push(format!("{}: {target}: no such heading", doc.display()));
            }
        }
    }
    bad
}

#[test]
fn every_relative_link_of_the_documents_resolves() {
    let bad: Vec<String> = documents().iter().flat_map(|d| check(d)).collect();
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(
        anchor(" No lost update: `if_version` (issue: many agents, one memory)"),
        "no-lost-update-if_version-issue-many-agents-one-memory"
    );
    assert_eq!(
        anchor("A long paragraph's commit: 124 ms → 4.4 ms"),
        "a-long-paragraphs-commit-124-ms--44-ms"
    );
    assert_eq!(
        links("see [a](B.md#c) and [d](#e), ```x```"),
        vec!["B.md#c", "#e"]
    );
    // A link to a heading that is not there is caught.
    let dir = std::env::temp_dir().join(format!("ctxfs-docs-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let doc = dir.join("a.md");
    std::fs::write(&doc, "# Top\n\n[ok](#top) [bad](#nope) [gone](b.md)\n").unwrap();
    let bad = check(&doc);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(bad.len(), 2, "{bad:?}");
}
