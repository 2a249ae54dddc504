//! Tests of the index over a real store: events in, searches out, loads, dumps and rebuilds.

use super::*;
use crate::schema::event;
use crate::store::NodeRec;
use crate::store::Op;
use crate::store::RedbStore;
use crate::store::Status;

#[test]
fn derived_overview_of_one_chunk_has_no_record() {
    let one = "First line of a note.\nSecond line.\n".to_string();
    let derived = crate::schema::derive::derive_overview(&one);
    let levels = |texts: &[(u8, String)]| -> Vec<u8> {
        records(texts).into_iter().map(|(l, _, _)| l).collect()
    };
    let t = [(0, "A note".into()), (1, derived), (2, one.clone())];
    assert_eq!(levels(&t), [0, 2]);
    // An overview the writer wrote is a record.
    let t = [(1, "What this note covers".into()), (2, one)];
    assert_eq!(levels(&t), [1, 2]);
    // A long content: the derived overview spans chunks, and stays.
    let long = "A line of some length that fills the chunk.\n".repeat(60);
    let t = [
        (1, crate::schema::derive::derive_overview(&long)),
        (2, long),
    ];
    let l = levels(&t);
    assert!(l[0] == 1 && l.len() > 2, "{l:?}");
}

#[test]
fn index_documents_stored_before_source_still_read() {
    // The layout before `source`, as postcard wrote it.
    let old = IxDocV1 {
        abstract_: "#0 user: hello".into(),
        model: "m".into(),
        recs: vec![IxRec {
            label: 3,
            level: 2,
            line: 0,
            hash: 9,
        }],
        terms: vec![("hello".into(), 1)],
        edges: Vec::new(),
    };
    let d = IxDoc::decode(&postcard::to_stdvec(&old).unwrap()).unwrap();
    assert_eq!(d.abstract_, "#0 user: hello");
    assert_eq!(d.recs[0].label, 3);
    assert_eq!(d.terms, old.terms);
    assert_eq!(d.source, None);
    // And the new layout round-trips with it.
    let new = IxDoc {
        source: Some(1_790_000_000_000_000_000),
        ..d
    };
    let back = IxDoc::decode(&new.encode()).unwrap();
    assert_eq!(back.source, new.source);
    assert_eq!(back.abstract_, new.abstract_);
    assert!(!back.asks);
    assert!(IxDoc::decode(b"\xff\xff").is_err());
    // The layout before `asks`: its source kept, nothing asks.
    let v2 = IxDocV2 {
        abstract_: "#1 user: which one?".into(),
        model: "m".into(),
        recs: Vec::new(),
        terms: Vec::new(),
        edges: Vec::new(),
        source: Some(7),
    };
    let d = IxDoc::decode(&postcard::to_stdvec(&v2).unwrap()).unwrap();
    assert_eq!(
        (d.source, d.asks, d.abstract_.as_str()),
        (Some(7), false, "#1 user: which one?")
    );
    let asks = IxDoc { asks: true, ..d };
    assert!(IxDoc::decode(&asks.encode()).unwrap().asks);
    // The layout before `tells_when`: it still asks, says no time.
    let v3 = IxDocV3 {
        abstract_: "#2 user: when?".into(),
        model: "m".into(),
        recs: Vec::new(),
        terms: Vec::new(),
        edges: Vec::new(),
        source: Some(8),
        asks: true,
    };
    let d = IxDoc::decode(&postcard::to_stdvec(&v3).unwrap()).unwrap();
    assert_eq!(
        (d.source, d.asks, d.tells_when, d.abstract_.as_str()),
        (Some(8), true, false, "#2 user: when?")
    );
    let told = IxDoc {
        tells_when: true,
        ..d
    };
    let back = IxDoc::decode(&told.encode()).unwrap();
    assert!(back.tells_when && back.asks);
}

