//! Many agents on one memory: a change made on a version lands only over
//! that version (`if_version`), and agents racing over one node through
//! batch lines, the memory tool and MCP lose no update.

use crate::harness::*;
use serde_json::Value;

/// acme with two writer uids (two agents) and a reader.
const TWO_WRITERS: &str = r#"
[[account]]
id = "acme"
writers = [1001, 1004]
readers = [1002]
"#;
const SECOND_WRITER: u32 = 1004;
const NODE: &str = "accounts/acme/users/alice/memories/notes/counter";

/// Write `text` to `path` and close it, as the caller: `OK`, or the errno's
/// name the write or close failed with.
fn put(m: &Mount, uid: u32, path: &str, text: &str) -> String {
    let py = m.shared_file("put.py");
    std::fs::write(
        &py,
        "import errno, os, sys\n\
         try:\n    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n    \
         os.write(fd, sys.argv[2].encode())\n    os.close(fd)\n    print('OK')\n\
         except OSError as e:\n    print(errno.errorcode[e.errno])\n",
    )
    .unwrap();
    let full = format!("{}/{path}", m.mnt.display());
    let out = command_as(uid, "/usr/bin/python3")
        .arg(&py)
        .arg(&full)
        .arg(text)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_change_made_on_an_old_version_is_refused_with_estale() {
    let m = Mount::with_args(Some(TWO_WRITERS), &["--no-index"]);
    let meta = |v: &str| format!("{NODE}/.meta.json{v}");
    m.ok(WRITER, &format!("mkdir -p $M/{NODE}"));
    assert_eq!(
        put(&m, WRITER, &format!("{NODE}/content.md"), "one\n"),
        "OK"
    );
    assert_eq!(
        put(
            &m,
            WRITER,
            &meta(""),
            r#"{"status":"ACTIVE","if_version":0}"#
        ),
        "OK"
    );
    // Made on version 1, committed over it: version 2, the condition not stored.
    assert_eq!(
        put(&m, WRITER, &format!("{NODE}/content.md"), "two\n"),
        "OK"
    );
    assert_eq!(
        put(
            &m,
            SECOND_WRITER,
            &meta(""),
            r#"{"status":"ACTIVE","if_version":1}"#
        ),
        "OK"
    );
    let committed = m.json(READER, &format!("cat $M/{}", meta("")));
    assert_eq!(committed["version"], 2);
    assert!(committed.get("if_version").is_none(), "{committed}");
    // Another change made on version 1 is refused: ESTALE, the reason names
    // the current version, the committed node is unchanged, the draft stays.
    assert_eq!(
        put(&m, WRITER, &format!("{NODE}/content.md"), "three\n"),
        "OK"
    );
    assert_eq!(
        put(
            &m,
            WRITER,
            &meta(""),
            r#"{"status":"ACTIVE","if_version":1}"#
        ),
        "ESTALE"
    );
    let why = m.ok(WRITER, &format!("cat $M/{NODE}/.commit-error"));
    assert!(
        why.contains("the node is at version 2, not 1") && why.contains(".versions/2/"),
        "{why}"
    );
    assert_eq!(m.ok(READER, &format!("cat $M/{NODE}/content.md")), "two\n");
    assert_eq!(
        m.ok(WRITER, &format!("cat $M/{NODE}/content.md")),
        "three\n"
    );
    assert_eq!(
        m.ok(WRITER, &format!("cat $M/{NODE}/.versions/2/content.md")),
        "two\n"
    );
    // Made again on version 2: committed.
    assert_eq!(
        put(
            &m,
            WRITER,
            &meta(""),
            r#"{"status":"ACTIVE","if_version":2}"#
        ),
        "OK"
    );
    assert_eq!(
        m.ok(READER, &format!("cat $M/{NODE}/content.md")),
        "three\n"
    );
    // 0 is "only a new node"; a value that is not a version is EINVAL.
    assert_eq!(
        put(
            &m,
            WRITER,
            &meta(""),
            r#"{"status":"ACTIVE","if_version":0}"#
        ),
        "ESTALE"
    );
    let why = m.ok(WRITER, &format!("cat $M/{NODE}/.commit-error"));
    assert!(
        why.contains("created since") && why.contains("version 3"),
        "{why}"
    );
    assert_eq!(
        put(
            &m,
            WRITER,
            &meta(""),
            r#"{"status":"ACTIVE","if_version":"3"}"#
        ),
        "EINVAL"
    );
    // A batch line planned on an old version says the current one, whether
    // the line or its `meta` says `if_version`.
    let line = |meta: &str, cond: &str| {
        format!(
            r#"{{"node":"users/alice/memories/notes/other","content":"x\n","meta":{{"status":"ACTIVE"{meta}}}{cond}}}"#
        ) + "\n"
    };
    let batch = "accounts/acme/.ctxfs/batch";
    assert_eq!(
        put(&m, WRITER, batch, &line("", r#","if_version":0"#)),
        "OK"
    );
    for (meta, cond) in [("", r#","if_version":0"#), (r#","if_version":0"#, "")] {
        assert_eq!(put(&m, WRITER, batch, &line(meta, cond)), "EINVAL");
        let result = m.json(WRITER, &format!("cat $M/{batch}"));
        assert_eq!(result["current"], 1, "{result}");
        assert!(
            result["error"].as_str().unwrap().contains("created since"),
            "{result}"
        );
    }
    let other = m.json(
        READER,
        "cat $M/accounts/acme/users/alice/memories/notes/other/.meta.json",
    );
    assert_eq!(other["version"], 1);
    m.umount_and_fsck();
}

/// Two agents (two writer uids) add to one counter node many times at
/// once, each change made on the version it read and committed over it
/// (a batch line with `if_version`), redone on a refusal: every increment
/// lands, every refusal is reported as the node's newer version.
const RACER: &str = r#"
import json, os, sys
mnt, who, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
node = "users/alice/memories/notes/counter"
d = os.path.join(mnt, "accounts/acme", node)
batch = os.path.join(mnt, "accounts/acme/.ctxfs/batch")
done = refused = 0
while done < rounds:
    with open(os.path.join(d, ".meta.json")) as f:
        v = json.load(f)["version"]
    try:
        with open(os.path.join(d, ".versions", str(v), "content.md")) as f:
            n = int(f.read())
    except FileNotFoundError:
        continue
    line = json.dumps({"node": node, "content": f"{n + 1}\n", "meta": {"status": "ACTIVE", "by": who}, "if_version": v})
    try:
        fd = os.open(batch, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, (line + "\n").encode())
        os.close(fd)
        done += 1
    except OSError as e:
        assert e.errno == 22, e
        with open(batch) as f:
            r = json.loads(f.readline())
        assert r.get("current", 0) > v, r
        refused += 1
print(json.dumps({"done": done, "refused": refused}))
"#;

#[test]
fn two_agents_racing_over_one_node_lose_no_update() {
    let m = Mount::with_args(Some(TWO_WRITERS), &["--no-index"]);
    let racer = m.shared_file("racer.py");
    std::fs::write(&racer, RACER).unwrap();
    m.ok(WRITER, &format!("mkdir -p $M/{NODE}"));
    assert_eq!(put(&m, WRITER, &format!("{NODE}/content.md"), "0\n"), "OK");
    assert_eq!(put(&m, WRITER, &format!("{NODE}/.meta.json"), ACTIVE), "OK");
    let rounds = 150;
    let spawn = |uid: u32, who: &str| {
        command_as(uid, "/usr/bin/python3")
            .arg(&racer)
            .arg(&m.mnt)
            .arg(who)
            .arg(rounds.to_string())
            .output()
            .unwrap()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| spawn(WRITER, "a"));
        let b = s.spawn(|| spawn(SECOND_WRITER, "b"));
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut refused = 0;
    for o in [&a, &b] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["done"], rounds);
        refused += r["refused"].as_u64().unwrap();
    }
    // Every increment landed: the counter is both agents' rounds, and each
    // landed as its own version.
    assert_eq!(
        m.ok(READER, &format!("cat $M/{NODE}/content.md")),
        format!("{}\n", 2 * rounds)
    );
    let meta = m.json(READER, &format!("cat $M/{NODE}/.meta.json"));
    assert_eq!(meta["version"], 2 * rounds + 1);
    eprintln!("{} increments, {refused} refusals redone", 2 * rounds);
    m.umount_and_fsck();
}

/// The memory tool's `insert` by two agents at once: each insert is made
/// on the version read and redone on a fresh read when the other committed
/// in between, so no line is lost; MCP `update` with a stale `if_version`
/// is refused with ESTALE.
#[test]
fn memory_tool_edits_of_two_agents_at_once_keep_every_line() {
    let m = Mount::with_args(Some(TWO_WRITERS), &["--no-index"]);
    let scope = "accounts/acme/users/alice";
    let lines = 40;
    let file = |name: &str, cmds: Vec<Value>| {
        let f = m.shared_file(name);
        let text: Vec<String> = cmds.iter().map(|c| c.to_string()).collect();
        std::fs::write(&f, text.join("\n") + "\n").unwrap();
        f
    };
    let inserts = |who: &str| {
        let cmds = (0..lines)
            .map(|i| serde_json::json!({"command": "insert", "path": "/memories/log.md", "insert_line": 1, "insert_text": format!("{who}{i}")}))
            .collect();
        file(&format!("memtool-{who}.jsonl"), cmds)
    };
    let run = |uid: u32, f: &std::path::Path| {
        command_as(uid, BIN)
            .args(["memtool", "--mount"])
            .arg(&m.mnt)
            .args(["--scope", scope])
            .stdin(std::fs::File::open(f).unwrap())
            .output()
            .unwrap()
    };
    let create = file(
        "memtool-create.jsonl",
        vec![
            serde_json::json!({"command": "create", "path": "/memories/log.md", "file_text": "start\n"}),
        ],
    );
    assert!(run(WRITER, &create).status.success());
    let (fa, fb) = (inserts("a"), inserts("b"));
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| run(WRITER, &fa));
        let b = s.spawn(|| run(SECOND_WRITER, &fb));
        (a.join().unwrap(), b.join().unwrap())
    });
    for o in [&a, &b] {
        let out = String::from_utf8_lossy(&o.stdout);
        for l in out.lines() {
            let r: Value = serde_json::from_str(l).unwrap();
            assert!(
                r["text"].as_str().unwrap_or("").contains("has been edited"),
                "{l}"
            );
        }
        assert_eq!(out.lines().count(), lines, "{out}");
    }
    let text = m.ok(READER, &format!("cat $M/{scope}/memories/_/log/content.md"));
    for who in ["a", "b"] {
        for i in 0..lines {
            assert!(
                text.lines().any(|l| l == format!("{who}{i}")),
                "{who}{i} lost:\n{text}"
            );
        }
    }
    assert_eq!(text.lines().count(), 2 * lines + 1, "{text}");
    m.umount_and_fsck();
}

