//! The agent's view: the memory map (`users/{u}/README.md`,
//! `agents/{g}/README.md`), the prompt header (`MOUNT/.ctxfs/header` and
//! `.header.md` beside each map) and `MOUNT/.ctxfs/help`. All generated at
//! open from the store, so they are always current.

use super::{Caller, Fs};
use crate::config::Access;
use crate::error::Result;
use crate::schema::names::MAP_FILE;
use crate::schema::place::{self, DirPlace};
use crate::store::{NodeRec, Status};

/// Nodes the map lists at most (newest first); the rest are counted.
pub const MAP_MAX_NODES: usize = 50;
/// Byte budget of the memory map.
pub const MAP_MAX_BYTES: usize = 12 * 1024;
/// How the memory map ends.
const MAP_FOOTER: &str = "\n## How to read and search\n\
     - Read a node's `.abstract.md` (one line) first, `.overview.md` next, `content.md` last.\n\
     - Search this directory: `cat '.search/your question'` (TSV: rank, score, path, uri,\n  \
     abstract, confidence, lines, hits); `?k=20` for more, `?format=json` for programs.\n\
     - Help: `MOUNT/.ctxfs/help`.\n";
/// Byte budget of a prompt header.
pub const HEADER_MAX_BYTES: usize = 2048;
/// Owner spaces the mount-wide header names at most.
const HEADER_MAX_SPACES: usize = 12;

/// Is `path` a user or agent directory (`{a}/users/{u}`, `{a}/agents/{g}`)?
pub fn is_owner_space(path: &str) -> bool {
    let c = place::split(path);
    c.len() == 3 && (c[1] == "users" || c[1] == "agents")
}

/// Children a directory summary names at most (seed 002: at most 20
/// siblings).
pub const SUMMARY_MAX_CHILDREN: usize = 20;
/// Characters of a directory's `.abstract.md`, as of a node's L0.
pub(super) const SUMMARY_ABSTRACT_CHARS: usize = 100;

/// Is `path` a category directory: `{a}/users/{u}/memories/{c}` (not the
/// profile node), `{a}/agents/{g}/memories/{c}`, or `{a}/agents/{g}/skills`?
pub fn is_category(path: &str) -> bool {
    let c = place::split(path);
    match c.len() {
        4 => c[1] == "agents" && c[3] == "skills",
        5 => {
            (c[1] == "users" && c[3] == "memories" && c[4] != "profile")
                || (c[1] == "agents" && c[3] == "memories")
        }
        _ => false,
    }
}

/// Does `path` show a derived `.abstract.md` and `.overview.md` summarising
/// its children (CONTRACT §3): user, agent and category directories.
pub fn is_summarized(path: &str) -> bool {
    is_owner_space(path) || is_category(path)
}

/// A directory's deterministic summary.
pub(super) struct Derived {
    /// `.abstract.md` without its newline.
    pub abstract_line: String,
    pub overview: String,
    /// ACTIVE nodes under the directory.
    pub nodes: usize,
}

/// What an owner space holds, as a reader sees it.
struct Space {
    /// ACTIVE nodes, newest first: (path relative to the space, record).
    active: Vec<(String, NodeRec)>,
    archived: usize,
}

impl Fs {
    /// Every committed node under `dir` (recursively), ACTIVE ones kept.
    fn space(&self, dir: &str) -> Result<Space> {
        let mut s = Space {
            active: Vec::new(),
            archived: 0,
        };
        let mut stack = vec![dir.to_string()];
        while let Some(p) = stack.pop() {
            let comps = place::split(&p);
            let placed = place::classify_dir(&comps)?;
            if placed == DirPlace::Node {
                continue;
            }
            for (name, rec) in self.store.list_nodes(&p)? {
                if self.expired(&rec.path) {
                    continue;
                }
                match rec.status {
                    Status::Active => {
                        let full = format!("{p}/{name}");
                        s.active.push((full[dir.len() + 1..].to_string(), rec));
                    }
                    Status::Archived => s.archived += 1,
                    Status::Broken => {}
                }
            }
            for d in self.subdirs(&p)? {
                stack.push(format!("{p}/{d}"));
            }
        }
        s.active
            .sort_by(|a, b| b.1.updated_ns.cmp(&a.1.updated_ns).then(a.0.cmp(&b.0)));
        Ok(s)
    }

