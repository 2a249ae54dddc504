//! The fronts beside the shell, driven by real clients on a real mount: the
//! official Python MCP SDK talking to `ctxfs mcp` over stdio as writer,
//! reader and stranger uids, and the memory-tool protocol's command
//! sequences through `ctxfs memtool` and the MCP `memory` tool.

use crate::harness::*;
use serde_json::{json, Value};
use std::path::PathBuf;

const SCOPE: &str = "accounts/acme/users/alice";

/// Where `make deps` installs the Python MCP SDK.
fn mcp_py() -> String {
    let dir = std::env::var("CTXFS_MCP_PY").unwrap_or_else(|_| "/var/tmp/ctxfs-py".into());
    assert!(
        std::path::Path::new(&dir).join("mcp").is_dir(),
        "the Python MCP SDK is missing from {dir}: run `make deps`"
    );
    dir
}

/// The binary and the client script, copied where every uid may run them
/// (the checkout may sit in a directory other uids cannot enter).
fn tools(m: &Mount) -> (PathBuf, PathBuf) {
    let bin = m.dir.path().join("ctxfs");
    let client = m.dir.path().join("mcp-client.py");
    if !bin.exists() {
        std::fs::copy(BIN, &bin).unwrap();
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/mcp-client.py"),
            &client,
        )
        .unwrap();
        chmod(&bin, 0o755);
        chmod(&client, 0o755);
    }
    (bin, client)
}