#[test]
fn the_loaded_bound_is_shared_among_tenants() {
    use super::account::{victim, Held};
    let t0 = Instant::now();
    let held = |specs: &[(&str, u64, Option<u32>, usize)]| -> Vec<Held> {
        specs
            .iter()
            .map(|(a, ms, t, b)| Held {
                account: a.to_string(),
                at: t0 + Duration::from_millis(*ms),
                tenant: *t,
                bytes: *b,
            })
            .collect()
    };
    let name = |h: &[Held], i: Option<usize>| i.map(|i| h[i].account.clone());
    // Within the bound: nothing goes.
    let h = held(&[("v", 1, Some(1), 50), ("a1", 2, Some(2), 40)]);
    assert_eq!(victim(&h, "a1", 4, 100), None);
    // Over in bytes: the victim's index is the oldest, but within its share
    // (100 / 2 = 50): the attacker's own oldest goes, not the victim's.
    let h = held(&[
        ("v", 1, Some(1), 50),
        ("a1", 2, Some(2), 30),
        ("a2", 3, Some(2), 30),
    ]);
    assert_eq!(name(&h, victim(&h, "a2", 4, 100)), Some("a1".into()));
    // Over in accounts: 2 tenants, a share of 2 each; the attacker holds 3.
    let h = held(&[
        ("v", 1, Some(1), 1),
        ("a1", 2, Some(2), 1),
        ("a2", 3, Some(2), 1),
        ("a3", 4, Some(2), 1),
    ]);
    assert_eq!(name(&h, victim(&h, "a3", 3, 100)), Some("a1".into()));
    // The account in use is never the victim; a tenant over its share
    // loses its own, and one within its share nothing, even when the bound
    // stays exceeded by the account in use.
    let h = held(&[("v", 5, Some(1), 10), ("a1", 1, Some(2), 95)]);
    assert_eq!(name(&h, victim(&h, "v", 4, 100)), Some("a1".into()));
    assert_eq!(victim(&h, "a1", 4, 100), None);
    // The victim over its share goes like anyone's (least recently used of
    // the tenants over their share).
    let h = held(&[("v", 1, Some(1), 70), ("a1", 2, Some(2), 40)]);
    assert_eq!(name(&h, victim(&h, "a1", 4, 100)), Some("v".into()));
    // Over the bound in accounts only: a tenant over its share in bytes
    // but not in accounts keeps its large index (one large index against
    // many small ones).
    let h = held(&[
        ("v", 1, Some(1), 80),
        ("a1", 2, Some(2), 1),
        ("a2", 3, Some(2), 1),
        ("a3", 4, Some(2), 1),
    ]);
    assert_eq!(name(&h, victim(&h, "a3", 3, 100)), Some("a1".into()));
    // The daemon's own work is a tenant of its own.
    let h = held(&[
        ("v", 1, Some(1), 30),
        ("i1", 2, None, 40),
        ("i2", 3, None, 40),
    ]);
    assert_eq!(name(&h, victim(&h, "i2", 4, 100)), Some("i1".into()));
}

struct T {
    _dir: tempfile::TempDir,
    store: Arc<RedbStore>,
    ix: Arc<Index>,
    seq: u64,
}

