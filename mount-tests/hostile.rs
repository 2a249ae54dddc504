//! Hostile input: every refusal has its errno, the daemon keeps serving,
//! and what was stored before is unchanged.

use crate::harness::*;

const REF: &str = "acme/users/alice/memories/prefs/ref";
const T: &str = "acme/users/alice/memories/prefs/target";

/// The bytes of every file of the reference node, as a reader sees them.
fn snapshot(m: &Mount) -> String {
    m.ok(
        READER,
        &format!("cd $M/accounts/{REF} && for f in content.md .abstract.md .overview.md .relations.json .meta.json; do echo \"== $f\"; cat $f; done"),
    )
}

#[test]
fn hostile_input_is_refused_with_its_errno_and_changes_nothing() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(WRITER, &four_steps(REF, "reference text", ACTIVE));
    m.ok(WRITER, &four_steps(T, "target v1", ACTIVE));
    let before = snapshot(&m);
    let n = format!("$M/accounts/{T}");

    // Huge .meta.json and .relations.json: EINVAL at close, with the reason.
    let big_meta = m.shared_file("big_meta.json");
    std::fs::write(
        &big_meta,
        format!(
            "{{\"status\":\"ACTIVE\",\"pad\":\"{}\"}}",
            "x".repeat(70 * 1024)
        ),
    )
    .unwrap();
    m.fails(
        WRITER,
        &format!("cat {} > {n}/.meta.json", big_meta.display()),
        "Invalid argument",
    );
    assert!(m
        .ok(WRITER, &format!("cat {n}/.commit-error"))
        .contains("at most 65536"));
    let big_rel = m.shared_file("big_rel.json");
    std::fs::write(&big_rel, format!("[{}]", " ".repeat(1100 * 1024))).unwrap();
    m.fails(
        WRITER,
        &format!(
            "cp {} {n}/.relations.json && /bin/echo '{ACTIVE}' > {n}/.meta.json",
            big_rel.display()
        ),
        "Invalid argument",
    );
    // Deeply nested and non-UTF-8 JSON.
    let deep = m.shared_file("deep.json");
    std::fs::write(&deep, "[".repeat(100_000)).unwrap();
    m.fails(
        WRITER,
        &format!(
            "cp {} {n}/.relations.json && /bin/echo '{ACTIVE}' > {n}/.meta.json",
            deep.display()
        ),
        "Invalid argument",
    );
    m.fails(
        WRITER,
        &format!("printf '\\377\\376' > {n}/content.md && /bin/echo '{ACTIVE}' > {n}/.meta.json"),
        "Invalid argument",
    );
    // The writer puts the draft right by committing it again.
    m.ok(WRITER, &four_steps(T, "target v1", ACTIVE));

    // Names: control bytes, DEL, newline, `..`, over-long names and paths.
    for bad in ["a\\001b", "a\\177b", "new\\nline", "tab\\tname"] {
        m.fails(
            WRITER,
            &format!("mkdir \"$M/accounts/acme/users/$(printf '{bad}')\""),
            "Invalid argument",
        );
    }
    // Inside a node any file name is a draft temp file (editors); one with
    // control bytes never becomes part of a version.
    m.ok(
        WRITER,
        &format!("touch \"{n}/$(printf 'x\\001y')\" && /bin/echo '{ACTIVE}' > {n}/.meta.json"),
    );
    assert_eq!(
        m.ok(READER, &format!("ls -a {n} | wc -l")).trim(),
        "7",
        "readers see . .. and the five node files"
    );
    m.ok(WRITER, &format!("rm \"{n}/$(printf 'x\\001y')\""));
    m.fails(
        WRITER,
        &format!("touch {n}/{}", "f".repeat(256)),
        "File name too long",
    );
    m.fails(
        WRITER,
        &format!("mkdir -p $M/accounts/acme/users/{}", "u".repeat(300)),
        "Invalid argument",
    );
    let deep_path = (0..40)
        .map(|_| "d".repeat(120))
        .collect::<Vec<_>>()
        .join("/");
    m.fails(
        WRITER,
        &format!("mkdir -p $M/accounts/acme/users/alice/memories/{deep_path}"),
        "",
    );
    m.fails(WRITER, &format!("mv {n} $M/accounts/acme/users/.."), "");
    m.fails(WRITER, &format!("touch {n}/.outbox"), "");
    m.fails(WRITER, &format!("mkdir {n}/.versions"), "File exists");

    // Links and special files.
    m.fails(
        WRITER,
        &format!("ln -s content.md {n}/link"),
        "Operation not permitted",
    );
    m.fails(
        WRITER,
        &format!("ln {n}/content.md {n}/hard"),
        "Operation not permitted",
    );
    m.fails(
        WRITER,
        &format!("mkfifo {n}/fifo"),
        "Operation not permitted",
    );

    // Moves across accounts; writes by readers and strangers.
    m.fails(
        WRITER,
        &format!("mv {n} $M/accounts/other/users/bob/memories/prefs/x"),
        "Permission denied",
    );
    m.fails(
        READER,
        &format!("echo x > {n}/content.md"),
        "Read-only file system",
    );
    m.fails(READER, &format!("rm -r {n}"), "Read-only file system");
    m.fails(
        STRANGER,
        &format!("cat {n}/content.md"),
        "Permission denied",
    );
    m.fails(
        STRANGER,
        &format!("echo x > {n}/content.md"),
        "Permission denied",
    );

    // The daemon still serves, and nothing of the above reached the store.
    assert_eq!(snapshot(&m), before);
    assert_eq!(m.ok(READER, &format!("cat {n}/content.md")), "target v1");
    let status = m.json(0, "cat $M/.ctxfs/status");
    assert_eq!(status["nodes"]["ACTIVE"], 2, "{status}");
    m.umount_and_fsck();
}

