//! The shapes of the tree (CONTRACT §3) as a pure function of path components.
//!
//! Paths here are relative to `MOUNT/accounts/`: `acme/users/alice/memories/profile`.

use crate::error::{Error, Result};

pub const MAX_NAME: usize = 128;
pub const MAX_FILE_NAME: usize = 255;

pub use super::names::{
    ABSTRACT, COMMIT_ERROR, CONTENT, META, NODE_FILES, OUTBOX, OVERVIEW, RELATIONS,
};

/// Fixed structural directories: always present under their parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fixed {
    Users,
    Agents,
    Projects,
    Memories,
    Skills,
}

impl Fixed {
    pub fn name(self) -> &'static str {
        match self {
            Fixed::Users => "users",
            Fixed::Agents => "agents",
            Fixed::Projects => "projects",
            Fixed::Memories => "memories",
            Fixed::Skills => "skills",
        }
    }
}

/// What a directory path under `accounts/` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirPlace {
    /// `{account}`: a container.
    Account,
    /// `users`, `agents`, `projects`, `memories`, `skills`.
    Fixed(Fixed),
    /// `users/{u}`, `agents/{g}`, `projects/{p}`, `memories/{category}`: containers.
    Container,
    /// A node directory.
    Node,
}

/// Is `name` a valid account, user, agent, project, category, slug or skill name?
pub fn check_name(name: &str) -> Result<()> {
    let ok = name.len() <= MAX_NAME
        && !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{} is not a URL-safe name (ASCII letters, digits, _ - ., not starting with ., at most {MAX_NAME} bytes)",
            super::excerpt(name)
        )))
    }
}

/// Is `name` acceptable as a file inside a node directory?
pub fn check_file_name(name: &str) -> Result<()> {
    if name.len() > MAX_FILE_NAME {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Error::Invalid(format!("{name:?} is not a file name")));
    }
    if super::names::is_reserved(name) {
        return Err(Error::NotPermitted("reserved virtual name"));
    }
    Ok(())
}

/// Classify a directory path (components under `accounts/`). `Err(Invalid)` when
/// the shape is outside the contract's tree.
pub fn classify_dir(c: &[&str]) -> Result<DirPlace> {
    use DirPlace::*;
    let fixed = |n: &str, f: self::Fixed| {
        if n == f.name() {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "{} is not a directory of this tree here",
                super::excerpt(n)
            )))
        }
    };
    match c.len() {
        0 => Err(Error::Invalid("empty path".into())),
        1 => {
            check_name(c[0])?;
            Ok(Account)
        }
        2 => match c[1] {
            "users" => Ok(Fixed(self::Fixed::Users)),
            "agents" => Ok(Fixed(self::Fixed::Agents)),
            "projects" => Ok(Fixed(self::Fixed::Projects)),
            other => Err(Error::Invalid(format!(
                "{}: an account holds only users/, agents/ and projects/",
                super::excerpt(other)
            ))),
        },
        3 => {
            check_name(c[2])?;
            Ok(Container)
        }
        4 => match c[1] {
            "users" => fixed(c[3], self::Fixed::Memories).map(|_| Fixed(self::Fixed::Memories)),
            "agents" => match c[3] {
                "memories" => Ok(Fixed(self::Fixed::Memories)),
                "skills" => Ok(Fixed(self::Fixed::Skills)),
                other => Err(Error::Invalid(format!(
                    "{}: an agent holds only memories/ and skills/",
                    super::excerpt(other)
                ))),
            },
            _ => Err(Error::Invalid(
                "a project holds only scratchpad/ and activity_log.jsonl".into(),
            )),
        },
        5 => {
            check_name(c[4])?;
            match (c[1], c[3]) {
                ("users", "memories") if c[4] == "profile" => Ok(Node),
                ("users", "memories") | ("agents", "memories") => Ok(Container),
                ("agents", "skills") => Ok(Node),
                _ => Err(Error::Invalid("not a place for a directory".into())),
            }
        }
        6 => {
            check_name(c[5])?;
            match (c[1], c[3], c[4]) {
                ("users", "memories", "profile") => Err(Error::Invalid(
                    "the profile node holds files, not directories".into(),
                )),
                ("users", "memories", _) | ("agents", "memories", _) => Ok(Node),
                _ => Err(Error::Invalid("node directories hold files only".into())),
            }
        }
        _ => Err(Error::Invalid("node directories hold files only".into())),
    }
}

