//! A hostile tenant cannot hurt the others: each test reproduces an attack
//! as another uid would run it (`setpriv`), and checks the rule that stops it.

use crate::harness::*;

const N: &str = "acme/users/alice/memories/work/w1";

/// A `to_uri` in `.relations.json` is a node place of the writer's own
/// account, parsed with the name rules of paths: traversal, empty segments,
/// spaces, fragments and queries are refused at close and nothing is stored.
#[test]
fn relations_cannot_point_out_of_the_account() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(WRITER, &four_steps(N, "v1", ACTIVE));
    let before = m.ok(
        READER,
        &format!("cat $M/accounts/{N}/.relations.json $M/accounts/{N}/.meta.json"),
    );
    let from = format!("ctx://{N}");
    for (i, to) in [
        "ctx://acme/../globex/users/bob/memories/work/w1",
        "ctx://acme/users/alice/memories/work/../../../../../globex/users/bob/memories/work/w1",
        "ctx://acme//globex/users/bob/memories/work/w1",
        "ctx://acme/users/alice/memories/work/w 2",
        "ctx://acme/users/alice/memories/work/w2#frag?k=1",
        "ctx://acme/users/alice/memories/./work/w2",
    ]
    .iter()
    .enumerate()
    {
        let rel = m.shared_file(&format!("rel{i}.json"));
        std::fs::write(
            &rel,
            format!(r#"[{{"from_uri":"{from}","to_uri":"{to}","relation_type":"related_to"}}]"#),
        )
        .unwrap();
        m.fails(
            WRITER,
            &format!(
                "cp {} $M/accounts/{N}/.relations.json && /bin/echo '{ACTIVE}' > $M/accounts/{N}/.meta.json",
                rel.display()
            ),
            "Invalid argument",
        );
        let why = m.ok(WRITER, &format!("cat $M/accounts/{N}/.commit-error"));
        assert!(why.contains("to_uri"), "{to}: {why}");
    }
    // The committed version is untouched, and a good edge still commits.
    assert_eq!(
        m.ok(
            READER,
            &format!("cat $M/accounts/{N}/.relations.json $M/accounts/{N}/.meta.json")
        ),
        before
    );
    let good = m.shared_file("good.json");
    std::fs::write(
        &good,
        format!(r#"[{{"from_uri":"{from}","to_uri":"ctx://acme/users/alice/memories/work/w2","relation_type":"related_to"}}]"#),
    )
    .unwrap();
    m.ok(
        WRITER,
        &format!(
            "cp {} $M/accounts/{N}/.relations.json && /bin/echo '{ACTIVE}' > $M/accounts/{N}/.meta.json",
            good.display()
        ),
    );
    assert!(m
        .ok(READER, &format!("cat $M/accounts/{N}/.relations.json"))
        .contains("memories/work/w2"));
    m.umount_and_fsck();
}

/// `.ctxfs/status` and `.ctxfs/metrics` show each caller only what it may
/// see: readers no drafts (PENDING, uncommitted edits) and no BROKEN count;
/// a uid in no account nothing of anyone; daemon-wide activity only root.
#[test]
fn status_shows_each_caller_only_what_it_may_see() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(WRITER, &four_steps(N, "v1", ACTIVE));
    // A PENDING node and an uncommitted edit of the committed one.
    m.ok(
        WRITER,
        "mkdir -p $M/accounts/acme/users/alice/memories/work/wip && echo x > $M/accounts/acme/users/alice/memories/work/wip/content.md",
    );
    m.ok(WRITER, &format!("echo v2 > $M/accounts/{N}/content.md"));
    let status = |uid: u32| m.json(uid, "cat $M/.ctxfs/status");
    let w = status(WRITER);
    assert_eq!(
        (
            w["nodes"]["ACTIVE"].as_i64(),
            w["nodes"]["PENDING"].as_i64()
        ),
        (Some(1), Some(1)),
        "{w}"
    );
    assert_eq!(w["uncommitted_edits"], 1, "{w}");
    let r = status(READER);
    assert_eq!(r["nodes"]["ACTIVE"], 1, "{r}");
    assert_eq!(r["nodes"]["PENDING"], 0, "{r}");
    assert_eq!(r["nodes"]["BROKEN"], 0, "{r}");
    assert_eq!(r["uncommitted_edits"], 0, "{r}");
    let nobody = status(NOBODY);
    assert_eq!(nobody["nodes"]["ACTIVE"], 0, "{nobody}");
    assert!(nobody["index_lag_ms"].is_null(), "{nobody}");
    for s in [&w, &r, &nobody] {
        for daemon_wide in ["commits", "commit_failures", "inodes"] {
            assert!(s.get(daemon_wide).is_none(), "{daemon_wide} in {s}");
        }
    }
    let root = status(0);
    assert!(root["commits"].as_u64().unwrap() >= 1, "{root}");
    assert_eq!(root["nodes"]["PENDING"], 1, "{root}");
}

