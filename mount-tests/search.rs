//! Search through the mount: `.search/` files, `.ctxfs/sync`, tenancy of
//! results, no stale hits, dead letters with the HTTP embedder.

use crate::harness::*;
use std::io::BufRead;
use std::time::{Duration, Instant};

const ALICE: &str = "acme/users/alice/memories";
const BOB: &str = "acme/users/bob/memories";

/// Commit a node with content and abstract as `uid`.
fn put(m: &Mount, uid: u32, node: &str, content: &str, abs: &str) {
    m.ok(
        uid,
        &format!(
            "set -e; N=\"$M/accounts/{node}\"; mkdir -p \"$N\"; printf '%s' '{content}' > \"$N/content.md\"; \
             printf '%s' '{abs}' > \"$N/.abstract.md\"; /bin/echo '{ACTIVE}' > \"$N/.meta.json\""
        ),
    );
}

/// Result paths of `DIR/.search/QUERY` read as `uid`.
fn search(m: &Mount, uid: u32, dir: &str, query: &str) -> Vec<String> {
    let out = m.ok(uid, &format!("cat \"$M/accounts/{dir}/.search/{query}\""));
    out.lines()
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            assert!(
                cols.len() >= 5,
                "TSV line with {} columns: {l:?}",
                cols.len()
            );
            assert_eq!(cols[2], format!("accounts/{}", &cols[3]["ctx://".len()..]));
            cols[2].trim_start_matches("accounts/").to_string()
        })
        .collect()
}

fn sync(m: &Mount) {
    assert_eq!(m.ok(0, "cat $M/.ctxfs/sync"), "ok\n");
}

fn minilm_config() -> String {
    format!(
        "{CONFIG}\n[index]\nembedder = \"minilm\"\nmodel_dir = \"{}\"\n",
        model_dir().display()
    )
}

