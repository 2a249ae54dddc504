//! The commit point through the mount: the four-step write, what readers
//! and writers see before and after a commit, refusals at close, ordinary
//! tools writing drafts, and the kernel's caches around commits.

use crate::harness::*;
use std::time::Duration;

const N1: &str = "acme/users/alice/memories/events/e1";

#[test]
fn four_step_commit_fills_derived_fields() {
    // No indexer: the events stay in the outbox to be looked at.
    let m = Mount::without_index();
    m.ok(
        0,
        &four_steps(N1, "hello world", r#"{"status":"ACTIVE","tags":["t1"]}"#),
    );
    let meta = m.ok(0, &format!("cat $M/accounts/{N1}/.meta.json"));
    let v: serde_json::Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(v["uri"], "ctx://acme/users/alice/memories/events/e1");
    assert_eq!(v["owner_space"], "user:alice");
    assert_eq!(v["version"], 1);
    assert_eq!(v["status"], "ACTIVE");
    assert_eq!(v["tags"][0], "t1");
    assert!(v["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(v["created_at"], v["updated_at"]);
    assert_eq!(
        m.ok(0, &format!("cat $M/accounts/{N1}/content.md")),
        "hello world"
    );
    // Listing order follows the write protocol, so cp -r writes .meta.json last.
    assert_eq!(
        m.ok(0, &format!("ls -U -A $M/accounts/{N1}")),
        "content.md\n.relations.json\n.abstract.md\n.overview.md\n.meta.json\n"
    );
    // An update is version 2 and keeps created_at.
    m.ok(0, &format!("echo 'v2' > $M/accounts/{N1}/content.md && /bin/echo '{ACTIVE}' > $M/accounts/{N1}/.meta.json"));
    let v2: serde_json::Value =
        serde_json::from_str(&m.ok(0, &format!("cat $M/accounts/{N1}/.meta.json"))).unwrap();
    assert_eq!(v2["version"], 2);
    assert_eq!(v2["created_at"], v["created_at"]);
    // The outbox shows the events, read-only and not listed in the node.
    let events = m.ok(0, &format!("ls $M/accounts/{N1}/.outbox/"));
    assert!(
        events.lines().filter(|l| l.ends_with(".json")).count() >= 2,
        "{events}"
    );
    let first = events.lines().next().unwrap();
    let ev = m.ok(0, &format!("cat $M/accounts/{N1}/.outbox/{first}"));
    assert!(ev.contains("UPSERT_CONTEXT"), "{ev}");
    m.fails(0, &format!("echo x > $M/accounts/{N1}/.outbox/{first}"), "");
    m.fails(0, &format!("rm $M/accounts/{N1}/.outbox/{first}"), "");
    let status = m.ok(0, "cat $M/.ctxfs/status");
    let s: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(s["nodes"]["ACTIVE"], 1);
    assert!(s["outbox_depth"].as_i64().unwrap() >= 3);
    drop(m);
}

#[test]
fn reader_never_sees_pending_node_or_draft() {
    let m = Mount::with_config(Some(CONFIG));
    m.ok(
        WRITER,
        "mkdir -p $M/accounts/acme/users/alice/memories/events",
    );
    // A reader polls the node while the writer goes through the four steps slowly.
    let log = m.shared_file("poll.log");
    // Every observation carries the time it was made (ns since the epoch).
    let poll = format!(
        "N=$M/accounts/{N1}; end=$(( $(date +%s) + 30 )); \
         while [ $(date +%s) -lt $end ]; do \
           if ls $N >/dev/null 2>&1; then \
             echo \"$(date +%s%N) seen $(ls -U -A $N | tr '\\n' ' ')|$(cat $N/content.md 2>/dev/null)|$(grep -c ACTIVE $N/.meta.json 2>/dev/null)\"; \
           else echo \"$(date +%s%N) absent\"; fi; \
           ls $M/accounts/acme/users/alice/memories/events | grep -q e1 && echo \"$(date +%s%N) listed\"; \
           grep -rl secret-draft $M/accounts/acme 2>/dev/null | sed \"s/^/$(date +%s%N) grep:/\"; \
           find $M/accounts/acme -name content.md | sed \"s/^/$(date +%s%N) find:/\"; \
         done > {log}",
        log = log.display()
    );
    let mut reader = m.spawn_as(READER, &poll);
    std::thread::sleep(Duration::from_millis(300));
    let steps = [
        format!("mkdir -p $M/accounts/{N1}"),
        format!("echo 'secret-draft content' > $M/accounts/{N1}/content.md"),
        format!("echo '[]' > $M/accounts/{N1}/.relations.json"),
        format!(
            "echo 'abs' > $M/accounts/{N1}/.abstract.md && echo ov > $M/accounts/{N1}/.overview.md"
        ),
        format!("echo '{{\"status\":\"PENDING\"}}' > $M/accounts/{N1}/.meta.json"),
    ];
    for s in &steps {
        m.ok(WRITER, s);
        // The writer reaches its own draft by path.
        assert!(
            m.ok(WRITER, &format!("ls -A $M/accounts/{N1}"))
                .contains("content.md")
                || s.starts_with("mkdir")
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The writer's own listing of the category does not show a PENDING node either.
    assert!(!m
        .ok(WRITER, "ls $M/accounts/acme/users/alice/memories/events")
        .contains("e1"));
    let commit_start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    m.ok(
        WRITER,
        &format!("/bin/echo '{ACTIVE}' > $M/accounts/{N1}/.meta.json"),
    );
    std::thread::sleep(Duration::from_millis(600));
    // Let the poller end.
    let _ = reader.kill();
    let _ = reader.wait();
    let out = std::fs::read_to_string(&log).unwrap();
    let mut seen_after = false;
    for line in out.lines() {
        let (ts, what) = line.split_once(' ').unwrap();
        let ts: u128 = ts.parse().unwrap();
        if what == "absent" {
            continue;
        }
        // Nothing of the node, in any form, before the commit began.
        assert!(ts >= commit_start, "observed before the commit: {line}");
        if let Some(rest) = what.strip_prefix("seen ") {
            // Every observation of the node is the complete committed version.
            assert_eq!(
                rest,
                "content.md .relations.json .abstract.md .overview.md .meta.json |secret-draft content|1",
                "reader saw a partial node: {line}"
            );
            seen_after = true;
        }
    }
    assert!(out.contains("absent"), "poller never ran before the commit");
    assert!(seen_after, "reader never saw the committed node:\n{out}");
}

/// Committed entries stay in the kernel's cache for minutes, so a name a
/// draft takes over must not be cached for anyone: after a reader looked the
/// file up again, the writer's `stat` still shows its draft (and a file it
/// deleted in its draft stays gone for it), the reader's the committed file.
#[test]
fn a_reader_lookup_does_not_hide_the_writers_draft() {
    let m = Mount::with_config(Some(CONFIG));
    let n = format!("$M/accounts/{N1}");
    m.ok(WRITER, &four_steps(N1, "version one", ACTIVE));
    let size = |uid: u32, f: &str| m.ok(uid, &format!("stat -c %s {n}/{f}"));
    assert_eq!(size(READER, "content.md"), "11\n");
    m.ok(
        WRITER,
        &format!("echo ' and more' >> {n}/content.md; rm {n}/.overview.md"),
    );
    for _ in 0..3 {
        assert_eq!(size(READER, "content.md"), "11\n");
        assert_eq!(size(WRITER, "content.md"), "21\n");
        m.ok(READER, &format!("test -f {n}/.overview.md"));
        m.fails(WRITER, &format!("stat {n}/.overview.md"), "No such file");
    }
    // After the commit, everyone meets the new version (whose overview the
    // daemon derives, the writer having deleted it).
    m.ok(WRITER, &format!("/bin/echo '{ACTIVE}' > {n}/.meta.json"));
    assert_eq!(size(READER, "content.md"), "21\n");
    let overview = |uid: u32| {
        m.ok(
            uid,
            &format!("stat -c %i:%s {n}/.overview.md; cat {n}/.overview.md"),
        )
    };
    assert_eq!(overview(READER), overview(WRITER));
}

#[test]
fn update_is_invisible_until_commit() {
    let m = Mount::with_config(Some(CONFIG));
    m.ok(WRITER, &four_steps(N1, "version one", ACTIVE));
    m.ok(WRITER, &format!("echo 'version two' > $M/accounts/{N1}/content.md; echo 'new abstract' > $M/accounts/{N1}/.abstract.md"));
    // The writer sees its draft; a reader still sees version 1, whole.
    assert_eq!(
        m.ok(WRITER, &format!("cat $M/accounts/{N1}/content.md")),
        "version two\n"
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N1}/content.md")),
        "version one"
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N1}/.abstract.md")),
        format!("abstract of {N1}\n")
    );
    assert_eq!(
        m.ok(READER, &format!("stat -c %s $M/accounts/{N1}/content.md")),
        "11\n"
    );
    assert!(m
        .ok(READER, "grep -r 'version' $M/accounts/acme")
        .contains("version one"));
    assert!(!m
        .ok(READER, "grep -r 'version' $M/accounts/acme")
        .contains("version two"));
    // A reader holding the file open across the commit keeps reading version 1.
    let held = m.shared_file("held");
    let script = format!(
        "exec 3< $M/accounts/{N1}/content.md; head -c 4 <&3 > {h}; sleep 1; cat <&3 >> {h}",
        h = held.display()
    );
    let mut r = m.spawn_as(READER, &script);
    std::thread::sleep(Duration::from_millis(300));
    m.ok(
        WRITER,
        &format!("/bin/echo '{ACTIVE}' > $M/accounts/{N1}/.meta.json"),
    );
    assert!(r.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(&held).unwrap(), "version one");
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N1}/content.md")),
        "version two\n"
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N1}/.abstract.md")),
        "new abstract\n"
    );
    assert!(m
        .ok(READER, &format!("cat $M/accounts/{N1}/.meta.json"))
        .contains("\"version\": 2"));
}

