//! The memory-tool protocol on ctxfs: the six commands an application
//! implements on a `/memories` directory (`view`, `create`, `str_replace`,
//! `insert`, `delete`, `rename`), mapped onto nodes so that each change is an
//! atomic, versioned, searchable commit.
//!
//! The mapping (also in docs/AGENTS.md):
//! - `/memories` is `SCOPE/memories/`, a directory of categories;
//! - `/memories/CATEGORY/NAME` is the node `SCOPE/memories/CATEGORY/SLUG`,
//!   its text the node's `content.md`; SLUG is NAME without a final `.md`
//!   (`notes.md` → `notes`, `notes.txt` → `notes.txt`), and a node is shown
//!   as `SLUG.md` when its slug holds no `.`;
//! - a file directly in `/memories` (`/memories/todo.txt`) is a node of the
//!   category `_`, which is shown as the top level, never as a directory;
//! - deeper paths, and names outside the node name rules (ASCII letters,
//!   digits, `_ - .`, not starting with `.`), are refused with a reason.
//!
//! Every change commits: `create` writes the node (a new version when it
//! exists), `str_replace` and `insert` write a new version of `content.md`,
//! `delete` deletes the node (or every node of a category), `rename` moves
//! nodes. The abstract and overview are derived again at each change.

use super::edit::EditError;
use super::{Front, FrontError, NodeWrite};
use serde_json::Value;

/// The category of the files directly under `/memories`.
pub const TOP: &str = "_";
const ROOT: &str = "/memories";

/// Where a memory-tool path lands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `/memories`
    Root,
    /// `/memories/CATEGORY`
    Category(String),
    /// `/memories/CATEGORY/NAME` (or `/memories/NAME`: category `_`)
    File { category: String, slug: String },
}

fn parse(path: &str) -> Result<Target, String> {
    let p = path.trim();
    let rest = match p.strip_prefix(ROOT) {
        Some("") | Some("/") => return Ok(Target::Root),
        Some(r) if r.starts_with('/') => r.trim_matches('/'),
        _ => {
            return Err(format!(
                "Error: The path {p} is outside {ROOT}: every memory path starts with {ROOT}/"
            ))
        }
    };
    let parts: Vec<&str> = rest.split('/').collect();
    for seg in &parts {
        // The tree's own name rules: a path the mount would refuse is refused here.
        crate::schema::place::check_name(seg).map_err(|e| format!("Error: {p}: {e}"))?;
    }
    match parts.as_slice() {
        [one] if has_file_ext(one) => Ok(Target::File {
            category: TOP.into(),
            slug: slug_of(one),
        }),
        [one] => {
            if *one == TOP {
                return Err(format!(
                    "Error: {p}: the directory name {TOP} is reserved for files directly in {ROOT}"
                ));
            }
            Ok(Target::Category(one.to_string()))
        }
        [cat, name] => {
            if *cat == TOP {
                return Err(format!(
                    "Error: {p}: the directory name {TOP} is reserved for files directly in {ROOT}"
                ));
            }
            Ok(Target::File {
                category: cat.to_string(),
                slug: slug_of(name),
            })
        }
        _ => Err(format!(
            "Error: {p}: memory paths are {ROOT}/FILE or {ROOT}/DIRECTORY/FILE (two levels at most)"
        )),
    }
}

/// A name with an extension (`notes.txt`, `todo.md`) is a file at the top
/// level; one without is a directory.
fn has_file_ext(name: &str) -> bool {
    name.contains('.')
}

fn slug_of(name: &str) -> String {
    match name.strip_suffix(".md") {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => name.to_string(),
    }
}

fn name_of(slug: &str) -> String {
    if slug.contains('.') {
        slug.to_string()
    } else {
        format!("{slug}.md")
    }
}

