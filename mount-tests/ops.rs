//! Operations: metrics through the mount and over HTTP, parsed by
//! Prometheus's own text parser (python3-prometheus-client).

use crate::harness::*;

/// A TCP port free at the time of the call.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Parse Prometheus text with the reference parser: (name, labels, value) samples.
fn parse(
    m: &Mount,
    source: &str,
) -> Vec<(String, serde_json::Map<String, serde_json::Value>, f64)> {
    let script = m.shared_file("parse.py");
    std::fs::write(
        &script,
        "import sys, json, urllib.request\n\
         from prometheus_client.parser import text_string_to_metric_families\n\
         src = sys.argv[1]\n\
         text = urllib.request.urlopen(src).read().decode() if src.startswith('http') else open(src).read()\n\
         print(json.dumps([[s.name, s.labels, s.value] for f in text_string_to_metric_families(text) for s in f.samples]))\n",
    )
    .unwrap();
    let out = m.ok(
        0,
        &format!("/usr/bin/python3 {} '{source}'", script.display()),
    );
    let v: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    v.into_iter()
        .map(|s| {
            (
                s[0].as_str().unwrap().to_string(),
                s[1].as_object().unwrap().clone(),
                s[2].as_f64().unwrap(),
            )
        })
        .collect()
}

fn value(
    samples: &[(String, serde_json::Map<String, serde_json::Value>, f64)],
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).and_then(|x| x.as_str()) == Some(*v))
        })
        .map(|s| s.2)
}