/// A read of `.ctxfs/sync` holds a FUSE worker while it waits, so a uid in
/// no account gets EACCES at once, and at most a few reads wait at a time
/// (2 per uid, 4 in the daemon); the others get EAGAIN at once. Before: 20
/// reads by a stranger held every worker, and other tenants' `stat` took
/// seconds.
#[test]
fn sync_readers_cannot_hold_the_workers() {
    // An embedder that refuses every connection: the event stays pending
    // (retried a minute later), so a sync waits for its whole timeout.
    let config = format!(
        "{CONFIG}\n[index]\nembedder = \"http\"\nhttp_url = \"http://127.0.0.1:9/v1/embeddings\"\n\
         http_model = \"m\"\nhttp_dim = 16\nmax_retries = 100\nretry_backoff_ms = 60000\nsync_timeout_s = 4\n"
    );
    let m = Mount::with_args(Some(&config), &[]);
    m.ok(WRITER, &four_steps(N, "pending forever", ACTIVE));
    m.fails(NOBODY, "cat $M/.ctxfs/sync", "Permission denied");
    let strangers: Vec<_> = (0..20)
        .map(|_| m.spawn_piped(NOBODY, "cat $M/.ctxfs/sync 2>&1; echo rc=$?"))
        .collect();
    let writers: Vec<_> = (0..6)
        .map(|_| m.spawn_piped(WRITER, "cat $M/.ctxfs/sync 2>&1; echo rc=$?"))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Another account's writer is served at once while syncs wait.
    let t = std::time::Instant::now();
    m.ok(
        STRANGER,
        "ls $M/accounts/other >/dev/null; stat $M/accounts >/dev/null",
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "stat took {:?}",
        t.elapsed()
    );
    for c in strangers {
        let out = String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).into_owned();
        assert!(out.contains("Permission denied"), "{out}");
    }
    let outs: Vec<String> = writers
        .into_iter()
        .map(|c| String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).into_owned())
        .collect();
    let waited = outs.iter().filter(|o| o.contains("timed out")).count();
    let refused = outs
        .iter()
        .filter(|o| o.contains("Resource temporarily unavailable"))
        .count();
    assert_eq!((waited, refused), (2, 4), "{outs:?}");
}

/// Ctrl-C ends a waiting read of `.ctxfs/sync` at once (the kernel waits
/// out a request the daemon holds even through a fatal signal, so the
/// daemon looks for the signal itself). Before: `cat .ctxfs/sync` sat
/// through Ctrl-C until its timeout.
#[test]
fn ctrl_c_ends_a_waiting_sync() {
    let config = format!(
        "{CONFIG}\n[index]\nembedder = \"http\"\nhttp_url = \"http://127.0.0.1:9/v1/embeddings\"\n\
         http_model = \"m\"\nhttp_dim = 16\nmax_retries = 100\nretry_backoff_ms = 60000\nsync_timeout_s = 60\n"
    );
    let m = Mount::with_args(Some(&config), &[]);
    m.ok(WRITER, &four_steps(N, "pending forever", ACTIVE));
    let mut cat = m.spawn_as(WRITER, "exec cat $M/.ctxfs/sync");
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert!(cat.try_wait().unwrap().is_none(), "the sync did not wait");
    unsafe { libc::kill(cat.id() as i32, libc::SIGINT) };
    let gone = within(std::time::Duration::from_secs(3), || {
        cat.try_wait().unwrap().is_some()
    });
    assert!(gone.is_some(), "cat .ctxfs/sync ignored Ctrl-C");
}

