//! Several daemons, one namespace: two mounts of one PostgreSQL database
//! (a real PostgreSQL 18 with pgvector), each its own daemon with its own
//! data dir and kernel cache, as two hosts would run them.

use crate::harness::*;
use std::time::Duration;

const NODE: &str = "acme/users/alice/memories/prefs/tea";

fn pair(db: &PgDb) -> (Mount, Mount) {
    (
        db.mount(Some(CONFIG), &["--embedder", "hash"]),
        db.mount(Some(CONFIG), &["--embedder", "hash"]),
    )
}

/// `ctxfs fsck --store` of `db` finds nothing to report.
fn assert_fsck_clean(db: &PgDb) {
    let fsck = ctxfs(&["fsck", "--store", &db.url]);
    assert_eq!(
        String::from_utf8_lossy(&fsck.stdout),
        "clean\n",
        "{}",
        String::from_utf8_lossy(&fsck.stderr)
    );
}

fn seen(m: &Mount, uid: u32, script: &str, want: &str) -> bool {
    let o = m.sh(uid, script);
    o.status.success() && String::from_utf8_lossy(&o.stdout) == want
}

#[test]
fn a_commit_on_one_daemon_is_visible_on_the_other_within_a_second_and_never_before() {
    let db = PgDb::new();
    let (mut a, mut b) = pair(&db);
    let n = format!("$M/accounts/{NODE}");
    // The four-step write on A: nothing of it on B until the commit.
    a.ok(
        WRITER,
        &format!(
            "mkdir -p {n}; printf 'Sencha.\\n' > {n}/content.md; echo '[]' > {n}/.relations.json"
        ),
    );
    a.ok(
        WRITER,
        &format!("echo 'Alice drinks sencha.' > {n}/.abstract.md"),
    );
    b.fails(READER, &format!("cat {n}/content.md"), "No such file");
    b.fails(WRITER, &format!("ls {n}"), "No such file");
    a.ok(WRITER, &format!("/bin/echo '{ACTIVE}' > {n}/.meta.json"));
    let t = within(Duration::from_secs(1), || {
        seen(&b, READER, &format!("cat {n}/content.md"), "Sencha.\n")
    });
    assert!(t.is_some(), "the commit did not reach B within 1 s");
    assert_eq!(
        b.ok(READER, &format!("cat {n}/.abstract.md")),
        "Alice drinks sencha.\n"
    );

    // Updates, after B's kernel cached the node: each within 1 s.
    for v in 2..=4 {
        b.ok(
            READER,
            &format!("cat {n}/content.md {n}/.meta.json > /dev/null; ls {n}/.. > /dev/null"),
        );
        a.ok(
            WRITER,
            &format!(
                "printf 'Version {v}.\\n' > {n}/content.md; /bin/echo '{ACTIVE}' > {n}/.meta.json"
            ),
        );
        let t = within(Duration::from_secs(1), || {
            seen(
                &b,
                READER,
                &format!("cat {n}/content.md"),
                &format!("Version {v}.\n"),
            )
        });
        assert!(t.is_some(), "version {v} did not reach B within 1 s");
        let meta = b.json(READER, &format!("cat {n}/.meta.json"));
        assert_eq!(meta["version"], v);
    }
    // Versions written on A are readable on B.
    assert_eq!(
        b.ok(READER, &format!("cat {n}/.versions/1/content.md")),
        "Sencha.\n"
    );

    // Tenancy holds on both daemons.
    for m in [&a, &b] {
        m.fails(
            STRANGER,
            &format!("cat {n}/content.md"),
            "Permission denied",
        );
        m.fails(
            READER,
            &format!("echo x > {n}/content.md"),
            "Read-only file system",
        );
    }

    // Search on B finds what A wrote, once B's .ctxfs/sync returns.
    b.ok(WRITER, "cat $M/.ctxfs/sync");
    let hits = b.ok(READER, "cat \"$M/accounts/acme/.search/version 4\"");
    assert!(hits.contains("memories/prefs/tea"), "{hits}");
    // The same query gives the same answer on both daemons once each
    // daemon's sync has returned.
    a.ok(WRITER, "cat $M/.ctxfs/sync");
    let q = "cat \"$M/accounts/acme/.search/what does alice drink?k=5\"";
    assert_eq!(a.ok(READER, q), b.ok(READER, q));

    // A move on A: B sees the new place, not the old.
    let moved = "$M/accounts/acme/users/alice/memories/drinks/tea".to_string();
    a.ok(
        WRITER,
        &format!("mkdir -p $M/accounts/acme/users/alice/memories/drinks; mv {n} {moved}"),
    );
    assert!(
        within(Duration::from_secs(1), || seen(
            &b,
            READER,
            &format!("cat {moved}/content.md"),
            "Version 4.\n"
        ))
        .is_some(),
        "the move did not reach B"
    );
    b.fails(READER, &format!("cat {n}/content.md"), "No such file");
    // A delete on A.
    a.ok(WRITER, &format!("rm -r {moved}"));
    assert!(
        within(Duration::from_secs(1), || !b
            .sh(READER, &format!("ls {moved}"))
            .status
            .success())
        .is_some(),
        "the delete did not reach B"
    );
    // B writes, A reads: the other way round.
    b.ok(
        WRITER,
        &four_steps("acme/users/bob/memories/p/x", "from B", ACTIVE),
    );
    assert!(within(Duration::from_secs(1), || seen(
        &a,
        READER,
        "cat $M/accounts/acme/users/bob/memories/p/x/content.md",
        "from B"
    ))
    .is_some());
    a.umount();
    b.umount();
}