#[test]
fn metrics_parse_as_prometheus_text_and_count_what_happened() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let m = Mount::with_args(
        Some(CONFIG),
        &["--embedder", "hash", "--metrics-addr", &addr],
    );
    m.ok(
        WRITER,
        &four_steps("acme/users/alice/memories/prefs/tea", "green tea", ACTIVE),
    );
    m.fails(STRANGER, "ls $M/accounts/acme", "Permission denied");
    m.fails(
        READER,
        "mkdir $M/accounts/acme/users/alice/memories/prefs/x",
        "Read-only file system",
    );
    m.ok(0, "cat $M/.ctxfs/sync");
    m.ok(READER, "cat \"$M/accounts/acme/.search/green tea\"");

    // The operator's view: root through the mount, and the HTTP endpoint.
    let file = m.shared_file("metrics.txt");
    m.ok(0, &format!("cat $M/.ctxfs/metrics > {}", file.display()));
    for samples in [
        parse(&m, file.to_str().unwrap()),
        parse(&m, &format!("http://{addr}/metrics")),
    ] {
        let v = |n: &str, l: &[(&str, &str)]| {
            value(&samples, n, l).unwrap_or_else(|| panic!("no {n} {l:?}"))
        };
        assert!(v("ctxfs_requests_total", &[("op", "lookup")]) > 0.0);
        assert!(v("ctxfs_requests_total", &[("op", "write")]) >= 5.0);
        assert_eq!(
            v("ctxfs_request_duration_seconds_count", &[("op", "lookup")]),
            v(
                "ctxfs_request_duration_seconds_bucket",
                &[("op", "lookup"), ("le", "+Inf")]
            )
        );
        assert!(v("ctxfs_errors_total", &[("op", "mkdir"), ("errno", "EROFS")]) >= 1.0);
        assert!(
            v(
                "ctxfs_auth_failures_total",
                &[("account", "acme"), ("kind", "denied")]
            ) >= 1.0
        );
        assert!(
            v(
                "ctxfs_auth_failures_total",
                &[("account", "acme"), ("kind", "read_only")]
            ) >= 1.0
        );
        assert!(v("ctxfs_commits_total", &[]) >= 1.0);
        assert_eq!(
            v("ctxfs_nodes", &[("account", "acme"), ("status", "ACTIVE")]),
            1.0
        );
        assert_eq!(v("ctxfs_outbox_depth", &[("account", "acme")]), 0.0);
        assert_eq!(v("ctxfs_dead_letters", &[("account", "acme")]), 0.0);
        assert!(v("ctxfs_embeddings_total", &[("result", "computed")]) >= 1.0);
        assert!(v("ctxfs_searches_total", &[]) >= 1.0);
        assert_eq!(v("ctxfs_embedding_jobs_queued", &[]), 0.0);
        v("ctxfs_index_lag_seconds", &[]);
    }
    // A tenant's view holds its accounts' series only: no daemon-wide
    // activity (requests, errors, commits, the indexer's counters).
    let mine = m.shared_file("writer-metrics.txt");
    m.ok(
        WRITER,
        &format!("cat $M/.ctxfs/metrics > {}", mine.display()),
    );
    let samples = parse(&m, mine.to_str().unwrap());
    assert_eq!(
        value(
            &samples,
            "ctxfs_nodes",
            &[("account", "acme"), ("status", "ACTIVE")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &samples,
            "ctxfs_nodes",
            &[("account", "acme"), ("status", "BROKEN")]
        ),
        Some(0.0)
    );
    for daemon_wide in [
        "ctxfs_requests_total",
        "ctxfs_errors_total",
        "ctxfs_commits_total",
        "ctxfs_commit_failures_total",
        "ctxfs_embeddings_total",
        "ctxfs_searches_total",
    ] {
        assert_eq!(value(&samples, daemon_wide, &[]), None, "{daemon_wide}");
    }
    // A reader sees no BROKEN count (BROKEN nodes are for writers).
    let text = m.ok(READER, "cat $M/.ctxfs/metrics");
    assert!(text.contains("status=\"ACTIVE\""), "{text}");
    assert!(!text.contains("status=\"BROKEN\""), "{text}");
    // Another account's writer: nothing of acme.
    let text = m.ok(STRANGER, "cat $M/.ctxfs/metrics");
    assert!(!text.contains("\"acme\""), "{text}");
    assert!(text.contains("account=\"other\""));
    // A uid in no account: no account, no daemon-wide figure.
    let text = m.ok(NOBODY, "cat $M/.ctxfs/metrics");
    for leak in [
        "account=",
        "ctxfs_requests_total",
        "ctxfs_commits_total",
        "ctxfs_index_lag",
    ] {
        assert!(!text.contains(leak), "{leak} in {text}");
    }
    // The endpoint serves only /metrics.
    let code = m.ok(
        0,
        &format!("/usr/bin/python3 -c \"import urllib.request, urllib.error\ntry: urllib.request.urlopen('http://{addr}/x')\nexcept urllib.error.HTTPError as e: print(e.code)\""),
    );
    assert_eq!(code.trim(), "404");
    // An address in use fails the mount, saying why; nothing stays mounted.
    let mnt2 = m.dir.path().join("mnt2");
    std::fs::create_dir(&mnt2).unwrap();
    let data2 = m.dir.path().join("data2");
    let o = ctxfs(&[
        "mount",
        mnt2.to_str().unwrap(),
        "--data",
        data2.to_str().unwrap(),
        "--no-index",
        "--metrics-addr",
        &addr,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("cannot serve metrics"),
        "{err}"
    );
    assert!(!is_mounted(&mnt2));
}

/// Python asks `isatty` of every file it opens: an ioctl, which the kernel
/// forwards each time. It fails with ENOTTY, is counted, and leaves nothing
/// in the daemon's log (it once wrote four log lines per `open`).
#[test]
fn ioctl_fails_with_enotty_quietly() {
    let m = Mount::with_config(Some(CONFIG));
    let node = "acme/users/alice/memories/prefs/tty";
    m.ok(WRITER, &four_steps(node, "not a terminal", ACTIVE));
    let out = m.ok(
        READER,
        &format!(
            "/usr/bin/python3 -c \"import os, fcntl, termios\n\
             fd = os.open('$M/accounts/{node}/content.md', os.O_RDONLY)\n\
             print(os.isatty(fd))\n\
             try: fcntl.ioctl(fd, termios.TCGETS, bytes(64))\n\
             except OSError as e: print(e.errno == __import__('errno').ENOTTY)\""
        ),
    );
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["False", "True"]
    );
    let file = m.shared_file("metrics.txt");
    m.ok(0, &format!("cat $M/.ctxfs/metrics > {}", file.display()));
    let samples = parse(&m, file.to_str().unwrap());
    let n = value(&samples, "ctxfs_requests_total", &[("op", "ioctl")]).expect("ioctl counted");
    assert!(n >= 2.0, "{n}");
    let log = std::fs::read_to_string(m.data.join("ctxfs.log")).unwrap();
    assert!(!log.contains("Not Implemented"), "{log}");
}