/// A writer cannot fill the disk through the daemon's log: client text in a
/// refusal is cut to a short escaped excerpt (in the log and in
/// `.commit-error`), refusals are logged at most 10 a minute per account,
/// and the log file has a size limit past which it rotates. Before: 3 s of
/// refused commits with a 65,000-byte status grew the log by ~464 MB.
#[test]
fn refused_commits_cannot_flood_the_log() {
    let m = Mount::with_env(
        Some(CONFIG),
        &["--no-index"],
        &[("CTXFS_LOG_MAX_BYTES", "100000"), ("RUST_LOG", "info")],
    );
    m.ok(WRITER, &four_steps(N, "v1", ACTIVE));
    let log = m.data.join("ctxfs.log");
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let before = size(&log);
    let py = r#"
import errno, json, sys
meta = sys.argv[1]
status = "B" * 60000 + "\u001b[2J\n"
refused = 0
for i in range(300):
    try:
        with open(meta, "w") as f:
            f.write(json.dumps({"status": status}))
    except OSError as e:
        assert e.errno == errno.EINVAL, e
        refused += 1
print(refused)
"#;
    let script = m.shared_file("flood.py");
    std::fs::write(&script, py).unwrap();
    let out = m.ok(
        WRITER,
        &format!(
            "/usr/bin/python3 {} $M/accounts/{N}/.meta.json",
            script.display()
        ),
    );
    assert_eq!(out.trim(), "300");
    let why = m.ok(WRITER, &format!("cat $M/accounts/{N}/.commit-error"));
    assert!(why.len() < 300, "{} bytes: {why}", why.len());
    assert!(why.contains("bytes)") && !why.contains('\u{1b}'), "{why}");
    let grown = size(&log) + size(&m.data.join("ctxfs.log.1")) - before;
    assert!(grown < 20_000, "the log grew by {grown} bytes");
    // Every refusal is still counted.
    let metrics = m.ok(0, "cat $M/.ctxfs/metrics");
    let failures: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ctxfs_commit_failures_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(failures >= 300.0, "{failures}");
    // The committed version is untouched.
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N}/content.md")),
        "v1"
    );
    // The size limit: a debug-level daemon logs every request; its log
    // rotates and stays within the limit.
    let mut m = m;
    m.umount();
    m.env = vec![
        ("CTXFS_LOG_MAX_BYTES".into(), "100000".into()),
        ("RUST_LOG".into(), "debug".into()),
    ];
    m.mount();
    m.ok(WRITER, "for i in $(seq 1 300); do ls $M/accounts/acme/users/alice/memories/work/nope 2>/dev/null; done; true");
    assert!(size(&log) <= 100_000, "{}", size(&log));
    assert!(
        size(&m.data.join("ctxfs.log.1")) > 0,
        "the log never rotated"
    );
}

/// Two processes of one uid listing one directory while a writer deletes
/// half of it: every entry present for the whole listing appears exactly
/// once in every listing. Before: a second lister replaced the first one's
/// snapshot and continuation offsets indexed into it, so up to 161 of 537
/// listings missed a node that was never deleted, and some held duplicates.
#[test]
fn concurrent_listings_skip_and_repeat_nothing() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    let dir = "acme/users/alice/memories/many";
    let make = r#"
import os, sys
root = sys.argv[1]
for i in range(3000):
    n = os.path.join(root, f"n{i:05d}")
    os.makedirs(n)
    for f, b in (("content.md", f"node {i}"), (".meta.json", '{"status":"ACTIVE"}')):
        with open(os.path.join(n, f), "w") as fh:
            fh.write(b)
"#;
    let list = r#"
