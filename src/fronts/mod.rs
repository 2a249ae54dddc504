//! The fronts agents already use besides a shell: an MCP server (`mcp`) and
//! the memory-tool protocol (`memtool`). Each is a thin layer over the files
//! of a mount, run by (and as) the calling uid, so the kernel and the daemon
//! decide who may do what exactly as they do for `cat` and `echo`: a reader's
//! write fails with `EROFS`, a stranger's read with `EACCES`.
//!
//! This module holds what both share: paths resolved inside a scope, the
//! four-step write (through the held descriptors of `dirfd`), and errors
//! that carry the errno and the node's `.commit-error` reason.

mod dirfd;
pub mod edit;
pub mod mcp;
pub mod memtool;
mod search;

use self::dirfd::{mkdirs_at, open_at, write_checked, NodeDir};

use serde_json::{json, Map, Value};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::schema::names::{
    ABSTRACT, COMMIT_ERROR, CONTENT, HEADER_FILE, MAP_FILE, META, OVERVIEW, RELATIONS, RESTORE,
    VERSIONS_DIR,
};

/// A refused operation: the errno (when the file system gave one) and a
/// reason a user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontError {
    pub errno: Option<i32>,
    pub message: String,
}

impl FrontError {
    pub fn invalid(message: impl Into<String>) -> Self {
        FrontError {
            errno: Some(libc::EINVAL),
            message: message.into(),
        }
    }

    /// `what` failed with `e`; `reason` (a `.commit-error`) is appended.
    fn io(what: &str, e: &std::io::Error, reason: Option<String>) -> Self {
        let errno = e.raw_os_error();
        let mut message = format!("{what}: {}", strip_os_error(e));
        if let Some(r) = reason.filter(|r| !r.trim().is_empty()) {
            message.push_str(": ");
            message.push_str(r.trim());
        }
        FrontError { errno, message }
    }

    /// `EINVAL`, `EROFS`… (or `EIO` when no errno came with it).
    pub fn errno_name(&self) -> &'static str {
        crate::error::errno_name(self.errno.unwrap_or(libc::EIO))
    }

    /// `REASON (ERRNO)`: the text a memory-tool application shows the model.
    pub fn message_for_tool(&self) -> String {
        format!("{} ({})", self.message, self.errno_name())
    }

    /// The error as a JSON object: `{"errno": "EROFS", "code": 30, "message": …}`.
    pub fn to_json(&self) -> Value {
        json!({
            "errno": self.errno_name(),
            "code": self.errno.unwrap_or(libc::EIO),
            "message": self.message,
        })
    }
}

impl std::fmt::Display for FrontError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.errno_name(), self.message)
    }
}

pub type FrontResult<T> = std::result::Result<T, FrontError>;