impl T {
    fn with(cfg: IndexConfig) -> T {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("db.redb")).unwrap();
        let ix = T::index(&store, dir.path(), cfg);
        ix.start().unwrap();
        T {
            _dir: dir,
            store,
            ix,
            seq: 0,
        }
    }

    /// An index over the store and graph dumps under `dir`, not started.
    fn index(store: &Arc<RedbStore>, dir: &std::path::Path, cfg: IndexConfig) -> Arc<Index> {
        Index::new(
            store.clone() as Arc<dyn Store>,
            &dir.join("index"),
            Arc::new(embed::HashEmbedder::new(64)),
            "test".into(),
            cfg,
        )
        .unwrap()
    }

    /// The same store and dumps as a new daemon would find them (the
    /// indexer thread not started: loads happen where the test asks).
    fn reopen(&mut self, cfg: IndexConfig) {
        self.ix = T::index(&self.store, self._dir.path(), cfg);
    }

    /// Nodes `a/users/u/memories/c/n{i}` holding "note {i} about widget{i}".
    fn notes(&mut self, ids: std::ops::Range<usize>) {
        for i in ids {
            self.upsert(
                &format!("a/users/u/memories/c/n{i}"),
                &format!("note {i} about widget{i}"),
            );
        }
    }

    /// Store the node as ACTIVE (or remove it) with its event, then sync.
    fn event(&mut self, etype: &str, path: &str, payload: Value, active: Option<&str>) {
        self.seq += 1;
        let mut ops = vec![Op::PutEvent {
            seq: self.seq,
            node_path: path.into(),
            account: "a".into(),
            json: serde_json::to_vec(&json!({
                "event_id": format!("{:016x}", self.seq), "event_type": etype,
                "uri": place::uri_of(path), "payload": payload, "retry_count": 0,
                "status": "PENDING", "created_at": "2026-01-01T00:00:00.000Z",
            }))
            .unwrap(),
        }];
        match active {
            Some(p) => ops.push(Op::PutNode {
                path: p.into(),
                rec: NodeRec {
                    id: self.seq,
                    path: p.into(),
                    status: Status::Active,
                    version: 1,
                    created_at: String::new(),
                    updated_at: String::new(),
                    updated_ns: 0,
                    files: Vec::new(),
                },
            }),
            None => ops.push(Op::DelNode { path: path.into() }),
        }
        self.store.apply(ops, true).unwrap();
        self.ix.notify();
        self.ix.sync(self.seq, &|| false).unwrap();
    }

    fn upsert(&mut self, path: &str, text: &str) {
        let recs = json!({"records": event::records(path, &[(2, text.to_string())])});
        self.event("UPSERT_CONTEXT", path, recs, Some(path));
    }

    fn hits(&self, q: &str) -> Vec<String> {
        let q = Query {
            text: q.into(),
            k: 10,
            mode: Mode::Hybrid,
            expand: false,
            tenant: None,
        };
        self.ix
            .search("a", &q)
            .unwrap()
            .into_iter()
            .map(|h| h.path)
            .collect()
    }
}

/// A graph from the first vector on (an account past the exact size).
fn graphed() -> IndexConfig {
    IndexConfig {
        exact_scope: 0,
        ..IndexConfig::default()
    }
}

#[test]
fn a_dump_left_from_a_larger_account_is_dropped() {
    let mut t = T::with(graphed());
    t.notes(0..10);
    t.ix.shutdown();
    let dump = t._dir.path().join("index").join("a");
    assert!(dump.join(format!("{}.hnsw.graph", ann::DUMP)).exists());
    // The same store with the default exact size: 10 records need no graph.
    t.reopen(IndexConfig::default());
    let ai = t.ix.account("a").unwrap();
    t.ix.ensure_vectors(&ai).unwrap();
    {
        let st = rlock(&ai.st);
        assert!(!st.graphed);
        assert_eq!(st.vecs.len(), 10, "vectors from the dump");
    }
    assert_eq!(rlock(&ai.graph).get_nb_point(), 0);
    assert_eq!(t.hits("widget4")[0], "accounts/a/users/u/memories/c/n4");
    t.ix.dump_all();
    assert!(!dump.exists(), "the stale dump is removed");
}

#[test]
fn an_indexed_change_takes_the_summaries_of_its_directories() {
    let mut t = T::with(IndexConfig::default());
    let rows = ["a/users/u/memories/c/.summary", "a/users/u/.summary"];
    let other = "a/users/v/memories/c/.summary";
    for p in rows.iter().chain([&other]) {
        t.store
            .apply(
                vec![Op::PutScratch {
                    path: p.to_string(),
                    data: b"{}".to_vec(),
                }],
                true,
            )
            .unwrap();
    }
    let told = Arc::new(Mutex::new(Vec::new()));
    let t2 = told.clone();
    t.ix.on_changed_dirs(Box::new(move |d| lock(&t2).extend_from_slice(d)));
    t.notes(0..1);
    for p in rows {
        assert!(t.store.get_scratch(p).unwrap().is_none(), "{p} left");
    }
    assert!(t.store.get_scratch(other).unwrap().is_some());
    assert_eq!(
        *lock(&told),
        vec!["a/users/u".to_string(), "a/users/u/memories/c".to_string()]
    );
}