import os, sys
root, rounds = sys.argv[1], int(sys.argv[2])
keep = {f"n{i:05d}" for i in range(1, 3000, 2)}
bad = 0
for _ in range(rounds):
    names = os.listdir(root)
    if len(names) != len(set(names)) or not keep <= set(names):
        bad += 1
print(bad)
"#;
    let delete = r#"
import os, shutil, sys
root = sys.argv[1]
for i in range(0, 3000, 2):
    shutil.rmtree(os.path.join(root, f"n{i:05d}"))
"#;
    let (mk, ls, rm) = (
        m.shared_file("make.py"),
        m.shared_file("list.py"),
        m.shared_file("delete.py"),
    );
    std::fs::write(&mk, make).unwrap();
    std::fs::write(&ls, list).unwrap();
    std::fs::write(&rm, delete).unwrap();
    m.ok(
        WRITER,
        &format!("/usr/bin/python3 {} $M/accounts/{dir}", mk.display()),
    );
    let listers: Vec<_> = (0..2)
        .map(|_| {
            m.spawn_piped(
                WRITER,
                &format!("/usr/bin/python3 {} $M/accounts/{dir} 60", ls.display()),
            )
        })
        .collect();
    m.ok(
        WRITER,
        &format!("/usr/bin/python3 {} $M/accounts/{dir}", rm.display()),
    );
    for l in listers {
        let out = l.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(text.trim(), "0", "listings that skipped or repeated a node");
    }
    let left = m.ok(READER, &format!("ls $M/accounts/{dir} | wc -l"));
    assert_eq!(left.trim(), "1500");
}