#[test]
fn a_million_tiny_writes_to_one_file() {
    // One byte per write, over a 200,000-byte file (a node holds at most
    // 300,000 bytes): every write reaches the daemon (drafts use direct I/O).
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(WRITER, &format!("mkdir -p $M/accounts/{T}"));
    let script = m.shared_file("tiny.py");
    std::fs::write(
        &script,
        "import os, sys\n\
         fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n\
         for i in range(1_000_000):\n    os.pwrite(fd, b'abcdefghij'[i % 10:i % 10 + 1], i % 200_000)\n\
         os.close(fd)\n",
    )
    .unwrap();
    m.ok(
        WRITER,
        &format!(
            "/usr/bin/python3 {} $M/accounts/{T}/content.md && /bin/echo '{ACTIVE}' > $M/accounts/{T}/.meta.json",
            script.display()
        ),
    );
    let sum = m.ok(READER, &format!("wc -c < $M/accounts/{T}/content.md"));
    assert_eq!(sum.trim(), "200000");
    let head = m.ok(READER, &format!("head -c 25 $M/accounts/{T}/content.md"));
    assert_eq!(head, "abcdefghijabcdefghijabcde");
    m.umount_and_fsck();
}

#[test]
fn concurrent_commits_of_one_node_by_two_writers() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(WRITER, &four_steps(T, "start", ACTIVE));
    // Each writer commits 25 versions; `flock` on the node directory makes
    // each four-step write one unit, so every version is one writer's.
    let step = m.shared_file("step.sh");
    std::fs::write(
        &step,
        "printf '%s %s' \"$1\" \"$2\" > \"$N/content.md\" && printf '%s' \"$1\" > \"$N/.abstract.md\" && \
         /bin/echo \"{\\\"status\\\":\\\"ACTIVE\\\",\\\"writer\\\":\\\"$1\\\",\\\"i\\\":$2}\" > \"$N/.meta.json\"\n",
    )
    .unwrap();
    let writer = |who: &str| {
        format!(
            "export N=$M/accounts/{T}; for i in $(seq 1 25); do flock $N sh {} {who} $i || exit 1; done",
            step.display()
        )
    };
    let a = m.spawn_as(WRITER, &writer("A"));
    let b = m.spawn_as(WRITER, &writer("B"));
    // A reader polls meanwhile: a version it reads whole (same version
    // number before and after) holds one writer's files.
    let check = m.shared_file("check.sh");
    std::fs::write(
        &check,
        "N=$M/accounts/$1; for i in $(seq 1 200); do \
           v1=$(grep '\"version\"' $N/.meta.json); c=$(cat $N/content.md); w=$(cat $N/.abstract.md); \
           v2=$(grep '\"version\"' $N/.meta.json); \
           if [ \"$v1\" = \"$v2\" ]; then case \"$c\" in start|\"$w \"*) ;; *) echo \"torn: $c / $w\"; exit 1;; esac; fi; \
         done\n",
    )
    .unwrap();
    let reader = m.spawn_as(READER, &format!("sh {} {T}", check.display()));
    for mut child in [a, b, reader] {
        assert!(child.wait().unwrap().success());
    }
    let v = m.json(READER, &format!("cat $M/accounts/{T}/.meta.json"));
    assert_eq!(v["version"], 51, "every commit made exactly one version");
    // Every version holds one writer's files; the last one is the winner.
    for ver in 2..=51 {
        let dir = format!("$M/accounts/{T}/.versions/{ver}");
        let meta = m.json(READER, &format!("cat {dir}/.meta.json"));
        let who = meta["writer"].as_str().unwrap();
        let content = m.ok(READER, &format!("cat {dir}/content.md"));
        assert_eq!(content, format!("{who} {}", meta["i"]), "version {ver}");
        assert_eq!(m.ok(READER, &format!("cat {dir}/.abstract.md")), who);
    }
    let last = m.ok(READER, &format!("cat $M/accounts/{T}/content.md"));
    let v51 = m.ok(
        READER,
        &format!("cat $M/accounts/{T}/.versions/51/content.md"),
    );
    assert_eq!(last, v51);
    m.umount_and_fsck();
}
