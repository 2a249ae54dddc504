//! The agent's view through the mount: memory map, prompt header, help,
//! derived summaries and the node budget, redaction, search confidence,
//! and the project scratchpad with its append-only activity log.

use crate::harness::*;

const ALICE: &str = "acme/users/alice";

fn hash_mount(config: &str) -> Mount {
    Mount::with_args(Some(config), &["--embedder", "hash"])
}

/// Commit `content` alone (no abstract, no overview) as `uid`.
fn put_content(m: &Mount, uid: u32, node: &str, content: &str) {
    m.ok(
        uid,
        &format!(
            "set -e; N=\"$M/accounts/{node}\"; mkdir -p \"$N\"; printf '%b' '{content}' > \"$N/content.md\"; \
             echo '[]' > \"$N/.relations.json\"; /bin/echo '{ACTIVE}' > \"$N/.meta.json\""
        ),
    );
}

#[test]
fn memory_map_and_header_are_current_tenant_scoped_and_read_only() {
    let mut m = hash_mount(CONFIG);
    let tea = format!("{ALICE}/memories/prefs/tea");
    put_content(
        &m,
        WRITER,
        &tea,
        "# Tea\\n\\nAlice likes green tea in the morning. She avoids coffee.\\n\\n## Brands\\nSencha from Shizuoka.\\n",
    );
    // Derived L0 and L1, marked as such.
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{tea}/.abstract.md")),
        "Alice likes green tea in the morning.\n"
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{tea}/.overview.md")),
        "# Tea\nAlice likes green tea in the morning. She avoids coffee.\n## Brands\nSencha from Shizuoka.\n"
    );
    let meta = m.ok(READER, &format!("cat $M/accounts/{tea}/.meta.json"));
    let v: serde_json::Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(v["derived"], serde_json::json!(["abstract", "overview"]));

    // The map lists the node with its L0 and version, for writer and reader.
    let map = m.ok(READER, &format!("cat $M/accounts/{ALICE}/README.md"));
    assert!(
        map.contains("- memories/prefs/tea/ (v1, ")
            && map.contains("): Alice likes green tea in the morning.")
            && map.contains("- memories/prefs/: 1 node"),
        "{map}"
    );
    assert!(m
        .ok(WRITER, &format!("ls $M/accounts/{ALICE}"))
        .contains("README.md"));

    // A commit shows up at once, newest first (no wait, no cache).
    let editor = format!("{ALICE}/memories/prefs/editor");
    put_content(&m, WRITER, &editor, "Alice edits with Helix.\\n");
    let map = m.ok(READER, &format!("cat $M/accounts/{ALICE}/README.md"));
    let (e, t) = (
        map.find("memories/prefs/editor/").expect("editor listed"),
        map.find("memories/prefs/tea/").expect("tea listed"),
    );
    assert!(e < t, "newest first:\n{map}");
    assert!(map.contains("- memories/prefs/: 2 nodes"), "{map}");
    let header = m.ok(READER, &format!("cat $M/accounts/{ALICE}/.header.md"));
    assert!(header.contains("Alice edits with Helix."), "{header}");
    assert!(header.len() <= 2048);

    // Read-only: EROFS for the reader, EPERM for the writer.
    for f in ["README.md", ".header.md"] {
        m.fails(
            READER,
            &format!("echo x > $M/accounts/{ALICE}/{f}"),
            "Read-only file system",
        );
        m.fails(
            WRITER,
            &format!("echo x > $M/accounts/{ALICE}/{f}"),
            "Operation not permitted",
        );
    }
    // The mount-wide header: the caller's accounts only.
    let h = m.ok(WRITER, "cat $M/.ctxfs/header");
    assert!(h.contains("accounts/acme/users/alice/: 2 memories"), "{h}");
    assert!(h.len() <= 2048, "{} bytes", h.len());
    let h = m.ok(STRANGER, "cat $M/.ctxfs/header");
    assert!(!h.contains("acme"), "{h}");
    m.fails(
        STRANGER,
        &format!("cat $M/accounts/{ALICE}/README.md"),
        "Permission denied",
    );
    let help = m.ok(STRANGER, "cat $M/.ctxfs/help");
    assert!(
        help.contains("ERRORS") && help.contains(".search/"),
        "{help}"
    );

    // Over the node budget: EFBIG, a reason, the previous version kept.
    m.fails(
        WRITER,
        &format!(
            "set -e; N=$M/accounts/{tea}; head -c 300001 /dev/zero | tr '\\0' a > $N/content.md; \
             /bin/echo '{ACTIVE}' > $N/.meta.json"
        ),
        "File too large",
    );
    let why = m.ok(WRITER, &format!("cat $M/accounts/{tea}/.commit-error"));
    assert!(why.contains("300000"), "{why}");
    assert!(m
        .ok(READER, &format!("cat $M/accounts/{tea}/content.md"))
        .contains("green tea"));
    // A writer's own abstract is kept; an empty one is derived.
    m.ok(
        WRITER,
        &format!(
            "set -e; N=$M/accounts/{tea}; printf 'Tea: sencha.\\n' > $N/content.md; echo 'Own words.' > $N/.abstract.md; \
             : > $N/.overview.md; /bin/echo '{ACTIVE}' > $N/.meta.json"
        ),
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{tea}/.abstract.md")),
        "Own words.\n"
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{tea}/.overview.md")),
        "Tea: sencha.\n"
    );
    let v: serde_json::Value =
        serde_json::from_str(&m.ok(READER, &format!("cat $M/accounts/{tea}/.meta.json"))).unwrap();
    assert_eq!(v["derived"], serde_json::json!(["overview"]));
    // `rm -r` of a user directory goes through its generated files.
    m.ok(WRITER, &format!("rm -r $M/accounts/{ALICE}/memories"));
    let map = m.ok(READER, &format!("cat $M/accounts/{ALICE}/README.md"));
    assert!(map.contains("0 ACTIVE nodes"), "{map}");
    m.umount();
    m.fsck();
}