/// The daemon's resident memory of the `ctxfs` daemon, in bytes.
fn rss(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// Uncommitted bytes are bounded: an account's drafts count against its byte
/// quota (EDQUOT), and every draft and open scratchpad file against the
/// daemon's draft memory (ENOSPC), quota or not. Before: with `bytes =
/// 10000000` one writer held 11 × 9 MB draft files; without a quota, 8 × 64
/// MiB temp files took the daemon's RSS from 564 MB to 1.18 GB.
#[test]
fn drafts_cannot_grow_daemon_memory_without_bound() {
    let config = "[[account]]\nid = \"acme\"\nwriters = [1001]\nreaders = [1002]\n\
                  [account.quota]\nbytes = 10000000\n\
                  [[account]]\nid = \"other\"\nwriters = [1003]\n";
    let m = Mount::with_args(Some(config), &["--no-index", "--draft-memory-mb", "64"]);
    m.ok(WRITER, &four_steps(N, "v1", ACTIVE));
    let n = format!("$M/accounts/{N}");
    m.ok(WRITER, &format!("head -c 6000000 /dev/zero > {n}/tmp1"));
    m.fails(
        WRITER,
        &format!("head -c 6000000 /dev/zero > {n}/tmp2"),
        "Disk quota exceeded",
    );
    // Removing a draft file gives its bytes back.
    m.ok(
        WRITER,
        &format!("rm {n}/tmp1 {n}/tmp2 && head -c 6000000 /dev/zero > {n}/tmp3"),
    );
    // No quota: the daemon's draft memory (64 MiB here) still holds.
    let pid = m.daemon_pid();
    let before = rss(pid);
    let o = "$M/accounts/other/users/bob/memories/work/big";
    let out = m.ok(
        STRANGER,
        &format!(
            "mkdir -p {o}; for i in 1 2 3 4 5 6 7 8; do head -c 67108864 /dev/zero 2>&1 > {o}/t$i || true; done"
        ),
    );
    let refused = out.matches("No space left on device").count();
    assert!(refused >= 7, "{out}");
    let grown = rss(pid).saturating_sub(before);
    assert!(grown < 200 << 20, "RSS grew by {} MiB", grown >> 20);
    // The space comes back when the drafts go.
    m.ok(STRANGER, &format!("rm -r {o}"));
    m.ok(
        STRANGER,
        &format!("mkdir -p {o} && head -c 30000000 /dev/zero > {o}/again"),
    );
    eprintln!(
        "RSS {} MiB before the attack, +{} MiB after",
        before >> 20,
        grown >> 20
    );
    m.ok(STRANGER, &format!("rm -r {o}"));
    // Open batch handles buffer their bytes until close: they count in the
    // same memory. Before: 8 open batches of 64 MiB took the daemon from
    // 44 MB to 646 MB under a 64 MiB cap.
    let script = m.shared_file("batches.py");
    std::fs::write(
        &script,
        r#"
import os, sys
path = sys.argv[1]
fds, refused = [], 0
for i in range(8):
    fd = os.open(path, os.O_WRONLY)
    fds.append(fd)
    try:
        os.write(fd, b" " * (16 << 20))
    except OSError as e:
        refused += 1
        print("refused", e.errno)
print("refused", refused)
"#,
    )
    .unwrap();
    let before = rss(pid);
    let out = m.ok(
        STRANGER,
        &format!(
            "/usr/bin/python3 {} $M/accounts/other/.ctxfs/batch",
            script.display()
        ),
    );
    assert!(out.contains("refused 28"), "{out}");
    // One account holds at most half of the draft memory: while the other
    // tenant's batches hold theirs, this one still writes.
    let held = m.spawn_as(
        STRANGER,
        "exec /usr/bin/python3 -c 'import os,time\nfd=os.open(\"'$M'/accounts/other/.ctxfs/batch\", os.O_WRONLY)\ntry:\n  for i in range(60): os.write(fd, b\" \" * (1 << 20))\nexcept OSError: pass\ntime.sleep(3)'",
    );
    std::thread::sleep(std::time::Duration::from_millis(800));
    m.ok(WRITER, &format!("head -c 3000000 /dev/zero > {n}/tmp4"));
    let _ = held.wait_with_output();
    let grown = rss(pid).saturating_sub(before);
    assert!(
        grown < 150 << 20,
        "open batches grew RSS by {} MiB",
        grown >> 20
    );
}

/// Where the code and SEMANTICS disagreed, both now say the same: a
/// configured account is never removed (EPERM, empty or not); reserved names
/// are refused; a restore written in two writes is applied once; a search
/// option given twice is refused; and uid 0 can remove a project whose
/// activity log only grows.
#[test]
fn refusals_match_the_docs() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(WRITER, &four_steps(N, "first", ACTIVE));
    m.ok(
        WRITER,
        &format!("printf second > $M/accounts/{N}/content.md && /bin/echo '{ACTIVE}' > $M/accounts/{N}/.meta.json"),
    );
    m.fails(0, "rmdir $M/accounts/acme", "Operation not permitted");
    m.fails(0, "rmdir $M/accounts/other", "Operation not permitted");
    m.fails(
        WRITER,
        &format!("echo x > $M/accounts/{N}/.commit-error"),
        "Operation not permitted",
    );
    m.fails(
        WRITER,
        &format!("echo x > $M/accounts/{N}/.outbox"),
        "Is a directory",
    );
    // A restore in two writes: applied once, at the end of the line.
    let py = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"1")
os.write(fd, b"\n")
os.close(fd)
"#;
    let script = m.shared_file("restore.py");
    std::fs::write(&script, py).unwrap();
    m.ok(
        WRITER,
        &format!(
            "/usr/bin/python3 {} $M/accounts/{N}/.versions/restore",
            script.display()
        ),
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N}/content.md")),
        "first"
    );
    let meta = m.json(READER, &format!("cat $M/accounts/{N}/.meta.json"));
    assert_eq!(
        (meta["version"].as_u64(), meta["restored_from"].as_u64()),
        (Some(3), Some(1))
    );
    // Without a newline, the restore happens at close.
    m.ok(
        WRITER,
        &format!("printf 2 > $M/accounts/{N}/.versions/restore"),
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N}/content.md")),
        "second"
    );
    m.fails(
        READER,
        "cat \"$M/accounts/acme/.search/first?k=1&k=2\"",
        "Invalid argument",
    );
    // The activity log only grows, but root can remove a whole project.
    let p = "$M/accounts/acme/projects/launch";
    m.ok(WRITER, &format!("mkdir -p {p} && echo '{{\"e\":1}}' >> {p}/activity_log.jsonl && echo plan > {p}/scratchpad/plan.md"));
    m.fails(
        WRITER,
        &format!("rm {p}/activity_log.jsonl"),
        "Operation not permitted",
    );
    m.fails(WRITER, &format!("rmdir {p}"), "Directory not empty");
    m.ok(0, &format!("rm -r {p}"));
    assert_eq!(m.ok(READER, "ls $M/accounts/acme/projects"), "");
    m.umount_and_fsck();
}