#[test]
fn expiry_on_one_daemon_hides_the_node_on_the_other() {
    let db = PgDb::new();
    let (a, b) = pair(&db);
    let n = "acme/users/alice/memories/tmp/short";
    a.ok(
        WRITER,
        &four_steps(n, "short-lived", r#"{"status":"ACTIVE","ttl_seconds":2}"#),
    );
    assert!(within(Duration::from_secs(1), || seen(
        &b,
        READER,
        &format!("cat $M/accounts/{n}/content.md"),
        "short-lived"
    ))
    .is_some());
    // Gone on both within a second of its expiry.
    std::thread::sleep(Duration::from_secs(2));
    for (name, m) in [("A", &a), ("B", &b)] {
        assert!(
            within(Duration::from_secs(1), || !m
                .sh(READER, &format!("cat $M/accounts/{n}/content.md"))
                .status
                .success())
            .is_some(),
            "the expired node is still readable on {name}"
        );
    }
}

/// A commits one node in a loop; readers on B read its content, 16 KiB of
/// lines that all name one version: never a mix of two.
#[test]
fn readers_on_one_daemon_never_see_a_torn_node_while_the_other_commits_it() {
    let db = PgDb::new();
    let (a, b) = pair(&db);
    let n = format!("$M/accounts/{NODE}");
    let writer = a.spawn_as(
        WRITER,
        &format!(
            "set -e; mkdir -p {n}; echo '[]' > {n}/.relations.json; for i in $(seq 1 30); do \
             yes \"version $i\" | head -c 16384 > {n}/content.md; /bin/echo '{ACTIVE}' > {n}/.meta.json; done"
        ),
    );
    let reader = b.spawn_piped(
        READER,
        &format!(
            "torn=0; reads=0; end=$(( $(date +%s) + 30 )); while [ $(date +%s) -lt $end ]; do \
               if f=$(cat {n}/content.md 2>/dev/null); then reads=$((reads+1)); \
                 k=$(printf '%s\\n' \"$f\" | sort -u | wc -l); \
                 [ \"$k\" -gt 2 ] && torn=$((torn+1)); \
                 case \"$f\" in *'version 30'*) break;; esac; fi; done; echo \"$reads $torn\""
        ),
    );
    let w = writer.wait_with_output().unwrap();
    assert!(w.status.success());
    let out = reader.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(v[0] > 0, "B never read the node");
    assert_eq!(
        v[1], 0,
        "{} of {} reads on B mixed two versions",
        v[1], v[0]
    );
    let meta = b.json(READER, &format!("cat {n}/.meta.json"));
    assert_eq!(meta["version"], 30);
}

/// Both daemons commit the same node at once: every commit is a version of
/// its own (the compare-and-set plans a commit again when the other daemon
/// got there first), none lost.
#[test]
fn concurrent_commits_of_one_node_on_two_daemons_are_all_versions() {
    let db = PgDb::new();
    let (a, b) = pair(&db);
    let n = format!("$M/accounts/{NODE}");
    a.ok(WRITER, &four_steps(NODE, "start", ACTIVE));
    assert!(within(Duration::from_secs(1), || b
        .sh(READER, &format!("cat {n}/content.md"))
        .status
        .success())
    .is_some());
    let script = |tag: &str| {
        format!(
            "set -e; for i in $(seq 1 15); do printf '{tag} %s' $i > {n}/content.md; /bin/echo '{ACTIVE}' > {n}/.meta.json; done"
        )
    };
    let ja = a.spawn_as(WRITER, &script("A"));
    let jb = b.spawn_as(WRITER, &script("B"));
    for j in [ja, jb] {
        let o = j.wait_with_output().unwrap();
        assert!(o.status.success(), "a writer failed: {:?}", o.status);
    }
    let meta = a.json(READER, &format!("cat {n}/.meta.json"));
    assert_eq!(meta["version"], 31, "{meta}");
    // Every version holds one writer's text; all 30 are there.
    let all = a.ok(
        READER,
        &format!("for v in $(seq 2 31); do cat {n}/.versions/$v/content.md; echo; done | sort"),
    );
    let mut want: Vec<String> = (1..=15)
        .flat_map(|i| [format!("A {i}"), format!("B {i}")])
        .collect();
    want.sort();
    let got: Vec<&str> = all.lines().collect();
    assert_eq!(got, want);
}

/// `kill -9` of one daemon loses nothing it acknowledged; the other keeps
/// answering, takes over the indexer, and the killed one comes back.
#[test]
fn kill_9_of_one_daemon_loses_nothing_and_the_other_keeps_serving() {
    let db = PgDb::new();
    let (mut a, b) = pair(&db);
    let nodes: Vec<String> = (0..20)
        .map(|i| format!("acme/users/alice/memories/k/n{i}"))
        .collect();
    for (i, n) in nodes.iter().enumerate() {
        a.ok(WRITER, &four_steps(n, &format!("node {i}"), ACTIVE));
    }
    a.kill9();
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(
            b.ok(READER, &format!("cat $M/accounts/{n}/content.md")),
            format!("node {i}")
        );
    }
    // B keeps committing and its search catches up (it leads the indexer now).
    b.ok(
        WRITER,
        &four_steps(
            "acme/users/alice/memories/k/after",
            "written after the kill",
            ACTIVE,
        ),
    );
    b.ok(WRITER, "cat $M/.ctxfs/sync");
    let hits = b.ok(
        READER,
        "cat \"$M/accounts/acme/.search/written after the kill\"",
    );
    assert!(hits.contains("memories/k/after"), "{hits}");
    // A again: everything is there.
    a.mount();
    assert_eq!(
        a.ok(READER, "ls $M/accounts/acme/users/alice/memories/k | wc -l")
            .trim(),
        "21"
    );
    assert_eq!(
        a.ok(
            READER,
            "cat $M/accounts/acme/users/alice/memories/k/after/content.md"
        ),
        "written after the kill"
    );
}

