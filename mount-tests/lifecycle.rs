//! A node's life beyond one version: `.versions/` and restore, TTL, quotas.

use crate::harness::*;
use std::path::Path;
use std::process::Command;

const N: &str = "acme/users/alice/memories/prefs/tea";

fn commit(m: &Mount, node: &str, content: &str) {
    m.ok(WRITER, &four_steps(node, content, ACTIVE));
}

#[test]
fn versions_are_kept_read_only_and_restorable() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    commit(&m, N, "green tea");
    commit(&m, N, "black tea");
    commit(&m, N, "no tea at all");
    let v = format!("$M/accounts/{N}/.versions");
    // Not listed in the node (grep -r and cp -r skip it), reached by path.
    let ls = m.ok(WRITER, &format!("ls -a $M/accounts/{N}"));
    assert!(!ls.contains(".versions"), "{ls}");
    assert_eq!(
        m.ok(READER, &format!("ls {v}")),
        "1\n2\n3\nredact\nrestore\n"
    );
    assert_eq!(m.ok(READER, &format!("cat {v}/1/content.md")), "green tea");
    assert_eq!(m.ok(READER, &format!("cat {v}/2/content.md")), "black tea");
    let meta1 = m.json(READER, &format!("cat {v}/1/.meta.json"));
    assert_eq!(meta1["version"], 1);
    // content_hash is what sha256sum prints for the content.
    let sum = m.ok(READER, &format!("sha256sum < $M/accounts/{N}/content.md"));
    let meta = m.json(READER, &format!("cat $M/accounts/{N}/.meta.json"));
    assert_eq!(
        meta["content_hash"].as_str().unwrap(),
        format!("sha256:{}", sum.split_whitespace().next().unwrap())
    );
    assert_ne!(meta1["content_hash"], meta["content_hash"]);

    // Old versions are read-only for everyone; readers cannot restore.
    m.fails(
        WRITER,
        &format!("/bin/echo x > {v}/1/content.md"),
        "Operation not permitted",
    );
    m.fails(
        READER,
        &format!("/bin/echo 1 > {v}/restore"),
        "Read-only file system",
    );
    m.fails(STRANGER, &format!("ls {v}"), "Permission denied");
    // Bad requests: a clear errno, nothing changes.
    m.fails(
        WRITER,
        &format!("/bin/echo 9 > {v}/restore"),
        "Invalid argument",
    );
    m.fails(
        WRITER,
        &format!("/bin/echo banana > {v}/restore"),
        "Invalid argument",
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N}/content.md")),
        "no tea at all"
    );

    // Restore version 1: a new commit, version 4, with version 1's files.
    m.ok(WRITER, &format!("echo 1 > {v}/restore"));
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N}/content.md")),
        "green tea"
    );
    let meta = m.json(READER, &format!("cat $M/accounts/{N}/.meta.json"));
    assert_eq!(meta["version"], 4);
    assert_eq!(meta["restored_from"], 1);
    assert_eq!(meta["content_hash"], meta1["content_hash"]);
    assert_eq!(
        m.ok(READER, &format!("ls {v}")),
        "1\n2\n3\n4\nredact\nrestore\n"
    );

    // With uncommitted changes a restore is refused (EBUSY) and the draft kept.
    m.ok(WRITER, &format!("echo draft > $M/accounts/{N}/content.md"));
    m.fails(
        WRITER,
        &format!("/bin/echo 2 > {v}/restore"),
        "Device or resource busy",
    );
    assert_eq!(
        m.ok(WRITER, &format!("cat $M/accounts/{N}/content.md")),
        "draft\n"
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N}/content.md")),
        "green tea"
    );

    // History survives a remount; a delete drops it.
    let mut m = m;
    m.umount();
    m.fsck();
    m.mount();
    assert_eq!(
        m.ok(READER, &format!("cat {v}/3/content.md")),
        "no tea at all"
    );
    m.ok(WRITER, &format!("rm -r $M/accounts/{N}"));
    m.fails(READER, &format!("ls {v}"), "No such file or directory");
    m.umount();
    m.fsck();
}