#[test]
fn search_finds_paraphrases_and_never_stale_or_foreign_nodes() {
    let mut m = Mount::with_config(Some(&minilm_config()));
    let tea = format!("{ALICE}/prefs/tea");
    let editor = format!("{ALICE}/prefs/editor");
    let trip = format!("{ALICE}/events/trip");
    let cat = format!("{BOB}/pets/cat");
    put(
        &m,
        WRITER,
        &tea,
        "Alice drinks green tea every morning and avoids coffee.",
        "Alice prefers green tea",
    );
    put(
        &m,
        WRITER,
        &editor,
        "Alice writes code in vim with a dark colour scheme.",
        "Alice uses vim",
    );
    put(
        &m,
        WRITER,
        &trip,
        "In May Alice flew to Lisbon for a conference on databases.",
        "Trip to Lisbon",
    );
    put(
        &m,
        WRITER,
        &cat,
        "Bob has a ginger cat named Biscuit who sleeps all day.",
        "Bob has cat Biscuit",
    );
    // Another account with the same words: never in acme's results.
    put(
        &m,
        STRANGER,
        "other/users/eve/memories/prefs/tea",
        "Eve drinks green tea every morning.",
        "Eve likes tea",
    );
    // A PENDING node (no .meta.json): never in results.
    m.ok(WRITER, &format!("mkdir -p $M/accounts/{ALICE}/prefs/draft && printf 'zanzibar quokka beverage' > $M/accounts/{ALICE}/prefs/draft/content.md"));
    sync(&m);

    // A paraphrase sharing no content word with the node.
    let hits = search(
        &m,
        READER,
        "acme",
        "which hot beverage does she like in the morning",
    );
    assert_eq!(hits.first(), Some(&tea), "{hits:?}");
    let hits = search(&m, READER, "acme", "favourite text editor for programming");
    assert_eq!(hits.first(), Some(&editor), "{hits:?}");
    let hits = search(&m, WRITER, "acme", "pet animal");
    assert_eq!(hits.first(), Some(&cat), "{hits:?}");
    // Exact rare words go through the lexical channel.
    assert_eq!(search(&m, READER, "acme", "Biscuit").first(), Some(&cat));
    for q in ["green tea", "zanzibar quokka", "Eve"] {
        for h in search(&m, WRITER, "acme", q) {
            assert!(h.starts_with("acme/") && !h.ends_with("/draft"), "{q}: {h}");
        }
    }
    // Scoped to a subtree.
    for h in search(&m, READER, "acme/users/bob", "green tea") {
        assert!(h.starts_with("acme/users/bob/"), "{h}");
    }
    assert_eq!(
        search(&m, READER, &format!("{ALICE}/prefs"), "Lisbon conference").len(),
        2
    );
    // k, JSON.
    assert_eq!(search(&m, READER, "acme", "tea?k=1").len(), 1);
    let j: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        "cat \"$M/accounts/acme/.search/Lisbon trip?format=json\"",
    ))
    .unwrap();
    assert_eq!(j["results"][0]["path"], format!("accounts/{trip}"));
    assert_eq!(j["results"][0]["rank"], 1);
    assert_eq!(j["model"], "all-MiniLM-L6-v2");
    // Bad options and strangers are refused; nothing matches: empty file.
    m.fails(
        READER,
        "cat \"$M/accounts/acme/.search/tea?k=0\"",
        "Invalid argument",
    );
    m.fails(
        STRANGER,
        "cat \"$M/accounts/acme/.search/tea\"",
        "Permission denied",
    );
    assert_eq!(
        m.ok(
            READER,
            "cat \"$M/accounts/acme/users/bob/memories/.search/xqzvj?mode=lexical\""
        ),
        ""
    );
    // The CLI asks the same files.
    let out = std::process::Command::new(BIN)
        .args([
            "search",
            "--dir",
            m.p("accounts/acme").to_str().unwrap(),
            "-k",
            "2",
            "coffee or tea",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.lines().next().unwrap().contains(&tea), "{text}");
    // A '?' in the query is the query's; a query longer than a file name
    // is searched by its first words, and says so.
    let cli = |q: &str| {
        std::process::Command::new(BIN)
            .args(["search", "--dir", m.p("accounts/acme").to_str().unwrap(), q])
            .output()
            .unwrap()
    };
    let out = cli("tea?k=0");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&tea));
    let long = format!("green tea {}", "and more words ".repeat(40));
    let out = cli(&long);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("longer than a file name"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&tea));

    // Update: the old words leave, the new ones come.
    m.ok(WRITER, &format!("printf 'Alice now drinks espresso.' > $M/accounts/{tea}/content.md && printf 'Alice likes espresso' > $M/accounts/{tea}/.abstract.md && /bin/echo '{ACTIVE}' > $M/accounts/{tea}/.meta.json"));
    sync(&m);
    assert!(!search(&m, READER, "acme", "green tea?mode=lexical").contains(&tea));
    assert_eq!(search(&m, READER, "acme", "espresso").first(), Some(&tea));
    // Move: found at the new path only.
    let moved = format!("{BOB}/events/trip");
    m.ok(
        WRITER,
        &format!("mkdir -p $M/accounts/{BOB}/events && mv $M/accounts/{trip} $M/accounts/{moved}"),
    );
    sync(&m);
    let hits = search(&m, READER, "acme", "Lisbon");
    assert_eq!(hits.first(), Some(&moved), "{hits:?}");
    assert!(!hits.contains(&trip));
    // Archive and delete: gone from results.
    m.ok(
        WRITER,
        &format!("/bin/echo '{{\"status\":\"ARCHIVED\"}}' > $M/accounts/{moved}/.meta.json"),
    );
    m.ok(WRITER, &format!("rm -r $M/accounts/{cat}"));
    sync(&m);
    for q in ["Lisbon", "Biscuit", "cat", "conference"] {
        let hits = search(&m, READER, "acme", q);
        assert!(
            !hits.contains(&moved) && !hits.contains(&cat),
            "{q}: {hits:?}"
        );
    }
    let s: serde_json::Value = serde_json::from_str(&m.ok(0, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["outbox_depth"], 0, "{s}");
    assert_eq!(s["indexer"]["embedder"]["kind"], "minilm");
    assert_eq!(s["indexer"]["indexed_nodes"], 3, "{s}");

    // Restart: results unchanged. An account this small has no graph (its
    // searches are exact), so no dump: its vectors come from the store.
    m.umount();
    m.fsck();
    assert!(!m.data.join("index/acme/hnsw16.hnsw.graph").exists());
    m.mount();
    // The account's vectors load in the background after a mount (its
    // first searches answer from words alone): on busy cores, give them time.
    let found = within(Duration::from_secs(30), || {
        search(&m, READER, "acme", "favourite text editor for programming").first() == Some(&editor)
    });
    assert!(
        found.is_some(),
        "the editor node is not found after a remount"
    );
    assert_eq!(search(&m, READER, "acme", "espresso").first(), Some(&tea));
}

