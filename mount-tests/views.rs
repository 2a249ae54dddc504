//! Views (`--views DIR`): one read-only mount per uid at `DIR/UID`, that
//! only that uid enters, showing committed memory only, cached by the
//! kernel; a commit swaps what a path names at once.

use crate::harness::*;
use std::time::{Duration, Instant};

const N1: &str = "acme/users/alice/memories/events/e1";

fn with_views() -> (Mount, String) {
    with_views_of(CONFIG)
}

fn with_views_of(config: &str) -> (Mount, String) {
    let mut m = Mount::prepared(Some(config), &["--no-index"], &[], &[]);
    let views = m.dir.path().join("views").to_str().unwrap().to_string();
    m.args.extend(["--views".to_string(), views.clone()]);
    m.mount();
    (m, views)
}

/// The requests the daemon has counted for `op`.
fn requests(m: &Mount, op: &str) -> u64 {
    let text = m.ok(0, "cat $M/.ctxfs/metrics");
    let key = format!("ctxfs_requests_total{{op=\"{op}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[test]
fn each_uid_reads_its_own_view_and_no_one_else_enters_it() {
    let (mut m, v) = with_views();
    m.ok(WRITER, &four_steps(N1, "acme data", ACTIVE));
    m.ok(
        STRANGER,
        &four_steps("other/users/x/memories/a/b", "other data", ACTIVE),
    );
    // Each uid sees its accounts through its own view, as on the mount.
    assert_eq!(m.ok(WRITER, &format!("ls {v}/1001/accounts")), "acme\n");
    assert_eq!(m.ok(READER, &format!("ls {v}/1002/accounts")), "acme\n");
    assert_eq!(m.ok(STRANGER, &format!("ls {v}/1003/accounts")), "other\n");
    for uid in [WRITER, READER] {
        let got = m.ok(uid, &format!("cat {v}/{uid}/accounts/{N1}/content.md"));
        assert_eq!(got, "acme data");
    }
    // The kernel refuses everyone else at the view's door, root too, and
    // uids the config does not name have no view.
    for (uid, dir) in [
        (STRANGER, "1001"),
        (WRITER, "1003"),
        (READER, "1001"),
        (0, "1001"),
    ] {
        m.fails(
            uid,
            &format!("stat {v}/{dir}/accounts"),
            "Permission denied",
        );
        m.fails(uid, &format!("ls {v}/{dir}"), "Permission denied");
    }
    m.fails(NOBODY, &format!("ls {v}/{NOBODY}"), "No such file");
    // `.ctxfs/help` tells each uid where its view is.
    let help = m.ok(WRITER, "cat $M/.ctxfs/help");
    assert!(
        help.contains(&format!("VIEW   {v}/1001/accounts/")),
        "{help}"
    );
    assert!(!m.ok(NOBODY, "cat $M/.ctxfs/help").contains("VIEW"));
    // Inside one's view, another account is refused as on the mount.
    m.fails(
        WRITER,
        &format!("ls {v}/1001/accounts/other"),
        "Permission denied",
    );
    // Read-only, for writers too.
    m.fails(
        WRITER,
        &format!("echo x > {v}/1001/accounts/{N1}/content.md"),
        "Read-only file system",
    );
    m.fails(
        WRITER,
        &format!("mkdir {v}/1001/accounts/{N1}/../e2"),
        "Read-only file system",
    );
    // Committed node files only: no virtual files, no drafts, no pending node.
    let listed = m.ok(WRITER, &format!("ls -A {v}/1001/accounts/{N1}"));
    assert_eq!(
        listed,
        ".abstract.md\n.meta.json\n.overview.md\n.relations.json\ncontent.md\n"
    );
    for hidden in [".versions", ".commit-error"] {
        m.fails(
            WRITER,
            &format!("ls {v}/1001/accounts/{N1}/{hidden}"),
            "No such file",
        );
    }
    m.fails(WRITER, &format!("ls {v}/1001/.ctxfs"), "No such file");
    m.fails(
        WRITER,
        &format!("ls {v}/1001/accounts/acme/users/alice/inbox"),
        "No such file",
    );
    m.ok(
        WRITER,
        &format!(
            "printf draft > $M/accounts/{N1}/content.md; mkdir -p $M/accounts/{N1}/../pending"
        ),
    );
    assert_eq!(
        m.ok(WRITER, &format!("cat {v}/1001/accounts/{N1}/content.md")),
        "acme data"
    );
    m.fails(
        WRITER,
        &format!("ls {v}/1001/accounts/{N1}/../pending"),
        "No such file",
    );
    let events = m.ok(WRITER, &format!("ls {v}/1001/accounts/{N1}/.."));
    assert_eq!(events, "e1\n");
    // The commit swaps the path at once, for every view (no wait for a TTL).
    m.ok(
        WRITER,
        &format!("/bin/echo '{ACTIVE}' > $M/accounts/{N1}/.meta.json"),
    );
    assert_eq!(
        m.ok(READER, &format!("cat {v}/1002/accounts/{N1}/content.md")),
        "draft"
    );
    assert!(m
        .ok(WRITER, &format!("cat {v}/1001/accounts/{N1}/.meta.json"))
        .contains("\"version\": 2"));
    // A delete stays deleted there too (queued: rmdir holds the main
    // mount's directory lock until it returns).
    m.ok(WRITER, &format!("rm -r $M/accounts/{N1}"));
    let gone = within(Duration::from_secs(2), || {
        !m.sh(READER, &format!("cat {v}/1002/accounts/{N1}/content.md"))
            .status
            .success()
    });
    assert!(gone.is_some(), "a deleted node still read on a view");
    // Its category's listing, which the writer's view listed above, was
    // dropped too.
    let events = "acme/users/alice/memories/events";
    assert_eq!(m.ok(WRITER, &format!("ls {v}/1001/accounts/{events}")), "");
    // The views go with the mount.
    m.umount();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(&v), "a view is still mounted: {mounts}");
}

#[test]
fn a_warm_read_by_path_on_a_view_asks_the_daemon_nothing() {
    let (m, v) = with_views();
    m.ok(WRITER, &four_steps(N1, "acme data", ACTIVE));
    let path = format!("{v}/1001/accounts/{N1}/content.md");
    m.ok(WRITER, &format!("cat {path} >/dev/null"));
    let ops = ["view_lookup", "view_getattr", "view_read", "view_readdir"];
    let before: Vec<u64> = ops.iter().map(|o| requests(&m, o)).collect();
    m.ok(
        WRITER,
        &format!("for i in $(seq 50); do cat {path} >/dev/null; done"),
    );
    let after: Vec<u64> = ops.iter().map(|o| requests(&m, o)).collect();
    assert_eq!(
        before, after,
        "{ops:?}: 50 warm reads by path asked the daemon"
    );
    // The main mount's open of the same file still costs requests: the
    // figure above is the view's, not a counter that never moves.
    let opens = requests(&m, "open");
    m.ok(
        WRITER,
        &format!("cat $M/accounts/{N1}/content.md >/dev/null"),
    );
    assert!(requests(&m, "open") > opens);
}

/// One writer commits a node again and again, each version's files all
/// naming it; readers on the view read all its files through one
/// directory descriptor each time, and by path after each commit.
#[test]
fn a_reader_on_a_view_never_mixes_two_versions_of_a_node() {
    let (m, v) = with_views();
    let node = format!("accounts/{N1}");
    let commit = |i: u32| {
        format!(
            "set -e; N=\"$M/{node}\"; mkdir -p \"$N\"; printf 'v{i}' > \"$N/content.md\"; \
             printf 'v{i}' > \"$N/.abstract.md\"; printf 'v{i}' > \"$N/.overview.md\"; \
             /bin/echo '{ACTIVE}' > \"$N/.meta.json\""
        )
    };
    m.ok(WRITER, &commit(0));
    let reader = r#"
import os, sys, time
d = sys.argv[1]
end = time.time() + float(sys.argv[2])
reads = mixed = 0
seen = set()
while time.time() < end:
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        continue
    try:
        got = []
        for f in ("content.md", ".abstract.md", ".overview.md"):
            g = os.open(f, os.O_RDONLY, dir_fd=fd)
            got.append(os.read(g, 100).decode())
            os.close(g)
    finally:
        os.close(fd)
    reads += 1
    seen.add(got[0])
    if len(set(got)) != 1:
        mixed += 1
        print("mixed", got, file=sys.stderr)
print(reads, mixed, len(seen))
"#;
    let script = m.shared_file("reader.py");
    std::fs::write(&script, reader).unwrap();
    let dir = format!("{v}/1001/{node}");
    let readers: Vec<_> = (0..2)
        .map(|_| {
            m.spawn_piped(
                WRITER,
                &format!("/usr/bin/python3 {} {dir} 3", script.display()),
            )
        })
        .collect();
    let t = Instant::now();
    let mut i = 1;
    while t.elapsed() < Duration::from_secs(2) {
        m.ok(WRITER, &commit(i));
        // By path, right after the commit: the new version.
        let got = m.ok(WRITER, &format!("cat {dir}/content.md {dir}/.abstract.md"));
        assert_eq!(got, format!("v{i}v{i}"));
        i += 1;
    }
    assert!(i > 5, "only {i} commits in 2 s");
    for r in readers {
        let out = r.wait_with_output().unwrap();
        assert!(out.status.success());
        let s = String::from_utf8_lossy(&out.stdout);
        let f: Vec<u64> = s.split_whitespace().map(|n| n.parse().unwrap()).collect();
        assert!(f[0] > 50, "too few reads to race: {s}");
        assert_eq!(f[1], 0, "reads mixing two versions: {s}");
        assert!(f[2] > 1, "the readers never met a new version: {s}");
    }
}

/// A user's own uid reaches only its own part on its view, as on the mount.
#[test]
fn a_users_view_holds_only_what_that_user_may_read() {
    // `[[account.user]]` belongs to the account above it: acme comes last.
    let config = "[[account]]\nid = \"other\"\nwriters = [1003]\n\n\
                  [[account]]\nid = \"acme\"\nwriters = [1001]\nreaders = [1002]\n\n\
                  [[account.user]]\nid = \"alice\"\nuids = [1201]\n\n\
                  [[account.user]]\nid = \"bob\"\nuids = [1202]\n";
    let (m, v) = with_views_of(config);
    let b1 = "acme/users/bob/memories/events/b1";
    m.ok(WRITER, &four_steps(N1, "for alice", ACTIVE));
    m.ok(WRITER, &four_steps(b1, "for bob", ACTIVE));
    assert_eq!(
        m.ok(1201, &format!("ls {v}/1201/accounts/acme/users")),
        "alice\n"
    );
    assert_eq!(
        m.ok(1201, &format!("cat {v}/1201/accounts/{N1}/content.md")),
        "for alice"
    );
    m.fails(
        1201,
        &format!("cat {v}/1201/accounts/{b1}/content.md"),
        "Permission denied",
    );
    assert!(!m
        .ok(
            1201,
            &format!("grep -r 'for bob' {v}/1201/accounts 2>&1; true")
        )
        .contains("for bob"));
    // Twice: the second walk is the kernel's, and still refused.
    for _ in 0..2 {
        assert_eq!(
            m.ok(1202, &format!("cat {v}/1202/accounts/{b1}/content.md")),
            "for bob"
        );
        m.fails(
            1202,
            &format!("cat {v}/1202/accounts/{N1}/content.md"),
            "Permission denied",
        );
    }
}

/// A daemon killed with `-9` leaves its views dead (they have no
/// auto-unmount helper); the next mount detaches them and serves them again.
#[test]
fn views_left_by_a_killed_daemon_are_mounted_again() {
    let (mut m, v) = with_views();
    m.ok(WRITER, &four_steps(N1, "acme data", ACTIVE));
    m.kill9();
    m.mount();
    assert_eq!(
        m.ok(WRITER, &format!("cat {v}/1001/accounts/{N1}/content.md")),
        "acme data"
    );
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let views = mounts.lines().filter(|l| l.contains(&v)).count();
    assert_eq!(views, 3, "one view per uid, no dead one left: {mounts}");
}

/// A BROKEN node (the Repair Job's verdict on a draft nothing can
/// complete) is listed for writers on the main mount, never on a view.
#[test]
fn a_broken_node_is_not_on_a_writers_view() {
    let (mut m, v) = with_views();
    let dir = "acme/users/alice/memories/events";
    m.ok(WRITER, &four_steps(N1, "acme data", ACTIVE));
    // A draft with no content.md, made durable, then the daemon killed.
    m.ok(
        WRITER,
        &format!(
            "mkdir $M/accounts/{dir}/broken && /usr/bin/python3 - <<'EOF'\nimport os\n\
             d = os.path.expandvars('$M/accounts/{dir}/broken')\n\
             for n, t in (('.abstract.md', 'text'), ('.meta.json', '{{\"status\": \"PENDING\"}}')):\n\
             \x20   fd = os.open(os.path.join(d, n), os.O_CREAT | os.O_WRONLY | os.O_TRUNC)\n\
             \x20   os.write(fd, t.encode()); os.fsync(fd); os.close(fd)\nEOF"
        ),
    );
    m.kill9();
    let out = ctxfs(&["repair", "--data", m.data.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("marked BROKEN"), "{report}");
    m.mount();
    assert_eq!(
        m.ok(WRITER, &format!("ls $M/accounts/{dir}")),
        "broken\ne1\n"
    );
    assert_eq!(m.ok(WRITER, &format!("ls {v}/1001/accounts/{dir}")), "e1\n");
    m.fails(
        WRITER,
        &format!("ls {v}/1001/accounts/{dir}/broken"),
        "No such file",
    );
}