/// MCP `update` with `if_version`: made on the version read, refused with
/// ESTALE once another writer committed.
#[test]
fn mcp_update_with_a_stale_version_is_refused() {
    use crate::fronts::{session, tool};
    use serde_json::json;
    let m = Mount::with_args(Some(TWO_WRITERS), &["--no-index"]);
    let scope = "accounts/acme/users/alice";
    let tea = "memories/prefs/tea";
    let w = session(
        &m,
        WRITER,
        Some(scope),
        json!([
            tool(
                "remember",
                json!({"category": "prefs", "slug": "tea", "content": "Sencha.\n", "meta": {"tags": ["tea"]}})
            ),
            tool(
                "update",
                json!({"path": tea, "content": "Genmaicha.\n", "if_version": 1})
            ),
            tool(
                "update",
                json!({"path": tea, "content": "Oolong.\n", "if_version": 1})
            ),
            tool(
                "update",
                json!({"path": tea, "content": "Oolong.\n", "if_version": 2})
            ),
            tool("update", json!({"path": tea, "abstract": "tea of the day"})),
            tool(
                "update",
                json!({"path": tea, "content": "x", "if_version": "2"})
            ),
        ]),
    );
    assert_eq!(w[1]["structured"]["version"], 2, "{}", w[1]);
    assert_eq!(w[2]["error"], true, "{}", w[2]);
    assert_eq!(w[2]["structured"]["errno"], "ESTALE", "{}", w[2]);
    assert!(
        w[2]["text"]
            .as_str()
            .unwrap()
            .contains("at version 2, not 1"),
        "{}",
        w[2]
    );
    assert_eq!(w[3]["structured"]["version"], 3, "{}", w[3]);
    // Without if_version: made on the version current when it lands; the
    // content and own fields are kept.
    assert_eq!(w[4]["structured"]["version"], 4, "{}", w[4]);
    assert_eq!(w[5]["structured"]["errno"], "EINVAL", "{}", w[5]);
    let node = format!("$M/{scope}/{tea}");
    assert_eq!(m.ok(READER, &format!("cat {node}/content.md")), "Oolong.\n");
    assert_eq!(
        m.ok(READER, &format!("cat {node}/.abstract.md")),
        "tea of the day"
    );
    let meta = m.json(READER, &format!("cat {node}/.meta.json"));
    assert_eq!(
        (meta["version"].clone(), meta["tags"].clone()),
        (json!(4), json!(["tea"]))
    );
    assert_eq!(meta["committed_by"]["via"], "mcp", "{meta}");
    m.umount_and_fsck();
}