/// The files under `dir` (recursively) whose bytes hold `text`.
fn files_holding(dir: &std::path::Path, text: &str) -> Vec<std::path::PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|f| {
            let b = std::fs::read(f).unwrap();
            b.windows(text.len()).any(|w| w == text.as_bytes())
        })
        .collect()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Deletes really forget: once the indexer has applied a delete and
/// `ctxfs compact` has run, no file of the data dir holds the deleted
/// node's text (not redb's freed pages, the log, graph dumps, vectors,
/// dead letters or the daemon's log), and what was kept is intact.
#[test]
fn a_deleted_node_is_forgotten_after_compact() {
    let mut m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let marker = "zqxjvkwmarker";
    let gone = "acme/users/alice/memories/work/secret";
    m.ok(WRITER, &four_steps(N, "kept text about trains", ACTIVE));
    m.ok(
        WRITER,
        &four_steps(gone, &format!("the code is {marker} keep it"), ACTIVE),
    );
    // A large version (its blob spans redb pages) that redb has made
    // durable before the delete: the bytes are on disk.
    let big = format!("{marker} ").repeat(4000);
    let big_file = m.shared_file("big.md");
    std::fs::write(&big_file, &big).unwrap();
    m.ok(
        WRITER,
        &format!(
            "cp {} $M/accounts/{gone}/content.md && /bin/echo '{ACTIVE}' > $M/accounts/{gone}/.meta.json",
            big_file.display()
        ),
    );
    // A second version holds it too, and a derived abstract.
    m.ok(
        WRITER,
        &format!(
            "printf 'second {marker} version' > $M/accounts/{gone}/content.md && rm $M/accounts/{gone}/.abstract.md && /bin/echo '{ACTIVE}' > $M/accounts/{gone}/.meta.json"
        ),
    );
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    assert!(m
        .ok(
            WRITER,
            &format!("cat \"$M/accounts/acme/.search/{marker}\"")
        )
        .contains("secret"));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    m.ok(WRITER, &format!("rm -r $M/accounts/{gone}"));
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    m.umount();
    let before = files_holding(&m.data, marker);
    // The premise: without the step, redb's freed pages still hold it.
    assert!(
        !before.is_empty(),
        "the deleted text was not on disk to begin with"
    );
    let data = m.data.to_str().unwrap().to_string();
    let out = ctxfs(&["compact", "--data", &data]);
    assert!(
        out.status.success(),
        "compact: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = files_holding(&m.data, marker);
    assert!(
        after.is_empty(),
        "still holding the deleted text: {after:?}"
    );
    m.fsck();
    m.mount();
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N}/content.md")),
        "kept text about trains"
    );
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    assert!(m
        .ok(READER, "cat \"$M/accounts/acme/.search/trains\"")
        .contains("work/w1"));
}