/// PostgreSQL stopped and started while A commits and B reads: every
/// acknowledged commit survives, no read answers wrongly (a read either
/// fails with EIO or gives the committed text), both daemons recover.
#[test]
fn a_postgresql_restart_under_load_loses_nothing_acknowledged() {
    let db = PgDb::alone();
    let (a, b) = pair(&db);
    let acked = a.shared_file("acked");
    let wrong = b.shared_file("wrong");
    let writer = a.spawn_as(
        WRITER,
        &format!(
            "for i in $(seq 1 60); do N=$M/accounts/acme/users/alice/memories/r/n$i; \
             mkdir -p $N 2>/dev/null && printf 'node %s' $i > $N/content.md 2>/dev/null \
             && /bin/echo '{ACTIVE}' > $N/.meta.json 2>/dev/null && echo $i >> {acked}; sleep 0.05; done",
            acked = acked.display()
        ),
    );
    let reader = b.spawn_as(
        READER,
        &format!(
            "end=$(( $(date +%s) + 8 )); while [ $(date +%s) -lt $end ]; do \
               for f in $M/accounts/acme/users/alice/memories/r/*/content.md; do \
                 [ -e \"$f\" ] || continue; t=$(cat \"$f\" 2>/dev/null) || continue; i=${{f%/content.md}}; i=${{i##*/n}}; \
                 [ \"$t\" = \"node $i\" ] || echo \"$f: $t\" >> {wrong}; done; done",
            wrong = wrong.display()
        ),
    );
    std::thread::sleep(Duration::from_millis(700));
    db.restart_server();
    writer.wait_with_output().unwrap();
    reader.wait_with_output().unwrap();
    assert_eq!(
        std::fs::read_to_string(&wrong).unwrap(),
        "",
        "wrong answers on B"
    );
    let acked: Vec<String> = std::fs::read_to_string(&acked)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        acked.len() >= 20,
        "only {} commits acknowledged",
        acked.len()
    );
    // Both daemons answer again, with every acknowledged commit.
    for (name, m) in [("A", &a), ("B", &b)] {
        for i in &acked {
            let f = format!("$M/accounts/acme/users/alice/memories/r/n{i}/content.md");
            assert!(
                within(Duration::from_secs(10), || seen(
                    m,
                    READER,
                    &format!("cat {f}"),
                    &format!("node {i}")
                ))
                .is_some(),
                "{name} lost acknowledged commit n{i}"
            );
        }
    }
    // And commit again.
    a.ok(
        WRITER,
        &four_steps(
            "acme/users/alice/memories/r/after",
            "after the restart",
            ACTIVE,
        ),
    );
    assert!(within(Duration::from_secs(2), || seen(
        &b,
        READER,
        "cat $M/accounts/acme/users/alice/memories/r/after/content.md",
        "after the restart"
    ))
    .is_some());
}

/// `ctxfs migrate` copies an embedded store, with its versions, scratchpad
/// and index, into PostgreSQL; daemons on the database serve all of it.
#[test]
fn migrate_copies_an_embedded_store_into_postgresql() {
    let db = PgDb::new();
    let mut local = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let n = "acme/users/alice/memories/prefs/tea";
    local.ok(WRITER, &four_steps(n, "Sencha.", ACTIVE));
    local.ok(WRITER, &four_steps(n, "Genmaicha.", ACTIVE));
    local.ok(
        WRITER,
        &four_steps("acme/agents/bot/skills/brew", "Boil, wait, pour.", ACTIVE),
    );
    local.ok(WRITER, "mkdir -p $M/accounts/acme/projects/p/scratchpad && echo plan > $M/accounts/acme/projects/p/scratchpad/plan.txt");
    local.ok(0, "cat $M/.ctxfs/sync");
    local.umount();
    let data = local.data.to_str().unwrap().to_string();
    let out = ctxfs(&["migrate", "--data", &data, "--store", &db.url]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("versions: 3") && text.contains("migrated "),
        "{text}"
    );
    // Into a database that holds data already: refused, nothing changed.
    let again = ctxfs(&["migrate", "--data", &data, "--store", &db.url]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds ctxfs data"));

    let m = db.mount(Some(CONFIG), &["--embedder", "hash"]);
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{n}/content.md")),
        "Genmaicha."
    );
    assert_eq!(
        m.ok(
            READER,
            &format!("cat $M/accounts/{n}/.versions/1/content.md")
        ),
        "Sencha."
    );
    assert_eq!(
        m.json(READER, &format!("cat $M/accounts/{n}/.meta.json"))["version"],
        2
    );
    assert_eq!(
        m.ok(
            WRITER,
            "cat $M/accounts/acme/projects/p/scratchpad/plan.txt"
        ),
        "plan\n"
    );
    m.ok(0, "cat $M/.ctxfs/sync");
    let hits = m.ok(READER, "cat \"$M/accounts/acme/.search/boil wait pour\"");
    assert!(hits.contains("skills/brew"), "{hits}");
    // And the next commit continues the ids and versions.
    m.ok(WRITER, &four_steps(n, "Hojicha.", ACTIVE));
    assert_eq!(
        m.json(READER, &format!("cat $M/accounts/{n}/.meta.json"))["version"],
        3
    );
}

