//! The daemon's life: restart, refusals of the command line, kill -9 during
//! commits, SIGTERM, the Repair Job at mount, and umount of a busy mount.

use crate::harness::*;
use std::time::{Duration, Instant};

const N1: &str = "acme/users/alice/memories/events/e1";

#[test]
fn restart_keeps_committed_state_and_drafts() {
    let mut m = Mount::new();
    m.ok(0, &four_steps(N1, "durable", ACTIVE));
    m.ok(0, "mkdir -p $M/accounts/acme/users/alice/memories/events/draft1 && echo wip > $M/accounts/acme/users/alice/memories/events/draft1/content.md");
    m.umount();
    m.fsck();
    m.mount();
    assert_eq!(
        m.ok(0, &format!("cat $M/accounts/{N1}/content.md")),
        "durable"
    );
    assert!(m
        .ok(0, &format!("cat $M/accounts/{N1}/.meta.json"))
        .contains("\"version\": 1"));
    // The draft was saved at unmount and is still the writer's.
    assert_eq!(
        m.ok(
            0,
            "cat $M/accounts/acme/users/alice/memories/events/draft1/content.md"
        ),
        "wip\n"
    );
}

#[test]
fn daemon_cli_refusals() {
    let m = Mount::new();
    // A second daemon on the same data dir.
    let other = m.dir.path().join("mnt2");
    std::fs::create_dir(&other).unwrap();
    let out = ctxfs(&[
        "mount",
        other.to_str().unwrap(),
        "--data",
        m.data.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already served by another ctxfs daemon"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one-line reason: {err}");
    // Missing mountpoint, bad config.
    let out = ctxfs(&["mount", "/nonexistent/x", "--data", "/tmp/x"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("mountpoint"));
    let bad = m.dir.path().join("bad.toml");
    std::fs::write(&bad, "[[account]]\nid = 'a b'\n").unwrap();
    let out = ctxfs(&[
        "mount",
        other.to_str().unwrap(),
        "--data",
        "/tmp/unused",
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("bad config"));
    let out = ctxfs(&[
        "mount",
        other.to_str().unwrap(),
        "--config",
        "/nonexistent.toml",
    ]);
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("cannot read config")
    );
    // fsck refuses a data dir that is being served.
    let out = ctxfs(&["fsck", "--data", m.data.to_str().unwrap()]);
    assert!(!out.status.success());
}

#[test]
fn kill9_during_commit_stream_loses_nothing_acknowledged() {
    let mut m = Mount::new();
    let acked = m.dir.path().join("acked");
    // A writer streams commits and records each one whose close returned 0.
    let script = format!(
        "i=0; while true; do i=$((i+1)); N=$M/accounts/acme/users/w/memories/stream/n$i; \
         mkdir $N 2>/dev/null && printf 'content %d' $i > $N/content.md 2>/dev/null && echo '[]' > $N/.relations.json 2>/dev/null \
         && echo a > $N/.abstract.md 2>/dev/null && echo o > $N/.overview.md 2>/dev/null \
         && /bin/echo '{ACTIVE}' > $N/.meta.json 2>/dev/null && echo $i >> {a} || exit 0; done",
        a = acked.display()
    );
    // The writer creates only node dirs: their parent exists only inside the
    // mount, so once the daemon is gone it fails instead of writing to the
    // plain directory under the mountpoint.
    m.ok(0, "mkdir -p $M/accounts/acme/users/w/memories/stream");
    let mut w = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .env("M", &m.mnt)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // A durably fsynced draft must survive too.
    m.ok(
        0,
        "mkdir -p $M/accounts/acme/users/w/memories/drafts/d1 && /usr/bin/python3 -c \"
import os
fd = os.open('$M/accounts/acme/users/w/memories/drafts/d1/content.md', os.O_CREAT|os.O_WRONLY)
os.write(fd, b'fsynced draft'); os.fsync(fd); os.close(fd)\"",
    );
    std::thread::sleep(Duration::from_millis(500));
    m.kill9();
    let _ = w.wait();
    let acked: Vec<u32> = std::fs::read_to_string(&acked)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(
        acked.len() > 10,
        "too few commits before the kill: {}",
        acked.len()
    );
    m.fsck();
    m.mount();
    for i in &acked {
        assert_eq!(
            m.ok(
                0,
                &format!("cat $M/accounts/acme/users/w/memories/stream/n{i}/content.md")
            ),
            format!("content {i}"),
            "acknowledged commit n{i} lost"
        );
    }
    // No PENDING node is visible; the status shows committed nodes only.
    let listed = m
        .ok(0, "ls $M/accounts/acme/users/w/memories/stream")
        .lines()
        .count();
    assert!(
        listed >= acked.len() && listed <= acked.len() + 1,
        "listed {listed}, acked {}",
        acked.len()
    );
    assert_eq!(
        m.ok(
            0,
            "cat $M/accounts/acme/users/w/memories/drafts/d1/content.md"
        ),
        "fsynced draft"
    );
    m.umount();
    m.fsck();
}

#[test]
fn sigterm_unmounts_cleanly_and_saves_drafts() {
    let mut m = Mount::new();
    m.ok(0, &four_steps(N1, "kept", ACTIVE));
    m.ok(0, "mkdir -p $M/accounts/acme/users/alice/memories/events/wip && echo draft > $M/accounts/acme/users/alice/memories/events/wip/content.md");
    let pid = m.daemon_pid();
    unsafe { libc::kill(pid, libc::SIGTERM) };
    m.wait_gone(pid);
    m.fsck();
    m.mount();
    assert_eq!(m.ok(0, &format!("cat $M/accounts/{N1}/content.md")), "kept");
    assert_eq!(
        m.ok(
            0,
            "cat $M/accounts/acme/users/alice/memories/events/wip/content.md"
        ),
        "draft\n"
    );
}

#[test]
fn repair_job_branches() {
    let mut m = Mount::new();
    let base = "$M/accounts/acme/users/r/memories/rep";
    // fsync'd drafts in the states of seed 000's failure table.
    let py = |node: &str, files: &[&str]| {
        let writes: String = files
            .iter()
            .map(|f| {
                let body = match *f {
                    ".relations.json" => "[]",
                    ".meta.json" => "{\"status\": \"PENDING\"}",
                    _ => "text",
                };
                format!("w('{f}', '{body}')\n")
            })
            .collect();
        format!(
            "mkdir -p {base}/{node} && /usr/bin/python3 - <<'EOF'\nimport os\nd = os.path.expandvars('{base}/{node}')\n\
             def w(n, t):\n    fd = os.open(os.path.join(d, n), os.O_CREAT | os.O_WRONLY | os.O_TRUNC)\n    os.write(fd, t.encode()); os.fsync(fd); os.close(fd)\n{writes}EOF"
        )
    };
    let all = [
        "content.md",
        ".relations.json",
        ".abstract.md",
        ".overview.md",
    ];
    m.ok(0, &py("orphan", &["content.md"]));
    m.ok(0, &py("complete", &all));
    m.ok(
        0,
        &py("pending_meta", &[&all[..], &[".meta.json"]].concat()),
    );
    m.ok(
        0,
        &py("partial", &["content.md", ".relations.json", ".meta.json"]),
    );
    m.ok(0, &py("nothing", &[".abstract.md"]));
    m.ok(0, &py("no_content", &[".abstract.md", ".meta.json"]));
    m.kill9();
    let out = ctxfs(&["repair", "--data", m.data.to_str().unwrap()]);
    assert!(out.status.success());
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("rep/orphan: orphan content.md, .meta.json recreated"),
        "{report}"
    );
    // Content alone is completed as a commit of it would be (AGFS failure
    // table: "recreate from content", "attempt completion").
    assert!(report.contains("rep/orphan: PENDING without .relations.json, .abstract.md, .overview.md, completed as a commit would (summaries derived, no relations) and activated as version 1"), "{report}");
    assert!(
        report.contains("rep/complete: PENDING with all files, activated as version 1"),
        "{report}"
    );
    assert!(
        report.contains("rep/pending_meta: PENDING with all files, activated"),
        "{report}"
    );
    assert!(
        report.contains(
            "rep/partial: PENDING without .abstract.md, .overview.md, completed as a commit would"
        ),
        "{report}"
    );
    // BROKEN only for what nothing can complete.
    assert!(
        report.contains("rep/no_content: PENDING with missing content.md: nothing to complete the node from; marked BROKEN"),
        "{report}"
    );
    assert!(!report.contains("rep/nothing"), "{report}");
    m.fsck();
    m.mount();
    // Activated nodes are ACTIVE; BROKEN ones are shown to writers only.
    assert_eq!(
        m.ok(0, &format!("ls {base}")),
        "complete\nno_content\norphan\npartial\npending_meta\n"
    );
    // The completed node reads as any commit of its content.
    assert_eq!(
        m.ok(0, &format!("cat {base}/orphan/.abstract.md")),
        "text\n"
    );
    let broken = m.ok(0, &format!("cat {base}/no_content/.meta.json"));
    assert!(
        broken.contains("\"BROKEN\"") && broken.contains("broken_reason"),
        "{broken}"
    );
    let s: serde_json::Value = serde_json::from_str(&m.ok(0, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["nodes"]["ACTIVE"], 4);
    assert_eq!(s["nodes"]["BROKEN"], 1);
    // A BROKEN node is fixed by rewriting it.
    m.ok(0, &format!("echo body > {base}/no_content/content.md; /bin/echo '{ACTIVE}' > {base}/no_content/.meta.json"));
    let s: serde_json::Value = serde_json::from_str(&m.ok(0, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["nodes"]["BROKEN"], 0);
    // A second repair has nothing to do.
    m.umount();
    let out = ctxfs(&["repair", "--data", m.data.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("repair: 0 action(s)"));
}

#[test]
fn umount_refuses_a_busy_mount_unless_lazy() {
    let mut m = Mount::new();
    m.ok(0, &four_steps(N1, "still here", ACTIVE));
    // A process with its working directory inside the mount.
    let mut busy = std::process::Command::new("/bin/sh")
        .args(["-c", "cd \"$M/accounts/acme\" && exec sleep 30"])
        .env("M", &m.mnt)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = ctxfs(&["umount", m.mnt.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is busy"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing was disturbed.
    assert_eq!(
        m.ok(0, &format!("cat $M/accounts/{N1}/content.md")),
        "still here"
    );
    // --lazy detaches now; the daemon finishes when the last user leaves.
    let pid = m.daemon_pid();
    let out = ctxfs(&["umount", "--lazy", m.mnt.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = busy.kill();
    let _ = busy.wait();
    m.wait_gone(pid);
    m.fsck();
    m.mount();
    assert_eq!(
        m.ok(0, &format!("cat $M/accounts/{N1}/content.md")),
        "still here"
    );
}

/// A clean stop does not wait for the indexing backlog: the indexer stops at
/// its next text batch and the outbox keeps the rest for the next mount.
/// Measured before the fix: 17 s for 2,991 MiniLM events not yet indexed;
/// then up to 10 s on two busy cores, waiting for the forward passes under
/// way (now not waited for) and for init to reap the daemon (a zombie now
/// counts as gone); now 0.15-0.25 s there.
#[test]
fn umount_and_sigterm_do_not_wait_for_the_index_backlog() {
    let config = format!(
        "[index]\nembedder = \"minilm\"\nmodel_dir = \"{}\"\n",
        model_dir().display()
    );
    let mut m = Mount::with_args(Some(&config), &[]);
    let uid = unsafe { libc::getuid() };
    // 2,000 nodes of ~40 words: tens of seconds of MiniLM work here.
    let py = r#"
import os, sys
root = os.path.join(sys.argv[1], "accounts/acme/users/alice/memories/bulk")
words = "the quick brown fox jumps over a lazy dog while agents keep memory".split()
for i in range(2000):
    n = os.path.join(root, f"n{i}")
    os.makedirs(n)
    text = " ".join(words[(i + k) % len(words)] for k in range(40)) + f" item {i}"
    for f, b in (("content.md", text), (".relations.json", "[]"), (".abstract.md", f"note {i}"),
                 (".overview.md", text[:80]), (".meta.json", '{"status":"ACTIVE"}')):
        with open(os.path.join(n, f), "w") as fh:
            fh.write(b)
"#;
    let script = m.shared_file("bulk.py");
    std::fs::write(&script, py).unwrap();
    m.ok(uid, &format!("/usr/bin/python3 {} $M", script.display()));
    let backlog = |m: &Mount| -> i64 {
        m.json(uid, "cat $M/.ctxfs/status")["outbox_depth"]
            .as_i64()
            .unwrap()
    };
    assert!(
        backlog(&m) > 300,
        "the backlog is too small to test: {}",
        backlog(&m)
    );
    let t = Instant::now();
    m.umount();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(5), "umount took {took:?}");
    // Nothing is lost: the events wait in the outbox, and a remount indexes them.
    m.mount();
    let left = backlog(&m);
    assert!(left > 0, "the whole backlog was indexed before the stop");
    // SIGTERM stops as quickly.
    let pid = m.daemon_pid();
    let t = Instant::now();
    unsafe { libc::kill(pid, libc::SIGTERM) };
    m.wait_gone(pid);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "SIGTERM took {:?}",
        t.elapsed()
    );
    m.fsck();
}

/// Without the embedding model, `ctxfs mount` says so on stderr, with the
/// one command that fetches it where the daemon looks; a chosen embedder
/// (or no index) says nothing.
#[test]
fn mount_says_when_no_model_is_installed() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let (mnt, data) = (dir.path().join("mnt"), dir.path().join("data"));
    std::fs::create_dir(&mnt).unwrap();
    let mnt_s = mnt.to_str().unwrap();
    let data_s = data.to_str().unwrap();
    for (args, warned) in [(vec![], true), (vec!["--embedder", "hash"], false)] {
        let mut all = vec!["mount", mnt_s, "--data", data_s];
        all.extend(args.iter().copied());
        let out = ctxfs(&all);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        let model = data.join("models/all-MiniLM-L6-v2");
        let says = err.contains("no embedding model")
            && err.contains(&format!("scripts/fetch-model.sh {}", model.display()));
        assert_eq!(says, warned, "{args:?}: {err}");
        assert!(ctxfs(&["umount", mnt_s]).status.success());
    }
}

/// Installed like a filesystem: `mount -t fuse.ctxfs DATA MNT -o …` and an
/// fstab line of type `fuse.ctxfs` go through /sbin/mount.fuse.ctxfs (a link
/// to the binary, as `make install` makes it), `umount` stops the daemon
/// cleanly; completions and the man page come from the binary.
#[test]
fn mounts_through_mount_8_and_fstab() {
    let helper = std::path::Path::new("/sbin/mount.fuse.ctxfs");
    let bin = std::fs::canonicalize(BIN).unwrap();
    let before = std::fs::read_link(helper).ok();
    let _ = std::fs::remove_file(helper);
    std::os::unix::fs::symlink(&bin, helper).unwrap();
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    chmod(dir.path(), 0o755);
    let (mnt, data) = (dir.path().join("mnt"), dir.path().join("data"));
    std::fs::create_dir(&mnt).unwrap();
    chmod(&mnt, 0o755);
    let config = dir.path().join("config.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let run = |cmd: &str| {
        let o = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .output()
            .unwrap();
        (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    let (m, d, c) = (mnt.display(), data.display(), config.display());
    let (ok, out) = run(&format!(
        "mount -t fuse.ctxfs {d} {m} -o config={c},no_index,_netdev"
    ));
    assert!(ok, "{out}");
    assert!(is_mounted(&mnt));
    let node = "acme/users/alice/memories/work/w1";
    let script = dir.path().join("write.sh");
    std::fs::write(&script, four_steps(node, "through fstab", ACTIVE)).unwrap();
    chmod(&script, 0o755);
    let (ok, out) = run(&format!(
        "M={m} setpriv --reuid={WRITER} --regid={WRITER} --clear-groups sh {}",
        script.display()
    ));
    assert!(ok, "{out}");
    let pid: i32 = std::fs::read_to_string(mnt.join(".ctxfs/pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (ok, out) = run(&format!("umount {m}"));
    assert!(ok, "{out}");
    let t = std::time::Instant::now();
    while alive(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the daemon did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // An fstab line (in a file of our own, not /etc/fstab).
    let fstab = dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!("{d} {m} fuse.ctxfs config={c},no_index,noauto,nofail 0 0\n"),
    )
    .unwrap();
    let (ok, out) = run(&format!("mount --fstab {} {m}", fstab.display()));
    assert!(ok, "{out}");
    assert_eq!(
        std::fs::read_to_string(mnt.join(format!("accounts/{node}/content.md"))).unwrap(),
        "through fstab"
    );
    let (ok, out) = run(&format!("umount {m}"));
    assert!(ok, "{out}");
    let t = std::time::Instant::now();
    while is_mounted(&mnt) {
        assert!(t.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(helper);
    if let Some(b) = before {
        let _ = std::os::unix::fs::symlink(b, helper);
    }
    let bash = ctxfs(&["completions", "bash"]);
    assert!(String::from_utf8_lossy(&bash.stdout).contains("_ctxfs()"));
    let man = ctxfs(&["man"]);
    assert!(String::from_utf8_lossy(&man.stdout).contains(".TH ctxfs 1"));
}