/// Run one command (`{"command": "view", "path": "/memories"}`…); the text
/// the application hands back to the model, or the error text (`Error: …`).
pub fn execute(front: &Front, cmd: &Value) -> Result<String, String> {
    let s = |k: &str| cmd.get(k).and_then(Value::as_str);
    let need = |k: &str| s(k).ok_or_else(|| format!("Error: parameter `{k}` is required"));
    let command = need("command")?;
    let mem = MemTool { front };
    match command {
        "view" => {
            let range = cmd.get("view_range").and_then(Value::as_array).map(|a| {
                (
                    a.first().and_then(Value::as_i64).unwrap_or(1),
                    a.get(1).and_then(Value::as_i64).unwrap_or(-1),
                )
            });
            let budget = match cmd.get("budget") {
                None | Some(Value::Null) => None,
                Some(b) => Some(
                    b.as_u64()
                        .map(|b| b as usize)
                        .filter(|b| {
                            (crate::schema::budget::MIN_BUDGET..=crate::schema::budget::MAX_BUDGET)
                                .contains(b)
                        })
                        .ok_or_else(|| {
                            format!(
                                "Error: `budget` is a number of tokens, {} to {}",
                                crate::schema::budget::MIN_BUDGET,
                                crate::schema::budget::MAX_BUDGET
                            )
                        })?,
                ),
            };
            let out = mem.view(need("path")?, range, budget)?;
            Ok(match budget {
                Some(b) => crate::schema::budget::cut_lines(out, b),
                None => out,
            })
        }
        "create" => mem.create(need("path")?, need("file_text")?),
        "str_replace" => {
            mem.str_replace(need("path")?, need("old_str")?, s("new_str").unwrap_or(""))
        }
        "insert" => {
            let line = cmd
                .get("insert_line")
                .and_then(Value::as_i64)
                .ok_or("Error: parameter `insert_line` is required")?;
            mem.insert(need("path")?, line, need("insert_text")?)
        }
        "delete" => mem.delete(need("path")?),
        "rename" => mem.rename(need("old_path")?, need("new_path")?),
        other => Err(format!(
            "Error: unknown command {other:?} (view, create, str_replace, insert, delete, rename)"
        )),
    }
}

/// `ctxfs memtool`: one JSON command per line on stdin, one JSON answer per
/// line on stdout (`{"ok": true, "text": …}` or `{"ok": false, "error": …}`).
pub fn serve_lines(front: &Front) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(cmd) => match execute(front, &cmd) {
                Ok(text) => serde_json::json!({"ok": true, "text": text}),
                Err(text) => serde_json::json!({"ok": false, "error": text}),
            },
            Err(e) => {
                serde_json::json!({"ok": false, "error": format!("Error: not a JSON command: {e}")})
            }
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

struct MemTool<'a> {
    front: &'a Front,
}