/// "Read-only file system (os error 30)" → "Read-only file system".
fn strip_os_error(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// What `remember` and `update` write: the node files given (others kept,
/// or derived by the daemon when left out of a new node).
#[derive(Debug, Default, Clone)]
pub struct NodeWrite {
    pub content: Option<String>,
    pub abstract_: Option<String>,
    pub overview: Option<String>,
    pub relations: Option<Value>,
    /// Fields of `.meta.json` (the daemon owns the derived ones); `status`
    /// defaults to `ACTIVE`.
    pub meta: Map<String, Value>,
}

/// A mount seen through a scope: `accounts/A/users/U` (or any directory of
/// the mount, or the mount itself). Paths given to the fronts are relative
/// to the scope; `accounts/…` paths and `ctx://` URIs inside it are taken
/// too. A path may not leave the scope.
#[derive(Debug, Clone)]
pub struct Front {
    pub mount: PathBuf,
    /// Relative to the mount, no leading or trailing `/` ("" = the mount).
    pub scope: String,
    /// The scope directory held open (`O_PATH`) once it exists: node writes
    /// walk from it, so the account's entry, which the kernel looks up
    /// afresh for every path (its answer depends on the caller), is not
    /// looked up again for each file.
    held: Arc<OnceLock<OwnedFd>>,
}

impl Front {
    pub fn new(mount: &Path, scope: Option<&str>) -> FrontResult<Self> {
        let scope = scope.unwrap_or("").trim_matches('/').to_string();
        check_segments(&scope)?;
        let f = Front {
            mount: mount.to_path_buf(),
            scope,
            held: Arc::default(),
        };
        // A scope the caller may not enter is refused at once; one that does
        // not exist yet (a new user) is made by the first write in it.
        match std::fs::metadata(f.mount.join(&f.scope)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(FrontError::io(
                &format!("scope {}", display(&f.scope)),
                &e,
                None,
            )),
            _ => Ok(f),
        }
    }

    /// A path relative to the mount for `path` (relative to the scope, or
    /// `accounts/…`, or `ctx://ACCOUNT/…`).
    pub fn rel(&self, path: &str) -> FrontResult<String> {
        let p = path.trim();
        let p = if let Some(rest) = p.strip_prefix("ctx://") {
            format!("accounts/{}", rest.trim_matches('/'))
        } else {
            p.trim_matches('/').to_string()
        };
        check_segments(&p)?;
        let under_scope =
            self.scope.is_empty() || p == self.scope || p.starts_with(&format!("{}/", self.scope));
        if p.starts_with("accounts/") || p == "accounts" {
            if !under_scope {
                return Err(FrontError {
                    errno: Some(libc::EACCES),
                    message: format!("{p} is outside the scope {}", display(&self.scope)),
                });
            }
            return Ok(p);
        }
        Ok(match (self.scope.is_empty(), p.is_empty()) {
            (true, _) => p,
            (false, true) => self.scope.clone(),
            (false, false) => format!("{}/{p}", self.scope),
        })
    }

    /// The node directory `node` (relative to the mount) held open, made
    /// first (with its parents) when `create`; true when it was made now.
    fn node_dir(&self, node: &str, create: bool) -> FrontResult<(NodeDir, bool)> {
        let io = |e: std::io::Error| FrontError::io(&format!("opening {node}"), &e, None);
        // Walk from the scope when the node is under it and it exists.
        let under = node
            .strip_prefix(&self.scope)
            .and_then(|r| r.strip_prefix('/'))
            .filter(|_| !self.scope.is_empty());
        let root;
        let (base, rel): (BorrowedFd, &str) = match under {
            Some(rel) => match self.scope_fd() {
                Some(fd) => (fd, rel),
                None => {
                    root = self.mount_fd().map_err(io)?;
                    (root.as_fd(), node)
                }
            },
            None => {
                root = self.mount_fd().map_err(io)?;
                (root.as_fd(), node)
            }
        };
        let made = if create {
            mkdirs_at(base, rel)
                .map_err(|e| FrontError::io(&format!("creating {node}"), &e, None))?
        } else {
            false
        };
        let fd = open_at(base, rel, libc::O_PATH | libc::O_DIRECTORY, 0).map_err(io)?;
        Ok((
            NodeDir {
                fd,
                node: node.to_string(),
            },
            made,
        ))
    }

    fn mount_fd(&self) -> std::io::Result<OwnedFd> {
        Ok(std::fs::File::open(&self.mount)?.into())
    }

    /// The scope held open, once it exists.
    fn scope_fd(&self) -> Option<BorrowedFd<'_>> {
        if self.held.get().is_none() {
            let fd = self.mount_fd().ok()?;
            let fd = open_at(fd.as_fd(), &self.scope, libc::O_PATH | libc::O_DIRECTORY, 0).ok()?;
            let _ = self.held.set(fd);
        }
        self.held.get().map(|fd| fd.as_fd())
    }

    pub fn abs(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.mount.clone()
        } else {
            self.mount.join(rel)
        }
    }

    fn read_text(&self, rel: &str) -> FrontResult<String> {
        std::fs::read_to_string(self.abs(rel))
            .map_err(|e| FrontError::io(&format!("reading {rel}"), &e, None))
    }

    /// A node's abstract, overview or content (optionally lines FROM..=TO of
    /// it), or any other file of the mount.
    pub fn read(
        &self,
        path: &str,
        level: Option<&str>,
        lines: Option<(usize, usize)>,
    ) -> FrontResult<Value> {
        // `…/inbox/NAME.json#N`, as search and provenance name a message:
        // that message of the stored conversation.
        if let Some((file, n)) = path.rsplit_once('#') {
            if let Ok(n) = n.parse::<usize>() {
                let rel = self.rel(file)?;
                let text = self.read_text(&rel)?;
                let name = rel.rsplit('/').next().unwrap_or("");
                let conv = crate::extract::parse(name, text.as_bytes())
                    .map_err(|e| FrontError::invalid(format!("{rel}: {e}")))?;
                let m = conv.messages.get(n).ok_or_else(|| {
                    FrontError::invalid(format!(
                        "{rel} has {} messages, numbered from 0",
                        conv.messages.len()
                    ))
                })?;
                return Ok(json!({
                    "path": format!("{rel}#{n}"), "message": n, "role": m.role,
                    "name": m.name, "ts": m.ts, "text": m.content,
                }));
            }
        }
        let rel = self.rel(path)?;
        let abs = self.abs(&rel);
        let md = std::fs::metadata(&abs)
            .map_err(|e| FrontError::io(&format!("reading {rel}"), &e, None))?;
        if md.is_dir() && level.is_none() && lines.is_none() {
            // A large node, asked for with no level: summary first.
            let content = format!("{rel}/{CONTENT}");
            if let Ok(c) = std::fs::metadata(self.abs(&content)) {
                if c.len() > LARGE_NODE_BYTES {
                    let text = self.read_text(&content)?;
                    let abstract_ = self.read_text(&format!("{rel}/{ABSTRACT}"))?;
                    let overview = self.read_text(&format!("{rel}/{OVERVIEW}"))?;
                    let index: Vec<Value> = line_index(&text)
                        .into_iter()
                        .map(|(n, t)| json!([n, t]))
                        .collect();
                    return Ok(json!({
                        "path": content, "large": true, "bytes": c.len(),
                        "lines": text.lines().count(),
                        "abstract": abstract_.trim(), "overview": overview,
                        "index": index,
                        "how": "summary first: ask level=content for the whole text, or from_line/to_line for a part (the index gives line numbers)",
                    }));
                }
            }
        }
        let file = if md.is_dir() {
            let name = match level.unwrap_or("content") {
                "abstract" | "L0" => ABSTRACT,
                "overview" | "L1" => OVERVIEW,
                "content" | "L2" => CONTENT,
                "meta" => META,
                other => {
                    return Err(FrontError::invalid(format!(
                        "level {other:?}: use abstract, overview, content or meta"
                    )))
                }
            };
            format!("{rel}/{name}")
        } else {
            rel.clone()
        };
        let text = self.read_text(&file)?;
        let text = match lines {
            Some((from, to)) => {
                if from == 0 || to < from {
                    return Err(FrontError::invalid(format!(
                        "lines {from}-{to}: lines count from 1, FROM <= TO"
                    )));
                }
                text.lines()
                    .skip(from - 1)
                    .take(to - from + 1)
                    .map(|l| format!("{l}\n"))
                    .collect()
            }
            None => text,
        };
        Ok(json!({ "path": file, "text": text }))
    }

    /// The node place for `path`, or for `category`/`slug` under the scope's
    /// `memories/` (`skills/` when `skill`).
    pub fn node_place(
        &self,
        path: Option<&str>,
        category: Option<&str>,
        slug: Option<&str>,
        skill: bool,
    ) -> FrontResult<String> {
        match (path, category, slug) {
            (Some(p), _, _) => self.rel(p),
            (None, _, Some(s)) if skill => self.rel(&format!("skills/{s}")),
            (None, Some(c), Some(s)) => self.rel(&format!("memories/{c}/{s}")),
            _ => Err(FrontError::invalid(
                "give the node's path, or its category and slug",
            )),
        }
    }

    /// Write a node and commit it (the four-step write): a new node, or a new
    /// version of an existing one holding what is given (summaries left out
    /// are derived again; `.meta.json`'s own fields are kept unless given).
    /// Returns `{path, uri, version, status}`.
    pub fn remember(&self, node: &str, w: &NodeWrite) -> FrontResult<Value> {
        let content = w
            .content
            .as_deref()
            .ok_or_else(|| FrontError::invalid("content is required"))?;
        let (dir, made) = self.node_dir(node, true)?;
        let mut w = w.clone();
        w.content = Some(content.to_string());
        // A node made just now has nothing to keep or to clear.
        let committed: Map<String, Value> = if made {
            Map::new()
        } else {
            // Left out: derived again by the daemon, not kept from an older version.
            for (given, name) in [
                (w.abstract_.is_some(), ABSTRACT),
                (w.overview.is_some(), OVERVIEW),
            ] {
                if !given {
                    dir.unlink_if_present(name)?;
                }
            }
            dir.read(META)
                .ok()
                .flatten()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default()
        };
        if w.relations.is_none() && committed.is_empty() {
            w.relations = Some(json!([]));
        }
        self.write_and_commit(&dir, &w, committed)
    }

    fn write_and_commit(
        &self,
        dir: &NodeDir,
        w: &NodeWrite,
        mut meta: Map<String, Value>,
    ) -> FrontResult<Value> {
        let node = &dir.node;
        let put = |name: &str, data: &[u8]| {
            dir.write(name, data).map_err(|e| {
                // A refused commit says why in `.commit-error`.
                let reason = (name == META)
                    .then(|| dir.read(COMMIT_ERROR).ok().flatten())
                    .flatten();
                FrontError::io(&format!("writing {node}/{name}"), &e, reason)
            })
        };
        if let Some(c) = &w.content {
            put(CONTENT, c.as_bytes())?;
        }
        if let Some(r) = &w.relations {
            put(RELATIONS, r.to_string().as_bytes())?;
        }
        if let Some(a) = &w.abstract_ {
            put(ABSTRACT, a.as_bytes())?;
        }
        if let Some(o) = &w.overview {
            put(OVERVIEW, o.as_bytes())?;
        }
        for (k, v) in &w.meta {
            meta.insert(k.clone(), v.clone());
        }
        if !w.meta.contains_key("status") {
            meta.insert("status".into(), json!("ACTIVE"));
        }
        put(META, Value::Object(meta).to_string().as_bytes())?;
        let text = dir
            .read(META)
            .map_err(|e| FrontError::io(&format!("reading {node}/{META}"), &e, None))?
            .unwrap_or_default();
        info_of(node, &text)
    }

    /// `{path, uri, version, status}` of a committed node.
    pub fn node_info(&self, node: &str) -> FrontResult<Value> {
        info_of(node, &self.read_text(&format!("{node}/{META}"))?)
    }

    /// Delete a node (and its history): `rm -r NODE`.
    pub fn forget(&self, node: &str) -> FrontResult<Value> {
        let abs = self.abs(node);
        let md = std::fs::metadata(&abs)
            .map_err(|e| FrontError::io(&format!("deleting {node}"), &e, None))?;
        if !md.is_dir() || std::fs::metadata(abs.join(META)).is_err() {
            return Err(FrontError::invalid(format!(
                "{node} is not a committed node"
            )));
        }
        std::fs::remove_dir_all(&abs)
            .map_err(|e| FrontError::io(&format!("deleting {node}"), &e, None))?;
        Ok(json!({ "path": node, "deleted": true }))
    }

    /// Move a node to another place of its account (a new version there).
    pub fn move_node(&self, from: &str, to: &str) -> FrontResult<Value> {
        if let Some(parent) = Path::new(to).parent() {
            std::fs::create_dir_all(self.abs(&parent.to_string_lossy()))
                .map_err(|e| FrontError::io(&format!("creating {}", parent.display()), &e, None))?;
        }
        if self.abs(to).exists() {
            return Err(FrontError {
                errno: Some(libc::EEXIST),
                message: format!("{to} already exists"),
            });
        }
        std::fs::rename(self.abs(from), self.abs(to))
            .map_err(|e| FrontError::io(&format!("moving {from} to {to}"), &e, None))?;
        self.node_info(to)
    }

    /// The entries of a directory: nodes with their abstract, containers, files.
    pub fn list(&self, dir: &str) -> FrontResult<Value> {
        let abs = self.abs(dir);
        let rd = std::fs::read_dir(&abs)
            .map_err(|e| FrontError::io(&format!("listing {dir}"), &e, None))?;
        let mut out = Vec::new();
        for e in rd {
            let e = e.map_err(|e| FrontError::io(&format!("listing {dir}"), &e, None))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let path = format!("{}{name}", slash(dir));
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if is_dir && e.path().join(META).exists() {
                let abstract_ =
                    std::fs::read_to_string(e.path().join(ABSTRACT)).unwrap_or_default();
                out.push(json!({"name": name, "path": path, "kind": "node", "abstract": abstract_.trim_end()}));
            } else {
                out.push(json!({"name": name, "path": path, "kind": if is_dir { "dir" } else { "file" }}));
            }
        }
        Ok(json!({ "path": dir, "entries": out }))
    }

    /// The memory map (`README.md`) of a user or agent directory.
    pub fn map(&self, dir: &str) -> FrontResult<String> {
        self.read_text(&format!("{}{MAP_FILE}", slash(dir)))
    }

    /// The prompt header of the scope (`.header.md`), or the mount's.
    pub fn header(&self) -> FrontResult<String> {
        match self.read_text(&format!("{}{HEADER_FILE}", slash(&self.scope))) {
            Ok(t) => Ok(t),
            Err(_) => self.read_text(".ctxfs/header"),
        }
    }

    /// Every version of a node with its status, time and content hash.
    pub fn history(&self, node: &str) -> FrontResult<Value> {
        let vdir = format!("{node}/{VERSIONS_DIR}");
        let rd = std::fs::read_dir(self.abs(&vdir))
            .map_err(|e| FrontError::io(&format!("listing {vdir}"), &e, None))?;
        let mut nums: Vec<u64> = rd
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        nums.sort_unstable();
        let mut out = Vec::new();
        for n in nums {
            let meta: Value = self
                .read_text(&format!("{vdir}/{n}/{META}"))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null);
            let mut v = json!({ "version": n });
            for k in [
                "status",
                "updated_at",
                "content_hash",
                "restored_from",
                "redacted_version",
            ] {
                if let Some(x) = meta.get(k) {
                    v[k] = x.clone();
                }
            }
            out.push(v);
        }
        Ok(json!({ "path": node, "versions": out }))
    }

    /// Make version `n` current again, as a new version.
    pub fn restore(&self, node: &str, n: u64) -> FrontResult<Value> {
        let rel = format!("{node}/{VERSIONS_DIR}/{RESTORE}");
        write_checked(&self.abs(&rel), format!("{n}\n").as_bytes())
            .map_err(|e| FrontError::io(&format!("restoring version {n} of {node}"), &e, None))?;
        self.node_info(node)
    }
}

