//! The tree: deletes, moves and archives of nodes, the name and shape
//! rules, and listings read by several uids at once.

use crate::harness::*;

const N1: &str = "acme/users/alice/memories/events/e1";

#[test]
fn delete_move_archive() {
    let m = Mount::without_index();
    m.ok(0, &four_steps(N1, "to move", ACTIVE));
    let n2 = "acme/users/bob/memories/cases/c1";
    m.ok(0, &format!("mkdir -p $M/accounts/acme/users/bob/memories/cases && mv $M/accounts/{N1} $M/accounts/{n2}"));
    m.fails(0, &format!("ls $M/accounts/{N1}"), "No such file");
    let meta: serde_json::Value =
        serde_json::from_str(&m.ok(0, &format!("cat $M/accounts/{n2}/.meta.json"))).unwrap();
    assert_eq!(meta["uri"], format!("ctx://{n2}"));
    assert_eq!(meta["owner_space"], "user:bob");
    assert_eq!(meta["category"], "cases");
    assert!(m
        .ok(0, &format!("cat $M/accounts/{n2}/.outbox/*.json"))
        .contains("MOVE_CONTEXT"));
    assert_eq!(
        m.ok(0, &format!("cat $M/accounts/{n2}/content.md")),
        "to move"
    );
    // Moving to a non-node place is refused.
    m.fails(
        0,
        &format!("mv $M/accounts/{n2} $M/accounts/acme/users/bob/memories/cases2"),
        "",
    );
    // Archive.
    m.ok(
        0,
        &format!("/bin/echo '{{\"status\":\"ARCHIVED\"}}' > $M/accounts/{n2}/.meta.json"),
    );
    assert!(m
        .ok(0, &format!("cat $M/accounts/{n2}/.outbox/*.json"))
        .contains("ARCHIVE_CONTEXT"));
    let s: serde_json::Value = serde_json::from_str(&m.ok(0, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["nodes"]["ARCHIVED"], 1);
    // rm -r deletes the node as one change.
    m.ok(0, &format!("rm -r $M/accounts/{n2}"));
    m.fails(0, &format!("ls $M/accounts/{n2}"), "No such file");
    let s: serde_json::Value = serde_json::from_str(&m.ok(0, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["nodes"]["ARCHIVED"], 0);
    // rm -r of a whole user removes everything under it.
    m.ok(
        0,
        &four_steps("acme/users/carol/memories/a/n1", "x", ACTIVE),
    );
    m.ok(
        0,
        &four_steps("acme/users/carol/memories/profile", "x", ACTIVE),
    );
    m.ok(0, "rm -r $M/accounts/acme/users/carol");
    assert_eq!(m.ok(0, "ls $M/accounts/acme/users"), "alice\nbob\n");
    let mut m = m;
    m.umount();
    m.fsck();
}

#[test]
fn names_and_shapes_are_validated() {
    let m = Mount::new();
    for bad in [
        "accounts/acme/users/a b",
        "accounts/acme/users/.hidden",
        "accounts/acme/users/caf\u{e9}",
        "accounts/acme/stuff",
        "accounts/acme/users/alice/notes",
        "accounts/acme/users/alice/memories/events/e1/sub",
        "accounts/acme/agents/bot/tools",
    ] {
        m.fails(0, &format!("mkdir -p \"$M/{bad}\""), "Invalid argument");
    }
    let long = "a".repeat(129);
    m.fails(
        0,
        &format!("mkdir -p $M/accounts/acme/users/{long}"),
        "Invalid argument",
    );
    m.ok(
        0,
        &format!("mkdir -p $M/accounts/acme/users/{}", "b".repeat(128)),
    );
    m.fails(
        0,
        "echo x > $M/accounts/acme/users/file.txt",
        "Invalid argument",
    );
    m.fails(0, "echo x > $M/accounts/file.txt", "Invalid argument");
    // Nothing of the refused names was stored.
    // (mkdir -p made the valid parents, e.g. users/alice, before the refusal.)
    assert_eq!(
        m.ok(0, "ls $M/accounts/acme/users"),
        format!("alice\n{}\n", "b".repeat(128))
    );
    assert_eq!(
        m.ok(0, "ls $M/accounts/acme/users/alice/memories"),
        "events\n"
    );
    assert_eq!(m.ok(0, "ls $M/accounts/acme"), "agents\nprojects\nusers\n");
    // All node shapes work.
    for node in [
        "acme/users/u1/memories/profile",
        "acme/users/u1/memories/prefs/coffee",
        "acme/agents/bot/memories/cases/c1",
        "acme/agents/bot/skills/search-web",
    ] {
        m.ok(0, &four_steps(node, "x", ACTIVE));
    }
    assert!(m
        .ok(
            0,
            "cat $M/accounts/acme/agents/bot/skills/search-web/.meta.json"
        )
        .contains("\"SKILL\""));
}

/// Directories are opened without asking the daemon and listings live in
/// the kernel's cache: listings that differ by uid must still never reach
/// another uid, also when several uids list the same directory at once.
#[test]
fn concurrent_listings_stay_per_uid() {
    let m = Mount::with_config(Some(CONFIG));
    let cat = "$M/accounts/acme/users/alice/memories/events";
    m.ok(WRITER, &four_steps(N1, "one", ACTIVE));
    // The writer's draft adds a file the reader must not see.
    m.ok(WRITER, &format!("echo tmp > {cat}/e1/extra.txt"));
    // Each loop prints a line only when it sees something it must not.
    let watch = |want_accounts: &str, want_node: Option<&str>| {
        let cat_check = match want_node {
            Some(w) => format!("[ \"$(ls {cat}/e1 | tr '\\n' ' ')\" = \"{w}\" ] || echo \"node $(ls {cat}/e1 | tr '\\n' ' ')\";"),
            None => String::new(),
        };
        format!(
            "i=0; while [ $i -lt 300 ]; do \
               [ \"$(ls $M/accounts | tr '\\n' ' ')\" = \"{want_accounts}\" ] || echo \"accounts $(ls $M/accounts | tr '\\n' ' ')\"; \
               {cat_check} i=$((i+1)); done"
        )
    };
    let out = |c: std::process::Child| {
        let o = c.wait_with_output().expect("wait");
        assert!(o.status.success());
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let w = m.spawn_piped(WRITER, &watch("acme ", Some("content.md extra.txt ")));
    let r = m.spawn_piped(READER, &watch("acme ", Some("content.md ")));
    let s = m.spawn_piped(STRANGER, &watch("other ", None));
    assert_eq!(out(w), "", "writer saw a listing not its own");
    assert_eq!(out(r), "", "reader saw a listing not its own");
    assert_eq!(out(s), "", "stranger saw a listing not its own");
}