/// The children a fixed directory always shows under a given directory place.
pub fn fixed_children(c: &[&str], place: &DirPlace) -> &'static [Fixed] {
    match (place, c.len()) {
        (DirPlace::Account, _) => &[Fixed::Users, Fixed::Agents, Fixed::Projects],
        (DirPlace::Container, 3) if c[1] == "users" => &[Fixed::Memories],
        (DirPlace::Container, 3) if c[1] == "agents" => &[Fixed::Memories, Fixed::Skills],
        _ => &[],
    }
}

/// The path under the mount (`accounts/A/…`) of a store path (`A/…`): how
/// search results, scopes and messages name what they point at.
pub fn mount_path(store_path: &str) -> String {
    format!("accounts/{store_path}")
}

/// The store path (`A/…`) of a path under the mount (`accounts/A/…`); a
/// path without the prefix is taken as a store path already.
pub fn store_path(mount_path: &str) -> &str {
    mount_path.strip_prefix("accounts/").unwrap_or(mount_path)
}

/// The account of a store path (`A` of `A/…`): its first segment.
pub fn account_of(store_path: &str) -> &str {
    store_path.split('/').next().unwrap_or("")
}

/// A store path under its account (`users/u/…` of `A/users/u/…`; empty
/// for the account itself).
pub fn in_account(store_path: &str) -> &str {
    store_path.split_once('/').map_or("", |(_, r)| r)
}

/// `ctx://` URI of a node path.
pub fn uri_of(node: &str) -> String {
    format!("ctx://{node}")
}

/// The node path of a `ctx://` URI, when it is one (not checked: for URIs
/// the daemon wrote itself).
pub fn node_of_uri(uri: &str) -> Option<&str> {
    uri.strip_prefix("ctx://")
}

/// The node path of a client's `ctx://` URI, parsed as a node place with the
/// name rules of paths: no empty, `.` or `..` segments, URL-safe names only
/// (so no spaces, `?`, `#` or `%`), and the shape of a node directory.
pub fn node_of_client_uri(uri: &str) -> Result<&str> {
    let node = node_of_uri(uri)
        .ok_or_else(|| Error::Invalid(format!("{} is not a ctx:// URI", super::excerpt(uri))))?;
    let comps: Vec<&str> = node.split('/').collect();
    for c in &comps {
        check_name(c)?;
    }
    match classify_dir(&comps)? {
        DirPlace::Node => Ok(node),
        _ => Err(Error::Invalid(format!(
            "{} does not name a node",
            super::excerpt(uri)
        ))),
    }
}

/// `user:{id}` or `agent:{id}` (seed 000/002 owner_space format).
pub fn owner_space(c: &[&str]) -> String {
    match c.get(1) {
        Some(&"users") => format!("user:{}", c[2]),
        _ => format!("agent:{}", c[2]),
    }
}

/// Category of a node path (`skills` for skill nodes, `profile` for the profile node).
pub fn category<'a>(c: &[&'a str]) -> &'a str {
    match c.len() {
        5 if c[3] == "skills" => "skills",
        5 => c[4],
        _ => c[4],
    }
}

pub fn context_type(c: &[&str]) -> &'static str {
    if c.len() == 5 && c[3] == "skills" {
        "SKILL"
    } else {
        "MEMORY"
    }
}

/// Container directories that must exist for a node (or container) at `c`.
/// Returned as (parent, name) pairs, outermost first.
pub fn ancestor_containers(c: &[&str]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for len in 1..c.len() {
        if let Ok(DirPlace::Account | DirPlace::Container) = classify_dir(&c[..len]) {
            out.push((c[..len - 1].join("/"), c[len - 1].to_string()));
        }
    }
    out
}