#[test]
fn a_small_account_has_no_graph_until_it_grows() {
    let mut t = T::with(IndexConfig {
        exact_scope: 30,
        ..IndexConfig::default()
    });
    t.notes(0..30);
    let ai = t.ix.account("a").unwrap();
    {
        let st = rlock(&ai.st);
        assert!(!st.graphed);
        assert_eq!(st.vecs.len(), 30);
    }
    assert_eq!(rlock(&ai.graph).get_nb_point(), 0);
    assert_eq!(t.hits("widget7")[0], "accounts/a/users/u/memories/c/n7");
    // Deletes leave no tombstones without a graph.
    for i in 20..25 {
        t.event(
            "DELETE_CONTEXT",
            &format!("a/users/u/memories/c/n{i}"),
            json!({}),
            None,
        );
    }
    assert_eq!(rlock(&ai.st).dead.len(), 0);
    assert!(!t.hits("widget21").iter().any(|p| p.ends_with("/c/n21")));
    // Past the exact size: the graph holds every live vector.
    t.notes(30..40);
    let st = rlock(&ai.st);
    assert!(st.graphed);
    assert_eq!(st.vecs.len(), 35);
    assert_eq!(rlock(&ai.graph).get_nb_point(), 35);
    drop(st);
    assert_eq!(t.hits("widget33")[0], "accounts/a/users/u/memories/c/n33");
}

#[test]
fn follows_events_and_survives_rebuild_and_reload() {
    let mut t = T::with(graphed());
    t.notes(0..40);
    assert_eq!(t.hits("widget7")[0], "accounts/a/users/u/memories/c/n7");
    // Update, move, delete.
    t.upsert("a/users/u/memories/c/n7", "now about gadgets");
    assert!(!t
        .hits("widget7")
        .contains(&"accounts/a/users/u/memories/c/n7".to_string()));
    t.event(
        "MOVE_CONTEXT",
        "a/users/u/memories/c/n8",
        json!({"new_uri": "ctx://a/users/u/memories/d/n8"}),
        Some("a/users/u/memories/d/n8"),
    );
    t.store
        .apply(
            vec![Op::DelNode {
                path: "a/users/u/memories/c/n8".into(),
            }],
            true,
        )
        .unwrap();
    assert_eq!(t.hits("widget8")[0], "accounts/a/users/u/memories/d/n8");
    for i in 10..40 {
        t.event(
            "DELETE_CONTEXT",
            &format!("a/users/u/memories/c/n{i}"),
            json!({}),
            None,
        );
    }
    assert!(!t.hits("widget20").iter().any(|p| p.ends_with("/c/n20")));
    let ai = t.ix.account("a").unwrap();
    assert_eq!(rlock(&ai.st).dead.len(), 31);
    // The idle indexer's upkeep frees them without a restart (31
    // tombstones, 10 live vectors: rebuilt).
    t.ix.rebuild_tombstoned();
    assert_eq!(
        rlock(&ai.st).dead.len(),
        0,
        "tombstones held until a restart"
    );
    // Rebuild: tombstones gone, results unchanged.
    t.ix.rebuild(&ai);
    assert_eq!(rlock(&ai.st).dead.len(), 0);
    assert_eq!(t.hits("widget8")[0], "accounts/a/users/u/memories/d/n8");
    assert_eq!(t.hits("gadgets")[0], "accounts/a/users/u/memories/c/n7");
    // Reload from the store and the dump: same answers.
    t.ix.shutdown();
    t.reopen(graphed());
    let ai = t.ix.account("a").unwrap();
    // Phase one: documents, lexical answers, no vectors yet.
    assert_eq!(rlock(&ai.st).docs.len(), 10);
    assert!(!ai.ready.load(Ordering::Acquire));
    assert_eq!(t.hits("widget3")[0], "accounts/a/users/u/memories/c/n3");
    // Phase two (the indexer thread's job): the graph from its dump.
    t.ix.ensure_vectors(&ai).unwrap();
    assert_eq!(rlock(&ai.st).vecs.len(), 10);
    assert_eq!(t.hits("widget3")[0], "accounts/a/users/u/memories/c/n3");
    assert_eq!(t.hits("gadgets")[0], "accounts/a/users/u/memories/c/n7");
    // Every label of every document has a live vector.
    let st = rlock(&ai.st);
    for d in st.docs.values() {
        for r in &d.ix.recs {
            assert!(st.vecs.contains_key(&(r.label as usize)));
        }
    }
}

