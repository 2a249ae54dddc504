//! The faults real disks produce: a full data-dir disk, a damaged
//! write-ahead log, a lost store file, a corrupt store. The daemon stays up,
//! says what happened, and never loses an acknowledged commit silently.

use crate::harness::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A small tmpfs mounted at a data dir, unmounted (lazily: the daemon may
/// still be leaving) when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn at(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs (root is needed)");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

const CAT: &str = "acme/users/alice/memories/notes";

/// A Python program for the writer: commit 100 KB nodes named `PREFIXi`
/// until a commit fails (or `limit`), printing each acknowledged name and
/// finally the errno of the failure.
const FILL: &str = r#"
import os, sys, random
d, prefix, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
random.seed(prefix)
for i in range(limit):
    n = d + "/" + prefix + str(i)
    body = "".join(random.choice("abcdefghij ") for _ in range(100000))
    try:
        os.makedirs(n, exist_ok=True)
        for f, t in (("content.md", body), (".abstract.md", "fill " + str(i)),
                     (".overview.md", "o"), (".meta.json", '{"status":"ACTIVE"}')):
            with open(n + "/" + f, "w") as fh:
                fh.write(t)
    except OSError as e:
        print("failed", prefix + str(i), e.errno, flush=True)
        sys.exit(0)
    print("ok", prefix + str(i), len(body), flush=True)
print("done")
"#;

/// A full data-dir disk: commits fail `ENOSPC` with nothing applied; reads,
/// listings and search go on; the daemon stays up and counts the log lines
/// it could not write; once space returns, commits resume by themselves
/// (the store is reopened), and after a remount every acknowledged commit is
/// there. (Before: the daemon aborted on its first unwritable log line, and
/// after one storage error every commit failed `EIO` until a restart.)
#[test]
fn a_full_disk_refuses_commits_keeps_serving_and_recovers() {
    let mut m = Mount::prepared(Some(CONFIG), &["--embedder", "hash"], &[], &[]);
    let _fs = Tmpfs::at(&m.data, "64m");
    let ballast = m.data.join("ballast");
    let st = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=16", "status=none"])
        .arg(format!("of={}", ballast.display()))
        .status()
        .unwrap();
    assert!(st.success());
    m.mount();
    let pid = m.daemon_pid();
    let script = m.shared_file("fill.py");
    std::fs::write(&script, FILL).unwrap();
    let dir = format!("$M/accounts/{CAT}");
    m.ok(WRITER, &format!("mkdir -p {dir}"));
    let out = m.ok(
        WRITER,
        &format!("/usr/bin/python3 {} {dir} n 2000", script.display()),
    );
    let acked: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("ok "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let failed = out
        .lines()
        .find_map(|l| l.strip_prefix("failed "))
        .unwrap_or_else(|| panic!("the disk never filled:\n{out}"));
    assert!(acked.len() > 20, "{out}");
    let (name, errno) = failed.split_once(' ').unwrap();
    let errno: i32 = errno.split(' ').next().unwrap().parse().unwrap();
    assert_eq!(errno, libc::ENOSPC, "a full disk says so: {failed}");
    assert!(alive(pid), "the daemon died of a full disk");
    // Nothing of the refused node is visible.
    m.fails(
        READER,
        &format!("cat {dir}/{name}/content.md"),
        "No such file",
    );
    // Reads, listings and search go on.
    let first = acked[0];
    assert_eq!(
        m.ok(READER, &format!("cat {dir}/{first}/.abstract.md")),
        "fill 0"
    );
    let listed = m.ok(READER, &format!("ls {dir} | wc -l"));
    assert!(listed.trim().parse::<usize>().unwrap() >= acked.len());
    let hits = m.ok(READER, &format!("cat \"{dir}/.search/fill 3\""));
    assert!(hits.contains("/notes/n"), "{hits}");
    // More refused commits, each logged: the log's last page fills too.
    m.ok(
        WRITER,
        &format!(
            "for i in $(seq 1 20); do /usr/bin/python3 {} {dir} again$i 1; done",
            script.display()
        ),
    );
    assert!(alive(pid));
    let status = m.json(0, "cat $M/.ctxfs/status");
    assert!(
        status["log_lines_dropped"].as_u64().unwrap() > 0,
        "{status}"
    );
    assert!(alive(pid));

    let df = |m: &Mount| {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "df -k {0}; ls -la {0}; tail -n 5 {0}/ctxfs.log",
                m.data.display()
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // Space returns: commits resume within seconds, without a restart.
    // (redb's file is larger than the disk, with holes: what it writes
    // after a reopen fills them, so the ballast's 16 MB alone do not last;
    // the volume grows too, as an operator would make room.)
    std::fs::remove_file(&ballast).unwrap();
    let st = Command::new("mount")
        .args(["-o", "remount,size=160m"])
        .arg(&m.data)
        .status()
        .unwrap();
    assert!(st.success());
    let mut after = Vec::new();
    let resumed = within(std::time::Duration::from_secs(15), || {
        let out = m.ok(
            WRITER,
            &format!("/usr/bin/python3 {} {dir} after 1", script.display()),
        );
        if out.starts_with("ok ") {
            after.push("after0");
            true
        } else {
            false
        }
    });
    assert!(
        resumed.is_some(),
        "commits did not resume once space returned"
    );
    assert_eq!(pid, m.daemon_pid(), "no restart");

    // Every acknowledged commit is there after a clean restart.
    m.umount();
    let before = df(&m);
    let again = m.try_mount();
    assert!(
        again.status.success(),
        "remount: {}\nbefore:\n{before}\nafter:\n{}",
        String::from_utf8_lossy(&again.stderr),
        df(&m)
    );
    for n in acked.iter().chain(after.iter()) {
        let size = m.ok(READER, &format!("wc -c < {dir}/{n}/content.md"));
        assert_eq!(size.trim(), "100000", "{n} lost");
    }
    m.umount();
    m.fsck();
}

/// Commit `n` small nodes and kill the daemon before a checkpoint cuts the
/// log: the acknowledged commits live in the write-ahead log alone.
fn commits_in_the_log(m: &mut Mount, n: usize) -> Vec<String> {
    let script = m.shared_file("burst.py");
    std::fs::write(
        &script,
        r#"
import os, sys
d, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    p = d + "/" + prefix + str(i)
    os.makedirs(p, exist_ok=True)
    for f, t in (("content.md", "burst text " + prefix + str(i) + " " + "x" * 2000),
                 (".abstract.md", "a"), (".overview.md", "o"), (".meta.json", '{"status":"ACTIVE"}')):
        with open(p + "/" + f, "w") as fh:
            fh.write(t)
    print(prefix + str(i), flush=True)
"#,
    )
    .unwrap();
    let dir = format!("$M/accounts/{CAT}");
    m.ok(WRITER, &format!("mkdir -p {dir}"));
    let wal = m.data.join("ctxfs.wal");
    for round in 0..8 {
        let out = m.ok(
            WRITER,
            &format!("/usr/bin/python3 {} {dir} r{round}n {n}", script.display()),
        );
        // Killed at once, before the next checkpoint (every second).
        m.kill9();
        let names: Vec<String> = out.lines().map(String::from).collect();
        if std::fs::metadata(&wal).map(|md| md.len()).unwrap_or(0) > 20_000 {
            return names;
        }
        m.mount();
    }
    panic!("every burst was checkpointed before the kill");
}

/// A write-ahead log damaged in the middle (64 bytes overwritten after a
/// kill -9) is refused by fsck and by mount, with the reason and the
/// command that salvages; nothing is cut. `ctxfs salvage` writes a new data
/// dir with every commit whose record is intact. (Before: fsck took the
/// damage for a torn tail, cut everything after it, printed "clean", and
/// the mount served half the acknowledged nodes missing.)
#[test]
fn a_damaged_log_is_refused_and_salvaged() {
    let mut m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let names = commits_in_the_log(&mut m, 40);
    let wal = m.data.join("ctxfs.wal");
    let mut bytes = std::fs::read(&wal).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid..mid + 64].fill(0xEE);
    std::fs::write(&wal, &bytes).unwrap();
    let data = m.data.to_str().unwrap().to_string();

    let fsck = ctxfs(&["fsck", "--data", &data]);
    let text = String::from_utf8_lossy(&fsck.stdout);
    assert!(!fsck.status.success(), "fsck passed a damaged log: {text}");
    assert!(
        text.contains("damaged") && text.contains("ctxfs salvage --data"),
        "{text}"
    );
    assert_eq!(std::fs::read(&wal).unwrap(), bytes, "fsck changed the log");

    let mount = m.try_mount();
    let err = String::from_utf8_lossy(&mount.stderr);
    assert!(!mount.status.success(), "a damaged log was mounted");
    assert!(
        err.contains("damaged") && err.contains("ctxfs salvage"),
        "{err}"
    );
    assert_eq!(std::fs::read(&wal).unwrap(), bytes, "mount changed the log");

    let out = m.dir.path().join("salvaged");
    let salv = ctxfs(&["salvage", "--data", &data, "--out", out.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&salv.stdout);
    assert!(
        report.contains("lost: "),
        "the damage is reported: {report}"
    );
    // Serve the salvaged dir: the commits of every intact record are there.
    std::fs::rename(&m.data, m.dir.path().join("damaged")).unwrap();
    std::fs::rename(&out, &m.data).unwrap();
    m.mount();
    let dir = format!("$M/accounts/{CAT}");
    let listed = m.ok(READER, &format!("ls {dir}"));
    let found = names
        .iter()
        .filter(|n| listed.lines().any(|l| l == n.as_str()))
        .count();
    // 64 bytes damage one record (two when they straddle a boundary): a
    // record holds one commit or a group of them.
    assert!(
        found + 4 >= names.len() && found < names.len() + 1,
        "{found} of {} salvaged: {report}",
        names.len()
    );
    for n in names
        .iter()
        .filter(|n| listed.lines().any(|l| l == n.as_str()))
    {
        let c = m.ok(READER, &format!("cat {dir}/{n}/content.md"));
        assert!(c.starts_with(&format!("burst text {n} ")), "{n}: {c}");
    }
    m.umount_and_fsck();
}

/// A store file emptied (or removed) beside the traces of a store is lost,
/// not new: mount and fsck refuse it with the reason, and create nothing.
/// (Before: an empty tree was served as if nothing had been there.)
#[test]
fn a_lost_store_file_is_refused() {
    let mut m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    m.ok(WRITER, &four_steps(&format!("{CAT}/kept"), "kept", ACTIVE));
    m.umount();
    let db = m.data.join("ctxfs.redb");
    let data = m.data.to_str().unwrap().to_string();
    for how in ["empty", "missing"] {
        if how == "empty" {
            std::fs::write(&db, b"").unwrap();
        } else {
            std::fs::remove_file(&db).unwrap();
        }
        let mount = m.try_mount();
        let err = String::from_utf8_lossy(&mount.stderr);
        assert!(!mount.status.success(), "a {how} store was mounted as new");
        assert!(
            err.contains(&format!("is {how}")) && err.contains("traces of a store"),
            "{err}"
        );
        let fsck = ctxfs(&["fsck", "--data", &data]);
        assert!(!fsck.status.success(), "fsck passed a {how} store");
        assert_eq!(
            std::fs::metadata(&db).map(|m| m.len()).ok(),
            (how == "empty").then_some(0),
            "nothing was created"
        );
    }
}

/// fsck of a store with three random 4 KiB blocks overwritten reports the
/// corruption and exits 1, without a panic and without changing a byte;
/// salvage copies what can be read. (Before: fsck panicked, exit 101, and
/// rewrote the file.)
#[test]
fn fsck_reads_a_corrupt_store_without_changing_it() {
    let mut m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let script = m.shared_file("fill.py");
    std::fs::write(&script, FILL).unwrap();
    let dir = format!("$M/accounts/{CAT}");
    m.ok(WRITER, &format!("mkdir -p {dir}"));
    m.ok(
        WRITER,
        &format!("/usr/bin/python3 {} {dir} c 60", script.display()),
    );
    // Three live blocks: those holding text of three nodes (a block of
    // free space overwritten harms nothing, and fsck rightly says clean).
    let samples: Vec<String> = [10, 30, 50]
        .iter()
        .map(|i| {
            let text = m.ok(READER, &format!("cat {dir}/c{i}/content.md"));
            text[50_000..50_064].to_string()
        })
        .collect();
    m.umount();
    let db = m.data.join("ctxfs.redb");
    let data = m.data.to_str().unwrap().to_string();
    let mut bytes = std::fs::read(&db).unwrap();
    for (k, sample) in samples.iter().enumerate() {
        let at = bytes
            .windows(sample.len())
            .position(|w| w == sample.as_bytes())
            .expect("the node's text is in the store file");
        let b = at / 4096;
        for (i, x) in bytes[b * 4096..(b + 1) * 4096].iter_mut().enumerate() {
            *x = (i * 31 + k * 7 + 13) as u8;
        }
    }
    std::fs::write(&db, &bytes).unwrap();
    for _ in 0..2 {
        let fsck = ctxfs(&["fsck", "--data", &data]);
        let text = String::from_utf8_lossy(&fsck.stdout);
        let err = String::from_utf8_lossy(&fsck.stderr);
        assert_eq!(fsck.status.code(), Some(1), "{text}{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            text.contains("I0: ") && text.contains("ctxfs salvage"),
            "{text}"
        );
        assert_eq!(std::fs::read(&db).unwrap(), bytes, "fsck changed the store");
    }
    let out = m.dir.path().join("salvaged");
    let salv = ctxfs(&["salvage", "--data", &data, "--out", out.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&salv.stdout);
    assert!(report.contains("nodes: "), "{report}");
    assert_eq!(
        std::fs::read(&db).unwrap(),
        bytes,
        "salvage changed the store"
    );
}