/// A network namespace joined to this one by a veth pair: another host,
/// as far as the network goes. Removed on drop.
struct NetHost {
    ns: String,
    veth: String,
}

fn ip(args: &str) {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ip {args}"))
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetHost {
    fn new() -> NetHost {
        let tag = std::process::id() % 10_000;
        let (ns, veth) = (format!("ctxfs-h{tag}"), format!("ctxv{tag}"));
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &ns])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &format!("{veth}a")])
            .output();
        ip(&format!("netns add {ns}"));
        ip(&format!("link add {veth}a type veth peer name {veth}b"));
        ip(&format!("link set {veth}b netns {ns}"));
        ip(&format!("addr add 10.231.0.1/24 dev {veth}a"));
        ip(&format!("link set {veth}a up"));
        ip(&format!("-n {ns} addr add 10.231.0.2/24 dev {veth}b"));
        ip(&format!("-n {ns} link set {veth}b up"));
        ip(&format!("-n {ns} link set lo up"));
        NetHost { ns, veth }
    }

    /// Cut (or restore) the link between the two hosts.
    fn link(&self, up: bool) {
        ip(&format!(
            "link set {}a {}",
            self.veth,
            if up { "up" } else { "down" }
        ));
    }
}

impl Drop for NetHost {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &format!("{}a", self.veth)])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .output();
    }
}

/// Two daemons in two network namespaces, the database reachable from the
/// second over a veth pair: commits cross in both directions within 1 s;
/// when the link is cut, the cut-off daemon's requests fail with EIO (never
/// a wrong answer) while the other keeps serving, and once the link is back
/// it catches up with what it missed and commits again.
#[test]
fn two_hosts_in_network_namespaces_and_a_partition_between_them() {
    let db = PgDb::alone();
    db.restart_server(); // listen on the veth address too
    let host = NetHost::new();
    let remote_url = db.url.replace("127.0.0.1", "10.231.0.1");
    let net = format!("--net=/run/netns/{}", host.ns);
    let a = Mount::with_prefix(
        Some(CONFIG),
        &["--embedder", "hash", "--store", &remote_url],
        &[],
        &["nsenter", &net],
    );
    let b = db.mount(Some(CONFIG), &["--embedder", "hash"]);
    // A's daemon really is in the other namespace.
    let pid = a.daemon_pid();
    let ns_of = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
    assert_ne!(ns_of(pid), ns_of(std::process::id() as i32));

    let n1 = "acme/users/alice/memories/net/one";
    a.ok(WRITER, &four_steps(n1, "from host A", ACTIVE));
    assert!(within(Duration::from_secs(1), || seen(
        &b,
        READER,
        &format!("cat $M/accounts/{n1}/content.md"),
        "from host A"
    ))
    .is_some());
    let n2 = "acme/users/alice/memories/net/two";
    b.ok(WRITER, &four_steps(n2, "from host B", ACTIVE));
    assert!(within(Duration::from_secs(1), || seen(
        &a,
        READER,
        &format!("cat $M/accounts/{n2}/content.md"),
        "from host B"
    ))
    .is_some());
    a.fails(
        STRANGER,
        &format!("cat $M/accounts/{n2}/content.md"),
        "Permission denied",
    );

    // The partition.
    host.link(false);
    let n3 = "acme/users/alice/memories/net/three";
    b.ok(WRITER, &four_steps(n3, "while A was cut off", ACTIVE));
    assert_eq!(
        b.ok(READER, &format!("cat $M/accounts/{n3}/content.md")),
        "while A was cut off"
    );
    // A cannot know of it: an error, not "no such file".
    let o = a.sh(READER, &format!("cat $M/accounts/{n3}/content.md"));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("Input/output error"), "{err}");
    // A commit on A fails (EIO) and is not half-made anywhere.
    let n4 = "acme/users/alice/memories/net/four";
    let o = a.sh(WRITER, &four_steps(n4, "cut off", ACTIVE));
    assert!(!o.status.success());
    b.fails(READER, &format!("ls $M/accounts/{n4}"), "No such file");

    // Healed: A catches up and commits again.
    host.link(true);
    assert!(
        within(Duration::from_secs(15), || seen(
            &a,
            READER,
            &format!("cat $M/accounts/{n3}/content.md"),
            "while A was cut off"
        ))
        .is_some(),
        "A did not catch up after the partition"
    );
    a.ok(WRITER, &four_steps(n4, "after the partition", ACTIVE));
    assert!(within(Duration::from_secs(1), || seen(
        &b,
        READER,
        &format!("cat $M/accounts/{n4}/content.md"),
        "after the partition"
    ))
    .is_some());
}

/// Appends to a project's activity log from two daemons at once: every
/// line lands (each daemon adds its own bytes to the log as stored).
#[test]
fn activity_log_appends_from_two_daemons_lose_no_line() {
    let db = PgDb::new();
    let (a, b) = pair(&db);
    a.ok(WRITER, "mkdir -p $M/accounts/acme/projects/p/scratchpad");
    assert!(within(Duration::from_secs(1), || b
        .sh(WRITER, "ls $M/accounts/acme/projects/p/scratchpad")
        .status
        .success())
    .is_some());
    let log = "$M/accounts/acme/projects/p/activity_log.jsonl";
    let script = |tag: &str| {
        format!("for i in $(seq 1 100); do echo \"{{\\\"from\\\":\\\"{tag}\\\",\\\"i\\\":$i}}\" >> {log}; done")
    };
    let ja = a.spawn_as(WRITER, &script("A"));
    let jb = b.spawn_as(WRITER, &script("B"));
    assert!(ja.wait_with_output().unwrap().status.success());
    assert!(jb.wait_with_output().unwrap().status.success());
    for m in [&a, &b] {
        let ok = within(Duration::from_secs(2), || {
            let text = m.ok(READER, &format!("cat {log}"));
            text.lines().count() == 200
        });
        let text = m.ok(READER, &format!("cat {log}"));
        assert!(ok.is_some(), "{} lines:\n{text}", text.lines().count());
        for tag in ["A", "B"] {
            for i in 1..=100 {
                let line = format!("{{\"from\":\"{tag}\",\"i\":{i}}}");
                assert!(text.lines().any(|l| l == line), "missing {line}");
            }
        }
    }
}