#[test]
fn invalid_commits_fail_at_close_and_keep_state() {
    let m = Mount::new();
    let n = format!("$M/accounts/{N1}");
    // No content.md: refused.
    m.ok(0, &format!("mkdir -p {n}"));
    m.fails(
        0,
        &format!("/bin/echo '{ACTIVE}' > {n}/.meta.json"),
        "Invalid argument",
    );
    assert!(m
        .ok(0, &format!("cat {n}/.commit-error"))
        .contains("content.md is missing"));
    assert!(!m
        .ok(0, "ls $M/accounts/acme/users/alice/memories/events")
        .contains("e1"));
    // Now a good version 1.
    m.ok(0, &four_steps(N1, "good", ACTIVE));
    assert!(m.sh(0, &format!("cat {n}/.commit-error")).status.code() != Some(0));
    let bad: &[(&str, &str, &str)] = &[
        (".meta.json", "{not json", "not valid JSON"),
        (".meta.json", "[1,2]", "JSON object"),
        (".meta.json", r#"{"status":"BROKEN"}"#, "may not be set"),
        (".abstract.md", &"x".repeat(101), "at most 100"),
        (".relations.json", "{}", "list of edges"),
        (
            ".relations.json",
            r#"[{"from_uri":"ctx://acme/users/bob/memories/x/y","to_uri":"ctx://acme/a/b","relation_type":"r"}]"#,
            "not this node",
        ),
        (
            ".relations.json",
            r#"[{"from_uri":"ctx://acme/users/alice/memories/events/e1","to_uri":"ctx://other/users/x/memories/a/b","relation_type":"r"}]"#,
            "another account",
        ),
    ];
    for (file, body, reason) in bad {
        let script = if *file == ".meta.json" {
            format!("/usr/bin/printf '%s' '{body}' > {n}/.meta.json")
        } else {
            format!("printf '%s' '{body}' > {n}/{file} && /bin/echo '{ACTIVE}' > {n}/.meta.json")
        };
        let o = m.sh(0, &script);
        assert!(!o.status.success(), "{file} {body} should be refused");
        let err = m.ok(0, &format!("cat {n}/.commit-error"));
        assert!(
            err.contains(reason),
            "{file}: reason {err:?} should mention {reason:?}"
        );
        // Readers (root's view is the writer's: check with a fresh read of the committed file via python's close error too)
        // The node keeps version 1.
        m.ok(0, &format!("rm -f {n}/{file}"));
        m.ok(0, &format!("cd {n} && rm -f .meta.json .abstract.md .relations.json .overview.md content.md; true"));
        // Restore the draft to the committed version by committing it back.
        m.ok(0, &format!("echo good > {n}/content.md; echo '[]' > {n}/.relations.json; echo a > {n}/.abstract.md; echo o > {n}/.overview.md"));
        let v: serde_json::Value = serde_json::from_str(&m.ok(
            0,
            &format!("/bin/echo '{ACTIVE}' > {n}/.meta.json && cat {n}/.meta.json"),
        ))
        .unwrap();
        assert!(v["version"].as_u64().unwrap() >= 2);
    }
    // Python sees EINVAL from close().
    let py = format!(
        "/usr/bin/python3 -c \"
import errno, os
f = open('{p}/.meta.json', 'w'); f.write('{{\\\"status\\\": 5}}')
try:
    f.close(); print('closed')
except OSError as e:
    print('errno', e.errno == errno.EINVAL)
\"",
        p = m.p(&format!("accounts/{N1}")).display()
    );
    assert_eq!(m.ok(0, &py), "errno True\n");
    m.umount_and_fsck();
}

#[test]
fn ordinary_tools_write_drafts() {
    let m = Mount::new();
    let n = format!("$M/accounts/{N1}");
    let src = m.dir.path().join("src.txt");
    std::fs::write(&src, "copied in\n").unwrap();
    m.ok(0, &format!("mkdir -p {n}"));
    // cp, tee, cat >>, sed -i, truncate, touch, stat.
    m.ok(0, &format!("cp {} {n}/content.md", src.display()));
    m.ok(0, &format!("echo more | tee -a {n}/content.md >/dev/null; cat >> {n}/content.md <<'EOF'\nappended\nEOF"));
    m.ok(0, &format!("sed -i 's/more/MORE/' {n}/content.md"));
    assert_eq!(
        m.ok(0, &format!("cat {n}/content.md")),
        "copied in\nMORE\nappended\n"
    );
    m.ok(
        0,
        &format!("echo 'abc' > {n}/.abstract.md && truncate -s 2 {n}/.abstract.md"),
    );
    assert_eq!(m.ok(0, &format!("cat {n}/.abstract.md")), "ab");
    m.ok(
        0,
        &format!("truncate -s 0 {n}/.abstract.md && echo 'short' > {n}/.abstract.md"),
    );
    m.ok(0, &format!("touch -d '2020-01-02 03:04:05' {n}/content.md"));
    assert_eq!(
        m.ok(0, &format!("stat -c %Y {n}/content.md")),
        "1577934245\n"
    );
    // mv within the node, Python write-temp-then-rename, O_APPEND, random offsets.
    m.ok(
        0,
        &format!("echo '# ov' > {n}/tmp.ov && mv {n}/tmp.ov {n}/.overview.md"),
    );
    let py = format!(
        "/usr/bin/python3 - <<'EOF'
import os, tempfile
d = '{d}'
fd, tmp = tempfile.mkstemp(dir=d, prefix='.rel')
os.write(fd, b'[]\\n'); os.fsync(fd); os.close(fd)
os.replace(tmp, os.path.join(d, '.relations.json'))
with open(os.path.join(d, 'content.md'), 'a') as f: f.write('py-append\\n')
fd = os.open(os.path.join(d, 'scratch.bin'), os.O_CREAT | os.O_RDWR)
os.pwrite(fd, b'XYZ', 10); os.pwrite(fd, b'ab', 0); os.close(fd)
print(open(os.path.join(d, 'scratch.bin'), 'rb').read())
EOF",
        d = m.p(&format!("accounts/{N1}")).display()
    );
    assert_eq!(
        m.ok(0, &py),
        "b'ab\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00XYZ'\n"
    );
    // vim (ex mode) edits a draft file in place.
    m.ok(
        0,
        &format!(
            "vim -u NONE -i NONE -n -es -c '%s/appended/edited-by-vim/' -c 'wq' {n}/content.md"
        ),
    );
    assert!(m
        .ok(0, &format!("cat {n}/content.md"))
        .contains("edited-by-vim"));
    // Python commits by write-temp-then-rename onto .meta.json.
    let py_commit = format!(
        "/usr/bin/python3 - <<'EOF'
import os, json
d = '{d}'
tmp = os.path.join(d, '.meta.json.tmp')
with open(tmp, 'w') as f: json.dump({{'status': 'ACTIVE'}}, f)
os.replace(tmp, os.path.join(d, '.meta.json'))
print(json.load(open(os.path.join(d, '.meta.json')))['version'])
EOF",
        d = m.p(&format!("accounts/{N1}")).display()
    );
    assert_eq!(m.ok(0, &py_commit), "1\n");
    assert_eq!(
        m.ok(0, &format!("cat {n}/content.md")),
        "copied in\nMORE\nedited-by-vim\npy-append\n"
    );
    // scratch.bin is not part of the version but stays in the writer's draft.
    assert!(m.ok(0, &format!("ls -A {n}")).contains("scratch.bin"));
    m.ok(0, &format!("rm {n}/scratch.bin"));
    // A sed -i on .meta.json commits too (rename onto .meta.json).
    m.ok(
        0,
        &format!("sed -i 's/\"ACTIVE\"/\"ARCHIVED\"/' {n}/.meta.json"),
    );
    assert!(m.ok(0, &format!("cat {n}/.meta.json")).contains("ARCHIVED"));
    // Symlinks and hard links are refused.
    m.fails(
        0,
        &format!("ln -s content.md {n}/link"),
        "Operation not permitted",
    );
    m.fails(
        0,
        &format!("ln {n}/content.md {n}/hard"),
        "Operation not permitted",
    );
}

#[test]
fn cached_listings_follow_commits_and_hide_drafts() {
    let m = Mount::with_config(Some(CONFIG));
    let cat = "$M/accounts/acme/users/alice/memories/events";
    m.ok(WRITER, &four_steps(N1, "one", ACTIVE));
    // Readers list (and the kernel may cache) the category and the node.
    for _ in 0..2 {
        assert_eq!(m.ok(READER, &format!("ls {cat}")), "e1\n");
        assert_eq!(m.ok(READER, &format!("ls -U -A {cat}/e1 | wc -l")), "5\n");
    }
    // A new node appears in the reader's listing as soon as its commit returns.
    m.ok(
        WRITER,
        &four_steps("acme/users/alice/memories/events/e2", "two", ACTIVE),
    );
    assert_eq!(m.ok(READER, &format!("ls {cat}")), "e1\ne2\n");
    // A PENDING node is listed for no one, read in turns by both roles.
    m.ok(
        WRITER,
        &format!("mkdir {cat}/p1 && echo x > {cat}/p1/content.md"),
    );
    for _ in 0..3 {
        assert_eq!(m.ok(WRITER, &format!("ls {cat}")), "e1\ne2\n");
        assert_eq!(m.ok(READER, &format!("ls {cat}")), "e1\ne2\n");
    }
    m.ok(WRITER, &format!("rm -r {cat}/p1"));
    // A writer's draft file never shows in a reader's listing, cached or not.
    m.ok(WRITER, &format!("echo tmp > {cat}/e1/scratch.txt"));
    for _ in 0..2 {
        assert_eq!(
            m.ok(READER, &format!("ls -A {cat}/e1 | grep -c scratch; true")),
            "0\n"
        );
        assert_eq!(
            m.ok(WRITER, &format!("ls -A {cat}/e1 | grep -c scratch; true")),
            "1\n"
        );
    }
    // A file a commit replaces shows its new bytes to readers that cached it:
    // a removed overview is derived from the content again.
    assert_eq!(
        m.ok(READER, &format!("cat {cat}/e1/.overview.md")),
        "# overview\n"
    );
    m.ok(WRITER, &format!("rm {cat}/e1/scratch.txt; rm {cat}/e1/.overview.md; /bin/echo '{ACTIVE}' > {cat}/e1/.meta.json"));
    assert_eq!(m.ok(READER, &format!("ls -U -A {cat}/e1 | wc -l")), "5\n");
    assert_eq!(m.ok(READER, &format!("cat {cat}/e1/.overview.md")), "one\n");
    m.ok(
        WRITER,
        &format!("echo ov > {cat}/e1/.overview.md; /bin/echo '{ACTIVE}' > {cat}/e1/.meta.json"),
    );
    assert_eq!(m.ok(READER, &format!("cat {cat}/e1/.overview.md")), "ov\n");
    // Deletes and moves by the writer show at once.
    m.ok(WRITER, &format!("rm -r {cat}/e2"));
    assert_eq!(m.ok(READER, &format!("ls {cat}")), "e1\n");
    m.ok(WRITER, &format!("mv {cat}/e1 {cat}/e3"));
    assert_eq!(m.ok(READER, &format!("ls {cat}")), "e3\n");
    assert_eq!(m.ok(READER, &format!("cat {cat}/e3/content.md")), "one");
}

#[test]
fn cp_r_of_a_node_commits_a_copy() {
    let m = Mount::new();
    m.ok(
        0,
        &four_steps(N1, "original", r#"{"status":"ACTIVE","tags":["t"]}"#),
    );
    // Listings give .meta.json last, so cp -r writes it last: the copy commits.
    m.ok(
        0,
        &format!("cp -r $M/accounts/{N1} $M/accounts/acme/users/alice/memories/events/copy"),
    );
    let meta: serde_json::Value = serde_json::from_str(&m.ok(
        0,
        "cat $M/accounts/acme/users/alice/memories/events/copy/.meta.json",
    ))
    .unwrap();
    assert_eq!(meta["uri"], "ctx://acme/users/alice/memories/events/copy");
    assert_eq!(meta["version"], 1);
    assert_eq!(meta["tags"][0], "t");
    assert_eq!(
        m.ok(0, "ls $M/accounts/acme/users/alice/memories/events"),
        "copy\ne1\n"
    );
    assert_eq!(
        m.ok(
            0,
            "cat $M/accounts/acme/users/alice/memories/events/copy/content.md"
        ),
        "original"
    );
}

/// Many nodes by one write: JSON lines to `accounts/A/.ctxfs/batch`, one
/// node each, committed at close in one transaction, each whole or not at
/// all; the result, a line per node, is read back from the same file.
#[test]
fn a_batch_commits_many_nodes_at_close() {
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let py = r#"
import errno, json, sys
path, nodes = sys.argv[1], []
for i in range(3):
    nodes.append({"node": f"users/alice/memories/batch/n{i}", "content": f"batch note {i} about kayaks",
                  "meta": {"status": "ACTIVE", "tags": ["b"]}})
nodes.append({"node": "users/alice/memories/batch/bad", "content": "x", "abstract": "y" * 101,
              "meta": {"status": "ACTIVE"}})
nodes.append({"node": "users/alice/nope", "content": "x", "meta": {"status": "ACTIVE"}})
try:
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(n) for n in nodes) + "\n")
    print("closed")
except OSError as e:
    print("refused" if e.errno == errno.EINVAL else e)
"#;
    let script = m.shared_file("batch.py");
    std::fs::write(&script, py).unwrap();
    let b = "$M/accounts/acme/.ctxfs/batch";
    // A node directory made before (an empty draft) is committed over.
    m.ok(
        WRITER,
        "mkdir -p $M/accounts/acme/users/alice/memories/batch/n2",
    );
    assert_eq!(
        m.ok(
            WRITER,
            &format!("/usr/bin/python3 {} {b}", script.display())
        )
        .trim(),
        "refused"
    );
    let result: Vec<serde_json::Value> = m
        .ok(WRITER, &format!("cat {b}"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(result.len(), 5, "{result:?}");
    assert_eq!(
        result.iter().filter(|r| r["version"] == 1).count(),
        3,
        "{result:?}"
    );
    assert!(
        result[3]["error"].as_str().unwrap().contains("100"),
        "{result:?}"
    );
    assert!(
        result[4]["error"]
            .as_str()
            .unwrap()
            .contains("not a node place"),
        "{result:?}"
    );
    // Committed as by the four-step write: derived fields, readers see them.
    let n0 = "$M/accounts/acme/users/alice/memories/batch/n0";
    let meta = m.json(READER, &format!("cat {n0}/.meta.json"));
    assert_eq!(
        (meta["version"].as_u64(), meta["tags"][0].as_str()),
        (Some(1), Some("b"))
    );
    assert!(m
        .ok(READER, &format!("cat {n0}/.abstract.md"))
        .starts_with("batch note 0"));
    m.fails(
        READER,
        "ls $M/accounts/acme/users/alice/memories/batch/bad",
        "No such file",
    );
    assert_eq!(
        m.json(WRITER, "cat $M/.ctxfs/status")["nodes"]["PENDING"],
        0
    );
    // A second batch updates a node: version 2.
    m.ok(
        WRITER,
        &format!("printf '%s\\n' '{{\"node\":\"users/alice/memories/batch/n1\",\"content\":\"edited\",\"meta\":{{\"status\":\"ACTIVE\"}}}}' > {b}"),
    );
    let n1 = "$M/accounts/acme/users/alice/memories/batch/n1";
    assert_eq!(
        m.json(READER, &format!("cat {n1}/.meta.json"))["version"],
        2
    );
    assert_eq!(m.ok(READER, &format!("cat {n1}/content.md")), "edited");
    m.fails(
        READER,
        &format!("echo '{{}}' > {b}"),
        "Read-only file system",
    );
    m.fails(NOBODY, &format!("cat {b}"), "Permission denied");
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    assert!(m
        .ok(READER, "cat \"$M/accounts/acme/.search/kayaks\"")
        .contains("batch/n"));
    // A batch refused whole: reading the file says why, not the help.
    m.fails(
        WRITER,
        "/usr/bin/python3 -c 'f = open(\"'$M'/accounts/acme/.ctxfs/batch\", \"wb\"); f.write(b\"\\xff\\n\"); f.close()'",
        "Invalid argument",
    );
    let why = m.ok(WRITER, "cat $M/accounts/acme/.ctxfs/batch");
    assert!(why.contains("UTF-8"), "{why}");
}

/// A batch may make containers nobody made with `mkdir` (a new agent, a
/// new category): a listing the kernel held before shows them after.
#[test]
fn a_batch_shows_new_containers_in_listings_read_before() {
    let m = Mount::with_config(Some(CONFIG));
    m.ok(
        WRITER,
        "ls \"$M/accounts/acme/agents\"; ls \"$M/accounts/acme/users\"",
    );
    let batch = m.shared_file("containers.jsonl");
    std::fs::write(
        &batch,
        "{\"node\":\"agents/g/skills/s\",\"content\":\"x\",\"meta\":{\"status\":\"ACTIVE\"}}\n\
         {\"node\":\"users/u/memories/c/n\",\"content\":\"y\",\"meta\":{\"status\":\"ACTIVE\"}}\n",
    )
    .unwrap();
    m.ok(
        WRITER,
        &format!(
            "cat {} > \"$M/accounts/acme/.ctxfs/batch\"",
            batch.display()
        ),
    );
    let out = m.ok(
        READER,
        "ls \"$M/accounts/acme/agents\" \"$M/accounts/acme/users\"; find \"$M/accounts/acme\" -name content.md | wc -l",
    );
    assert!(out.contains("\ng\n") || out.contains(":\ng\n"), "{out}");
    assert!(out.contains("\nu\n"), "{out}");
    assert_eq!(out.lines().last().unwrap().trim(), "2", "{out}");
}

/// Every committed version says who made it and how (`committed_by`: the
/// uid of the request, and the front or path): a shell commit, a batch, a
/// move, a restore. A client cannot write it for the daemon: a forged
/// `committed_by` in `.meta.json` is replaced.
#[test]
fn every_version_says_who_made_it() {
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let n = "acme/users/alice/memories/prefs/tea";
    let forged = r#"{"status":"ACTIVE","committed_by":{"uid":0,"via":"root"}}"#;
    m.ok(WRITER, &four_steps(n, "Sencha.", forged));
    let by = |path: &str| -> serde_json::Value {
        let meta: serde_json::Value =
            serde_json::from_str(&m.ok(READER, &format!("cat $M/accounts/{path}/.meta.json")))
                .unwrap();
        meta["committed_by"].clone()
    };
    assert_eq!(by(n), serde_json::json!({"uid": WRITER, "via": "shell"}));
    m.ok(WRITER, &four_steps(n, "Genmaicha.", ACTIVE));
    m.ok(
        WRITER,
        &format!("echo 1 > $M/accounts/{n}/.versions/restore"),
    );
    assert_eq!(by(n), serde_json::json!({"uid": WRITER, "via": "restore"}));
    let moved = "acme/users/alice/memories/prefs/green-tea";
    m.ok(WRITER, &format!("mv $M/accounts/{n} $M/accounts/{moved}"));
    assert_eq!(by(moved), serde_json::json!({"uid": WRITER, "via": "move"}));
    m.ok(
        WRITER,
        "echo '{\"node\": \"users/alice/memories/prefs/coffee\", \"content\": \"None.\", \"meta\": {\"status\": \"ACTIVE\", \"committed_by\": \"me\"}}' > $M/accounts/acme/.ctxfs/batch",
    );
    assert_eq!(
        by("acme/users/alice/memories/prefs/coffee"),
        serde_json::json!({"uid": WRITER, "via": "batch"})
    );
    // The old version keeps who made it.
    let v1: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        &format!("cat $M/accounts/{moved}/.versions/1/.meta.json"),
    ))
    .unwrap();
    assert_eq!(v1["committed_by"]["via"], "shell");
    m.umount_and_fsck();
}

