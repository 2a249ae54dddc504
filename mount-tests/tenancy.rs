//! Who may do what: accounts by uid from the config, and the single-owner
//! mount without one.

use crate::harness::*;
use std::process::Command;

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

/// Every path under `root` (root itself included), as root sees it.
fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() {
            let mut kids: Vec<_> = std::fs::read_dir(&out[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            kids.sort();
            out.extend(kids);
        }
        i += 1;
    }
    out
}

/// What the daemon and the offline commands leave on disk is the owner's
/// alone, whatever the umask they were started with: a local uid in no
/// account reads no byte of the data dir or of an export, after a commit, a
/// search and an export (SEMANTICS "At rest").
#[test]
fn data_at_rest_is_owner_only_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    const UMASK0: &[&str] = &["/bin/sh", "-c", "umask 0; exec \"$0\" \"$@\""];
    let mut m = Mount::with_prefix(Some(CONFIG), &[], &[], UMASK0);
    m.ok(
        WRITER,
        &four_steps(N1, "the vault code is zebra4711", ACTIVE),
    );
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    let hits = m.ok(READER, "cat \"$M/accounts/acme/.search/vault code\"");
    assert!(hits.contains("events/e1"), "{hits}");
    m.umount();
    let export = m.dir.path().join("export");
    let out = Command::new("/bin/sh")
        .args(["-c", "umask 0; exec \"$0\" \"$@\"", BIN, "export", "--data"])
        .arg(&m.data)
        .arg(&export)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files = 0;
    for p in walk(&m.data).into_iter().chain(walk(&export)) {
        let md = std::fs::symlink_metadata(&p).unwrap();
        let mode = md.permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} is mode {mode:o}", p.display());
        if md.is_file() {
            files += 1;
            // The stranger can neither open it nor, through its directory, see it.
            m.fails(4242, &format!("cat '{}'", p.display()), "Permission denied");
        }
    }
    assert!(files >= 4, "store, log, lock and an exported file: {files}");
    let o = m.sh(
        4242,
        &format!(
            "grep -r zebra4711 '{}' '{}'",
            m.data.display(),
            export.display()
        ),
    );
    assert!(o.stdout.is_empty() && !o.status.success(), "{o:?}");
    // As root, the words are there: the test can see what it guards.
    let o = m.sh(0, &format!("grep -rl zebra4711 '{}'", export.display()));
    assert!(!o.stdout.is_empty(), "{o:?}");
}

/// A data dir that holds data and that group or others may read is refused
/// at mount with the `chmod` that fixes it; an empty one made by `mkdir` is
/// taken and set 0700, as initdb does.
#[test]
fn a_data_dir_others_may_read_is_refused_with_the_fix() {
    let mut m = Mount::new();
    m.umount();
    chmod(&m.data, 0o755);
    let out = Command::new(BIN)
        .arg("mount")
        .arg(&m.mnt)
        .arg("--data")
        .arg(&m.data)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted a 0755 data dir: {err}");
    assert!(
        err.contains(&format!("chmod 0700 {}", m.data.display())),
        "{err}"
    );
    let fsck = ctxfs(&["fsck", "--data", m.data.to_str().unwrap()]);
    assert!(!fsck.status.success(), "offline commands refuse it too");
    chmod(&m.data, 0o700);
    m.mount();
    m.umount();
    // An empty directory someone made with the default umask.
    let fresh = m.dir.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    chmod(&fresh, 0o755);
    let mnt = m.mnt.to_str().unwrap();
    let out = ctxfs(&["mount", mnt, "--data", fresh.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    let out = ctxfs(&["umount", mnt]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode, 0o700);
}