/// `flock` on a scratchpad file excludes across daemons: a lock held on A
/// makes B's non-blocking try fail, and a counter incremented under `flock`
/// from both daemons at once counts every increment.
#[test]
fn flock_on_scratchpad_files_excludes_across_daemons() {
    let db = PgDb::new();
    let (a, b) = pair(&db);
    let sp = "$M/accounts/acme/projects/p/scratchpad";
    a.ok(
        WRITER,
        &format!("mkdir -p {sp} && echo 0 > {sp}/counter && : > {sp}/lock"),
    );
    assert!(within(Duration::from_secs(1), || b
        .sh(WRITER, &format!("cat {sp}/counter"))
        .status
        .success())
    .is_some());
    // A holds it for two seconds: B cannot take it meanwhile, then can.
    let holder = a.spawn_as(WRITER, &format!("flock -x {sp}/lock sleep 2"));
    assert!(
        within(Duration::from_secs(2), || !b
            .sh(WRITER, &format!("flock -n {sp}/lock true"))
            .status
            .success())
        .is_some(),
        "B took a lock A holds"
    );
    holder.wait_with_output().unwrap();
    b.ok(WRITER, &format!("flock -n {sp}/lock true"));
    // Shared locks coexist across daemons; an exclusive one waits for them.
    let reader = a.spawn_as(WRITER, &format!("flock -s {sp}/lock sleep 2"));
    assert!(within(Duration::from_secs(2), || !b
        .sh(WRITER, &format!("flock -n -x {sp}/lock true"))
        .status
        .success())
    .is_some());
    b.ok(WRITER, &format!("flock -n -s {sp}/lock true"));
    reader.wait_with_output().unwrap();
    // Read-increment-write under the lock, 15 times from each daemon at once.
    let inc = format!(
        "for i in $(seq 1 15); do flock {sp}/lock sh -c 'n=$(cat {sp}/counter); echo $((n+1)) > {sp}/counter'; done"
    );
    let ja = a.spawn_as(WRITER, &inc);
    let jb = b.spawn_as(WRITER, &inc);
    assert!(ja.wait_with_output().unwrap().status.success());
    assert!(jb.wait_with_output().unwrap().status.success());
    assert_eq!(a.ok(WRITER, &format!("cat {sp}/counter")), "30\n");
    assert_eq!(b.ok(WRITER, &format!("cat {sp}/counter")), "30\n");
}