/// Index loads run at nice LOAD_NICE on a thread of their own; the
/// caller's priority is left as it was.
#[test]
fn loads_run_below_the_searches_priority() {
    // SAFETY: gettid and getpriority take and return integers.
    let nice = || unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::getpriority(libc::PRIO_PROCESS, tid)
    };
    let before = nice();
    let inside = super::account::at_low_priority(nice);
    assert_eq!(inside, before.max(super::account::LOAD_NICE));
    assert_eq!(nice(), before);
}

/// A view's exact index finds the vectors the indexer stored for the very
/// texts it holds (by hash), searches texts it never embedded by their
/// words, keeps to its scope, and ranks as the live search does.
#[test]
fn a_past_index_reuses_stored_vectors_and_keeps_to_its_scope() {
    let mut t = T::with(IndexConfig::default());
    t.notes(0..10);
    let doc = |path: &str, text: &str| super::PastDoc {
        path: Arc::from(path),
        texts: vec![(2, text.to_string())],
        content_blob: Some(1),
    };
    let px =
        t.ix.past_index(vec![
            // Indexed (text and path as the live index has them).
            doc("a/users/u/memories/c/n3", "note 3 about widget3"),
            // Never indexed: found by its words only.
            doc("a/users/u/memories/c/old", "an older note about sprockets"),
            doc("a/users/v/memories/c/n3", "note 3 about widget3"),
        ])
        .unwrap();
    assert_eq!(px.len(), 3);
    assert_eq!(
        px.unembedded, 1,
        "only the text never embedded lacks a vector"
    );
    let q = |text: &str, mode: Mode| Query {
        text: text.into(),
        k: 10,
        mode,
        expand: false,
        tenant: None,
    };
    let paths = |scope: &str, query: Query| -> Vec<String> {
        t.ix.past_search(&px, scope, &query)
            .unwrap()
            .into_iter()
            .map(|j| j.hit.path)
            .collect()
    };
    assert_eq!(
        paths("a/users/u", q("widget3", Mode::Hybrid))[0],
        "accounts/a/users/u/memories/c/n3"
    );
    assert_eq!(
        paths("a/users/u", q("sprockets", Mode::Lexical)),
        ["accounts/a/users/u/memories/c/old"]
    );
    // Vector-only finds what has a vector, never the unembedded text.
    assert!(!paths("a", q("sprockets", Mode::Vector))
        .iter()
        .any(|p| p.ends_with("/old")));
    // Scope: the other user's copy only from above.
    assert!(!paths("a/users/u", q("widget3", Mode::Hybrid))
        .iter()
        .any(|p| p.contains("/users/v/")));
    assert!(paths("a", q("widget3", Mode::Lexical))
        .iter()
        .any(|p| p.contains("/users/v/")));
    // Judged as live: the line and the confidence.
    let j = &t
        .ix
        .past_search(&px, "a/users/u", &q("widget3", Mode::Hybrid))
        .unwrap()[0];
    assert_eq!(j.lines, [1]);
    assert_eq!(px.blob_of("a/users/u/memories/c/old"), Some(Some(1)));
}