/// The account's audit trail says who did what: a commit, a move, a
/// restore, a delete, each a JSON line with the uid and the front, written
/// with the change itself. Writers and root read it; readers get `EACCES`;
/// nobody writes it.
#[test]
fn the_audit_trail_records_who_did_what() {
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let n = "acme/users/alice/memories/prefs/tea";
    m.ok(WRITER, &four_steps(n, "Sencha.", ACTIVE));
    m.ok(WRITER, &four_steps(n, "Genmaicha.", ACTIVE));
    m.ok(
        WRITER,
        &format!("echo 1 > $M/accounts/{n}/.versions/restore"),
    );
    let to = "acme/users/alice/memories/prefs/green";
    m.ok(WRITER, &format!("mv $M/accounts/{n} $M/accounts/{to}"));
    m.ok(WRITER, &format!("rm -r $M/accounts/{to}"));
    let trail = m.ok(WRITER, "cat $M/accounts/acme/.ctxfs/audit");
    let lines: Vec<serde_json::Value> = trail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ops: Vec<String> = lines
        .iter()
        .map(|l| {
            format!(
                "{} {} {}",
                l["op"].as_str().unwrap(),
                l["via"].as_str().unwrap(),
                l["uid"]
            )
        })
        .collect();
    assert_eq!(
        ops,
        [
            "commit shell 1001",
            "commit shell 1001",
            "commit restore 1001",
            "move move 1001",
            "delete shell 1001"
        ],
        "{trail}"
    );
    assert_eq!(lines[3]["from"], "users/alice/memories/prefs/tea");
    assert_eq!(lines[4]["node"], "users/alice/memories/prefs/green");
    // Scratchpad writes and activity-log appends are attributed too.
    let p = "$M/accounts/acme/projects/p";
    m.ok(
        WRITER,
        &format!("mkdir -p {p}/scratchpad && echo draft > {p}/scratchpad/plan.md && echo '{{\"step\": 1}}' >> {p}/activity_log.jsonl"),
    );
    let trail = m.ok(WRITER, "cat $M/accounts/acme/.ctxfs/audit");
    let last: Vec<serde_json::Value> = trail
        .lines()
        .rev()
        .take(2)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(last[1]["op"], "scratch-write", "{trail}");
    assert_eq!(last[1]["path"], "projects/p/scratchpad/plan.md");
    assert_eq!(last[0]["op"], "log-append", "{trail}");
    assert_eq!(last[0]["uid"], WRITER);
    assert_eq!(m.ok(0, "cat $M/accounts/acme/.ctxfs/audit"), trail);
    // Renaming, truncating and removing a scratchpad file leave lines too
    // (here root removes the writer's file).
    let sp = format!("{p}/scratchpad");
    m.ok(
        WRITER,
        &format!("mv {sp}/plan.md {sp}/old.md && truncate -s 2 {sp}/old.md"),
    );
    m.ok(0, &format!("rm {sp}/old.md"));
    let trail = m.ok(WRITER, "cat $M/accounts/acme/.ctxfs/audit");
    let last: Vec<serde_json::Value> = trail
        .lines()
        .rev()
        .take(3)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ops: Vec<String> = last
        .iter()
        .rev()
        .map(|l| format!("{} {}", l["op"].as_str().unwrap(), l["uid"]))
        .collect();
    assert_eq!(
        ops,
        [
            "scratch-rename 1001",
            "scratch-truncate 1001",
            "scratch-remove 0"
        ],
        "{trail}"
    );
    assert_eq!(last[2]["to"], "projects/p/scratchpad/old.md");
    assert_eq!(last[1]["was"], 6);
    assert_eq!(last[0]["path"], "projects/p/scratchpad/old.md");
    m.fails(
        READER,
        "cat $M/accounts/acme/.ctxfs/audit",
        "Permission denied",
    );
    m.fails(
        STRANGER,
        "cat $M/accounts/acme/.ctxfs/audit",
        "Permission denied",
    );
    m.fails(
        WRITER,
        "echo forged >> $M/accounts/acme/.ctxfs/audit",
        "Operation not permitted",
    );
    m.umount_and_fsck();
}

