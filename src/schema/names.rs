//! Every name the tree gives a meaning to, in one place: the files of a
//! node, the virtual and reserved names, the daemon's own files, and the
//! generated files of user and agent directories.

/// The five files that make a node version, in the order of the write protocol
/// (listings use this order so `cp -r` and `mv` fallbacks write `.meta.json` last).
pub const NODE_FILES: [&str; 5] = [CONTENT, RELATIONS, ABSTRACT, OVERVIEW, META];
pub const META: &str = ".meta.json";
pub const CONTENT: &str = "content.md";
pub const ABSTRACT: &str = ".abstract.md";
pub const OVERVIEW: &str = ".overview.md";
pub const RELATIONS: &str = ".relations.json";
/// The `relation_type` of an edge from a node to an older one it replaces
/// (search ranks the older one below it and says it is superseded).
pub const SUPERSEDES: &str = "supersedes";

/// Virtual, read-only: pending index events of the node (not listed, reached by path).
pub const OUTBOX: &str = ".outbox";
/// Inside `.outbox/`: the node's dead letters.
pub const OUTBOX_DLQ: &str = "dlq";
/// Virtual, writer-only: why the last commit of this node was refused.
pub const COMMIT_ERROR: &str = ".commit-error";
/// Virtual: a node's earlier versions (`NODE/.versions/{n}/`).
pub const VERSIONS_DIR: &str = ".versions";
/// `NODE/.versions/restore`: write a version number to restore it.
pub const RESTORE: &str = "restore";
/// `NODE/.versions/redact`: write an earlier version number to redact it.
pub const REDACT: &str = "redact";
/// `accounts/{a}/.as-of/{time}/`: the account as it stood then (read-only).
pub const AS_OF_DIR: &str = ".as-of";
/// The virtual search directory inside every directory of an account.
pub const SEARCH_DIR: &str = ".search";

/// `MOUNT/.ctxfs/` (the daemon's files) and `accounts/{a}/.ctxfs/` (the account's).
pub const CTXFS_DIR: &str = ".ctxfs";
pub const STATUS_FILE: &str = "status";
pub const PID_FILE: &str = "pid";
pub const SYNC_FILE: &str = "sync";
pub const HEADER: &str = "header";
pub const HELP: &str = "help";
pub const METRICS_FILE: &str = "metrics";
/// The files of `MOUNT/.ctxfs/`, in listing order.
pub const CTXFS_FILES: [&str; 6] = [STATUS_FILE, PID_FILE, SYNC_FILE, HEADER, HELP, METRICS_FILE];
/// `accounts/{a}/.ctxfs/usage`: usage against quota.
pub const USAGE_FILE: &str = "usage";
/// `accounts/{a}/.ctxfs/batch`: many nodes committed by one write.
pub const BATCH_FILE: &str = "batch";
/// `accounts/{a}/.ctxfs/audit`: who did what (writers and root read it).
pub const AUDIT_FILE: &str = "audit";

/// A user's directory of conversations (`users/{u}/inbox/`).
pub const INBOX: &str = "inbox";

/// Generated in user and agent directories: the memory map.
pub const MAP_FILE: &str = "README.md";
/// Generated in user and agent directories: the prompt header.
pub const HEADER_FILE: &str = ".header.md";

/// The stored row of a directory's summary written by the LLM, in the
/// scratch table under the directory's path (`{dir}/.summary`).
pub const SUMMARY_ROW: &str = ".summary";

/// A project's shared working area and its append-only log.
pub const SCRATCHPAD: &str = "scratchpad";
pub const ACTIVITY_LOG: &str = "activity_log.jsonl";

/// Names a client may not create inside a node: the node's virtual entries.
pub fn is_reserved(name: &str) -> bool {
    name == VERSIONS_DIR || name == OUTBOX || name == COMMIT_ERROR
}