/// The offline commands take `--store URL` in place of `--data DIR`:
/// fsck checks the shared store, export and import move nodes between
/// databases, reindex refuses while a daemon indexes and works after.
#[test]
fn offline_commands_work_on_a_postgresql_store() {
    let db = PgDb::new();
    let other = PgDb::new();
    let mut m = db.mount(Some(CONFIG), &["--embedder", "hash"]);
    let n = "acme/users/alice/memories/prefs/tea";
    m.ok(WRITER, &four_steps(n, "Sencha.", ACTIVE));
    m.ok(WRITER, &four_steps(n, "Genmaicha.", ACTIVE));
    let busy = ctxfs(&["reindex", "--store", &db.url, "--embedder", "hash"]);
    assert!(!busy.status.success());
    assert!(String::from_utf8_lossy(&busy.stderr).contains("a daemon is indexing"));
    m.umount();

    assert_fsck_clean(&db);
    let out = m.dir.path().join("export");
    let e = ctxfs(&["export", "--store", &db.url, out.to_str().unwrap()]);
    assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
    assert_eq!(
        std::fs::read_to_string(out.join(format!("accounts/{n}/content.md"))).unwrap(),
        "Genmaicha."
    );
    let i = ctxfs(&["import", "--store", &other.url, out.to_str().unwrap()]);
    assert!(i.status.success(), "{}", String::from_utf8_lossy(&i.stderr));
    let r = ctxfs(&["reindex", "--store", &db.url, "--embedder", "hash"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(String::from_utf8_lossy(&r.stdout).contains("reindexed 1 node(s)"));

    let m2 = other.mount(Some(CONFIG), &["--embedder", "hash"]);
    assert_eq!(
        m2.ok(READER, &format!("cat $M/accounts/{n}/content.md")),
        "Genmaicha."
    );
    m2.ok(0, "cat $M/.ctxfs/sync");
    let hits = m2.ok(READER, "cat \"$M/accounts/acme/.search/genmaicha\"");
    assert!(hits.contains("prefs/tea"), "{hits}");
}

/// An account's searches per minute are counted across daemons: what one
/// daemon spent, the other cannot spend again.
#[test]
fn search_rate_limits_are_the_accounts_across_daemons() {
    let db = PgDb::new();
    let config = format!("{CONFIG}\n[account.quota]\n");
    // The quota goes on the last account of CONFIG ("other", writer 1003).
    let config = config.replace(
        "[account.quota]\n",
        "[account.quota]\nsearches_per_minute = 4\n",
    );
    let a = db.mount(Some(&config), &["--embedder", "hash"]);
    let b = db.mount(Some(&config), &["--embedder", "hash"]);
    a.ok(
        STRANGER,
        &four_steps("other/users/o/memories/p/x", "rate limited", ACTIVE),
    );
    a.ok(0, "cat $M/.ctxfs/sync");
    let q = "cat \"$M/accounts/other/.search/rate\" > /dev/null";
    // Wait for a fresh minute if this one is nearly over.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if secs % 60 > 50 {
        std::thread::sleep(Duration::from_secs(61 - secs % 60));
    }
    a.ok(STRANGER, q);
    a.ok(STRANGER, q);
    b.ok(STRANGER, q);
    b.ok(STRANGER, q);
    // Four spent between the two daemons: the fifth is refused on either.
    b.fails(STRANGER, q, "Resource temporarily unavailable");
    a.fails(STRANGER, q, "Resource temporarily unavailable");
}

/// One tenant's blocked `flock`s cannot freeze the daemon: each wait runs
/// on a thread of its own, at most 8 per uid (more get `ENOLCK` at once),
/// and a Ctrl-C ends a wait. Before: 24 blocking `flock -x` of one tenant
/// on its own scratchpad file held every FUSE worker, and another
/// account's `ls` took 58 s.
#[test]
fn a_tenants_blocked_flocks_do_not_hold_the_workers() {
    let db = PgDb::new();
    let m = db.mount(Some(CONFIG), &["--embedder", "hash"]);
    let sp = "$M/accounts/other/projects/p/scratchpad";
    m.ok(STRANGER, &format!("mkdir -p {sp} && : > {sp}/lock"));
    m.ok(WRITER, "mkdir -p $M/accounts/acme/users/alice/memories/c");
    let holder = m.spawn_as(STRANGER, &format!("flock -x {sp}/lock sleep 8"));
    std::thread::sleep(Duration::from_millis(500));
    let waiters: Vec<_> = (0..24)
        .map(|_| {
            m.spawn_piped(
                STRANGER,
                &format!("flock -x -w 20 {sp}/lock true; echo rc=$?"),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let t = std::time::Instant::now();
    m.ok(
        WRITER,
        "ls $M/accounts/acme/users/alice/memories >/dev/null",
    );
    m.ok(READER, "stat $M/accounts/acme >/dev/null");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "another account waited {:?} behind one tenant's locks",
        t.elapsed()
    );
    // Ctrl-C ends a wait at once.
    let mut cc = m.spawn_as(WRITER, "mkdir -p $M/accounts/acme/projects/q/scratchpad && : > $M/accounts/acme/projects/q/scratchpad/l && exec flock -x $M/accounts/acme/projects/q/scratchpad/l sleep 30");
    std::thread::sleep(Duration::from_millis(500));
    let mut other = m.spawn_as(
        WRITER,
        "exec flock -x $M/accounts/acme/projects/q/scratchpad/l true",
    );
    std::thread::sleep(Duration::from_millis(700));
    unsafe { libc::kill(other.id() as i32, libc::SIGINT) };
    let t = std::time::Instant::now();
    let gone = within(Duration::from_secs(3), || {
        other.try_wait().unwrap().is_some()
    });
    assert!(gone.is_some(), "a waiting flock ignored Ctrl-C");
    assert!(t.elapsed() < Duration::from_secs(3));
    unsafe { libc::kill(cc.id() as i32, libc::SIGKILL) };
    let _ = cc.wait();
    holder.wait_with_output().unwrap();
    let outs: Vec<String> = waiters
        .into_iter()
        .map(|c| String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).into_owned())
        .collect();
    let took = outs.iter().filter(|o| o.contains("rc=0")).count();
    assert_eq!(took, 8, "8 waits of one uid, the rest refused: {outs:?}");
}

/// Daemons of one store share their tenancy, review, quota, indexing and
/// redaction settings: a daemon whose config differs from those serving
/// refuses to start, naming what differs; with no daemon serving, a new
/// config becomes the store's. Before: each daemon used its own, so a
/// leader lacking an account failed its jobs, one without `review = true`
/// committed an account in review, and quotas were each daemon's.
#[test]
fn daemons_with_different_configs_do_not_share_a_store() {
    let db = PgDb::new();
    let a = db.mount(Some(CONFIG), &["--embedder", "hash"]);
    let review = format!("{CONFIG}\n[[account]]\nid = \"rev\"\nwriters = [1004]\nreview = true\n");
    let mut prepared = Mount::prepared(
        Some(&review),
        &["--store", db.url.as_str(), "--embedder", "hash"],
        &[],
        &[],
    );
    let out = prepared.try_mount();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a daemon with another config joined");
    assert!(
        err.contains("differs from that of the daemons serving this store")
            && err.contains("review: theirs \"\", this daemon's \"rev\""),
        "{err}"
    );
    // The same config joins.
    let b = db.mount(Some(CONFIG), &["--embedder", "hash"]);
    b.ok(WRITER, &four_steps(NODE, "shared", ACTIVE));
    drop(a);
    drop(b);
    // No daemon serves: the new config is the store's from now on.
    let c = db.mount(Some(&review), &["--embedder", "hash"]);
    assert_eq!(
        c.ok(READER, &format!("cat $M/accounts/{NODE}/content.md")),
        "shared"
    );
    prepared.config = None;
    let d = prepared.try_mount();
    assert!(
        !d.status.success(),
        "a daemon without the config joined one with it"
    );
    drop(c);
}

/// A follower (the daemon that does not index) applies what the other
/// daemon's indexer changed to its loaded index in place: new, moved and
/// deleted nodes show in its searches (lexical and vector) without the
/// account being loaded again.
#[test]
fn a_follower_applies_index_changes_without_reloading() {
    let db = PgDb::new();
    let (a, b) = pair(&db);
    let leads = |m: &Mount| m.json(0, "cat $M/.ctxfs/status")["indexer"]["leads"] == true;
    let (leader, follower) = if leads(&a) { (&a, &b) } else { (&b, &a) };
    assert!(!leads(follower), "both daemons lead the indexer");
    for i in 0..30 {
        leader.ok(
            WRITER,
            &four_steps(
                &format!("acme/users/alice/memories/notes/n{i}"),
                &format!("note number {i} about gardening"),
                ACTIVE,
            ),
        );
    }
    leader.ok(WRITER, "cat $M/.ctxfs/sync");
    follower.ok(WRITER, "cat $M/.ctxfs/sync");
    let hits = follower.ok(READER, "cat \"$M/accounts/acme/.search/gardening\"");
    assert!(hits.contains("notes/n"), "{hits}");
    let stat = |m: &Mount, k: &str| {
        m.json(0, "cat $M/.ctxfs/status")["indexer"][k]
            .as_u64()
            .unwrap()
    };
    let loads = stat(follower, "index_loads");
    assert!(loads >= 1);

    leader.ok(
        WRITER,
        &four_steps(
            "acme/users/alice/memories/fruit/q",
            "the quokkaberry harvest",
            ACTIVE,
        ),
    );
    leader.ok(WRITER, "cat $M/.ctxfs/sync");
    let found = within(Duration::from_secs(2), || {
        follower
            .ok(READER, "cat \"$M/accounts/acme/.search/quokkaberry\"")
            .contains("fruit/q")
    });
    assert!(found.is_some(), "the follower did not see the new node");
    // A move and a delete.
    leader.ok(
        WRITER,
        "mkdir -p $M/accounts/acme/users/alice/memories/harvest && \
         mv $M/accounts/acme/users/alice/memories/fruit/q $M/accounts/acme/users/alice/memories/harvest/q && \
         rm -r $M/accounts/acme/users/alice/memories/notes/n3",
    );
    leader.ok(WRITER, "cat $M/.ctxfs/sync");
    let mut last = String::new();
    let moved = within(Duration::from_secs(2), || {
        last = follower.ok(READER, "cat \"$M/accounts/acme/.search/quokkaberry\"");
        last.contains("harvest/q")
            && !last.contains("\taccounts/acme/users/alice/memories/fruit/q\t")
    });
    assert!(
        moved.is_some(),
        "the follower did not see the move: {last}\nthe leader: {}",
        leader.ok(READER, "cat \"$M/accounts/acme/.search/quokkaberry\"")
    );
    let v = follower.ok(
        READER,
        "cat \"$M/accounts/acme/.search/quokkaberry harvest?mode=vector&k=3\"",
    );
    assert!(
        v.contains("harvest/q"),
        "vector search lost the moved node: {v}"
    );
    let h = follower.ok(
        READER,
        "cat \"$M/accounts/acme/.search/note number 3?k=40\"",
    );
    assert!(
        !h.contains("\taccounts/acme/users/alice/memories/notes/n3\t"),
        "{h}"
    );
    // The same answers as the leader, and no reload on the follower.
    let q = "cat \"$M/accounts/acme/.search/gardening quokkaberry?k=5\"";
    assert_eq!(leader.ok(READER, q), follower.ok(READER, q));
    assert_eq!(
        stat(follower, "index_loads"),
        loads,
        "the follower reloaded"
    );
    assert!(stat(follower, "remote_docs_applied") >= 3);
}

/// A batch on PostgreSQL takes its event ids once the chunk is planned (one
/// range, not one round trip per event): every node of two batches over
/// the same nodes ends indexed at its newest text on both daemons, and the
/// store checks clean.
#[test]
fn batches_on_postgresql_take_their_event_ids_at_once() {
    let db = PgDb::new();
    let (mut a, mut b) = pair(&db);
    let py = r#"
import json, sys
path, word = sys.argv[1], sys.argv[2]
with open(path, "w") as f:
    for i in range(150):
        f.write(json.dumps({"node": f"users/alice/memories/bulk/n{i}",
                            "content": f"bulk note {i} says {word}{i}",
                            "meta": {"status": "ACTIVE"}}) + "\n")
"#;
    let script = a.shared_file("bulk.py");
    std::fs::write(&script, py).unwrap();
    for word in ["oldword", "newword"] {
        a.ok(
            WRITER,
            &format!(
                "/usr/bin/python3 {} $M/accounts/acme/.ctxfs/batch {word}",
                script.display()
            ),
        );
    }
    a.ok(WRITER, "cat $M/.ctxfs/sync");
    b.ok(WRITER, "cat $M/.ctxfs/sync");
    for m in [&a, &b] {
        let hits = m.ok(READER, "cat \"$M/accounts/acme/.search/newword77?k=3\"");
        assert!(hits.contains("bulk/n77\t"), "{hits}");
        let old = m.ok(
            READER,
            "cat \"$M/accounts/acme/.search/oldword77?mode=lexical&k=3\"",
        );
        assert!(!old.contains("bulk/n77\t"), "the older version won: {old}");
        assert_eq!(
            m.ok(
                READER,
                "cat $M/accounts/acme/users/alice/memories/bulk/n149/content.md"
            ),
            "bulk note 149 says newword149"
        );
    }
    a.umount();
    b.umount();
    let out = ctxfs(&["fsck", "--store", &db.url]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A database a daemon of schema version 1 left (one counter row a key,
/// event ids in `high_water`, no `version` column) is migrated at mount:
/// the nodes' versions are filled in from their records, so the next
/// commit's check in the server passes; event ids go on from the old mark;
/// the counters still add up (fsck).
#[test]
fn a_version_1_database_is_migrated_at_mount() {
    let db = PgDb::new();
    let n = "acme/users/alice/memories/prefs/tea";
    let mut m = db.mount(Some(CONFIG), &["--embedder", "hash"]);
    m.ok(WRITER, &four_steps(n, "Sencha.", ACTIVE));
    m.ok(WRITER, &four_steps(n, "Genmaicha.", ACTIVE));
    m.ok(0, "cat $M/.ctxfs/sync");
    m.umount();
    // Back to version 1, as such a daemon would have left it.
    db.sql(
        "INSERT INTO high_water (key, value) \
           SELECT 'event', CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM ctxfs_event_ids; \
         DROP SEQUENCE ctxfs_event_ids; \
         DROP FUNCTION ctxfs_expect(text, text, text, integer); \
         ALTER TABLE nodes DROP COLUMN version; \
         CREATE TABLE one_row AS SELECT key, SUM(value)::bigint AS value FROM counters GROUP BY key; \
         DROP TABLE counters; \
         ALTER TABLE one_row RENAME TO counters; \
         ALTER TABLE counters ADD PRIMARY KEY (key); \
         UPDATE ctxfs_meta SET value = '1' WHERE key = 'schema_version';",
    );
    let mut m = db.mount(Some(CONFIG), &["--embedder", "hash"]);
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{n}/content.md")),
        "Genmaicha."
    );
    // Version 3 of the old node (its check reads the filled-in version 2),
    // and a new node whose events take ids past the old ones.
    m.ok(WRITER, &four_steps(n, "Hojicha.", ACTIVE));
    m.ok(
        WRITER,
        &four_steps("acme/users/alice/memories/prefs/coffee", "Cortado.", ACTIVE),
    );
    assert!(m
        .ok(READER, &format!("cat $M/accounts/{n}/.meta.json"))
        .contains("\"version\": 3"));
    m.ok(0, "cat $M/.ctxfs/sync");
    let hits = m.ok(
        READER,
        "cat \"$M/accounts/acme/.search/hojicha cortado?k=5\"",
    );
    assert!(
        hits.contains("prefs/tea") && hits.contains("prefs/coffee"),
        "{hits}"
    );
    m.umount();
    assert_eq!(
        db.sql("SELECT value FROM ctxfs_meta WHERE key = 'schema_version'"),
        "2"
    );
    assert_fsck_clean(&db);
}

/// `fsck --store` reads in batches (a chunk of records a round trip) and
/// still finds each kind of damage, wherever the record sits in the scan:
/// a blob of an old version gone, a blob cut short past the first chunks,
/// a current version's row gone, a `.meta.json` naming another version, a
/// counter off. It changes nothing, and exits 1.
#[test]
fn fsck_of_a_postgresql_store_finds_damage_in_every_chunk() {
    let db = PgDb::new();
    let mut m = db.mount(Some(CONFIG), &["--embedder", "hash"]);
    let tea = "acme/users/alice/memories/prefs/tea";
    for text in ["Sencha.", "Genmaicha.", "Hojicha."] {
        m.ok(WRITER, &four_steps(tea, text, ACTIVE));
    }
    m.ok(
        STRANGER,
        &four_steps("other/users/bob/memories/prefs/cup", "Mug.", ACTIVE),
    );
    let py = r#"
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(1300):
        f.write(json.dumps({"node": f"users/alice/memories/bulk/n{i:04}",
                            "content": f"bulk note {i:04}",
                            "meta": {"status": "ACTIVE"}}) + "\n")
"#;
    let script = m.shared_file("bulk.py");
    std::fs::write(&script, py).unwrap();
    m.ok(
        WRITER,
        &format!(
            "/usr/bin/python3 {} $M/accounts/acme/.ctxfs/batch",
            script.display()
        ),
    );
    m.ok(0, "cat $M/.ctxfs/sync");
    m.umount();
    assert_fsck_clean(&db);

    db.sql(
        "DELETE FROM blobs WHERE data = convert_to('Sencha.', 'UTF8'); \
         UPDATE blobs SET data = convert_to('cut', 'UTF8') \
           WHERE data = convert_to('bulk note 1234', 'UTF8'); \
         DELETE FROM versions WHERE version = 3; \
         UPDATE blobs SET data = convert_to(replace(convert_from(data, 'UTF8'), \
           '\"version\": 1', '\"version\": 7'), 'UTF8') WHERE account = 'other'; \
         UPDATE counters SET value = value + 5 WHERE key = 'nodes:acme:ACTIVE' \
           AND shard = (SELECT MIN(shard) FROM counters WHERE key = 'nodes:acme:ACTIVE');",
    );
    // pg_dump brackets its output with a random token: not the store.
    let data = || -> String {
        db.dump()
            .lines()
            .filter(|l| !l.starts_with("\\restrict") && !l.starts_with("\\unrestrict"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let before = data();
    let out = ctxfs(&["fsck", "--store", &db.url]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{text}");
    for want in [
        &format!("{tea} v1 content.md: storage error: blob"),
        "users/alice/memories/bulk/n1234 v1 content.md: storage error: blob",
        &format!("{tea}: version 3 is not stored as the current record"),
        "other/users/bob/memories/prefs/cup: .meta.json names another version",
        "counter nodes:acme:ACTIVE is 1306, a recount gives 1301",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(text.contains("5 violation(s)"), "{text}");
    assert!(data() == before, "fsck changed the store");
}