    /// A node's L0 on one line.
    fn abstract_of(&self, rec: &NodeRec) -> String {
        rec.file(place::ABSTRACT)
            .and_then(|f| self.store.read_blob(rec.account(), f.blob, f.size).ok())
            .map(|b| crate::index::text::one_line(&String::from_utf8_lossy(&b)))
            .unwrap_or_default()
    }

    /// Is the owner space `dir` there for `c`?
    pub(super) fn check_space(&self, c: Caller, dir: &str) -> Result<()> {
        self.attr_of(c, &super::inodes::Key::Dir(dir.into()), 0)
            .map(|_| ())
    }

    /// `users/{u}/README.md`: counts by category, then each node newest
    /// first with its L0, version and last update.
    /// The memory map of `dir`; with a `budget` (tokens), as many nodes as
    /// it holds (not only the first [`MAP_MAX_NODES`]), cut to it.
    pub(super) fn memory_map(
        &self,
        c: Caller,
        dir: &str,
        budget: Option<usize>,
    ) -> Result<Vec<u8>> {
        let (max_nodes, max_bytes) = match budget {
            Some(b) => (usize::MAX, b.saturating_mul(3)),
            None => (MAP_MAX_NODES, MAP_MAX_BYTES),
        };
        self.check_space(c, dir)?;
        let s = self.space(dir)?;
        let mut by_cat: std::collections::BTreeMap<String, usize> = Default::default();
        for (rel, _) in &s.active {
            let cat = match rel.rfind('/') {
                Some(i) => rel[..i].to_string(),
                None => String::new(),
            };
            *by_cat.entry(cat).or_default() += 1;
        }
        let mut out = format!(
            "# Memory map of ctx://{dir}\n\n\
             {} ACTIVE nodes, {} archived. Generated at {} from the store; always current.\n\n\
             ## Categories\n",
            s.active.len(),
            s.archived,
            crate::schema::time::rfc3339(crate::schema::time::now_ns()),
        );
        if by_cat.is_empty() {
            out.push_str("(none yet)\n");
        }
        for (cat, n) in &by_cat {
            out.push_str(&format!(
                "- {cat}/: {n} node{}\n",
                if *n == 1 { "" } else { "s" }
            ));
        }
        out.push_str("\n## Nodes, newest first (PATH (vVERSION, UPDATED): ABSTRACT)\n");
        // The footer and the line counting the nodes left out.
        let tail_room = MAP_FOOTER.len() + 128;
        let mut shown = 0;
        for (rel, rec) in s.active.iter().take(max_nodes) {
            let line = format!(
                "- {rel}/ (v{}, {}): {}\n",
                rec.version,
                rec.updated_at,
                self.abstract_of(rec)
            );
            if out.len() + line.len() + tail_room > max_bytes {
                break;
            }
            out.push_str(&line);
            shown += 1;
        }
        if shown < s.active.len() {
            out.push_str(&format!(
                "- … {} more: `ls CATEGORY/` lists one category, `cat '.search/TOPIC?k=50'` finds by topic.\n",
                s.active.len() - shown
            ));
        }
        out.push_str(MAP_FOOTER);
        Ok(match budget {
            Some(b) => crate::schema::budget::cut_lines(out, b),
            None => out,
        }
        .into_bytes())
    }

    /// A directory's derived `.abstract.md` (`overview` false) or
    /// `.overview.md`: the LLM's summary (`summaries.rs`) while it is
    /// current, else the deterministic one.
    pub(super) fn dir_summary(&self, c: Caller, dir: &str, overview: bool) -> Result<Vec<u8>> {
        self.check_space(c, dir)?;
        let d = self.derived_summary(dir)?;
        Ok(self.summary_text(dir, &d, overview)?.into_bytes())
    }