/// A never-committed node is in no listing, so `rm -r` of its category
/// cannot reach it: removing the directory discards its draft (before, the
/// directory stayed, `ENOTEMPTY`). Readers cannot do it; a committed node
/// in the directory still makes a bare `rmdir` fail, and keeps the draft; a
/// draft file held open goes on taking writes into nothing; no discarded
/// node comes back, not after a remount either.
#[test]
fn rm_r_of_a_category_discards_drafts_of_never_committed_nodes() {
    let mut m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let mem = "$M/accounts/acme/users/alice/memories";
    let cat = format!("{mem}/scratch");
    m.ok(
        WRITER,
        &format!(
            "mkdir -p {cat}/n1 {cat}/n2 && echo one > {cat}/n1/content.md && echo two > {cat}/n2/content.md"
        ),
    );
    m.fails(READER, &format!("rmdir {cat}"), "Read-only file system");
    m.ok(WRITER, &format!("mkdir {mem}/empty"));
    m.fails(
        READER,
        &format!("rmdir {mem}/empty"),
        "Read-only file system",
    );
    m.ok(WRITER, &format!("rmdir {mem}/empty"));
    assert_eq!(m.ok(WRITER, &format!("cat {cat}/n1/content.md")), "one\n");
    // One shell holds n2's draft file open across the removal, then writes.
    m.ok(
        WRITER,
        &format!(
            "exec 3>> {cat}/n2/content.md; rm -r {cat}; echo more >&3; exec 3>&-; \
             test ! -e {cat}; test ! -e {cat}/n1/content.md"
        ),
    );
    assert_eq!(m.ok(READER, &format!("ls {mem}")), "");

    // A committed node beside a draft: rmdir refuses and keeps the draft;
    // rm -r removes the node, then the directory with the draft.
    m.ok(
        WRITER,
        &four_steps("acme/users/alice/memories/scratch/kept", "kept", ACTIVE),
    );
    m.ok(
        WRITER,
        &format!("mkdir {cat}/n3 && echo three > {cat}/n3/content.md"),
    );
    m.fails(WRITER, &format!("rmdir {cat}"), "Directory not empty");
    assert_eq!(m.ok(WRITER, &format!("cat {cat}/n3/content.md")), "three\n");
    m.ok(WRITER, &format!("rm -r {cat}"));
    m.ok(WRITER, &format!("test ! -e {cat}/n3 && test ! -e {cat}"));
    m.umount();
    m.mount();
    for n in ["n1", "n2", "n3", "kept"] {
        m.ok(WRITER, &format!("test ! -e {cat}/{n}"));
    }
    assert_eq!(m.ok(WRITER, &format!("ls {mem}")), "");
    m.umount_and_fsck();
}