const SECRETS: [&str; 4] = [
    "sk-live0123456789abcdefghij",
    "hunter2-very-secret",
    "AKIAQWERTYUIOPASDFGH",
    "ghp_0123456789abcdefghijklmnopqrstuvwxyz",
];

#[test]
fn secrets_are_redacted_before_storage_search_and_disk() {
    let config = format!("{CONFIG}\n[[account]]\nid = \"raw\"\nwriters = [1004]\nredact = false\n");
    let mut m = hash_mount(&config);
    let node = format!("{ALICE}/memories/ops/deploy");
    put_content(
        &m,
        WRITER,
        &node,
        &format!(
            "Deploy notes for the billing service.\\napi_key: {}\\nDB password = {}\\n{{\"aws\": \"{}\", \"github_token\": \"{}\"}}\\nmax_tokens: 512\\n",
            SECRETS[0], SECRETS[1], SECRETS[2], SECRETS[3]
        ),
    );
    let content = m.ok(READER, &format!("cat $M/accounts/{node}/content.md"));
    for s in SECRETS {
        assert!(!content.contains(s), "{s} left in:\n{content}");
    }
    assert!(
        content.contains("api_key: [REDACTED]") && content.contains("max_tokens: 512"),
        "{content}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&m.ok(READER, &format!("cat $M/accounts/{node}/.meta.json"))).unwrap();
    assert_eq!(v["redacted"], 4, "{v}");
    // Not in the derived summaries, not in search results.
    m.ok(0, "cat $M/.ctxfs/sync");
    let found = m.ok(
        READER,
        "cat \"$M/accounts/acme/.search/billing deploy?format=json\"",
    );
    assert!(found.contains("deploy"), "{found}");
    for s in SECRETS {
        assert!(!found.contains(s), "{s} in search results");
        let hits = m.ok(READER, &format!("cat \"$M/accounts/acme/.search/{s}\""));
        assert!(!hits.contains(s));
    }
    // An account that turned redaction off keeps its text.
    let raw = "raw/users/r/memories/ops/deploy";
    put_content(&m, 1004, raw, &format!("api_key: {}\\n", SECRETS[0]));
    assert!(m
        .ok(1004, &format!("cat $M/accounts/{raw}/content.md"))
        .contains(SECRETS[0]));
    // Nothing of the redacted account's secrets reached the disk.
    m.umount();
    let mut disk = Vec::new();
    for e in std::fs::read_dir(&m.data).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            disk.extend(std::fs::read(&p).unwrap());
        }
    }
    assert!(!disk.is_empty());
    let has = |s: &str| disk.windows(s.len()).any(|w| w == s.as_bytes());
    for s in &SECRETS[1..] {
        assert!(!has(s), "{s} found in the data dir");
    }
    assert!(
        has(SECRETS[0]),
        "the raw account's text is stored as written"
    );
}