/// The Grafana dashboard in contrib/ asks only for metrics the daemon
/// serves: every `ctxfs_*` name in its queries is in `.ctxfs/metrics`.
#[test]
fn the_grafana_dashboard_queries_served_metrics() {
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/contrib/grafana-ctxfs.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    m.ok(
        WRITER,
        &four_steps("acme/users/alice/memories/prefs/tea", "green tea", ACTIVE),
    );
    m.ok(0, "cat $M/.ctxfs/sync");
    m.ok(READER, "cat \"$M/accounts/acme/.search/green tea\"");
    let text = m.ok(0, "cat $M/.ctxfs/metrics");
    let mut names = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(i) = rest.find("ctxfs_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[i + name.len()..];
                names.push(name);
            }
        }
    }
    assert!(names.len() >= 12, "{names:?}");
    for n in names {
        // Histograms are served as NAME_bucket/_sum/_count under `# TYPE NAME`.
        let family = n.trim_end_matches("_bucket");
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "the dashboard queries {n}, which .ctxfs/metrics does not serve"
        );
    }
}

/// A moved node is there under its new name as soon as `rename(2)`
/// returns, 300 times in a row, read through the dentries the kernel moved
/// with it. (The memory tool's rename read ENOENT at `NEW/.meta.json` under
/// load: the kernel moves the node's cached child dentries with it, and
/// their inodes still meant the old path until the invalidation thread
/// dropped them. The daemon now moves every inode under the node at once.)
/// One process reads, moves and reads again with nothing in between, so
/// the invalidation thread rarely gets there first.
#[test]
fn a_moved_node_reads_at_its_new_path_at_once() {
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let c = "acme/users/alice/memories/c";
    m.ok(WRITER, &four_steps(&format!("{c}/a"), "moving", ACTIVE));
    let script = m.shared_file("moves.py");
    std::fs::write(
        &script,
        format!(
            r#"import os
d = os.environ["M"] + "/accounts/{c}/"
bad = 0
for i in range(150):
    for s, t in (("a", "b"), ("b", "a")):
        open(d + s + "/.meta.json").read()
        open(d + s + "/content.md").read()
        os.rename(d + s, d + t)
        try:
            open(d + t + "/.meta.json").read()
            open(d + t + "/content.md").read()
        except OSError as e:
            bad += 1
            print(t, e)
print("bad", bad)
"#
        ),
    )
    .unwrap();
    let out = m.ok(WRITER, &format!("/usr/bin/python3 {}", script.display()));
    assert!(out.trim_end().ends_with("bad 0"), "{out}");
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{c}/a/content.md")),
        "moving"
    );
}

/// `.ctxfs/version` (a feature's own virtual file): listed in `.ctxfs/`,
/// the same JSON for every uid, read-only.
#[test]
fn the_daemon_says_what_it_is_in_ctxfs_version() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    assert!(m.ok(0, "ls $M/.ctxfs").lines().any(|l| l == "version"));
    for uid in [0, WRITER, NOBODY] {
        let v = m.json(uid, "cat $M/.ctxfs/version");
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
        assert_eq!(v["store"], "redb", "{v}");
        assert_eq!(v["search"], false, "{v}");
    }
    m.fails(
        WRITER,
        "/bin/echo x > $M/.ctxfs/version",
        "Operation not permitted",
    );
    m.fails(0, "rm $M/.ctxfs/version", "");
    assert!(m.ok(0, "cat $M/.ctxfs/version").contains("\"version\""));
}
