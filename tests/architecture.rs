//! The module table of `docs/ARCHITECTURE.md` ("may use") is the rule for
//! imports between the crate's top-level modules: this test reads every
//! `crate::…` path in `src/` and fails on an arrow the table does not allow,
//! on a module the table leaves out, and on an import circle in the table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules every module may use: they use nothing of ours.
const LEAVES: [&str; 2] = ["error", "locks"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `module → modules it may use`, from the table's rows.
fn table() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let mut out = BTreeMap::new();
    let mut in_table = false;
    for line in doc.lines() {
        if line.starts_with("| module | owns | may use |") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        if cols.len() < 4 || cols[1].starts_with("---") {
            continue;
        }
        let uses: BTreeSet<String> = ticked(cols[3]).into_iter().collect();
        for path in ticked(cols[1]) {
            if let Some(m) = module_of_path(&path) {
                out.insert(m, uses.clone());
            }
        }
    }
    assert!(
        !out.is_empty(),
        "no module table found in docs/ARCHITECTURE.md"
    );
    out
}

/// The `backticked` words of a table cell (the first word of each).
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.split_whitespace().next().unwrap_or("").to_string())
        .collect()
}

/// `src/core/` or `src/cli.rs` → `core` / `cli`; `src/main.rs` (the binary) → none.
fn module_of_path(p: &str) -> Option<String> {
    let rest = p.strip_prefix("src/")?;
    let name = rest.split('/').next()?.trim_end_matches(".rs");
    (name != "main" && name != "lib" && !name.is_empty()).then(|| name.to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level modules named by `crate::X` paths in `code` (comments skipped).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let l = line.trim_start();
        if l.starts_with("//") {
            continue;
        }
        let mut rest = l;
        while let Some(i) = rest.find("crate::") {
            // `ctxfs::crate::` cannot occur; skip identifiers ending in "crate".
            let before = rest[..i].chars().last();
            rest = &rest[i + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a, b::{c, d}, e}`: the names at depth 1.
                let mut depth = 1;
                let mut at_start = true;
                let mut word = String::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        ',' if depth == 1 => {
                            if !word.is_empty() {
                                out.insert(std::mem::take(&mut word));
                            }
                            at_start = true;
                        }
                        c if depth == 1 && at_start && (c.is_alphanumeric() || c == '_') => {
                            word.push(c)
                        }
                        _ if depth == 1 && at_start && !word.is_empty() => {
                            out.insert(std::mem::take(&mut word));
                            at_start = false;
                        }
                        _ => {}
                    }
                }
                if !word.is_empty() {
                    out.insert(word);
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

#[test]
fn imports_follow_the_module_table() {
    let table = table();
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad = Vec::new();
    let mut seen = BTreeSet::new();
    for f in files {
        let rel = f
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .to_string();
        let Some(module) = module_of_path(&rel) else {
            continue;
        };
        seen.insert(module.clone());
        let code = std::fs::read_to_string(&f).unwrap();
        let refs = crate_refs(&code);
        if LEAVES.contains(&module.as_str()) {
            for r in refs.iter().filter(|r| **r != module) {
                bad.push(format!("{rel}: the leaf `{module}` uses `{r}`"));
            }
            continue;
        }
        let Some(allowed) = table.get(&module) else {
            bad.push(format!("{rel}: module `{module}` is not in the table"));
            continue;
        };
        for r in refs {
            if r != module && !allowed.contains(&r) && !LEAVES.contains(&r.as_str()) {
                bad.push(format!(
                    "{rel}: `{module}` uses `{r}`, which the table does not allow"
                ));
            }
        }
    }
    for m in table.keys() {
        if !seen.contains(m) {
            bad.push(format!("the table lists `{m}`, which src/ does not have"));
        }
    }
    assert!(
        bad.is_empty(),
        "docs/ARCHITECTURE.md module table:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_module_table_has_no_circle() {
    let table = table();
    // Depth-first search from every module; a module met again on the
    // current path closes a circle.
    fn visit(
        m: &str,
        t: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut c = path[i..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if !done.insert(m.to_string()) {
            return None;
        }
        path.push(m.to_string());
        for n in t.get(m).into_iter().flatten() {
            if let Some(c) = visit(n, t, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for m in table.keys() {
        if let Some(c) = visit(m, &table, &mut Vec::new(), &mut done) {
            panic!("import circle in the module table: {}", c.join(" → "));
        }
    }
}

#[test]
fn the_scanner_reads_grouped_imports() {
    let code = "use crate::{a, b::{c, d}, e::f};\n// crate::zzz\nlet x = crate::g::h(\"ctx://q\");";
    let got: Vec<String> = crate_refs(code).into_iter().collect();
    assert_eq!(got, ["a", "b", "e", "g"]);
}