#[test]
fn search_tells_confidence_lines_and_answerability() {
    let m = hash_mount(CONFIG);
    let node = format!("{ALICE}/memories/work/deploy");
    put_content(
        &m,
        WRITER,
        &node,
        "# Deploys\\n\\nWe ship on Tuesdays.\\nThe pipeline runs in ArgoCD.\\n\\n## Rollback\\nUse helm rollback to undo a release.\\n",
    );
    put_content(
        &m,
        WRITER,
        &format!("{ALICE}/memories/prefs/tea"),
        "Alice likes green tea.\\n",
    );
    m.ok(0, "cat $M/.ctxfs/sync");
    let tsv = m.ok(
        READER,
        &format!("cat \"$M/accounts/{ALICE}/.search/helm rollback\""),
    );
    let first: Vec<&str> = tsv.lines().next().unwrap().split('\t').collect();
    assert_eq!(first.len(), 8, "{tsv}");
    assert_eq!(first[2], format!("accounts/{node}"));
    assert_eq!(first[5], "high", "{tsv}");
    assert_eq!(first[6], "6-7", "{tsv}");
    assert_eq!(first[7], "2");
    // The named lines are the ones to read.
    let lines = m.ok(
        READER,
        &format!("sed -n '6,7p' $M/accounts/{node}/content.md"),
    );
    assert!(lines.contains("helm rollback"), "{lines}");
    let j: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        &format!("cat \"$M/accounts/{ALICE}/.search/helm rollback?format=json\""),
    ))
    .unwrap();
    assert_eq!(j["answerable"], true);
    assert_eq!(j["signal"], "ANSWERABLE");
    assert_eq!(
        j["results"][0]["snippet"],
        "Use helm rollback to undo a release."
    );
    // Nothing good: NOT_ANSWERABLE, every try reported.
    let j: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        &format!("cat \"$M/accounts/{ALICE}/.search/the quantum chromodynamics?format=json\""),
    ))
    .unwrap();
    assert_eq!(j["answerable"], false, "{j}");
    assert_eq!(j["signal"], "NOT_ANSWERABLE");
    // Every try is reported. With the hashing fallback the keywords-alone
    // variant is skipped (it cannot change a BM25 answer), and no indexed
    // word is near these, so nothing else was tried.
    let tried: Vec<&str> = j["tried"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["query"].as_str().unwrap())
        .collect();
    assert_eq!(tried, ["the quantum chromodynamics"], "{j}");
    // A misspelling is retried with the indexed word.
    let j: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        &format!("cat \"$M/accounts/{ALICE}/.search/pipelnie?format=json\""),
    ))
    .unwrap();
    assert_eq!(j["tried"].as_array().unwrap().len(), 2, "{j}");
    assert_eq!(j["answered_by"], "pipelin", "{j}");
    assert_eq!(j["results"][0]["path"], format!("accounts/{node}"));
    assert_eq!(j["answerable"], true);
}