impl MemTool<'_> {
    fn memories(&self) -> Result<String, String> {
        self.front.rel("memories").map_err(fs_err)
    }

    fn cat_dir(&self, category: &str) -> Result<String, String> {
        Ok(format!("{}/{category}", self.memories()?))
    }

    fn node(&self, category: &str, slug: &str) -> Result<String, String> {
        Ok(format!("{}/{category}/{slug}", self.memories()?))
    }

    fn exists(&self, rel: &str) -> bool {
        self.front
            .abs(rel)
            .join(crate::schema::names::META)
            .exists()
    }

    fn show(category: &str, slug: &str) -> String {
        if category == TOP {
            format!("{ROOT}/{}", name_of(slug))
        } else {
            format!("{ROOT}/{category}/{}", name_of(slug))
        }
    }

    /// The nodes of a category: (slug, content size, abstract).
    fn nodes_of(&self, category: &str) -> Result<Vec<(String, u64, String)>, String> {
        let dir = self.cat_dir(category)?;
        let mut out = Vec::new();
        let rd = match std::fs::read_dir(self.front.abs(&dir)) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(format!("Error: {}: {}", show_dir(category), io_text(&e))),
        };
        for e in rd.flatten() {
            let p = e.path();
            if !p.join(crate::schema::names::META).exists() {
                continue;
            }
            let slug = e.file_name().to_string_lossy().into_owned();
            let size = std::fs::metadata(p.join(crate::schema::names::CONTENT))
                .map(|m| m.len())
                .unwrap_or(0);
            let abs =
                std::fs::read_to_string(p.join(crate::schema::names::ABSTRACT)).unwrap_or_default();
            out.push((slug, size, abs.trim_end().to_string()));
        }
        out.sort();
        Ok(out)
    }

    fn categories(&self) -> Result<Vec<String>, String> {
        let rd = match std::fs::read_dir(self.front.abs(&self.memories()?)) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("Error: {ROOT}: {}", io_text(&e))),
        };
        let mut out: Vec<String> = rd
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != TOP && !n.starts_with('.'))
            .collect();
        out.sort();
        Ok(out)
    }

    fn content(&self, category: &str, slug: &str, shown: &str) -> Result<String, String> {
        let node = self.node(category, slug)?;
        if !self.exists(&node) {
            return Err(missing(shown));
        }
        std::fs::read_to_string(
            self.front
                .abs(&format!("{node}/{}", crate::schema::names::CONTENT)),
        )
        .map_err(|e| format!("Error: {shown}: {}", io_text(&e)))
    }

    fn view(
        &self,
        path: &str,
        range: Option<(i64, i64)>,
        budget: Option<usize>,
    ) -> Result<String, String> {
        match parse(path)? {
            Target::Root => {
                let mut out = format!(
                    "Here're the files and directories up to 2 levels deep in {ROOT}, excluding hidden items (size, path, abstract):\n"
                );
                let mut lines = Vec::new();
                for (slug, size, abs) in self.nodes_of(TOP)? {
                    lines.push(file_line(size, &Self::show(TOP, &slug), &abs));
                }
                for cat in self.categories()? {
                    let nodes = self.nodes_of(&cat)?;
                    let total: u64 = nodes.iter().map(|n| n.1).sum();
                    lines.push(format!("{}\t{ROOT}/{cat}/", human(total)));
                    for (slug, size, abs) in nodes {
                        lines.push(file_line(size, &Self::show(&cat, &slug), &abs));
                    }
                }
                out.push_str(&lines.join("\n"));
                if lines.is_empty() {
                    out.push_str("(empty)");
                }
                Ok(out)
            }
            Target::Category(cat) => {
                if !self.front.abs(&self.cat_dir(&cat)?).is_dir() {
                    return Err(missing(path));
                }
                let mut out =
                    format!("Here're the files in {ROOT}/{cat} (size, path, abstract):\n");
                let lines: Vec<String> = self
                    .nodes_of(&cat)?
                    .into_iter()
                    .map(|(slug, size, abs)| file_line(size, &Self::show(&cat, &slug), &abs))
                    .collect();
                out.push_str(&lines.join("\n"));
                if lines.is_empty() {
                    out.push_str("(empty)");
                }
                Ok(out)
            }
            Target::File { category, slug } => {
                let text = self.content(&category, &slug, path)?;
                let lines: Vec<&str> = text.lines().collect();
                // Summary first when the file is large, or over the budget.
                let over = budget.is_some_and(|b| crate::schema::estimate_tokens(&text) > b);
                if range.is_none() && (over || text.len() as u64 > super::LARGE_NODE_BYTES) {
                    return Ok(self.large_view(&category, &slug, &text));
                }
                let (from, to) = match range {
                    None => (1, lines.len() as i64),
                    Some((a, b)) => {
                        let n = lines.len() as i64;
                        let b = if b == -1 { n } else { b };
                        if a < 1 || a > n.max(1) || b < a || b > n {
                            return Err(format!(
                                "Error: Invalid `view_range` [{a}, {}]: lines are 1 to {n} (-1 for the end)",
                                range.map(|r| r.1).unwrap_or(-1)
                            ));
                        }
                        (a, b)
                    }
                };
                let mut out = format!(
                    "Here's the content of {} with line numbers:\n",
                    Self::show(&category, &slug)
                );
                for (i, l) in lines.iter().enumerate() {
                    let n = i as i64 + 1;
                    if n >= from && n <= to {
                        out.push_str(&format!("{n:6}\t{l}\n"));
                    }
                }
                Ok(out)
            }
        }
    }

    /// `view` of a large file with no range: summary first (its abstract,
    /// overview and a line index), and how to ask for lines.
    fn large_view(&self, category: &str, slug: &str, text: &str) -> String {
        let node = self.node(category, slug).unwrap_or_default();
        let read = |name: &str| {
            std::fs::read_to_string(self.front.abs(&format!("{node}/{name}"))).unwrap_or_default()
        };
        let n = text.lines().count();
        let mut out = format!(
            "{} is large ({} bytes, {n} lines): its summary first. View a part with view_range [FROM, TO].\n\
             Abstract: {}\nOverview:\n{}\nLine index (line: start of line):\n",
            Self::show(category, slug),
            text.len(),
            read(crate::schema::names::ABSTRACT).trim(),
            read(crate::schema::names::OVERVIEW).trim_end()
        );
        for (l, t) in super::line_index(text) {
            out.push_str(&format!("{l:6}\t{t}\n"));
        }
        out
    }

    fn file_target(path: &str) -> Result<(String, String), String> {
        match parse(path)? {
            Target::File { category, slug } => Ok((category, slug)),
            _ => Err(format!("Error: {path} is a directory, not a file")),
        }
    }

    /// Commit `text` as the node's content (summaries derived again).
    fn put(&self, category: &str, slug: &str, text: &str, shown: &str) -> Result<u64, String> {
        let node = self.node(category, slug)?;
        let w = NodeWrite {
            content: Some(text.to_string()),
            ..Default::default()
        };
        let info = self
            .front
            .remember(&node, &w)
            .map_err(|e| format!("Error: {shown}: {}", e.message_for_tool()))?;
        Ok(info["version"].as_u64().unwrap_or(0))
    }

    fn create(&self, path: &str, text: &str) -> Result<String, String> {
        let (category, slug) = Self::file_target(path)?;
        let v = self.put(&category, &slug, text, path)?;
        Ok(format!(
            "File created successfully at: {} (version {v})",
            Self::show(&category, &slug)
        ))
    }

    fn str_replace(&self, path: &str, old: &str, new: &str) -> Result<String, String> {
        if old.is_empty() {
            return Err("Error: `old_str` is empty".into());
        }
        let v = self.edit(path, |text| {
            let hits: Vec<usize> = text.match_indices(old).map(|(i, _)| i).collect();
            match hits.len() {
                0 => Err(format!(
                    "Error: No replacement was performed, old_str `{old}` did not appear verbatim in {path}."
                )),
                1 => Ok(text.replacen(old, new, 1)),
                _ => {
                    let lines: Vec<String> = hits
                        .iter()
                        .map(|i| (text[..*i].matches('\n').count() + 1).to_string())
                        .collect();
                    Err(format!(
                        "Error: No replacement was performed. Multiple occurrences of old_str `{old}` in lines: [{}]. Please ensure it is unique",
                        lines.join(", ")
                    ))
                }
            }
        })?;
        Ok(format!("The memory file has been edited (version {v})."))
    }

    fn insert(&self, path: &str, line: i64, text: &str) -> Result<String, String> {
        let v = self.edit(path, |old| {
            let mut lines: Vec<String> = old.lines().map(str::to_string).collect();
            let n = lines.len() as i64;
            if line < 0 || line > n {
                return Err(format!(
                    "Error: Invalid `insert_line` parameter: {line}. It should be within the range of lines of the file: [0, {n}]"
                ));
            }
            let new: Vec<String> = text
                .trim_end_matches('\n')
                .split('\n')
                .map(str::to_string)
                .collect();
            let at = line as usize;
            lines.splice(at..at, new);
            let mut edited = lines.join("\n");
            edited.push('\n');
            Ok(edited)
        })?;
        Ok(format!("The file {path} has been edited (version {v})."))
    }

    /// Make `change` on the file's committed text and commit the result
    /// over the version read (made again on a fresh read when another
    /// writer committed in between; a conflict when it no longer applies).
    fn edit(
        &self,
        path: &str,
        mut change: impl FnMut(&str) -> Result<String, String>,
    ) -> Result<u32, String> {
        let (category, slug) = Self::file_target(path)?;
        let node = self.node(&category, &slug)?;
        if !self.exists(&node) {
            return Err(missing(path));
        }
        let done = self.front.edit(&node, |cur| {
            change(&cur.content).map(|content| NodeWrite {
                content: Some(content),
                ..Default::default()
            })
        });
        match done {
            Ok(v) => Ok(v),
            Err(EditError::Edit(why)) => Err(why),
            Err(EditError::Conflict { current, why }) => Err(format!(
                "Error: {path} was changed by another writer (now version {current}) and the edit no longer applies to it: {}",
                why.trim_start_matches("Error: ")
            )),
            Err(EditError::Front(e)) if e.errno == Some(libc::ENOENT) => Err(missing(path)),
            Err(EditError::Front(e)) => Err(format!("Error: {path}: {}", e.message_for_tool())),
        }
    }

    fn delete(&self, path: &str) -> Result<String, String> {
        match parse(path)? {
            Target::Root => Err(format!("Error: {ROOT} itself cannot be deleted")),
            Target::Category(cat) => {
                let dir = self.cat_dir(&cat)?;
                if !self.front.abs(&dir).is_dir() {
                    return Err(missing(path));
                }
                for (slug, _, _) in self.nodes_of(&cat)? {
                    let node = self.node(&cat, &slug)?;
                    self.front
                        .forget(&node)
                        .map_err(|e| format!("Error: {path}: {}", e.message_for_tool()))?;
                }
                std::fs::remove_dir(self.front.abs(&dir))
                    .map_err(|e| format!("Error: {path}: {}", io_text(&e)))?;
                Ok(format!("Successfully deleted {path}"))
            }
            Target::File { category, slug } => {
                let node = self.node(&category, &slug)?;
                if !self.exists(&node) {
                    return Err(missing(path));
                }
                self.front
                    .forget(&node)
                    .map_err(|e| format!("Error: {path}: {}", e.message_for_tool()))?;
                Ok(format!("Successfully deleted {path}"))
            }
        }
    }

    fn rename(&self, old_path: &str, new_path: &str) -> Result<String, String> {
        let moves: Vec<((String, String), (String, String))> =
            match (parse(old_path)?, parse(new_path)?) {
                (
                    Target::File { category, slug },
                    Target::File {
                        category: c2,
                        slug: s2,
                    },
                ) => {
                    vec![((category, slug), (c2, s2))]
                }
                (Target::Category(a), Target::Category(b)) => {
                    if !self.front.abs(&self.cat_dir(&a)?).is_dir() {
                        return Err(missing(old_path));
                    }
                    if self.front.abs(&self.cat_dir(&b)?).exists() {
                        return Err(format!("Error: The destination {new_path} already exists"));
                    }
                    self.nodes_of(&a)?
                        .into_iter()
                        .map(|(slug, _, _)| ((a.clone(), slug.clone()), (b.clone(), slug)))
                        .collect()
                }
                _ => {
                    return Err(format!(
                    "Error: {old_path} and {new_path} must both be files or both be directories"
                ))
                }
            };
        for ((c1, s1), (c2, s2)) in &moves {
            let (from, to) = (self.node(c1, s1)?, self.node(c2, s2)?);
            if !self.exists(&from) {
                return Err(missing(old_path));
            }
            if self.front.abs(&to).exists() {
                return Err(format!("Error: The destination {new_path} already exists"));
            }
            self.front
                .move_node(&from, &to)
                .map_err(|e| format!("Error: {old_path}: {}", e.message_for_tool()))?;
        }
        if let (Target::Category(a), Target::Category(_)) = (parse(old_path)?, parse(new_path)?) {
            let _ = std::fs::remove_dir(self.front.abs(&self.cat_dir(&a)?));
        }
        Ok(format!("Successfully renamed {old_path} to {new_path}"))
    }
}