/// One MCP session as `uid`: the steps' answers (`{error, text, structured}`).
pub fn session(m: &Mount, uid: u32, scope: Option<&str>, steps: Value) -> Vec<Value> {
    let out = run_client(m, uid, scope, &steps, false);
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn run_client(m: &Mount, uid: u32, scope: Option<&str>, steps: &Value, transcript: bool) -> String {
    let (bin, client) = tools(m);
    let file = m.shared_file(&format!("steps-{uid}.json"));
    std::fs::write(&file, steps.to_string()).unwrap();
    let scope = scope.map(|s| format!("--scope {s}")).unwrap_or_default();
    let t = if transcript { "--transcript" } else { "" };
    m.ok(
        uid,
        &format!(
            "PYTHONPATH={} /usr/bin/python3 {} --bin {} --mount $M {scope} {t} {}",
            mcp_py(),
            client.display(),
            bin.display(),
            file.display()
        ),
    )
}

pub fn tool(name: &str, args: Value) -> Value {
    json!({"tool": name, "args": args})
}

#[test]
fn mcp_sessions_of_writer_reader_and_stranger_match_the_mount() {
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let tea = "memories/prefs/tea";
    let w = session(
        &m,
        WRITER,
        Some(SCOPE),
        json!([
            {"tools": true},
            tool("remember", json!({"category": "prefs", "slug": "tea", "content": "Alice drinks sencha in the morning.\n", "meta": {"tags": ["tea"]}})),
            tool("read", json!({"path": tea, "level": "abstract"})),
            tool("update", json!({"path": tea, "content": "Alice drinks genmaicha in the morning.\n"})),
            tool("history", json!({"path": tea})),
            tool("restore", json!({"path": tea, "version": 1})),
            tool("read", json!({"path": "ctx://acme/users/alice/memories/prefs/tea", "level": "content"})),
            tool("search", json!({"query": "what does alice drink in the morning", "k": 3, "sync": true})),
            tool("remember", json!({"category": "prefs", "slug": "bad", "content": "x", "abstract": "y".repeat(150)})),
            tool("remember", json!({"category": "prefs", "slug": "no content"})),
            tool("read", json!({"path": "accounts/acme/users/bob"})),
            {"resources": true},
            {"resource": "ctxfs://map"},
            tool("list", json!({"path": "memories/prefs"})),
            tool("remember", json!({"category": "prefs", "slug": "gone", "content": "Temporary.\n"})),
            tool("forget", json!({"path": "memories/prefs/gone"})),
            tool("read", json!({"path": "memories/prefs/gone"})),
            tool("search", json!({"query": format!("alice morning drink {}", "and other words ".repeat(30))})),
        ]),
    );
    // A query longer than a file name is searched by its first words.
    let cut = w[17]["structured"]["query_cut_to"].as_str().unwrap_or("");
    assert!(
        w[17]["error"] == false && cut.starts_with("alice morning drink") && cut.len() < 255,
        "{}",
        w[17]
    );
    let names: Vec<&str> = w[0]["structured"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for t in [
        "search", "read", "remember", "update", "forget", "move", "list", "map", "history",
        "restore", "memory",
    ] {
        assert!(names.contains(&t), "tool {t} missing: {names:?}");
    }
    assert_eq!(w[1]["error"], false, "{}", w[1]);
    assert_eq!(
        w[1]["structured"]["uri"],
        "ctx://acme/users/alice/memories/prefs/tea"
    );
    assert_eq!(w[1]["structured"]["version"], 1);
    assert_eq!(
        w[2]["structured"]["text"],
        "Alice drinks sencha in the morning.\n"
    );
    assert_eq!(w[3]["structured"]["version"], 2);
    let versions = w[4]["structured"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{}", w[4]);
    assert_ne!(versions[0]["content_hash"], versions[1]["content_hash"]);
    assert_eq!(w[5]["structured"]["version"], 3);
    assert_eq!(
        w[6]["structured"]["text"],
        "Alice drinks sencha in the morning.\n"
    );
    assert_eq!(
        w[7]["structured"]["results"][0]["uri"], "ctx://acme/users/alice/memories/prefs/tea",
        "{}",
        w[7]
    );
    // A refused commit: a tool error with the errno and .commit-error's reason.
    assert_eq!(w[8]["error"], true);
    assert_eq!(w[8]["structured"]["errno"], "EINVAL", "{}", w[8]);
    assert!(
        w[8]["text"].as_str().unwrap().contains("abstract"),
        "{}",
        w[8]
    );
    assert_eq!(w[9]["error"], true);
    assert!(
        w[9]["text"]
            .as_str()
            .unwrap()
            .contains("content is required"),
        "{}",
        w[9]
    );
    assert_eq!(w[10]["structured"]["errno"], "EACCES", "{}", w[10]);
    assert_eq!(
        w[11]["structured"],
        json!(["ctxfs://map", "ctxfs://header"])
    );
    assert!(
        w[12]["text"]
            .as_str()
            .unwrap()
            .contains("memories/prefs/tea/ (v3"),
        "{}",
        w[12]
    );
    let entries = w[13]["structured"]["entries"].as_array().unwrap();
    let tea_entry = entries
        .iter()
        .find(|e| e["name"] == "tea")
        .expect("tea listed");
    assert_eq!(tea_entry["abstract"], "Alice drinks sencha in the morning.");
    assert_eq!(w[15]["structured"]["deleted"], true);
    assert_eq!(w[16]["structured"]["errno"], "ENOENT", "{}", w[16]);
    // What the session did is what the mount shows.
    assert_eq!(
        m.ok(READER, &format!("cat $M/{SCOPE}/{tea}/content.md")),
        "Alice drinks sencha in the morning.\n"
    );
    let meta = m.json(READER, &format!("cat $M/{SCOPE}/{tea}/.meta.json"));
    assert_eq!(
        (meta["version"].clone(), meta["tags"].clone()),
        (json!(3), json!(["tea"]))
    );
    assert_eq!(meta["restored_from"], 1);
    m.fails(
        READER,
        &format!("ls $M/{SCOPE}/memories/prefs/gone"),
        "No such file",
    );

    // The reader: reads and searches, every write refused as read-only.
    let r = session(
        &m,
        READER,
        Some(SCOPE),
        json!([
            tool("read", json!({"path": tea})),
            tool("search", json!({"query": "sencha", "k": 1})),
            tool(
                "remember",
                json!({"category": "prefs", "slug": "r", "content": "x"})
            ),
            tool("update", json!({"path": tea, "content": "changed"})),
            tool("forget", json!({"path": tea})),
            tool(
                "memory",
                json!({"command": "create", "path": "/memories/r.md", "file_text": "x"})
            ),
            tool("memory", json!({"command": "view", "path": "/memories"})),
        ]),
    );
    assert_eq!(r[0]["error"], false);
    assert_eq!(
        r[1]["structured"]["results"][0]["path"],
        format!("{SCOPE}/{tea}")
    );
    for (i, step) in r.iter().enumerate().take(5).skip(2) {
        assert_eq!(step["structured"]["errno"], "EROFS", "step {i}: {step}");
    }
    assert_eq!(r[5]["error"], true);
    assert!(
        r[5]["text"].as_str().unwrap().contains("(EROFS)"),
        "{}",
        r[5]
    );
    assert!(
        r[6]["text"]
            .as_str()
            .unwrap()
            .contains("/memories/prefs/tea.md"),
        "{}",
        r[6]
    );
    assert_eq!(
        m.ok(
            WRITER,
            &format!("cat $M/{SCOPE}/{tea}/.meta.json | grep -c '\"version\": 3'")
        ),
        "1\n",
        "the reader changed nothing"
    );

    // The stranger: a server scoped to alice does not start; one on the
    // whole mount sees nothing of acme.
    let (bin, _) = tools(&m);
    let o = m.sh(
        STRANGER,
        &format!(
            "{} mcp --mount $M --scope {SCOPE} </dev/null",
            bin.display()
        ),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("EACCES") && err.contains(SCOPE), "{err}");
    let s = session(
        &m,
        STRANGER,
        None,
        json!([
            tool("read", json!({"path": format!("{SCOPE}/{tea}")})),
            tool("search", json!({"query": "sencha", "path": SCOPE})),
            tool("list", json!({"path": format!("{SCOPE}/memories")})),
            tool(
                "remember",
                json!({"path": format!("{SCOPE}/memories/x/y"), "content": "x"})
            ),
        ]),
    );
    for (i, step) in s.iter().enumerate() {
        assert_eq!(step["structured"]["errno"], "EACCES", "step {i}: {step}");
    }
    // Without a scope, search covers every account the caller may read
    // (it failed with ENOENT on `.search/` above the accounts), and says
    // plainly when there is none.
    let s = session(
        &m,
        STRANGER,
        None,
        json!([tool("search", json!({"query": "sencha"}))]),
    );
    assert_eq!(s[0]["structured"]["accounts"], json!(["accounts/other"]));
    assert_eq!(s[0]["structured"]["results"], json!([]), "{}", s[0]);
    let s = session(
        &m,
        4242,
        None,
        json!([tool("search", json!({"query": "sencha"}))]),
    );
    assert_eq!(s[0]["error"], true, "{}", s[0]);
    assert!(
        s[0]["text"]
            .as_str()
            .unwrap()
            .contains("may read no account"),
        "{}",
        s[0]
    );
    let r = session(
        &m,
        READER,
        None,
        json!([tool("search", json!({"query": "sencha morning", "k": 1}))]),
    );
    assert_eq!(r[0]["error"], false, "{}", r[0]);
    let found = &r[0]["structured"];
    assert_eq!(found["scope"], "accounts", "{found}");
    assert_eq!(
        found["results"][0]["uri"], "ctx://acme/users/alice/memories/prefs/tea",
        "{found}"
    );
    assert_eq!(found["results"].as_array().unwrap().len(), 1);
    // A large node read with no level comes summary first, with a line index.
    let big: String = (1..=30)
        .map(|i| {
            format!(
                "# Week {i}\n\n{}\n\n",
                "Alice walked to the market again. ".repeat(10)
            )
        })
        .collect();
    let r = session(
        &m,
        WRITER,
        Some(SCOPE),
        json!([
            tool(
                "remember",
                json!({"category": "log", "slug": "walks", "content": big})
            ),
            tool("read", json!({"path": "memories/log/walks"})),
            tool(
                "read",
                json!({"path": "memories/log/walks", "from_line": 5, "to_line": 5})
            ),
        ]),
    );
    let s = &r[1]["structured"];
    assert_eq!(s["large"], true, "{}", r[1]);
    assert_eq!(s["index"][1], json!([5, "# Week 2"]), "{s}");
    assert!(s["how"].as_str().unwrap().contains("from_line"));
    assert_eq!(r[2]["structured"]["text"], "# Week 2\n");
    m.umount_and_fsck();
}

/// The memory tool's documented command sequences, through `ctxfs memtool`
/// (the library front: JSON lines) and the MCP `memory` tool; every change
/// is a committed, versioned, searchable node.
#[test]
fn memory_tool_commands_are_committed_versioned_nodes() {
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let (bin, _) = tools(&m);
    let cmds = [
        json!({"command": "view", "path": "/memories"}),
        json!({"command": "create", "path": "/memories/notes.txt", "file_text": "Meeting notes:\n- Discussed project timeline\n- Next steps defined\n"}),
        json!({"command": "create", "path": "/memories/preferences.txt", "file_text": "Favorite color: blue\nFavorite tea: sencha\n"}),
        json!({"command": "str_replace", "path": "/memories/preferences.txt", "old_str": "Favorite color: blue", "new_str": "Favorite color: green"}),
        json!({"command": "create", "path": "/memories/todo.txt", "file_text": "- Write tests\n- Ship\n"}),
        json!({"command": "insert", "path": "/memories/todo.txt", "insert_line": 2, "insert_text": "- Review memory tool documentation\n"}),
        json!({"command": "create", "path": "/memories/old_file.txt", "file_text": "obsolete\n"}),
        json!({"command": "delete", "path": "/memories/old_file.txt"}),
        json!({"command": "create", "path": "/memories/draft.txt", "file_text": "A draft.\n"}),
        json!({"command": "rename", "old_path": "/memories/draft.txt", "new_path": "/memories/final.txt"}),
        json!({"command": "create", "path": "/memories/projects/ctxfs.md", "file_text": "# ctxfs\nA FUSE file system for agent memory.\n"}),
        json!({"command": "view", "path": "/memories/notes.txt", "view_range": [2, -1]}),
        json!({"command": "view", "path": "/memories"}),
        // Refusals, in the protocol's words.
        json!({"command": "view", "path": "/memories/missing.txt"}),
        json!({"command": "str_replace", "path": "/memories/preferences.txt", "old_str": "Favorite", "new_str": "x"}),
        json!({"command": "insert", "path": "/memories/todo.txt", "insert_line": 99, "insert_text": "x"}),
        json!({"command": "create", "path": "/etc/passwd", "file_text": "x"}),
        json!({"command": "create", "path": "/memories/a/b/c.md", "file_text": "x"}),
        json!({"command": "rename", "old_path": "/memories/final.txt", "new_path": "/memories/todo.txt"}),
        // A large file: viewed summary first.
        json!({"command": "create", "path": "/memories/journal.md", "file_text": (1..=300).map(|i| format!("Day {i}: walked to the market and back.\n")).collect::<String>()}),
        json!({"command": "view", "path": "/memories/journal.md"}),
    ];
    let input = m.shared_file("memtool.jsonl");
    let lines: Vec<String> = cmds.iter().map(|c| c.to_string()).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = m.ok(
        WRITER,
        &format!(
            "{} memtool --mount $M --scope {SCOPE} < {}",
            bin.display(),
            input.display()
        ),
    );
    let a: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(a.len(), cmds.len(), "{out}");
    let text = |i: usize| a[i]["text"].as_str().unwrap_or("").to_string();
    let error = |i: usize| a[i]["error"].as_str().unwrap_or("").to_string();
    let large = text(cmds.len() - 1);
    assert!(
        large.starts_with("/memories/journal.md is large (")
            && large.contains("view_range [FROM, TO]")
            && large.contains("   289\tDay 289:"),
        "{large}"
    );
    assert!(text(0).contains("(empty)"), "{}", a[0]);
    assert_eq!(
        text(1),
        "File created successfully at: /memories/notes.txt (version 1)"
    );
    assert_eq!(text(3), "The memory file has been edited (version 2).");
    assert!(text(5).contains("(version 2)"), "{}", a[5]);
    assert_eq!(text(7), "Successfully deleted /memories/old_file.txt");
    assert_eq!(
        text(9),
        "Successfully renamed /memories/draft.txt to /memories/final.txt",
        "{}",
        a[9]
    );
    assert_eq!(
        text(11),
        "Here's the content of /memories/notes.txt with line numbers:\n     2\t- Discussed project timeline\n     3\t- Next steps defined\n"
    );
    let view = text(12);
    for shown in [
        "/memories/notes.txt\tMeeting notes:",
        "/memories/preferences.txt\t",
        "/memories/todo.txt\t",
        "/memories/final.txt\tA draft.",
        "/memories/projects/\n",
        "/memories/projects/ctxfs.md\tA FUSE file system",
    ] {
        assert!(view.contains(shown), "{shown:?} not in:\n{view}");
    }
    assert!(
        !view.contains("old_file") && !view.contains("draft.txt") && !view.contains("/_"),
        "{view}"
    );
    assert_eq!(
        error(13),
        "Error: The path /memories/missing.txt does not exist. Please provide a valid path."
    );
    assert!(
        error(14).contains("Multiple occurrences of old_str `Favorite` in lines: [1, 2]"),
        "{}",
        a[14]
    );
    assert!(
        error(15).contains("Invalid `insert_line` parameter: 99"),
        "{}",
        a[15]
    );
    assert!(error(16).contains("outside /memories"), "{}", a[16]);
    assert!(error(17).contains("two levels at most"), "{}", a[17]);
    assert!(error(18).contains("already exists"), "{}", a[18]);

    // On the mount: nodes with versions, the edits in place, each version
    // saying who made it and through which front.
    let top = format!("$M/{SCOPE}/memories/_");
    let meta: Value =
        serde_json::from_str(&m.ok(READER, &format!("cat {top}/preferences.txt/.meta.json")))
            .unwrap();
    assert_eq!(
        meta["committed_by"],
        json!({"uid": WRITER, "via": "memtool"}),
        "{meta:#}"
    );
    assert_eq!(
        m.ok(READER, &format!("cat {top}/preferences.txt/content.md")),
        "Favorite color: green\nFavorite tea: sencha\n"
    );
    assert_eq!(
        m.ok(READER, &format!("cat {top}/todo.txt/content.md")),
        "- Write tests\n- Ship\n- Review memory tool documentation\n"
    );
    assert_eq!(
        m.ok(
            READER,
            &format!("cat {top}/preferences.txt/.versions/1/content.md")
        ),
        "Favorite color: blue\nFavorite tea: sencha\n"
    );
    assert_eq!(
        m.ok(READER, &format!("ls {top}")),
        "final.txt\njournal\nnotes.txt\npreferences.txt\ntodo.txt\n"
    );
    let meta = m.json(READER, &format!("cat {top}/final.txt/.meta.json"));
    assert_eq!(meta["uri"], "ctx://acme/users/alice/memories/_/final.txt");
    assert_eq!(
        m.ok(
            READER,
            &format!("cat $M/{SCOPE}/memories/projects/ctxfs/content.md")
        ),
        "# ctxfs\nA FUSE file system for agent memory.\n"
    );
    // Searchable like any node.
    m.ok(0, "cat $M/.ctxfs/sync");
    let hits = m.ok(
        READER,
        &format!("cat \"$M/{SCOPE}/.search/favorite color\""),
    );
    assert!(hits.contains("memories/_/preferences.txt"), "{hits}");

    // The same protocol as an MCP tool, for the reader: views, no writes.
    let r = session(
        &m,
        READER,
        Some(SCOPE),
        json!([
            tool(
                "memory",
                json!({"command": "view", "path": "/memories/todo.txt"})
            ),
            tool(
                "memory",
                json!({"command": "str_replace", "path": "/memories/todo.txt", "old_str": "Ship", "new_str": "Sink"})
            ),
            tool(
                "memory",
                json!({"command": "delete", "path": "/memories/projects"})
            ),
        ]),
    );
    assert!(
        r[0]["text"]
            .as_str()
            .unwrap()
            .contains("     3\t- Review memory tool documentation"),
        "{}",
        r[0]
    );
    assert_eq!(r[1]["error"], true);
    assert!(r[1]["text"].as_str().unwrap().contains("EROFS"), "{}", r[1]);
    assert!(r[2]["text"].as_str().unwrap().contains("EROFS"), "{}", r[2]);
    // The writer deletes a whole directory through MCP.
    let w = session(
        &m,
        WRITER,
        Some(SCOPE),
        json!([tool(
            "memory",
            json!({"command": "delete", "path": "/memories/projects"})
        )]),
    );
    assert_eq!(
        w[0]["text"], "Successfully deleted /memories/projects",
        "{}",
        w[0]
    );
    m.fails(
        READER,
        &format!("ls $M/{SCOPE}/memories/projects"),
        "No such file",
    );
    m.umount_and_fsck();
}

/// The MCP session in docs/AGENTS.md is what a real client prints.
/// `make agents-doc` rewrites the block from a fresh run.
#[test]
fn agents_doc_mcp_transcript_matches_a_real_session() {
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let steps = json!([
        tool("remember", json!({"category": "prefs", "slug": "editor", "content": "Alice edits code in Helix with the default keymap.\n"})),
        {"resource": "ctxfs://map"},
        tool("search", json!({"query": "which editor does alice use", "k": 1, "sync": true})),
        tool("read", json!({"path": "memories/prefs/editor", "level": "abstract"})),
        tool("update", json!({"path": "memories/prefs/editor", "content": "Alice edits code in Helix; she switched from Vim in 2024.\n"})),
        tool("history", json!({"path": "memories/prefs/editor"})),
        tool("memory", json!({"command": "create", "path": "/memories/todo.md", "file_text": "- Review the PR\n"})),
        tool("memory", json!({"command": "view", "path": "/memories"})),
        tool("remember", json!({"category": "prefs", "slug": "shell", "content": "Fish.", "abstract": "x".repeat(120)})),
    ]);
    let got = run_client(&m, WRITER, Some(SCOPE), &steps, true);
    agents_doc_block("mcp-transcript", &got);
}