/// The directories whose derived summaries (`.abstract.md`,
/// `.overview.md`) a change to the node at `path` changes: its category
/// (none for the profile) and its owner space, innermost first.
pub fn summarized_dirs_of(path: &str) -> Vec<String> {
    let c = split(path);
    if c.len() < 4 || !(c[1] == "users" || c[1] == "agents") {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(2);
    match c[3] {
        "skills" if c[1] == "agents" && c.len() >= 5 => out.push(c[..4].join("/")),
        "memories" if c.len() >= 6 => out.push(c[..5].join("/")),
        "memories" | "skills" => {}
        _ => return Vec::new(),
    }
    out.push(c[..3].join("/"));
    out
}

pub fn split(path: &str) -> Vec<&str> {
    if path.is_empty() {
        Vec::new()
    } else {
        path.split('/').collect()
    }
}

/// (parent, name) of a path with at least one component.
pub fn parent_name(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_node_changes_the_summaries_of_its_category_and_owner() {
        use super::summarized_dirs_of as d;
        assert_eq!(
            d("a/users/u/memories/prefs/tea"),
            vec!["a/users/u/memories/prefs", "a/users/u"]
        );
        assert_eq!(d("a/users/u/memories/profile"), vec!["a/users/u"]);
        assert_eq!(
            d("a/agents/g/skills/deploy"),
            vec!["a/agents/g/skills", "a/agents/g"]
        );
        assert!(d("a/users/u/inbox/c.json").is_empty());
        assert!(d("a/projects/p/scratchpad/x").is_empty());
    }

    use super::*;

    #[test]
    fn mount_and_store_paths_are_one_prefix_apart() {
        assert_eq!(mount_path("acme/users/u"), "accounts/acme/users/u");
        assert_eq!(store_path("accounts/acme/users/u"), "acme/users/u");
        assert_eq!(account_of("acme/users/u"), "acme");
        assert_eq!(account_of("acme"), "acme");
        assert_eq!(in_account("acme/users/u"), "users/u");
        assert_eq!(in_account("acme"), "");
        assert_eq!(store_path("acme/users/u"), "acme/users/u");
        assert_eq!(store_path(&mount_path("a/b#3")), "a/b#3");
    }

    fn cl(p: &str) -> Result<DirPlace> {
        classify_dir(&split(p))
    }

    #[test]
    fn shapes() {
        assert_eq!(cl("acme").unwrap(), DirPlace::Account);
        assert_eq!(cl("acme/users").unwrap(), DirPlace::Fixed(Fixed::Users));
        assert_eq!(cl("acme/users/alice").unwrap(), DirPlace::Container);
        assert_eq!(
            cl("acme/users/alice/memories").unwrap(),
            DirPlace::Fixed(Fixed::Memories)
        );
        assert_eq!(
            cl("acme/users/alice/memories/profile").unwrap(),
            DirPlace::Node
        );
        assert_eq!(
            cl("acme/users/alice/memories/events").unwrap(),
            DirPlace::Container
        );
        assert_eq!(
            cl("acme/users/alice/memories/events/e1").unwrap(),
            DirPlace::Node
        );
        assert_eq!(
            cl("acme/agents/bot/memories/profile").unwrap(),
            DirPlace::Container
        );
        assert_eq!(
            cl("acme/agents/bot/memories/cases/c1").unwrap(),
            DirPlace::Node
        );
        assert_eq!(cl("acme/agents/bot/skills/s1").unwrap(), DirPlace::Node);
        assert_eq!(cl("acme/projects/p").unwrap(), DirPlace::Container);
        for bad in [
            "acme/other",
            "acme/users/alice/notes",
            "acme/users/alice/memories/profile/x",
            "acme/users/alice/memories/events/e1/sub",
            "acme/agents/bot/tools",
            "acme/agents/bot/skills/s1/x",
            "acme/users/.hidden",
            "acme/users/a b",
            "acme/projects/p/scratchpad",
            "ac/me",
        ] {
            assert!(cl(bad).is_err(), "{bad} should be refused");
        }
        assert!(matches!(
            cl(&format!("acme/users/{}", "a".repeat(129))),
            Err(Error::Invalid(_))
        ));
        assert!(cl(&format!("acme/users/{}", "a".repeat(128))).is_ok());
    }

    #[test]
    fn ancestors() {
        let c = split("acme/users/alice/memories/events/e1");
        let a = ancestor_containers(&c);
        assert_eq!(
            a,
            vec![
                ("".into(), "acme".into()),
                ("acme/users".into(), "alice".into()),
                ("acme/users/alice/memories".into(), "events".into()),
            ]
        );
        assert_eq!(owner_space(&c), "user:alice");
        assert_eq!(category(&c), "events");
        let s = split("acme/agents/bot/skills/s1");
        assert_eq!(category(&s), "skills");
        assert_eq!(context_type(&s), "SKILL");
        assert_eq!(owner_space(&s), "agent:bot");
    }
}