fn show_dir(category: &str) -> String {
    if category == TOP {
        ROOT.to_string()
    } else {
        format!("{ROOT}/{category}")
    }
}

fn missing(path: &str) -> String {
    format!("Error: The path {path} does not exist. Please provide a valid path.")
}

fn fs_err(e: FrontError) -> String {
    format!("Error: {}", e.message_for_tool())
}

fn io_text(e: &std::io::Error) -> String {
    let errno = e.raw_os_error().unwrap_or(libc::EIO);
    format!(
        "{} ({})",
        super::strip_os_error(e),
        crate::error::errno_name(errno)
    )
}

fn file_line(size: u64, shown: &str, abs: &str) -> String {
    format!("{}\t{shown}\t{abs}", human(size))
}

/// `du -h`-like sizes: 312, 1.2K, 3.4M.
fn human(n: u64) -> String {
    if n < 1024 {
        n.to_string()
    } else if n < 1024 * 1024 {
        format!("{:.1}K", n as f64 / 1024.0)
    } else {
        format!("{:.1}M", n as f64 / (1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_onto_nodes() {
        assert_eq!(parse("/memories").unwrap(), Target::Root);
        assert_eq!(parse("/memories/").unwrap(), Target::Root);
        assert_eq!(
            parse("/memories/prefs").unwrap(),
            Target::Category("prefs".into())
        );
        assert_eq!(
            parse("/memories/prefs/tea.md").unwrap(),
            Target::File {
                category: "prefs".into(),
                slug: "tea".into()
            }
        );
        assert_eq!(
            parse("/memories/notes.txt").unwrap(),
            Target::File {
                category: TOP.into(),
                slug: "notes.txt".into()
            }
        );
        assert_eq!(
            parse("/memories/todo.md").unwrap(),
            Target::File {
                category: TOP.into(),
                slug: "todo".into()
            }
        );
        for bad in [
            "/etc/passwd",
            "/memoriesx/a",
            "/memories/a/b/c.md",
            "/memories/../x",
            "/memories/_",
            "/memories/a b.md",
            "/memories/.hidden",
        ] {
            assert!(parse(bad).unwrap_err().starts_with("Error: "), "{bad}");
        }
        assert_eq!(name_of("tea"), "tea.md");
        assert_eq!(name_of("notes.txt"), "notes.txt");
        assert_eq!(slug_of("x.md"), "x");
        assert_eq!(slug_of(".md"), ".md");
    }

    #[test]
    fn a_view_is_cut_at_a_line_to_its_budget() {
        let text: String = (1..=200)
            .map(|i| format!("{i:6}\tline number {i} of the file\n"))
            .collect();
        let small = crate::schema::budget::cut_lines(text.clone(), 100);
        assert!(crate::schema::estimate_tokens(&small) <= 100, "{small}");
        assert!(small.starts_with("     1\tline number 1 of the file\n"));
        let last = small.lines().last().unwrap();
        let kept = small.lines().count() - 1;
        assert!(
            last.starts_with(&format!("... {} more lines left out", 200 - kept)),
            "{last}"
        );
        assert_eq!(
            crate::schema::budget::cut_lines(text.clone(), 1_000_000),
            text
        );
    }

    #[test]
    fn sizes_read_like_du() {
        assert_eq!(human(312), "312");
        assert_eq!(human(2048), "2.0K");
    }
}