/// A directory removed while processes still have it (or a directory
/// inside it) as their working directory, then made again at the same
/// path, is a new directory: the kernel marks the removed one's inode dead,
/// and the new one must not get its number. Before, `mkdir` inside the new
/// category failed `ENOENT` and a node committed again at the same path
/// could not be written.
#[test]
fn a_directory_made_again_where_a_held_one_was_removed_works() {
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let cat = "$M/accounts/acme/users/alice/memories/pinned";
    let node = "acme/users/alice/memories/pinned/n";
    m.ok(WRITER, &four_steps(node, "first", ACTIVE));
    let mut held = [
        m.spawn_as(READER, &format!("cd $M/accounts/{node} && sleep 20")),
        m.spawn_as(WRITER, &format!("cd {cat} && sleep 20")),
    ];
    std::thread::sleep(Duration::from_millis(500));
    m.ok(WRITER, &format!("rm -r {cat} && test ! -e {cat}"));
    m.ok(WRITER, &four_steps(node, "second", ACTIVE));
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{node}/content.md")),
        "second"
    );
    // A new node's draft directory in it (listed once committed).
    m.ok(WRITER, &format!("mkdir {cat}/other && test -d {cat}/other"));
    assert_eq!(m.ok(WRITER, &format!("ls {cat}")), "n\n");
    for p in held.iter_mut() {
        let _ = p.kill();
        let _ = p.wait();
    }
}