    /// The deterministic summary of `dir`, built from its children's
    /// committed abstracts (ACTIVE, unexpired), so it is always current and
    /// never holds text of a draft. A category lists its nodes newest
    /// first; a user or agent directory lists its categories, each by its
    /// own abstract, the profile first.
    pub(super) fn derived_summary(&self, dir: &str) -> Result<Derived> {
        let s = self.space(dir)?;
        let name = dir.rsplit('/').next().unwrap_or(dir);
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        let n = s.active.len();
        if is_category(dir) {
            let what = if name == "skills" { "skill" } else { "memory" };
            let whats = if name == "skills" {
                "skills"
            } else {
                "memories"
            };
            let newest = s.active.first().map(|(_, r)| self.abstract_of(r));
            let head = format!("{name}/: {n} {}", if n == 1 { what } else { whats });
            let line = match newest {
                Some(a) if !a.is_empty() => format!("{head}; newest: {a}"),
                _ => head,
            };
            let mut out = format!(
                "# {name}/\n\n{n} {}, {} archived; newest first (NAME/: ABSTRACT (vVERSION, UPDATED)).\n\n",
                if n == 1 { what } else { whats },
                s.archived
            );
            for (rel, rec) in s.active.iter().take(SUMMARY_MAX_CHILDREN) {
                out.push_str(&format!(
                    "- {rel}/: {} (v{}, {})\n",
                    self.abstract_of(rec),
                    rec.version,
                    rec.updated_at
                ));
            }
            if n > SUMMARY_MAX_CHILDREN {
                out.push_str(&format!(
                    "- … {} more: `ls` lists them, `cat '.search/TOPIC'` finds by topic.\n",
                    n - SUMMARY_MAX_CHILDREN
                ));
            }
            return Ok(Derived {
                abstract_line: crate::schema::clip(&line, SUMMARY_ABSTRACT_CHARS),
                overview: out,
                nodes: n,
            });
        }
        // An owner space: its categories (and the profile), by size.
        let mut cats: std::collections::BTreeMap<String, Vec<&NodeRec>> = Default::default();
        let mut profile = None;
        for (rel, rec) in &s.active {
            match rel.rfind('/') {
                _ if rel == "memories/profile" => profile = Some(rec),
                Some(i) => cats.entry(rel[..i].to_string()).or_default().push(rec),
                None => {}
            }
        }
        let mut order: Vec<(&String, &Vec<&NodeRec>)> = cats.iter().collect();
        order.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(b.0)));
        let mut line = format!("{name}: {n} memor{}", if n == 1 { "y" } else { "ies" });
        if let Some(p) = profile {
            let a = self.abstract_of(p);
            if !a.is_empty() {
                line.push_str(&format!("; {a}"));
            }
        }
        let parts: Vec<String> = order
            .iter()
            .map(|(c, v)| format!("{} {}", c.rsplit('/').next().unwrap_or(c), v.len()))
            .collect();
        if !parts.is_empty() {
            line.push_str(&format!(" ({})", parts.join(", ")));
        }
        let mut out = format!(
            "# {name}\n\n{n} memor{} in {} categor{}, {} archived.\n\n",
            if n == 1 { "y" } else { "ies" },
            cats.len(),
            if cats.len() == 1 { "y" } else { "ies" },
            s.archived
        );
        if let Some(p) = profile {
            out.push_str(&format!("- memories/profile/: {}\n", self.abstract_of(p)));
        }
        for (cat, recs) in order.iter().take(SUMMARY_MAX_CHILDREN) {
            // Newest first, as `space` orders them.
            let newest = recs
                .first()
                .map(|r| self.abstract_of(r))
                .unwrap_or_default();
            out.push_str(&format!(
                "- {cat}/: {} node{}; newest: {}\n",
                recs.len(),
                plural(recs.len()),
                crate::schema::clip(&newest, SUMMARY_ABSTRACT_CHARS)
            ));
        }
        if cats.len() > SUMMARY_MAX_CHILDREN {
            out.push_str(&format!(
                "- … {} more categories: see README.md.\n",
                cats.len() - SUMMARY_MAX_CHILDREN
            ));
        }
        Ok(Derived {
            abstract_line: crate::schema::clip(&line, SUMMARY_ABSTRACT_CHARS),
            overview: out,
            nodes: n,
        })
    }

    /// The prompt header: of one owner space (`dir`), or of everything the
    /// caller may use (`None`).
    /// The prompt header (of `dir`, or of every space the caller may
    /// read); at most [`HEADER_MAX_BYTES`], or cut to `budget` tokens.
    pub(super) fn header(
        &self,
        c: Caller,
        dir: Option<&str>,
        budget: Option<usize>,
    ) -> Result<Vec<u8>> {
        let max_bytes = budget.map_or(HEADER_MAX_BYTES, |b| b.saturating_mul(3));
        let mut out = String::from(
            "## Memory (ctxfs)\n\
             You have long-term memory as files under the ctxfs mount (paths below are relative to it).\n",
        );
        let mut spaces: Vec<(String, Access)> = Vec::new();
        match dir {
            Some(d) => {
                self.check_space(c, d)?;
                spaces.push((d.to_string(), self.access_of(c, d)));
            }
            None => {
                for a in self.accounts_visible(c)? {
                    for kind in ["users", "agents"] {
                        for name in self.store.list_dirs(&format!("{a}/{kind}"))? {
                            let space = format!("{a}/{kind}/{name}");
                            // A user's or an agent's uid: its own parts only.
                            match self.access_of(c, &space) {
                                Access::None => {}
                                access => spaces.push((space, access)),
                            }
                        }
                    }
                }
            }
        }
        if spaces.is_empty() {
            out.push_str("No memories yet.\n");
        }
        let mut listed = 0;
        for (d, access) in spaces.iter().take(HEADER_MAX_SPACES) {
            let s = self.space(d)?;
            let newest = s
                .active
                .first()
                .map(|(_, r)| format!(", newest {}", r.updated_at))
                .unwrap_or_default();
            let mode = if *access == Access::Write {
                "read-write"
            } else {
                "read-only"
            };
            let line = format!(
                "- accounts/{d}/: {} memories{newest} ({mode}); map: accounts/{d}/{MAP_FILE}\n",
                s.active.len()
            );
            if out.len() + line.len() > max_bytes.saturating_sub(700) {
                break;
            }
            out.push_str(&line);
            listed += 1;
            if dir.is_some() {
                for (rel, rec) in s.active.iter().take(5) {
                    let l = format!("  - {rel}/: {}\n", self.abstract_of(rec));
                    if out.len() + l.len() > max_bytes.saturating_sub(700) {
                        break;
                    }
                    out.push_str(&l);
                }
            }
        }
        if listed < spaces.len() {
            out.push_str(&format!(
                "- … {} more: `ls accounts/ACCOUNT/users accounts/ACCOUNT/agents`.\n",
                spaces.len() - listed
            ));
        }
        out.push_str(
            "Read first: the map (README.md), then a node's .abstract.md, .overview.md, content.md.\n\
             Search: `cat 'DIR/.search/QUESTION'` (TSV: rank, score, path, uri, abstract, confidence,\n\
             lines of content.md, hits); `?k=N` for more; `?format=json` adds `answerable`.\n\
             Remember: write content.md, .relations.json ([]), .abstract.md, .overview.md, then\n\
             .meta.json with {\"status\":\"ACTIVE\"} (the commit; use /bin/echo or a program).\n\
             Errors and more: `cat .ctxfs/help`.\n",
        );
        Ok(match budget {
            Some(b) => crate::schema::budget::cut_lines(out, b),
            None => {
                debug_assert!(out.len() <= HEADER_MAX_BYTES);
                out
            }
        }
        .into_bytes())
    }
}