/// `dir/` or "" for the mount.
fn slash(dir: &str) -> String {
    if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    }
}

/// Content larger than this is given summary first (abstract, overview,
/// line index) when no level or lines are asked: about 2,000 tokens.
pub const LARGE_NODE_BYTES: u64 = 8 * 1024;
/// Entries of a line index at most.
const INDEX_MAX: usize = 40;

/// Where things are in a long text: its headings (`#` lines), or, with
/// fewer than a handful, its non-empty lines at even steps; each as (line
/// number from 1, the line's start, at most 80 characters).
pub fn line_index(text: &str) -> Vec<(usize, String)> {
    let clip = |l: &str| crate::schema::clip(l, 80);
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let heads: Vec<(usize, String)> = lines
        .iter()
        .filter(|(_, l)| l.starts_with('#'))
        .map(|(n, l)| (*n, clip(l)))
        .collect();
    if heads.len() >= 5 {
        return heads.into_iter().take(INDEX_MAX).collect();
    }
    let step = lines.len().div_ceil(INDEX_MAX).max(1);
    lines
        .iter()
        .step_by(step)
        .map(|(n, l)| (*n, clip(l)))
        .collect()
}

fn display(scope: &str) -> &str {
    if scope.is_empty() {
        "(the mount)"
    } else {
        scope
    }
}