/// Recall to a budget: `?budget=N` packs the best results into at most N
/// tokens (estimated high: at least bytes / 3, and a digit a token),
/// abstracts first, then overviews, then
/// matching lines, and says what was left out; the same through MCP and
/// the memory tool's `view`; tenancy as any search.
#[test]
fn a_search_within_a_budget_fits_it_summary_first() {
    use crate::fronts::{session, tool};
    use serde_json::json;
    let m = Mount::with_args(Some(TWO_WRITERS), &["--embedder", "hash"]);
    let py = m.shared_file("kettles.py");
    std::fs::write(
        &py,
        r##"
import os, sys
root = os.path.join(sys.argv[1], "accounts/acme/users/alice/memories/kitchen")
for i in range(30):
    n = os.path.join(root, f"k{i}")
    os.makedirs(n)
    body = "".join(f"Line {j}: the kettle number {i} boils water at step {j}.\n" for j in range(12))
    for f, b in (("content.md", body), (".relations.json", "[]"), (".abstract.md", f"Kettle {i} and how it boils"),
                 (".overview.md", f"# Kettle {i}\nA kettle that boils water, twelve steps."), (".meta.json", '{"status":"ACTIVE"}')):
        with open(os.path.join(n, f), "w") as fh:
            fh.write(b)
# Nodes of ids and times: their tokens are a digit each.
root = os.path.join(sys.argv[1], "accounts/acme/users/alice/memories/builds")
for i in range(10):
    n = os.path.join(root, f"b{i}")
    os.makedirs(n)
    ids = " ".join(f"2023-10-{j + 1:02d}T14:{i:02d}:{j:02d}Z {i * 7919 + j * 104729:012d}" for j in range(4))
    body = "".join(f"Build {i} step {j}: {ids}\n" for j in range(12))
    for f, b in (("content.md", body), (".relations.json", "[]"), (".abstract.md", f"Build ids {i}: {ids[:84]}"),
                 (".overview.md", f"# Build {i}\n{ids}"), (".meta.json", '{"status":"ACTIVE"}')):
        with open(os.path.join(n, f), "w") as fh:
            fh.write(b)
"##,
    )
    .unwrap();
    m.ok(WRITER, &format!("/usr/bin/python3 {} $M", py.display()));
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    let dir = "$M/accounts/acme/users/alice";
    let tokens = |s: &str| s.len().div_ceil(3);
    for budget in [128usize, 200, 400, 1_000] {
        let out = m.ok(
            READER,
            &format!("cat \"{dir}/.search/kettle boils?budget={budget}\""),
        );
        assert!(
            tokens(&out) <= budget,
            "{budget}: {} tokens\n{out}",
            tokens(&out)
        );
        assert!(
            out.starts_with("# memory for \"kettle boils\" within"),
            "{out}"
        );
        assert!(
            out.contains("; paths under accounts/acme/users/alice/\n## 1. memories/kitchen/k"),
            "{out}"
        );
        let last = out.lines().last().unwrap();
        assert!(last.starts_with("# left out: "), "{budget}: {last}");
    }
    // A digit is a token (the default model's tokenizer splits every
    // digit): a packed answer of ids and times keeps its digits within the
    // budget, where a third of a token a byte let about twice as many in.
    let ids = m.ok(
        READER,
        &format!("cat \"{dir}/.search/build ids?budget=200\""),
    );
    let digits = ids.chars().filter(char::is_ascii_digit).count();
    assert!(
        digits <= 200 && tokens(&ids) <= 200 && ids.contains("\n## 1. memories/builds/b"),
        "{digits} digits\n{ids}"
    );
    // Summary first: with a small budget only abstracts; a large one adds
    // overviews and the matching lines.
    let small = m.ok(
        READER,
        &format!("cat \"{dir}/.search/kettle boils?budget=200\""),
    );
    assert!(
        small.contains("and how it boils") && !small.contains("\nL1: "),
        "{small}"
    );
    let large = m.ok(
        READER,
        &format!("cat \"{dir}/.search/kettle boils?budget=20000\""),
    );
    assert!(
        large.contains("> # Kettle") && large.contains("\nL1: Line 0: the kettle"),
        "{large}"
    );
    assert_eq!(large.matches("\n## ").count(), 10, "{large}");
    assert!(large.ends_with("# nothing left out\n"), "{large}");
    let j = m.json(
        READER,
        &format!("cat \"{dir}/.search/kettle boils?budget=150&format=json\""),
    );
    assert!(j["budget"]["used"].as_u64().unwrap() <= 150, "{j}");
    assert_eq!(j["budget"]["tokens"], 150);
    assert!(j["packed"].as_str().unwrap().starts_with("# memory for"));
    // Below the smallest budget, or not a number: EINVAL with the range.
    m.fails(
        READER,
        &format!("cat \"{dir}/.search/kettle?budget=10\""),
        "Invalid argument",
    );
    m.fails(
        READER,
        &format!("cat \"{dir}/.search/kettle?budget=x\""),
        "Invalid argument",
    );
    // Tenancy as any search: a uid of no account is refused.
    m.fails(
        NOBODY,
        &format!("cat \"{dir}/.search/kettle?budget=200\""),
        "Permission denied",
    );
    // `ctxfs search --budget` asks the same.
    let cli = m.ok(
        READER,
        &format!("{BIN} search --dir {dir} --budget 200 'kettle boils'"),
    );
    assert!(
        tokens(&cli) <= 200 && cli.starts_with("# memory for"),
        "{cli}"
    );
    // The memory map and the prompt header take a budget too.
    for (file, budget) in [
        ("README.md", 128usize),
        ("README.md", 300),
        (".header.md", 128),
    ] {
        let out = m.ok(READER, &format!("cat \"{dir}/{file}?budget={budget}\""));
        assert!(
            tokens(&out) <= budget,
            "{file} {budget}: {} tokens\n{out}",
            tokens(&out)
        );
        assert!(
            out.contains("more lines left out to keep within") || out.contains(" more: `ls"),
            "{out}"
        );
    }
    let header = m.ok(READER, "cat \"$M/.ctxfs/header?budget=128\"");
    assert!(tokens(&header) <= 128, "{header}");
    let whole = m.ok(READER, "cat \"$M/.ctxfs/header?budget=100000\"");
    assert!(whole.contains("accounts/acme/users/alice/"), "{whole}");
    m.fails(
        READER,
        "cat \"$M/.ctxfs/header?budget=1\"",
        "Invalid argument",
    );
    m.fails(
        WRITER,
        "/bin/echo x > \"$M/.ctxfs/header?budget=200\"",
        "Operation not permitted",
    );
    let map = m.ok(READER, &format!("cat \"{dir}/README.md?budget=100000\""));
    assert_eq!(map.matches("- memories/kitchen/k").count(), 30, "{map}");
    for bad in ["README.md?budget=5", "README.md?k=3", ".header.md?budget=x"] {
        m.fails(READER, &format!("cat \"{dir}/{bad}\""), "Invalid argument");
    }
    m.fails(
        NOBODY,
        &format!("cat \"{dir}/README.md?budget=500\""),
        "Permission denied",
    );
    assert!(!m.ok(READER, &format!("ls -a {dir}")).contains('?'));
    // MCP: the packed text is the answer; the memory tool's view keeps to it.
    let w = session(
        &m,
        READER,
        Some("accounts/acme/users/alice"),
        json!([
            tool("search", json!({"query": "kettle boils", "budget": 150})),
            tool(
                "memory",
                json!({"command": "view", "path": "/memories", "budget": 128})
            ),
        ]),
    );
    let text = w[0]["text"].as_str().unwrap();
    assert!(
        tokens(text) <= 150 && text.starts_with("# memory for"),
        "{}",
        w[0]
    );
    let view = w[1]["text"].as_str().unwrap();
    assert!(
        tokens(view) <= 128 && view.contains("more lines left out"),
        "{}",
        w[1]
    );
    m.umount_and_fsck();
}