/// An administrator deletes one user's memory, then a whole account, each in
/// one command and one transaction, with a count of what went; the index
/// forgets them at the next mount, and `ctxfs compact` leaves no trace.
#[test]
fn admin_deletes_a_user_or_an_account_in_one_command() {
    let mut m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let marker = "wqpzkdeletedmarker";
    for (node, text) in [
        (
            "acme/users/alice/memories/work/a1",
            format!("alice one {marker}"),
        ),
        (
            "acme/users/alice/memories/prefs/a2",
            format!("alice two {marker}"),
        ),
        (
            "acme/users/bob/memories/work/b1",
            "bob keeps this".to_string(),
        ),
    ] {
        m.ok(WRITER, &four_steps(node, &text, ACTIVE));
    }
    let p = "$M/accounts/acme/projects/launch";
    m.ok(WRITER, &format!("mkdir -p {p} && echo plan > {p}/scratchpad/plan.md && echo '{{}}' >> {p}/activity_log.jsonl"));
    m.ok(WRITER, "mkdir -p $M/accounts/acme/users/alice/memories/work/wip && echo draft > $M/accounts/acme/users/alice/memories/work/wip/content.md");
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    m.umount();
    let data = m.data.to_str().unwrap().to_string();
    let out = ctxfs(&[
        "delete",
        "--data",
        &data,
        "--account",
        "acme",
        "--user",
        "alice",
    ]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("2 node(s)") && said.contains("1 draft(s)"),
        "{said}"
    );
    m.fsck();
    m.mount();
    assert_eq!(m.ok(READER, "ls $M/accounts/acme/users"), "bob\n");
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    let hits = m.ok(
        READER,
        &format!("cat \"$M/accounts/acme/.search/{marker}\""),
    );
    assert!(!hits.contains("alice"), "{hits}");
    assert_eq!(
        m.ok(
            READER,
            "cat $M/accounts/acme/users/bob/memories/work/b1/content.md"
        ),
        "bob keeps this"
    );
    m.umount();
    let out = ctxfs(&["delete", "--data", &data, "--account", "acme"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains("1 node(s)") && said.contains("0 conversation(s), 2 other record(s)"),
        "{said}"
    );
    let out = ctxfs(&[
        "delete",
        "--data",
        &data,
        "--account",
        "acme",
        "--user",
        "../x",
    ]);
    assert!(!out.status.success());
    m.fsck();
    m.mount();
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    assert_eq!(
        m.ok(
            READER,
            "ls $M/accounts/acme/users $M/accounts/acme/projects"
        ),
        "$M/accounts/acme/projects:\n\n$M/accounts/acme/users:\n"
            .replace("$M", m.mnt.to_str().unwrap())
            .as_str()
    );
    m.umount();
    assert!(ctxfs(&["compact", "--data", &data]).status.success());
    let left = files_holding(&m.data, marker);
    assert!(left.is_empty(), "still holding deleted text: {left:?}");
}

/// A writer redacts an earlier version that holds a secret: its files
/// become a tombstone, the current version stays, and after `ctxfs compact`
/// no file of the data dir holds the secret.
#[test]
fn a_version_can_be_redacted() {
    let mut m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let secret = "pinzkq4471marker";
    m.ok(
        WRITER,
        &four_steps(N, &format!("my pin is {secret}"), ACTIVE),
    );
    m.ok(
        WRITER,
        &format!("printf 'pin removed' > $M/accounts/{N}/content.md && /bin/echo '{ACTIVE}' > $M/accounts/{N}/.meta.json"),
    );
    let v = format!("$M/accounts/{N}/.versions");
    m.fails(
        READER,
        &format!("/bin/echo 1 > {v}/redact"),
        "Read-only file system",
    );
    m.fails(
        WRITER,
        &format!("/bin/echo 2 > {v}/redact"),
        "Invalid argument",
    );
    m.ok(WRITER, &format!("/bin/echo 1 > {v}/redact"));
    assert_eq!(
        m.ok(READER, &format!("cat {v}/1/content.md")),
        "[REDACTED]\n"
    );
    let meta = m.json(READER, &format!("cat {v}/1/.meta.json"));
    assert_eq!(meta["redacted_version"], true, "{meta}");
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N}/content.md")),
        "pin removed"
    );
    // Twice is the same as once.
    m.ok(WRITER, &format!("/bin/echo 1 > {v}/redact"));
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    m.umount();
    m.fsck();
    let data = m.data.to_str().unwrap().to_string();
    assert!(ctxfs(&["compact", "--data", &data]).status.success());
    let left = files_holding(&m.data, secret);
    assert!(left.is_empty(), "still holding the secret: {left:?}");
    m.fsck();
    m.mount();
    assert_eq!(m.ok(READER, &format!("ls {v}")), "1\n2\nredact\nrestore\n");
}
