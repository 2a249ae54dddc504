//! Who may do what: accounts by uid from the config, and the single-owner
//! mount without one.

use crate::harness::*;

const N1: &str = "acme/users/alice/memories/events/e1";

#[test]
fn tenancy_is_enforced_per_uid() {
    let m = Mount::with_config(Some(CONFIG));
    m.ok(WRITER, &four_steps(N1, "acme data", ACTIVE));
    m.ok(
        STRANGER,
        &four_steps("other/users/x/memories/a/b", "other data", ACTIVE),
    );
    // Listings show only one's own accounts; root sees all.
    // In turns, twice: no caller is served another's listing from a cache.
    for _ in 0..2 {
        assert_eq!(m.ok(WRITER, "ls $M/accounts"), "acme\n");
        assert_eq!(m.ok(READER, "ls $M/accounts"), "acme\n");
        assert_eq!(m.ok(STRANGER, "ls $M/accounts"), "other\n");
        assert_eq!(m.ok(0, "ls $M/accounts"), "acme\nother\n");
        assert_eq!(m.ok(4242, "ls $M/accounts"), "");
    }
    // Cross-account read, write, list, rename: EACCES.
    for (uid, path) in [
        (STRANGER, format!("accounts/{N1}")),
        (WRITER, "accounts/other/users/x/memories/a/b".into()),
    ] {
        m.fails(
            uid,
            &format!("cat $M/{path}/content.md"),
            "Permission denied",
        );
        m.fails(uid, &format!("ls $M/{path}"), "Permission denied");
        m.fails(
            uid,
            &format!("echo x > $M/{path}/content.md"),
            "Permission denied",
        );
        m.fails(
            uid,
            &format!("mkdir $M/{path}/../newnode"),
            "Permission denied",
        );
        m.fails(uid, &format!("stat $M/{path}"), "Permission denied");
    }
    m.fails(STRANGER, "ls $M/accounts/acme", "Permission denied");
    m.fails(STRANGER, "ls $M/accounts/nonexistent", "Permission denied");
    m.fails(
        WRITER,
        &format!("mv $M/accounts/{N1} $M/accounts/other/users/x/memories/a/moved"),
        "Permission denied",
    );
    m.fails(
        STRANGER,
        &format!("mv $M/accounts/other/users/x/memories/a/b $M/accounts/{N1}x"),
        "Permission denied",
    );
    assert!(m
        .ok(STRANGER, "grep -r 'acme data' $M/accounts 2>&1; true")
        .is_empty());
    // Readers read but every write is EROFS.
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N1}/content.md")),
        "acme data"
    );
    m.fails(
        READER,
        &format!("echo x > $M/accounts/{N1}/content.md"),
        "Read-only file system",
    );
    m.fails(
        READER,
        &format!("echo x >> $M/accounts/{N1}/content.md"),
        "Read-only file system",
    );
    m.fails(
        READER,
        "mkdir $M/accounts/acme/users/newuser",
        "Read-only file system",
    );
    m.fails(
        READER,
        &format!("rm $M/accounts/{N1}/content.md"),
        "Read-only file system",
    );
    m.fails(
        READER,
        &format!("rm -r $M/accounts/{N1}"),
        "Read-only file system",
    );
    m.fails(
        READER,
        &format!("mv $M/accounts/{N1} $M/accounts/acme/users/alice/memories/events/e9"),
        "Read-only file system",
    );
    m.fails(
        READER,
        &format!("touch $M/accounts/{N1}/content.md"),
        "Read-only file system",
    );
    // Nothing changed.
    assert_eq!(
        m.ok(WRITER, &format!("cat $M/accounts/{N1}/content.md")),
        "acme data"
    );
    // Status counts only one's own accounts.
    let s: serde_json::Value =
        serde_json::from_str(&m.ok(STRANGER, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["nodes"]["ACTIVE"], 1);
    let s: serde_json::Value = serde_json::from_str(&m.ok(0, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["nodes"]["ACTIVE"], 2);
}

#[test]
fn without_config_only_the_mounting_uid_has_access() {
    let m = Mount::new();
    m.ok(0, &four_steps(N1, "mine", ACTIVE));
    m.fails(WRITER, "ls $M/accounts/acme", "Permission denied");
    m.fails(
        WRITER,
        &format!("cat $M/accounts/{N1}/content.md"),
        "Permission denied",
    );
    assert_eq!(m.ok(WRITER, "ls $M/accounts"), "");
}