#[test]
fn expired_nodes_vanish_at_once_and_are_swept() {
    let m = Mount::with_args(
        Some(CONFIG),
        &["--embedder", "hash", "--sweep-interval", "1"],
    );
    let short = "acme/users/alice/memories/events/standup";
    m.ok(
        WRITER,
        &four_steps(
            short,
            "daily standup at nine",
            r#"{"status":"ACTIVE","ttl_seconds":3}"#,
        ),
    );
    commit(&m, N, "green tea standup");
    m.ok(0, "cat $M/.ctxfs/sync");
    let meta = m.json(READER, &format!("cat $M/accounts/{short}/.meta.json"));
    assert!(meta["expires_at"].as_str().unwrap().ends_with('Z'));
    assert!(meta.get("ttl_seconds").is_none());
    let search = "cat \"$M/accounts/acme/.search/standup nine\"";
    assert!(m.ok(READER, search).contains("standup"));
    // Hold a reader on the listing and the file until the node expires.
    let users = "$M/accounts/acme/users/alice/memories/events";
    assert_eq!(m.ok(READER, &format!("ls {users}")), "standup\n");
    std::thread::sleep(std::time::Duration::from_millis(3300));
    // Not found anywhere from the instant it expires (before any sweep).
    m.fails(
        READER,
        &format!("cat $M/accounts/{short}/content.md"),
        "No such file or directory",
    );
    assert_eq!(m.ok(READER, &format!("ls {users}")), "");
    assert!(!m
        .ok(READER, search)
        .contains("accounts/acme/users/alice/memories/events"));
    assert!(!m
        .ok(READER, "cat $M/accounts/acme/users/alice/README.md")
        .contains("events/standup"));
    // The sweeper deletes it (a DELETE_CONTEXT event; counted in metrics).
    let mut swept = false;
    for _ in 0..50 {
        if m.ok(0, "cat $M/.ctxfs/metrics")
            .contains("ctxfs_expired_total 1")
        {
            swept = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(swept, "the sweeper did not remove the expired node");
    // The path can be used again by a new node.
    commit(&m, short, "standup moved to ten");
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{short}/content.md")),
        "standup moved to ten"
    );
    // Bad TTL fields are refused at close with EINVAL and a reason.
    m.fails(
        WRITER,
        &four_steps(
            "acme/users/alice/memories/events/bad",
            "x",
            r#"{"status":"ACTIVE","expires_at":"2001-01-01T00:00:00Z"}"#,
        ),
        "Invalid argument",
    );
    let why = m.ok(
        WRITER,
        "cat $M/accounts/acme/users/alice/memories/events/bad/.commit-error",
    );
    assert!(why.contains("in the past"), "{why}");
    m.umount_and_fsck();
}

#[test]
fn expiry_survives_a_restart() {
    let mut m = Mount::with_args(Some(CONFIG), &["--no-index", "--sweep-interval", "3600"]);
    m.ok(
        WRITER,
        &four_steps(N, "soon gone", r#"{"status":"ACTIVE","ttl_seconds":2}"#),
    );
    m.umount();
    std::thread::sleep(std::time::Duration::from_millis(2200));
    m.mount();
    m.fails(
        READER,
        &format!("cat $M/accounts/{N}/content.md"),
        "No such file or directory",
    );
    // A new node at the same path replaces the expired one in one commit.
    commit(&m, N, "fresh");
    let meta = m.json(READER, &format!("cat $M/accounts/{N}/.meta.json"));
    assert_eq!(meta["version"], 1);
    assert_eq!(
        m.ok(READER, &format!("ls $M/accounts/{N}/.versions")),
        "1\nredact\nrestore\n"
    );
    m.umount();
    m.fsck();
}

const QUOTA_CONFIG: &str = r#"
[[account]]
id = "acme"
writers = [1001]
readers = [1002]
[account.quota]
bytes = 20000
writes_per_day = 6
searches_per_minute = 3

[[account]]
id = "other"
writers = [1003]
"#;

#[test]
fn quotas_refuse_with_edquot_and_eagain_and_store_nothing() {
    let m = Mount::with_args(Some(QUOTA_CONFIG), &["--embedder", "hash"]);
    let usage =
        |m: &Mount| -> serde_json::Value { m.json(READER, "cat $M/accounts/acme/.ctxfs/usage") };
    commit(&m, N, "green tea");
    let u = usage(&m);
    assert_eq!(u["writes_today"]["used"], 1);
    assert_eq!(u["writes_today"]["limit"], 6);
    let used = u["bytes"]["used"].as_u64().unwrap();
    assert!(used > 9 && used < 2000, "{u}");
    m.fails(
        STRANGER,
        "cat $M/accounts/acme/.ctxfs/usage",
        "Permission denied",
    );

    // A file larger than the quota: EDQUOT at the write, nothing stored.
    let big = "acme/users/alice/memories/prefs/big";
    m.fails(
        WRITER,
        &format!("mkdir -p $M/accounts/{big} && head -c 30000 /dev/zero | tr '\\0' a > $M/accounts/{big}/content.md"),
        "Disk quota exceeded",
    );
    assert_eq!(usage(&m)["bytes"]["used"].as_u64().unwrap(), used);

    // Writes per day: 6 in all (the first commit counted, and an append to
    // a project's activity log: appends count as writes too).
    let log = "$M/accounts/acme/projects/p/activity_log.jsonl";
    m.ok(WRITER, "mkdir -p $M/accounts/acme/projects/p");
    m.ok(WRITER, &format!("echo '{{\"step\": 1}}' >> {log}"));
    assert_eq!(usage(&m)["writes_today"]["used"], 2);
    for i in 0..4 {
        commit(&m, &format!("acme/users/alice/memories/prefs/n{i}"), "x");
    }
    m.fails(
        WRITER,
        &format!("/bin/echo '{{\"step\": 2}}' >> {log}"),
        "Disk quota exceeded",
    );
    m.fails(
        WRITER,
        &four_steps("acme/users/alice/memories/prefs/n9", "x", ACTIVE),
        "Disk quota exceeded",
    );
    let why = m.ok(
        WRITER,
        "cat $M/accounts/acme/users/alice/memories/prefs/n9/.commit-error",
    );
    assert!(why.contains("writes"), "{why}");
    m.fails(
        READER,
        "cat $M/accounts/acme/users/alice/memories/prefs/n9/content.md",
        "No such file or directory",
    );
    // Deletes are never refused by a quota (they free space).
    m.ok(
        WRITER,
        "rm -r $M/accounts/acme/users/alice/memories/prefs/n0",
    );
    // Other accounts are not limited by acme's quota.
    m.ok(
        STRANGER,
        &four_steps("other/users/bob/memories/prefs/x", "fine", ACTIVE),
    );

    // Searches per minute: 3, then EAGAIN with a reason.
    for _ in 0..3 {
        m.ok(READER, "cat \"$M/accounts/acme/.search/tea\" > /dev/null");
    }
    m.fails(
        READER,
        "cat \"$M/accounts/acme/.search/tea\"",
        "Resource temporarily unavailable",
    );
    let metrics = m.ok(0, "cat $M/.ctxfs/metrics");
    for kind in ["bytes", "writes", "searches"] {
        assert!(
            metrics.contains(&format!(
                "ctxfs_quota_denials_total{{account=\"acme\",kind=\"{kind}\"}}"
            )),
            "{kind}: {metrics}"
        );
    }
    m.umount_and_fsck();
}

const TOKEN_CONFIG: &str = r#"
[[account]]
id = "acme"
writers = [1001]
readers = [1002]
[account.quota]
embed_tokens_per_day = 40

[index]
sync_timeout_s = 2
"#;

#[test]
fn embedding_over_budget_is_deferred_not_lost() {
    let m = Mount::with_args(Some(TOKEN_CONFIG), &["--embedder", "hash"]);
    commit(&m, N, "tea");
    m.ok(0, "cat $M/.ctxfs/sync");
    let long = "acme/users/alice/memories/prefs/long";
    commit(&m, long, &"a long text about coffee beans ".repeat(20));
    // The indexer defers the event to tomorrow: sync times out, the event
    // says why, the node itself is committed and readable.
    m.fails(0, "cat $M/.ctxfs/sync", "Connection timed out");
    let ev = m.ok(WRITER, &format!("cat $M/accounts/{long}/.outbox/*.json"));
    assert!(
        ev.contains("DEFERRED") && ev.contains("embed_tokens_per_day"),
        "{ev}"
    );
    assert!(m
        .ok(READER, &format!("cat $M/accounts/{long}/content.md"))
        .contains("coffee"));
    let u = m.json(READER, "cat $M/accounts/acme/.ctxfs/usage");
    assert_eq!(u["embed_tokens_today"]["limit"], 40);
    assert!(
        u["embed_tokens_today"]["used"].as_u64().unwrap() <= 40,
        "{u}"
    );
}

#[test]
fn export_import_round_trip_is_lossless_and_all_or_nothing() {
    let mut m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    commit(&m, N, "green tea");
    commit(&m, N, "green tea, twice a day");
    // Derived summaries and a redacted secret survive the trip.
    m.ok(
        WRITER,
        "set -e; N=$M/accounts/acme/agents/bot/skills/deploy; mkdir -p $N; \
         printf '# Deploy\\nRun make deploy.\\napi_key: sk-abcdefghijklmnopqrstuvwxyz\\n' > $N/content.md; \
         /bin/echo '{\"status\":\"ACTIVE\",\"tags\":[\"ops\"]}' > $N/.meta.json",
    );
    m.ok(
        STRANGER,
        &four_steps("other/users/bob/memories/prefs/x", "bob", ACTIVE),
    );
    // Archived nodes are not exported.
    m.ok(
        WRITER,
        &four_steps(
            "acme/users/alice/memories/prefs/old",
            "old",
            r#"{"status":"ARCHIVED"}"#,
        ),
    );
    m.umount();
    let dir = m.shared_file("x");
    let base = dir.parent().unwrap();
    let out1 = base.join("export1");
    let out2 = base.join("export2");
    let data2 = base.join("data2");
    let data = m.p("../data");
    let run = |args: &[&str]| {
        let o = ctxfs(args);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(&[
        "export",
        "--data",
        data.to_str().unwrap(),
        out1.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("exported 3 node(s)"), "{stdout}");
    let skill = out1.join("accounts/acme/agents/bot/skills/deploy");
    for f in ["content.md", ".abstract.md", ".overview.md", ".meta.json"] {
        assert!(skill.join(f).is_file(), "{f}");
    }
    assert!(!out1
        .join("accounts/acme/users/alice/memories/prefs/old")
        .exists());
    let meta = std::fs::read_to_string(skill.join(".meta.json")).unwrap();
    for field in [
        "\"derived\"",
        "\"redacted\": 1",
        "\"content_hash\"",
        "\"tags\"",
    ] {
        assert!(meta.contains(field), "{field}: {meta}");
    }
    let tea: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out1.join(format!("accounts/{N}/.meta.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(tea["version"], 2);
    // An existing target is refused.
    let (code, _, stderr) = run(&[
        "export",
        "--data",
        data.to_str().unwrap(),
        out1.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("exists"), "{stderr}");

    let (code, stdout, stderr) = run(&[
        "import",
        "--data",
        data2.to_str().unwrap(),
        out1.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("imported 3 node(s)"), "{stdout}");
    run(&["fsck", "--data", data2.to_str().unwrap()]);
    let (code, _, stderr) = run(&[
        "export",
        "--data",
        data2.to_str().unwrap(),
        out2.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let diff = std::process::Command::new("diff")
        .args(["-r", out1.to_str().unwrap(), out2.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        diff.status.success(),
        "round trip differs:\n{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    let fsck = ctxfs(&["fsck", "--data", data2.to_str().unwrap()]);
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );

    // A tree with bad nodes: all reported, nothing imported, store unchanged.
    let bad = base.join("bad");
    std::process::Command::new("cp")
        .args(["-r", out1.to_str().unwrap(), bad.to_str().unwrap()])
        .status()
        .unwrap();
    let b1 = bad.join("accounts/acme/users/alice/memories/prefs/b1");
    std::fs::create_dir_all(&b1).unwrap();
    std::fs::write(b1.join("content.md"), "x").unwrap();
    std::fs::write(b1.join(".meta.json"), "{not json").unwrap();
    let b2 = bad.join("accounts/acme/users/alice/nodes-here/x");
    std::fs::create_dir_all(&b2).unwrap();
    std::fs::write(b2.join("content.md"), "x").unwrap();
    let data3 = base.join("data3");
    let (code, _, stderr) = run(&[
        "import",
        "--data",
        data3.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("prefs/b1: .meta.json is not valid JSON"),
        "{stderr}"
    );
    assert!(stderr.contains("nodes-here/x"), "{stderr}");
    assert!(stderr.contains("nothing imported"), "{stderr}");
    let (code, _, _) = run(&[
        "export",
        "--data",
        data3.to_str().unwrap(),
        base.join("empty").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(
        std::fs::read_dir(base.join("empty/accounts"))
            .unwrap()
            .count(),
        0
    );
    // Into the data dir that already holds them: every node exists.
    let (code, _, stderr) = run(&[
        "import",
        "--data",
        data2.to_str().unwrap(),
        "--skip-bad",
        out1.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("a node exists at this path"), "{stderr}");
    // --skip-bad imports the good ones of the bad tree.
    let (code, stdout, _) = run(&[
        "import",
        "--data",
        data3.to_str().unwrap(),
        "--skip-bad",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(stdout.contains("imported 3 node(s)"), "{stdout}");
    let fsck = ctxfs(&["fsck", "--data", data3.to_str().unwrap()]);
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
}

/// A data dir written by the previous release (format 1 without its
/// marker: `tests/fixtures/data-format1.tar.gz`, made by that release's
/// binary with the commands in `tests/fixtures/README.md`) opens: every
/// node is there with its bytes and its versions, its scratchpad too, the
/// marker is written and fsck is clean. A data dir of a newer format is
/// refused with both format numbers, and nothing in it changes.
#[test]
fn a_data_dir_of_the_previous_release_opens_and_a_newer_one_is_refused() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut m = Mount::prepared(Some(CONFIG), &["--embedder", "hash"], &[], &[]);
    std::fs::create_dir(&m.data).unwrap();
    chmod(&m.data, 0o700);
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(fixtures.join("data-format1.tar.gz"))
        .arg("-C")
        .arg(&m.data)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(!m.data.join("ctxfs.format").exists());
    m.mount();
    let manifest = std::fs::read_to_string(fixtures.join("data-format1.manifest")).unwrap();
    assert_eq!(manifest.lines().count(), 4);
    for line in manifest.lines() {
        let mut f = line.split(' ');
        let (file, sha, versions) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let file = file.trim_start_matches("./");
        let got = m.ok(0, &format!("sha256sum < $M/accounts/{file} | cut -c1-64"));
        assert_eq!(got.trim(), sha, "{file}");
        let dir = file.trim_end_matches("/content.md");
        let n = m.ok(
            0,
            &format!("ls $M/accounts/{dir}/.versions | grep -c '^[0-9]'"),
        );
        assert_eq!(n.trim(), versions, "{dir}");
    }
    assert_eq!(
        m.ok(
            0,
            "cat $M/accounts/acme/users/alice/memories/prefs/tea/.versions/1/content.md"
        ),
        "Sencha."
    );
    assert_eq!(
        m.ok(
            READER,
            "cat $M/accounts/acme/projects/p/scratchpad/notes.txt"
        ),
        "scratch notes\n"
    );
    // Search works over it (the index is rebuilt from the stored documents).
    m.ok(WRITER, "cat $M/.ctxfs/sync >/dev/null");
    let hits = m.ok(READER, "cat \"$M/accounts/acme/.search/brother in Lyon\"");
    assert!(hits.contains("people/bob"), "{hits}");
    m.umount();
    assert_eq!(
        std::fs::read_to_string(m.data.join("ctxfs.format")).unwrap(),
        "ctxfs-data 1\n"
    );
    m.fsck();

    // A newer format: refused, with both numbers; nothing changes.
    std::fs::write(m.data.join("ctxfs.format"), "ctxfs-data 2\n").unwrap();
    let before = std::fs::read(m.data.join("ctxfs.redb")).unwrap();
    let out = m.try_mount();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("has format 2, written by a newer ctxfs; this one reads format 1"),
        "{err}"
    );
    let fsck = ctxfs(&["fsck", "--data", m.data.to_str().unwrap()]);
    assert!(!fsck.status.success());
    assert_eq!(std::fs::read(m.data.join("ctxfs.redb")).unwrap(), before);
}