/// Kills the server when the test ends, even by a failed assertion.
struct Server(std::process::Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A local OpenAI-compatible embedding server that fails until `ok_flag`
/// exists, then answers with deterministic vectors. Returns (server, url, flag).
fn embed_server(m: &Mount) -> (Server, String, std::path::PathBuf) {
    let flag = m.dir.path().join("server-ok");
    let script = m.dir.path().join("server.py");
    std::fs::write(
        &script,
        r#"
import hashlib, http.server, json, os, sys
FLAG = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        if self.path != '/v1/embeddings' or not os.path.exists(FLAG):
            self.send_response(500); self.end_headers(); self.wfile.write(b'model is loading'); return
        data = []
        for i, t in enumerate(body['input']):
            v = [0.0] * 16
            for w in t.lower().split():
                h = hashlib.sha256(w.strip('.,').encode()).digest()
                v[h[0] % 16] += 1.0
            data.append({'index': i, 'embedding': v})
        out = json.dumps({'data': data, 'model': body['model']}).encode()
        self.send_response(200); self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(out))); self.end_headers(); self.wfile.write(out)
s = http.server.HTTPServer(('127.0.0.1', 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#,
    )
    .unwrap();
    let mut child = std::process::Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(&flag)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (
        Server(child),
        format!("http://127.0.0.1:{}", line.trim()),
        flag,
    )
}

#[test]
fn failed_embeddings_go_to_the_dead_letter_queue_and_retry_by_mv() {
    // A first mount only to get a temp dir for the server files.
    let probe = Mount::without_index();
    let (_server, url, flag) = embed_server(&probe);
    let config = format!(
        "{CONFIG}\n[index]\nembedder = \"http\"\nhttp_url = \"{url}\"\nhttp_model = \"test-embed\"\nhttp_dim = 16\n\
         max_retries = 2\nretry_backoff_ms = 50\n"
    );
    let m = Mount::with_config(Some(&config));
    let node = format!("{ALICE}/notes/n1");
    let other = format!("{ALICE}/notes/n2");
    put(
        &m,
        WRITER,
        &node,
        "the quarterly report is due friday",
        "report due",
    );
    put(&m, WRITER, &other, "buy oat milk", "groceries");
    // Both events fail twice and become dead letters.
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let l = m.ok(
            READER,
            &format!("ls $M/accounts/{node}/.outbox/dlq/ $M/accounts/{other}/.outbox/dlq/"),
        );
        if l.lines().filter(|x| x.ends_with(".json")).count() == 2 {
            break l;
        }
        assert!(Instant::now() < deadline, "no dead letters: {l}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let id = dead
        .lines()
        .find(|x| x.ends_with(".json"))
        .unwrap()
        .to_string();
    let ev: serde_json::Value =
        serde_json::from_str(&m.ok(READER, &format!("cat $M/accounts/{node}/.outbox/dlq/{id}")))
            .unwrap();
    assert_eq!(ev["status"], "DEAD");
    assert_eq!(ev["retry_count"], 2);
    assert!(ev["last_error"].as_str().unwrap().contains("500"), "{ev}");
    let s: serde_json::Value = serde_json::from_str(&m.ok(WRITER, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["dead_letters"], 2, "{s}");
    assert_eq!(s["outbox_depth"], 0, "{s}");
    // Dead letters do not hold up sync; the node is not searchable yet.
    sync(&m);
    assert!(!search(&m, READER, "acme", "quarterly report").contains(&node));
    // Readers may not retry or drop.
    m.fails(
        READER,
        &format!("mv $M/accounts/{node}/.outbox/dlq/{id} $M/accounts/{node}/.outbox/"),
        "Read-only",
    );
    // The server recovers; moving the letter back retries it.
    std::fs::write(&flag, "").unwrap();
    m.ok(
        WRITER,
        &format!("mv $M/accounts/{node}/.outbox/dlq/{id} $M/accounts/{node}/.outbox/"),
    );
    sync(&m);
    assert_eq!(
        search(&m, READER, "acme", "quarterly report").first(),
        Some(&node)
    );
    assert_eq!(
        m.ok(READER, &format!("ls $M/accounts/{node}/.outbox/dlq/")),
        ""
    );
    // rm drops the other one for good.
    let id2 = m.ok(WRITER, &format!("ls $M/accounts/{other}/.outbox/dlq/"));
    m.ok(
        WRITER,
        &format!("rm $M/accounts/{other}/.outbox/dlq/{}", id2.trim()),
    );
    let s: serde_json::Value = serde_json::from_str(&m.ok(WRITER, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["dead_letters"], 0, "{s}");
    assert_eq!(s["indexer"]["embedder"]["kind"], "http");
    let mut m = m;
    m.umount();
    m.fsck();
}

#[test]
fn sync_and_search_without_model_use_the_hashing_fallback() {
    let m = Mount::new();
    let s: serde_json::Value = serde_json::from_str(&m.ok(0, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["indexer"]["embedder"]["kind"], "hash", "{s}");
    assert!(s["indexer"]["embedder"]["note"]
        .as_str()
        .unwrap()
        .contains("not found"));
    for i in 0..30 {
        put(
            &m,
            0,
            &format!("{ALICE}/facts/f{i}"),
            &format!("fact number {i} about topic{i}"),
            &format!("fact {i}"),
        );
    }
    sync(&m);
    assert_eq!(
        search(&m, 0, "acme", "topic17").first().map(String::as_str),
        Some(format!("{ALICE}/facts/f17").as_str())
    );
    assert_eq!(search(&m, 0, "acme", "fact number?k=30").len(), 30);
    // `.search` is not listed, and bad places are refused.
    assert!(!m.ok(0, "ls -a $M/accounts/acme").contains(".search"));
    m.fails(0, "cat \"$M/accounts/nosuch/.search/x\"", "No such file");
    m.fails(0, "echo x > \"$M/accounts/acme/.search/x\"", "");
}

#[test]
fn relations_expand_hits_and_a_model_change_reindexes() {
    let hash_cfg = format!("{CONFIG}\n[index]\nembedder = \"hash\"\n");
    let mut m = Mount::with_config(Some(&hash_cfg));
    let a = format!("{ALICE}/projects/apollo");
    let b = format!("{ALICE}/people/grace");
    put(
        &m,
        WRITER,
        &b,
        "Grace is an engineer who likes sailing.",
        "Grace the engineer",
    );
    m.ok(
        WRITER,
        &format!(
            "set -e; N=$M/accounts/{a}; mkdir -p $N; printf 'Apollo is the launch project for the moon lander.' > $N/content.md; \
             printf 'Apollo launch project' > $N/.abstract.md; \
             printf '[{{\"from_uri\":\"ctx://{a}\",\"to_uri\":\"ctx://{b}\",\"relation_type\":\"led_by\",\"weight\":0.9}}]' > $N/.relations.json; \
             /bin/echo '{ACTIVE}' > $N/.meta.json"
        ),
    );
    sync(&m);
    // Without expansion only Apollo matches; with it, Grace comes along, marked.
    assert_eq!(
        search(&m, READER, "acme", "moon lander?mode=lexical"),
        vec![a.clone()]
    );
    let out = m.ok(
        READER,
        "cat \"$M/accounts/acme/.search/moon lander?mode=lexical&expand=1\"",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[1].contains(&b) && lines[1].ends_with(&format!("related:led_by<-accounts/{a}")),
        "{out}"
    );
    m.umount();

    // Same data, another model: the indexer re-embeds before it reports sync.
    std::fs::write(m.config.as_ref().unwrap(), minilm_config()).unwrap();
    m.mount();
    sync(&m);
    let s: serde_json::Value = serde_json::from_str(&m.ok(0, "cat $M/.ctxfs/status")).unwrap();
    assert_eq!(s["indexer"]["embedder"]["model"], "all-MiniLM-L6-v2", "{s}");
    assert_eq!(s["indexer"]["indexed_nodes"], 2, "{s}");
    let j: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        "cat \"$M/accounts/acme/.search/space mission to land on the moon?mode=vector&format=json\"",
    ))
    .unwrap();
    assert_eq!(j["results"][0]["path"], format!("accounts/{a}"), "{j}");
    assert_eq!(j["model"], "all-MiniLM-L6-v2");
    m.umount();
    // A start with the same model finds nothing stale and marks the store
    // (the next start skips the check); a start with another model must
    // not trust that mark: it re-embeds again.
    m.mount();
    sync(&m);
    m.umount();
    std::fs::write(m.config.as_ref().unwrap(), &hash_cfg).unwrap();
    m.mount();
    sync(&m);
    let s: serde_json::Value = serde_json::from_str(&m.ok(0, "cat $M/.ctxfs/status")).unwrap();
    let model = s["indexer"]["embedder"]["model"].clone();
    assert_ne!(model, "all-MiniLM-L6-v2", "{s}");
    let j: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        "cat \"$M/accounts/acme/.search/Apollo launch project?mode=vector&format=json\"",
    ))
    .unwrap();
    assert_eq!(j["model"], model, "{j}");
    assert_eq!(j["results"][0]["path"], format!("accounts/{a}"), "{j}");
    m.umount();
    m.fsck();
}

/// Text that must never reach an embedder stays out of the index: a node
/// whose `.meta.json` says `"searchable": false`, a node under a prefix the
/// account lists as `unindexed`, and a conversation marked so. Search never
/// finds them; a later commit that makes a node searchable indexes it, and
/// one that makes it unsearchable forgets it.
#[test]
fn unsearchable_nodes_and_prefixes_never_reach_the_index() {
    let config = CONFIG.replace(
        "readers = [1002]",
        "readers = [1002]\nunindexed = [\"users/alice/memories/private\"]",
    );
    let m = Mount::with_args(Some(&config), &["--embedder", "hash"]);
    let base = "acme/users/alice/memories";
    let off = r#"{"status":"ACTIVE","searchable":false}"#;
    m.ok(
        WRITER,
        &four_steps(&format!("{base}/notes/a"), "zebrafinch code", off),
    );
    m.ok(
        WRITER,
        &four_steps(&format!("{base}/private/b"), "quokkanest code", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps(&format!("{base}/notes/c"), "walrusden code", ACTIVE),
    );
    m.fails(
        WRITER,
        &four_steps(
            &format!("{base}/notes/d"),
            "x",
            r#"{"status":"ACTIVE","searchable":"no"}"#,
        ),
        "Invalid argument",
    );
    sync(&m);
    // Nothing of them in the index: not even a weak vector hit.
    let (a, b, c) = (
        format!("{base}/notes/a"),
        format!("{base}/private/b"),
        format!("{base}/notes/c"),
    );
    let found = |m: &Mount, q: &str| search(m, READER, "acme", &format!("{q}?k=50"));
    assert!(!found(&m, "zebrafinch").contains(&a));
    assert!(!found(&m, "quokkanest").contains(&b));
    assert_eq!(found(&m, "code"), vec![c.clone()]);
    // They are ordinary nodes otherwise.
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{a}/content.md")),
        "zebrafinch code"
    );
    // Searchable again, then not.
    m.ok(WRITER, &four_steps(&a, "zebrafinch code", ACTIVE));
    sync(&m);
    assert_eq!(found(&m, "zebrafinch")[0], a);
    m.ok(WRITER, &four_steps(&c, "walrusden code", off));
    sync(&m);
    assert!(!found(&m, "walrusden").contains(&c));
    // A reindex honours both.
    let mut m = m;
    m.umount();
    let out = ctxfs(&[
        "reindex",
        "--data",
        m.data.to_str().unwrap(),
        "--config",
        m.config.as_ref().unwrap().to_str().unwrap(),
        "--embedder",
        "hash",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.mount();
    sync(&m);
    assert_eq!(found(&m, "code"), vec![a.clone()]);
}

/// Time and supersession: a node whose `supersedes` relation names an
/// older one ranks above it, and the older one says `superseded` with the
/// node that replaced it (until that node goes); an earlier version's
/// `.meta.json` says which version superseded it and when; `happened` and
/// `valid_from` place a node in a time range; a time field that is not a
/// date is refused.
#[test]
fn a_newer_node_supersedes_an_older_one_and_versions_say_until_when() {
    let hash_cfg = format!("{CONFIG}\n[index]\nembedder = \"hash\"\n");
    let m = Mount::with_config(Some(&hash_cfg));
    let old = format!("{ALICE}/events/offsite-1");
    let new = format!("{ALICE}/events/offsite-2");
    m.ok(
        WRITER,
        &four_steps(
            &old,
            "The team offsite is in Lisbon on 2026-05-02.",
            r#"{"status":"ACTIVE","happened":"2026-05-02","valid_from":"2026-03-19"}"#,
        ),
    );
    m.ok(
        WRITER,
        &format!(
            "set -e; N=$M/accounts/{new}; mkdir -p $N; printf 'The team offsite in Lisbon moved to 2026-06-06.' > $N/content.md; \
             printf '[{{\"from_uri\":\"ctx://{new}\",\"to_uri\":\"ctx://{old}\",\"relation_type\":\"supersedes\"}}]' > $N/.relations.json; \
             /bin/echo '{{\"status\":\"ACTIVE\",\"happened\":\"2026-06-06\",\"valid_from\":\"2026-04-01T09:30:00Z\"}}' > $N/.meta.json"
        ),
    );
    sync(&m);
    let j = |q: &str| -> serde_json::Value {
        serde_json::from_str(&m.ok(
            READER,
            &format!("cat \"$M/accounts/acme/users/alice/.search/{q}\""),
        ))
        .unwrap()
    };
    let r = j("team offsite Lisbon?format=json");
    let res = r["results"].as_array().unwrap();
    assert_eq!(res[0]["path"], format!("accounts/{new}"), "{r:#}");
    assert!(res[0].get("superseded_by").is_none(), "{r:#}");
    assert_eq!(res[1]["path"], format!("accounts/{old}"), "{r:#}");
    assert_eq!(res[1]["confidence"], "superseded", "{r:#}");
    assert_eq!(res[1]["superseded_by"], format!("accounts/{new}"), "{r:#}");
    // The TSV form: the confidence column and a ninth column.
    let tsv = m.ok(
        READER,
        "cat \"$M/accounts/acme/users/alice/.search/team offsite Lisbon\"",
    );
    let line = tsv.lines().find(|l| l.contains(&old)).unwrap();
    let cols: Vec<&str> = line.split('\t').collect();
    assert_eq!(cols[5], "superseded", "{tsv}");
    assert_eq!(cols[8], format!("superseded-by:accounts/{new}"), "{tsv}");
    // A time range by when each happened (not when it was committed).
    let paths = |q: &str| -> Vec<String> {
        j(q)["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["path"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        paths("team offsite?format=json&since=2026-06-01"),
        [format!("accounts/{new}")]
    );
    assert_eq!(
        paths("team offsite?format=json&until=2026-05-31"),
        [format!("accounts/{old}")]
    );
    // The newer node gone, the older one is what holds again.
    m.ok(WRITER, &format!("rm -r $M/accounts/{new}"));
    sync(&m);
    let r = j("team offsite Lisbon?format=json");
    assert_eq!(r["results"][0]["path"], format!("accounts/{old}"), "{r:#}");
    assert_ne!(r["results"][0]["confidence"], "superseded", "{r:#}");
    assert!(r["results"][0].get("superseded_by").is_none(), "{r:#}");

    // Versions: the earlier one says which superseded it and from when.
    m.ok(
        WRITER,
        &four_steps(
            &old,
            "The team offsite is in Porto on 2026-05-02.",
            r#"{"status":"ACTIVE","happened":"2026-05-02","valid_from":"2026-04-20"}"#,
        ),
    );
    let v1: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        &format!("cat $M/accounts/{old}/.versions/1/.meta.json"),
    ))
    .unwrap();
    assert_eq!(v1["superseded_by"], 2, "{v1:#}");
    assert_eq!(v1["valid_until"], "2026-04-20", "{v1:#}");
    assert_eq!(v1["valid_from"], "2026-03-19", "{v1:#}");
    // The size stat gives is the size cat reads.
    let size = m.ok(
        READER,
        &format!("stat -c %s $M/accounts/{old}/.versions/1/.meta.json"),
    );
    let bytes = m.ok(
        READER,
        &format!("wc -c < $M/accounts/{old}/.versions/1/.meta.json"),
    );
    assert_eq!(size.trim(), bytes.trim());
    let v2: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        &format!("cat $M/accounts/{old}/.versions/2/.meta.json"),
    ))
    .unwrap();
    assert!(v2.get("superseded_by").is_none(), "current: {v2:#}");
    // A third version without valid_from: the second stopped at its commit.
    m.ok(
        WRITER,
        &four_steps(&old, "The team offsite is in Porto, date open.", ACTIVE),
    );
    let v2: serde_json::Value = serde_json::from_str(&m.ok(
        READER,
        &format!("cat $M/accounts/{old}/.versions/2/.meta.json"),
    ))
    .unwrap();
    assert_eq!(v2["superseded_by"], 3, "{v2:#}");
    let v3: serde_json::Value =
        serde_json::from_str(&m.ok(READER, &format!("cat $M/accounts/{old}/.meta.json"))).unwrap();
    assert_eq!(v2["valid_until"], v3["updated_at"], "{v2:#}");
    // A time field that is not a date: refused, the version kept.
    m.fails(
        WRITER,
        &four_steps(&old, "x", r#"{"status":"ACTIVE","valid_from":"last May"}"#),
        "Invalid argument",
    );
    let err = m.ok(WRITER, &format!("cat $M/accounts/{old}/.commit-error"));
    assert!(err.contains("valid_from"), "{err}");
    assert_eq!(
        m.json(READER, &format!("cat $M/accounts/{old}/.meta.json"))["version"],
        3
    );
    m.umount_and_fsck();
}

/// `mode=tree` ranks the directories by their children's abstracts, then
/// searches inside the best ones: a query about one category's subject
/// finds that category's nodes; a node's own scope (no directory to rank)
/// is searched as hybrid; every result is one flat search could return.
#[test]
fn tree_mode_descends_into_the_closest_directories() {
    let m = Mount::with_config(Some(&minilm_config()));
    for (i, t) in [
        "Alice drinks sencha green tea every morning.",
        "Alice likes oolong tea after lunch.",
        "Alice never drinks coffee after noon.",
    ]
    .iter()
    .enumerate()
    {
        put(&m, WRITER, &format!("{ALICE}/drinks/d{i}"), t, t);
    }
    for (i, t) in [
        "Alice maintains the ctxfs FUSE file system in Rust.",
        "Alice reviews pull requests for the storage engine.",
        "Alice deploys the indexer on Debian servers.",
    ]
    .iter()
    .enumerate()
    {
        put(&m, WRITER, &format!("{ALICE}/work/w{i}"), t, t);
    }
    put(
        &m,
        WRITER,
        &format!("{BOB}/drinks/b0"),
        "Bob drinks tea.",
        "Bob drinks tea.",
    );
    sync(&m);
    let tree = search(
        &m,
        READER,
        "acme/users/alice",
        "what tea does she drink?mode=tree",
    );
    assert!(!tree.is_empty());
    assert!(tree[0].contains("/drinks/"), "{tree:?}");
    assert!(
        tree.iter().all(|p| p.starts_with(ALICE)),
        "only the scope: {tree:?}"
    );
    let j = m.json(
        READER,
        "cat \"$M/accounts/acme/users/alice/.search/code review of the storage engine?mode=tree&format=json\"",
    );
    assert_eq!(j["mode"], "tree");
    assert!(
        j["results"][0]["path"].as_str().unwrap().contains("/work/"),
        "{j:#}"
    );
    // A node's scope has no directory to rank: hybrid there.
    assert_eq!(
        search(&m, READER, &format!("{ALICE}/work/w1"), "storage?mode=tree"),
        [format!("{ALICE}/work/w1")]
    );
    m.fails(
        READER,
        "cat \"$M/accounts/acme/.search/tea?mode=forest\"",
        "Invalid argument",
    );
    m.umount_and_fsck();
}

/// The loaded indexes stay within `[index] max_loaded_mb`: searching a
/// second account unloads the least recently used one when both would not
/// fit, and the unloaded account answers again (loaded from the store).
#[test]
fn loaded_indexes_stay_within_their_memory_bound() {
    let cfg = format!("{CONFIG}\n[index]\nembedder = \"hash\"\nmax_loaded_mb = 1\n");
    let m = Mount::with_config(Some(&cfg));
    for account in ["acme", "other"] {
        let lines: Vec<String> = (0..400)
            .map(|i| {
                serde_json::json!({
                    "node": format!("users/u/memories/notes/n{i}"),
                    "content": format!("Note {i} of {account}: the harbor lantern and the copper kettle."),
                    "meta": {"status": "ACTIVE"},
                })
                .to_string()
            })
            .collect();
        let src = m.shared_file(&format!("batch-{account}"));
        std::fs::write(&src, lines.join("\n") + "\n").unwrap();
        m.ok(
            0,
            &format!("cat {} > $M/accounts/{account}/.ctxfs/batch", src.display()),
        );
    }
    sync(&m);
    let status = || m.json(0, "cat $M/.ctxfs/status")["indexer"].clone();
    for account in ["acme", "other", "acme"] {
        let hits = search(&m, 0, account, "harbor lantern");
        assert_eq!(hits.len(), 10, "{account}: {hits:?}");
        assert!(hits.iter().all(|p| p.starts_with(account)), "{hits:?}");
        let s = status();
        assert_eq!(s["loaded_accounts"], 1, "one fits at a time: {s:#}");
        assert_eq!(s["max_loaded_mb"], 1, "{s:#}");
    }
    m.umount_and_fsck();
}

/// On an encrypted PostgreSQL store, the indexer's retries rewrite events
/// whose payload is sealed: failed embeddings still retry, become dead
/// letters, and come back with `mv` (the store reads only the event's URI,
/// never its sealed payload).
#[test]
fn failed_embeddings_retry_on_an_encrypted_postgresql_store() {
    use crate::atrest::{key_file, keys_dir};
    let keys = keys_dir();
    let key = key_file(keys.path(), "master.key");
    let probe = Mount::without_index();
    let (_server, url, flag) = embed_server(&probe);
    let config = format!(
        "{CONFIG}\n[index]\nembedder = \"http\"\nhttp_url = \"{url}\"\nhttp_model = \"test-embed\"\nhttp_dim = 16\n\
         max_retries = 2\nretry_backoff_ms = 50\n[encryption]\nkey_file = \"{}\"\n",
        key.display()
    );
    let db = PgDb::new();
    let m = db.mount(Some(&config), &[]);
    let node = format!("{ALICE}/notes/sealed");
    put(&m, WRITER, &node, "the sealed quarterly report", "report");
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = loop {
        let l = m.ok(READER, &format!("ls $M/accounts/{node}/.outbox/dlq/"));
        if let Some(x) = l.lines().find(|x| x.ends_with(".json")) {
            break x.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no dead letter on the encrypted store"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let ev: serde_json::Value =
        serde_json::from_str(&m.ok(READER, &format!("cat $M/accounts/{node}/.outbox/dlq/{id}")))
            .unwrap();
    assert_eq!(ev["retry_count"], 2, "{ev}");
    // The payload reads as written (opened), not sealed.
    assert!(ev.to_string().contains("sealed quarterly report"), "{ev}");
    std::fs::write(&flag, "").unwrap();
    m.ok(
        WRITER,
        &format!("mv $M/accounts/{node}/.outbox/dlq/{id} $M/accounts/{node}/.outbox/"),
    );
    sync(&m);
    assert_eq!(
        search(&m, READER, "acme", "sealed quarterly report").first(),
        Some(&node)
    );
}

/// A long memory whose every line names its person: the result's `LINES`
/// are the lines holding the rarer words of the query, and `sed -n` of them
/// reads the answer.
#[test]
fn a_long_memory_names_the_lines_holding_the_rare_words() {
    let m = Mount::with_config(Some(CONFIG));
    let node = format!("{ALICE}/entities/andrew");
    let mut lines: Vec<String> = (1..=40)
        .map(|i| format!("Andrew said on day {i}: the birds were out again."))
        .collect();
    lines[33] = "Andrew said on day 34: I started a new job as a financial analyst.".into();
    put(&m, WRITER, &node, &lines.join("\n"), "What Andrew said.");
    // Other nodes naming Andrew make the name a common word.
    for i in 0..3 {
        put(
            &m,
            WRITER,
            &format!("{ALICE}/entities/walk-{i}"),
            "Andrew and the user walked the dogs.",
            "A walk.",
        );
    }
    sync(&m);
    let tsv = m.ok(
        READER,
        &format!("cat \"$M/accounts/{ALICE}/.search/What job did Andrew start\""),
    );
    let line = tsv
        .lines()
        .find(|l| l.contains("entities/andrew\t"))
        .unwrap_or_else(|| panic!("{tsv}"));
    let cols: Vec<&str> = line.split('\t').collect();
    assert_eq!(cols[7], "40", "every line holds a query word: {line}");
    let ranges = cols[6];
    let shown = m.ok(
        READER,
        &format!(
            "for r in $(echo {ranges} | tr , ' '); do sed -n \"$(echo $r | tr - ,)p\" \"$M/accounts/{node}/content.md\"; done"
        ),
    );
    assert_eq!(shown.lines().count(), 12, "{ranges}: {shown}");
    assert!(shown.contains("financial analyst"), "{ranges}: {shown}");
}