#[test]
fn scratchpad_is_shared_and_the_activity_log_only_grows() {
    let mut m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    let p = "$M/accounts/acme/projects/launch";
    m.ok(WRITER, &format!("mkdir -p {p}"));
    assert_eq!(
        m.ok(READER, &format!("ls {p}")),
        "activity_log.jsonl\nscratchpad\n"
    );
    m.ok(
        WRITER,
        &format!(
            "set -e; cd {p}/scratchpad; mkdir -p plan/drafts; echo 'step 1' > plan/todo.txt; \
             echo 'step 2' >> plan/todo.txt; cp plan/todo.txt plan/drafts/copy.txt; \
             mv plan/drafts plan/old; sed -i 's/step 1/step one/' plan/todo.txt; touch empty"
        ),
    );
    assert_eq!(
        m.ok(READER, &format!("cat {p}/scratchpad/plan/todo.txt")),
        "step one\nstep 2\n"
    );
    assert_eq!(
        m.ok(READER, &format!("cd {p}/scratchpad && find . | sort")),
        ".\n./empty\n./plan\n./plan/old\n./plan/old/copy.txt\n./plan/todo.txt\n"
    );
    m.fails(
        READER,
        &format!("echo x > {p}/scratchpad/plan/todo.txt"),
        "Read-only file system",
    );
    m.fails(STRANGER, &format!("ls {p}/scratchpad"), "Permission denied");
    m.fails(
        WRITER,
        &format!("rmdir {p}/scratchpad/plan"),
        "Directory not empty",
    );

    // Two writers append under flock: no line lost, none torn.
    let app = m.shared_file("append.sh");
    std::fs::write(
        &app,
        format!(
            "L={}/accounts/acme/projects/launch/activity_log.jsonl\n\
             for i in $(seq 1 150); do\n\
             flock \"$L\" sh -c 'printf \"{{\\\"w\\\":\\\"%s\\\",\\\"i\\\":%s}}\\n\" \"$1\" \"$2\" >> \"$0\"' \"$L\" \"$1\" \"$i\"\n\
             done\n",
            m.mnt.display()
        ),
    )
    .unwrap();
    let a = m.spawn_as(WRITER, &format!("sh {} a", app.display()));
    let b = m.spawn_as(WRITER, &format!("sh {} b", app.display()));
    for mut c in [a, b] {
        assert!(c.wait().unwrap().success());
    }
    let log = m.ok(READER, &format!("cat {p}/activity_log.jsonl"));
    assert_eq!(log.lines().count(), 300, "{log}");
    for l in log.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{l:?}: {e}"));
    }
    // flock excludes across processes.
    let held = m.spawn_as(WRITER, &format!("flock {p}/activity_log.jsonl sleep 2"));
    std::thread::sleep(std::time::Duration::from_millis(500));
    m.fails(
        WRITER,
        &format!("flock -n {p}/activity_log.jsonl true || {{ echo locked >&2; exit 1; }}"),
        "locked",
    );
    let mut held = held;
    assert!(held.wait().unwrap().success());

    // Only appends: every other change is EPERM, and nothing changes.
    for bad in [
        format!("truncate -s 0 {p}/activity_log.jsonl"),
        format!(": > {p}/activity_log.jsonl"),
        format!("rm {p}/activity_log.jsonl"),
        format!("mv {p}/activity_log.jsonl {p}/scratchpad/log"),
        format!(
            "/usr/bin/python3 -c \"import os; f=os.open('{}/accounts/acme/projects/launch/activity_log.jsonl', os.O_WRONLY); os.pwrite(f, b'X', 0)\"",
            m.mnt.display()
        ),
    ] {
        m.fails(WRITER, &bad, "Operation not permitted");
    }
    assert_eq!(m.ok(READER, &format!("cat {p}/activity_log.jsonl")), log);

    // Everything survives a remount.
    m.umount();
    m.mount();
    assert_eq!(m.ok(READER, &format!("cat {p}/activity_log.jsonl")), log);
    assert_eq!(
        m.ok(READER, &format!("cat {p}/scratchpad/plan/old/copy.txt")),
        "step 1\nstep 2\n"
    );
    m.ok(
        WRITER,
        &format!("rm -r {p}/scratchpad/plan {p}/scratchpad/empty"),
    );
    assert_eq!(m.ok(READER, &format!("ls {p}/scratchpad")), "");
    m.umount();
    m.fsck();
}

/// The session transcript in docs/AGENTS.md is what the product prints.
/// `make agents-doc` rewrites the block from a fresh run.
#[test]
fn agents_doc_transcript_matches_a_real_session() {
    let m = Mount::with_args(None, &["--embedder", "hash"]);
    m.ok(0, "mkdir $M/accounts/acme");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/agent-session.sh");
    let out = m.ok(0, &format!("sh {script} $M"));
    let time = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ").unwrap();
    let got = time.replace_all(&out, "<time>").into_owned();
    agents_doc_block("transcript", &got);
}

/// SQLite in WAL mode in a project's scratchpad, two processes writing at
/// once: WAL maps its `-shm` file shared, which the scratchpad's direct I/O
/// refused before ("disk I/O error").
#[test]
fn sqlite_wal_works_in_the_scratchpad() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    let p = "$M/accounts/acme/projects/tools";
    m.ok(WRITER, &format!("mkdir -p {p}"));
    let py = r#"
import sqlite3, sys
db, who = sys.argv[1], sys.argv[2]
c = sqlite3.connect(db, timeout=30)
assert c.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
c.execute("CREATE TABLE IF NOT EXISTS t (who TEXT, i INTEGER)")
c.commit()
for i in range(100):
    c.execute("INSERT INTO t VALUES (?, ?)", (who, i))
    c.commit()
c.close()
"#;
    let script = m.shared_file("wal.py");
    std::fs::write(&script, py).unwrap();
    let db = format!("{p}/scratchpad/state.db");
    m.ok(
        WRITER,
        &format!("/usr/bin/python3 {} {db} init", script.display()),
    );
    let a = m.spawn_piped(
        WRITER,
        &format!("/usr/bin/python3 {} {db} a 2>&1", script.display()),
    );
    let b = m.spawn_piped(
        WRITER,
        &format!("/usr/bin/python3 {} {db} b 2>&1", script.display()),
    );
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let check = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print(c.execute("PRAGMA integrity_check").fetchone()[0], c.execute("SELECT count(*) FROM t").fetchone()[0])
"#;
    let cs = m.shared_file("check.py");
    std::fs::write(&cs, check).unwrap();
    assert_eq!(
        m.ok(WRITER, &format!("/usr/bin/python3 {} {db}", cs.display()))
            .trim(),
        "ok 300"
    );
}