impl Fs {
    /// `MOUNT/.ctxfs/help` as `c` reads it: with the path of its view, when
    /// the daemon mounted views and `c` has one.
    pub(in crate::core) fn help(&self, c: Caller) -> String {
        let mut out = help_text().to_string();
        if let Some(dir) = self.services.views() {
            if self.tenancy.uids().contains(&c.uid) {
                let view = dir.join(c.uid.to_string()).join("accounts");
                out.push_str(&format!(
                    "\nVIEW   {}/   your read-only view of the same tree:\n\
                     \x20      committed files only, cat/grep/find there run at the kernel's speed.\n",
                    view.display()
                ));
            }
        }
        out
    }
}

/// `MOUNT/.ctxfs/help`: one screen for a newcomer agent.
pub fn help_text() -> &'static str {
    "ctxfs: long-term memory as files\n\
     \n\
     TREE   accounts/ACCOUNT/users/USER/memories/CATEGORY/SLUG/   a memory (node)\n\
     \x20      accounts/ACCOUNT/users/USER/memories/profile/\n\
     \x20      accounts/ACCOUNT/agents/AGENT/memories/CATEGORY/SLUG/ and agents/AGENT/skills/NAME/\n\
     \x20      accounts/ACCOUNT/projects/PROJECT/scratchpad/          shared files, no protocol\n\
     \x20      accounts/ACCOUNT/projects/PROJECT/activity_log.jsonl   append-only log\n\
     NODE   content.md (full text)  .abstract.md (L0, one line <= 100 chars)\n\
     \x20      .overview.md (L1)  .relations.json (edges)  .meta.json (status, version, ...)\n\
     MAP    users/USER/README.md and agents/AGENT/README.md list every memory, newest first.\n\
     \x20      .header.md beside it is a short block for a system prompt.\n\
     \n\
     READ   summary first: .abstract.md, then .overview.md, then content.md (or just the\n\
     \x20      lines a search names: sed -n '12,30p' content.md).\n\
     SEARCH cat 'DIR/.search/your question'        in any directory of an account\n\
     \x20      columns: RANK SCORE PATH URI ABSTRACT CONFIDENCE LINES HITS\n\
     \x20      options: ?k=20  ?format=json (adds answerable, tried queries)  ?mode=lexical\n\
     \x20      ?since=2026-03-01&until=2026-04-01   confidence superseded: a newer memory replaced it\n\
     \x20      ?budget=500   the best results packed into 500 tokens, summaries first\n\
     \x20      cat .ctxfs/sync waits until everything committed is searchable.\n\
     \n\
     WRITE  mkdir -p N; write N/content.md, N/.relations.json ([]), N/.abstract.md,\n\
     \x20      N/.overview.md, then N/.meta.json with {\"status\":\"ACTIVE\"}: closing it commits\n\
     \x20      all files at once as the next version. Until then nobody else sees the node.\n\
     \x20      Leave out .abstract.md/.overview.md and they are derived from content.md.\n\
     \x20      Secrets (api_key: ..., tokens, private keys) are replaced by [REDACTED].\n\
     \x20      Update: rewrite files, then .meta.json again. Archive: \"status\":\"ARCHIVED\".\n\
     \x20      Delete: rm -r N. Move: mv N NEW (same account).\n\
     \x20      History: N/.versions/1/ ...; /bin/echo 2 > N/.versions/restore brings v2 back.\n\
     \x20      The past: accounts/A/.as-of/2026-11-20T10:00:00Z/ is the account then (read-only;\n\
     \x20      its .search/ searches the versions of then).\n\
     \x20      Expiry: \"ttl_seconds\":3600 in .meta.json; gone everywhere when it expires.\n\
     \x20      Use /bin/echo or a program to write .meta.json: the shell's builtin echo\n\
     \x20      cannot report a refused commit.\n\
     \n\
     ERRORS EINVAL   bad name or refused commit: cat N/.commit-error says why\n\
     \x20      EFBIG    node over 300000 bytes: split it\n\
     \x20      EROFS    your account is read-only for you\n\
     \x20      EACCES   not your account (or, as a user's or agent's own uid, not your part)\n\
     \x20      EPERM    generated or append-only file\n\
     \x20      EXDEV    move across accounts (copy and delete instead)\n\
     \x20      EDQUOT   account quota spent: cat accounts/ACCOUNT/.ctxfs/usage\n\
     \x20      EBUSY    restore with uncommitted changes in the node\n\
     \x20      ETIMEDOUT .ctxfs/sync waited too long; EAGAIN: embedder down or search rate, retry\n\
     \n\
     MORE   .ctxfs/status (counts, index lag), .ctxfs/header, docs/AGENTS.md\n"
}