/// No empty, `.` or `..` segment: a path cannot climb out of the scope.
fn check_segments(p: &str) -> FrontResult<()> {
    if p.is_empty() {
        return Ok(());
    }
    for seg in p.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." || seg.contains('\0') {
            return Err(FrontError::invalid(format!(
                "{p:?}: a path has no empty, '.' or '..' segments"
            )));
        }
    }
    Ok(())
}

/// `{path, uri, version, status}` of `node` from its `.meta.json` text.
fn info_of(node: &str, meta: &str) -> FrontResult<Value> {
    let meta: Value = serde_json::from_str(meta)
        .map_err(|e| FrontError::invalid(format!("{node}/{META}: {e}")))?;
    Ok(json!({
        "path": node,
        "uri": meta.get("uri").cloned().unwrap_or(Value::Null),
        "version": meta.get("version").cloned().unwrap_or(Value::Null),
        "status": meta.get("status").cloned().unwrap_or(Value::Null),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn front(scope: &str) -> Front {
        Front {
            mount: PathBuf::from("/m"),
            scope: scope.into(),
            held: Arc::default(),
        }
    }

    #[test]
    fn a_line_index_gives_headings_or_even_steps() {
        let doc: String = (1..=6)
            .map(|i| format!("# Part {i}\n\ntext {i}\n"))
            .collect();
        let ix = line_index(&doc);
        assert_eq!(ix.len(), 6);
        assert_eq!(ix[1], (4, "# Part 2".to_string()));
        let plain: String = (1..=400).map(|i| format!("line {i}\n")).collect();
        let ix = line_index(&plain);
        assert_eq!(ix.len(), 40);
        assert_eq!((ix[0].0, ix[1].0), (1, 11));
    }

    #[test]
    fn paths_stay_inside_the_scope() {
        let f = front("accounts/acme/users/alice");
        assert_eq!(
            f.rel("memories/p/t").unwrap(),
            "accounts/acme/users/alice/memories/p/t"
        );
        assert_eq!(
            f.rel("/memories/p/t/").unwrap(),
            "accounts/acme/users/alice/memories/p/t"
        );
        assert_eq!(f.rel("").unwrap(), "accounts/acme/users/alice");
        assert_eq!(
            f.rel("ctx://acme/users/alice/memories/p/t").unwrap(),
            "accounts/acme/users/alice/memories/p/t"
        );
        assert_eq!(
            f.rel("accounts/acme/users/alice/memories/p").unwrap(),
            "accounts/acme/users/alice/memories/p"
        );
        assert_eq!(
            f.rel("accounts/acme/users/bob").unwrap_err().errno,
            Some(libc::EACCES)
        );
        assert_eq!(
            f.rel("ctx://other/users/x").unwrap_err().errno,
            Some(libc::EACCES)
        );
        assert_eq!(
            f.rel("accounts/acme/users/alicex").unwrap_err().errno,
            Some(libc::EACCES)
        );
        for bad in ["../bob", "memories/../../x", "a//b", "./a"] {
            assert_eq!(f.rel(bad).unwrap_err().errno, Some(libc::EINVAL), "{bad}");
        }
        let whole = front("");
        assert_eq!(whole.rel("accounts/x").unwrap(), "accounts/x");
        assert_eq!(whole.rel("").unwrap(), "");
    }

    #[test]
    fn errors_name_their_errno() {
        let e = FrontError::io(
            "writing n/.meta.json",
            &std::io::Error::from_raw_os_error(libc::EINVAL),
            Some("content.md is missing\n".into()),
        );
        assert_eq!(
            e.to_string(),
            "EINVAL: writing n/.meta.json: Invalid argument: content.md is missing"
        );
        assert_eq!(e.to_json()["code"], libc::EINVAL);
    }
}