/// User, agent and category directories show a derived `.abstract.md` (one
/// line, at most 100 characters) and `.overview.md` built from their
/// children's committed abstracts (at most 20, newest first): current after
/// each commit and delete, never naming a draft, read-only, and the
/// account's alone (CONTRACT §3).
#[test]
fn directories_summarise_their_children() {
    let m = hash_mount(CONFIG);
    let u = "acme/users/alice";
    m.ok(
        WRITER,
        &four_steps(&format!("{u}/memories/profile"), "Alice", ACTIVE),
    );
    for i in 0..22 {
        m.ok(
            WRITER,
            &four_steps(&format!("{u}/memories/prefs/p{i:02}"), "x", ACTIVE),
        );
    }
    m.ok(
        WRITER,
        &four_steps("acme/agents/helper/skills/deploy", "steps", ACTIVE),
    );
    // A draft: never in a summary.
    m.ok(
        WRITER,
        &format!("mkdir -p $M/accounts/{u}/memories/prefs/draft && echo secret-draft > $M/accounts/{u}/memories/prefs/draft/content.md"),
    );
    let cat = format!("$M/accounts/{u}/memories/prefs");
    let abs = m.ok(READER, &format!("cat {cat}/.abstract.md"));
    assert!(
        abs.starts_with(
            "prefs/: 22 memories; newest: abstract of acme/users/alice/memories/prefs/p21"
        ),
        "{abs}"
    );
    assert!(abs.trim_end().chars().count() <= 100, "{abs}");
    let ov = m.ok(READER, &format!("cat {cat}/.overview.md"));
    assert!(ov.contains("- p21/: abstract of"), "{ov}");
    assert!(!ov.contains("- p01/"), "20 children at most: {ov}");
    assert!(ov.contains("… 2 more"), "{ov}");
    let user = m.ok(READER, &format!("cat $M/accounts/{u}/.abstract.md"));
    assert!(
        user.starts_with("alice: 23 memories; abstract of acme/users/alice/memories/profile"),
        "{user}"
    );
    let uov = m.ok(READER, &format!("cat $M/accounts/{u}/.overview.md"));
    assert!(uov.contains("- memories/profile/: abstract of"), "{uov}");
    assert!(
        uov.contains("- memories/prefs/: 22 nodes; newest:"),
        "{uov}"
    );
    let skills = m.ok(
        READER,
        "cat $M/accounts/acme/agents/helper/skills/.abstract.md",
    );
    assert!(skills.starts_with("skills/: 1 skill; newest:"), "{skills}");
    assert!(m
        .ok(READER, "cat $M/accounts/acme/agents/helper/.overview.md")
        .contains("- skills/: 1 node"));
    // Listed (ls -a), and no draft text in any of them.
    let ls = m.ok(WRITER, &format!("ls -a {cat}"));
    assert!(
        ls.contains(".abstract.md") && ls.contains(".overview.md"),
        "{ls}"
    );
    let all = m.ok(
        WRITER,
        &format!("cat {cat}/.abstract.md {cat}/.overview.md $M/accounts/{u}/.overview.md"),
    );
    assert!(!all.contains("draft"), "{all}");
    // Current after a delete.
    m.ok(WRITER, &format!("rm -r {cat}/p21"));
    let abs = m.ok(READER, &format!("cat {cat}/.abstract.md"));
    assert!(
        abs.starts_with(
            "prefs/: 21 memories; newest: abstract of acme/users/alice/memories/prefs/p20"
        ),
        "{abs}"
    );
    // Read-only; the account's alone.
    m.fails(READER, &format!("echo x > {cat}/.abstract.md"), "Read-only");
    m.fails(
        WRITER,
        &format!("echo x > {cat}/.overview.md"),
        "Operation not permitted",
    );
    m.fails(
        STRANGER,
        &format!("cat {cat}/.abstract.md"),
        "Permission denied",
    );
    // The profile node keeps its own node files.
    assert_eq!(
        m.ok(
            READER,
            &format!("cat $M/accounts/{u}/memories/profile/.abstract.md")
        ),
        format!("abstract of {u}/memories/profile\n")
    );
}
