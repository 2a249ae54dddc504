//! Reference-model test of the commit semantics, on the core without a mount.
//! Random sequences of writes, unlinks, commits (valid and refused), deletes,
//! moves, clean restarts and crashes are applied to the real core over a real
//! redb file and to a small model; after every step the reader's view (only
//! committed versions) and the writer's view (committed + draft) must match.

use ctxfs::config::Tenancy;
use ctxfs::core::{inodes::ROOT, Caller, Fs};
use ctxfs::error::Error;
use ctxfs::store::{RedbStore, Store};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const WRITER: Caller = Caller {
    uid: 1,
    gid: 1,
    pid: 0,
};
const READER: Caller = Caller {
    uid: 2,
    gid: 2,
    pid: 0,
};
const CAT: &str = "acme/users/u/memories/c";
const FILES: [&str; 3] = ["content.md", ".abstract.md", ".overview.md"];

fn node(i: u8) -> String {
    format!("{CAT}/n{i}")
}

#[derive(Debug, Clone)]
enum Op {
    Write { n: u8, f: u8, v: u8 },
    Unlink { n: u8, f: u8 },
    Commit { n: u8, valid: bool },
    Delete { n: u8 },
    Move { a: u8, b: u8 },
    Restart,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3u8, 0..3u8, 0..4u8).prop_map(|(n, f, v)| Op::Write { n, f, v }),
        1 => (0..3u8, 0..3u8).prop_map(|(n, f)| Op::Unlink { n, f }),
        4 => (0..3u8, proptest::bool::weighted(0.8)).prop_map(|(n, valid)| Op::Commit { n, valid }),
        1 => (0..3u8).prop_map(|n| Op::Delete { n }),
        1 => (0..3u8, 0..3u8).prop_map(|(a, b)| Op::Move { a, b }),
        1 => Just(Op::Restart),
        1 => Just(Op::Crash),
    ]
}

/// A file value in the model; `None` in an overlay is a deletion.
type Files = BTreeMap<String, String>;

#[derive(Debug, Clone, Default)]
struct Model {
    committed: BTreeMap<String, (u32, Files)>,
    /// Summaries the daemon derived in a node's committed version.
    derived: BTreeMap<String, Vec<&'static str>>,
    drafts: BTreeMap<String, BTreeMap<String, Option<String>>>,
    persisted: BTreeMap<String, BTreeMap<String, Option<String>>>,
}

impl Model {
    fn writer_view(&self, n: &str) -> Option<Files> {
        let base = self.committed.get(n).map(|(_, f)| f.clone());
        let draft = self.drafts.get(n);
        if base.is_none() && draft.is_none() {
            return None;
        }
        let mut v = base.unwrap_or_default();
        for (k, val) in draft.into_iter().flatten() {
            match val {
                Some(x) => {
                    v.insert(k.clone(), x.clone());
                }
                None => {
                    v.remove(k);
                }
            }
        }
        Some(v)
    }
}

struct Sut {
    dir: tempfile::TempDir,
    store: Arc<RedbStore>,
    fs: Arc<Fs>,
}

fn tenancy() -> Tenancy {
    Tenancy::parse("[[account]]\nid = \"acme\"\nwriters = [1]\nreaders = [2]\n").unwrap()
}

impl Sut {
    fn new() -> Sut {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("db.redb")).unwrap();
        let fs = Fs::new(store.clone() as Arc<dyn Store>, tenancy()).unwrap();
        Sut { dir, store, fs }
    }

    fn reopen(&mut self, clean: bool) {
        if clean {
            self.fs.persist_all_drafts().unwrap();
        }
        self.store.close();
        // Drop the old core and store (and with them the database file lock).
        let dir = tempfile::tempdir().unwrap();
        let placeholder = RedbStore::open(&dir.path().join("p.redb")).unwrap();
        self.fs = Fs::new(placeholder.clone() as Arc<dyn Store>, tenancy()).unwrap();
        self.store = placeholder;
        let store = RedbStore::open(&self.dir.path().join("db.redb")).unwrap();
        self.fs = Fs::new(store.clone() as Arc<dyn Store>, tenancy()).unwrap();
        self.store = store;
    }

    fn resolve(&self, c: Caller, path: &str) -> Result<u64, Error> {
        let mut ino = ROOT;
        for comp in std::iter::once("accounts").chain(path.split('/')) {
            ino = self.fs.lookup(c, ino, comp)?.ino;
        }
        Ok(ino)
    }

    fn list(&self, c: Caller, path: &str) -> Result<Vec<String>, Error> {
        let ino = self.resolve(c, path)?;
        // As the kernel reads: from offset 0, each batch from the offset the
        // last entry named, until an empty batch.
        let (mut names, mut offset) = (Vec::new(), 0);
        loop {
            let batch = self.fs.readdir(c, ino, offset)?;
            let Some((next, _)) = batch.entries.last() else {
                break;
            };
            offset = *next;
            names.extend(batch.entries.into_iter().map(|(_, e)| e.name));
        }
        names.retain(|n| n != "." && n != "..");
        Ok(names)
    }

    fn read(&self, c: Caller, path: &str) -> Result<String, Error> {
        let ino = self.resolve(c, path)?;
        let o = self.fs.open(c, ino, libc::O_RDONLY)?;
        let data = self.fs.read(o.fh, 0, 1 << 20)?;
        self.fs.release(o.fh);
        Ok(String::from_utf8(data).unwrap())
    }

    /// Write a whole file as `echo v > path` would; returns close's result.
    fn write(&self, c: Caller, n: &str, name: &str, v: &str) -> Result<(), Error> {
        let dir = self.resolve(c, n)?;
        let fh = match self.fs.lookup(c, dir, name) {
            Ok(a) => self.fs.open(c, a.ino, libc::O_WRONLY | libc::O_TRUNC)?.fh,
            Err(Error::NotFound) => {
                self.fs
                    .create(c, dir, name, 0o644, libc::O_WRONLY | libc::O_CREAT)?
                    .1
                    .fh
            }
            Err(e) => return Err(e),
        };
        self.fs.write(fh, 0, v.as_bytes())?;
        let r = self.fs.flush(WRITER, fh);
        self.fs.release(fh);
        r
    }

    /// Node 0 committed with `content` as its content.md.
    fn committed_node(&self, content: &str) -> String {
        let n = node(0);
        self.ensure_dir(&n);
        self.write(WRITER, &n, "content.md", content).unwrap();
        self.write(WRITER, &n, ".meta.json", r#"{"status":"ACTIVE"}"#)
            .unwrap();
        n
    }

    fn ensure_dir(&self, n: &str) {
        let mut path = String::new();
        for comp in n.split('/') {
            let parent = if path.is_empty() {
                self.fs.lookup(WRITER, ROOT, "accounts").unwrap().ino
            } else {
                self.resolve(WRITER, &path).unwrap()
            };
            if self.fs.lookup(WRITER, parent, comp).is_err() {
                self.fs.mkdir(WRITER, parent, comp).unwrap();
            }
            path = if path.is_empty() {
                comp.to_string()
            } else {
                format!("{path}/{comp}")
            };
        }
    }
}

fn apply(sut: &mut Sut, m: &mut Model, op: &Op) {
    match *op {
        Op::Write { n, f, v } => {
            let n = node(n);
            sut.ensure_dir(&n);
            let val = format!("value {v}\n");
            sut.write(WRITER, &n, FILES[f as usize], &val).unwrap();
            if !m.drafts.contains_key(&n) {
                m.drafts.insert(n.clone(), BTreeMap::new());
            }
            m.drafts
                .get_mut(&n)
                .unwrap()
                .insert(FILES[f as usize].into(), Some(val));
        }
        Op::Unlink { n, f } => {
            let n = node(n);
            let name = FILES[f as usize];
            let has = m.writer_view(&n).is_some_and(|v| v.contains_key(name));
            let r = sut
                .resolve(WRITER, &n)
                .and_then(|d| sut.fs.unlink(WRITER, d, name));
            assert_eq!(r.is_ok(), has, "unlink {n}/{name}: {r:?}");
            if has {
                m.drafts.entry(n).or_default().insert(name.into(), None);
            }
        }
        Op::Commit { n, valid } => {
            let n = node(n);
            let Some(view) = m.writer_view(&n) else {
                return;
            };
            let meta = if valid {
                r#"{"status":"ACTIVE"}"#
            } else {
                r#"{"status":"BROKEN"}"#
            };
            let r = sut.write(WRITER, &n, ".meta.json", meta);
            if valid && view.contains_key("content.md") {
                r.unwrap();
                let version = m.committed.get(&n).map(|(v, _)| v + 1).unwrap_or(1);
                // Missing summaries are derived from content.md, and derived
                // ones again when the content changes under them (kept, and
                // still marked, when it does not).
                let mut view = view;
                let draft = m.drafts.get(&n).cloned().unwrap_or_default();
                let content_new = matches!(draft.get("content.md"), Some(Some(_)));
                let before = m.derived.get(&n).cloned().unwrap_or_default();
                let content = view["content.md"].clone();
                let mut derived = Vec::new();
                for (file, label) in [(".abstract.md", "abstract"), (".overview.md", "overview")] {
                    let written = matches!(draft.get(file), Some(Some(_)));
                    // Derived before and the content unchanged: kept as it
                    // is, and still marked derived.
                    if view.get(file).is_some_and(|v| !v.trim().is_empty())
                        && !written
                        && !content_new
                        && before.contains(&label)
                    {
                        derived.push(label);
                        continue;
                    }
                    let needed = match view.get(file) {
                        None => true,
                        Some(v) if v.trim().is_empty() => true,
                        Some(_) => !written && content_new && before.contains(&label),
                    };
                    if needed {
                        let mut t = if label == "abstract" {
                            ctxfs::schema::derive::derive_abstract(&content, 100)
                        } else {
                            ctxfs::schema::derive::derive_overview(&content)
                        };
                        if !t.ends_with('\n') {
                            t.push('\n');
                        }
                        view.insert(file.to_string(), t);
                        derived.push(label);
                    }
                }
                m.derived.insert(n.clone(), derived);
                m.committed.insert(n.clone(), (version, view));
                m.drafts.remove(&n);
                m.persisted.remove(&n);
            } else {
                assert!(
                    matches!(r, Err(Error::BadCommit(_))),
                    "commit of {n} should be refused: {r:?}"
                );
                // The refused .meta.json stays in the draft (not modelled as a file).
                m.drafts.entry(n).or_default();
            }
        }
        Op::Delete { n } => {
            let n = node(n);
            let exists = m.writer_view(&n).is_some();
            let Ok(dir) = sut.resolve(WRITER, &n) else {
                assert!(!exists, "{n} should resolve");
                return;
            };
            for name in sut.list(WRITER, &n).unwrap() {
                sut.fs.unlink(WRITER, dir, &name).unwrap();
            }
            let parent = sut.resolve(WRITER, CAT).unwrap();
            sut.fs
                .rmdir(WRITER, parent, n.rsplit('/').next().unwrap())
                .unwrap();
            m.committed.remove(&n);
            m.derived.remove(&n);
            m.drafts.remove(&n);
            m.persisted.remove(&n);
        }
        Op::Move { a, b } => {
            let (na, nb) = (node(a), node(b));
            let Ok(parent) = sut.resolve(WRITER, CAT) else {
                return;
            };
            let r = sut.fs.rename(
                WRITER,
                parent,
                &format!("n{a}"),
                parent,
                &format!("n{b}"),
                false,
            );
            let src = m.writer_view(&na).is_some();
            let dst = m.writer_view(&nb).is_some();
            if a == b {
                return;
            }
            assert_eq!(r.is_ok(), src && !dst, "move {na} -> {nb}: {r:?}");
            if r.is_ok() {
                if let Some(d) = m.derived.remove(&na) {
                    m.derived.insert(nb.clone(), d);
                }
                if let Some((v, f)) = m.committed.remove(&na) {
                    m.committed.insert(nb.clone(), (v + 1, f));
                }
                if let Some(d) = m.drafts.remove(&na) {
                    m.drafts.insert(nb, d);
                }
                m.persisted.remove(&na);
            }
        }
        Op::Restart => {
            sut.reopen(true);
            m.persisted = m.drafts.clone();
        }
        Op::Crash => {
            sut.reopen(false);
            m.drafts = m.persisted.clone();
        }
    }
}

fn check(sut: &Sut, m: &Model) {
    for i in 0..3 {
        let n = node(i);
        // Reader: exactly the committed version, or nothing.
        match m.committed.get(&n) {
            Some((version, files)) => {
                for (name, val) in files {
                    assert_eq!(
                        &sut.read(READER, &format!("{n}/{name}")).unwrap(),
                        val,
                        "reader {n}/{name}"
                    );
                }
                let mut listed = sut.list(READER, &n).unwrap();
                listed.retain(|x| x != ".meta.json");
                assert_eq!(listed.len(), files.len(), "reader listing of {n}");
                let meta = sut.read(READER, &format!("{n}/.meta.json")).unwrap();
                let v: serde_json::Value = serde_json::from_str(&meta).unwrap();
                assert_eq!(v["version"], *version, "{n} version");
                assert!(sut.list(READER, CAT).unwrap().contains(&format!("n{i}")));
            }
            None => {
                assert_eq!(
                    sut.resolve(READER, &n).err(),
                    Some(Error::NotFound),
                    "reader must not see {n}"
                );
                if let Ok(names) = sut.list(READER, CAT) {
                    assert!(!names.contains(&format!("n{i}")), "reader lists {n}");
                }
            }
        }
        // Writer: committed + draft.
        match m.writer_view(&n) {
            Some(files) => {
                for (name, val) in &files {
                    assert_eq!(
                        &sut.read(WRITER, &format!("{n}/{name}")).unwrap(),
                        val,
                        "writer {n}/{name}"
                    );
                }
                for name in FILES {
                    if !files.contains_key(name) {
                        assert!(
                            sut.read(WRITER, &format!("{n}/{name}")).is_err(),
                            "writer sees deleted {n}/{name}"
                        );
                    }
                }
            }
            None => assert!(sut.resolve(WRITER, &n).is_err(), "writer must not see {n}"),
        }
    }
    // Listings of a category never show draft-only nodes (its derived
    // summaries, files, are listed beside them).
    if let Ok(names) = sut.list(WRITER, CAT) {
        for name in names
            .into_iter()
            .filter(|n| n != ".abstract.md" && n != ".overview.md")
        {
            assert!(
                m.committed.contains_key(&format!("{CAT}/{name}")),
                "listed uncommitted {name}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn commit_semantics_match_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let mut sut = Sut::new();
        let mut m = Model::default();
        for op in &ops {
            apply(&mut sut, &mut m, op);
            check(&sut, &m);
        }
        sut.reopen(true);
        let v = ctxfs::store::fsck(&sut.store).unwrap();
        prop_assert!(v.is_empty(), "fsck: {:?}", v);
    }
}

#[test]
fn regression_update_then_delete_then_recreate() {
    let mut sut = Sut::new();
    let mut m = Model::default();
    for op in [
        Op::Write { n: 0, f: 0, v: 1 },
        Op::Commit { n: 0, valid: true },
        Op::Write { n: 0, f: 1, v: 2 },
        Op::Delete { n: 0 },
        Op::Write { n: 0, f: 0, v: 3 },
        Op::Commit { n: 0, valid: true },
        Op::Crash,
        Op::Move { a: 0, b: 1 },
        Op::Restart,
    ] {
        apply(&mut sut, &mut m, &op);
        check(&sut, &m);
    }
}

/// A file inode the kernel looked up before a commit (a dentry not yet
/// dropped) serves the node's current version, never a mix of two, and
/// `ENOENT` once the node is gone.
#[test]
fn an_inode_from_before_a_commit_serves_the_current_version() {
    let sut = Sut::new();
    let n = node(0);
    sut.ensure_dir(&n);
    let commit = |v: &str| {
        sut.write(WRITER, &n, "content.md", v).unwrap();
        sut.write(WRITER, &n, ".meta.json", r#"{"status":"ACTIVE"}"#)
            .unwrap();
    };
    commit("first\n");
    let old = sut.resolve(READER, &format!("{n}/content.md")).unwrap();
    let o = sut.fs.open(READER, old, libc::O_RDONLY).unwrap();
    assert!(!o.direct_io && o.keep_cache, "a current inode is cached");
    sut.fs.release(o.fh);

    commit("second, longer\n");
    let new = sut.resolve(READER, &format!("{n}/content.md")).unwrap();
    assert_ne!(old, new, "a new version is a new inode");
    let o = sut.fs.open(READER, old, libc::O_RDONLY).unwrap();
    assert!(o.direct_io && !o.keep_cache, "around the stale pages");
    assert_eq!(sut.fs.read(o.fh, 0, 1 << 20).unwrap(), b"second, longer\n");
    sut.fs.release(o.fh);
    assert_eq!(sut.fs.getattr(READER, old, None).unwrap().size, 15);

    let dir = sut.resolve(WRITER, &n).unwrap();
    for name in sut.list(WRITER, &n).unwrap() {
        sut.fs.unlink(WRITER, dir, &name).unwrap();
    }
    let cat = sut.resolve(WRITER, CAT).unwrap();
    sut.fs.rmdir(WRITER, cat, "n0").unwrap();
    assert!(matches!(
        sut.fs.open(READER, old, libc::O_RDONLY),
        Err(Error::NotFound)
    ));
}

/// A writer that opens a committed file for writing shares its inode with
/// the readers (the kernel truncates and resizes it for everyone): the
/// writer's open waits for readers already reading it through the cache,
/// and later readers of that inode bypass the cache.
#[test]
fn a_committed_inode_opened_for_writing_is_not_cached_for_readers() {
    let sut = Sut::new();
    let n = sut.committed_node("first\n");
    let ino = sut.resolve(READER, &format!("{n}/content.md")).unwrap();
    let r = sut.fs.open(READER, ino, libc::O_RDONLY).unwrap();
    assert!(r.keep_cache && !r.direct_io);
    // The reader closes 100 ms later; the writer's open waits for it.
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            sut.fs.release(r.fh);
        });
        let t = std::time::Instant::now();
        let w = sut
            .fs
            .open(WRITER, ino, libc::O_WRONLY | libc::O_TRUNC)
            .unwrap();
        assert!(
            t.elapsed() >= std::time::Duration::from_millis(90),
            "{:?}",
            t.elapsed()
        );
        assert!(w.direct_io);
        // A reader now: the committed bytes, around the kernel's cache.
        let r2 = sut.fs.open(READER, ino, libc::O_RDONLY).unwrap();
        assert!(r2.direct_io && !r2.keep_cache);
        assert_eq!(sut.fs.read(r2.fh, 0, 1 << 20).unwrap(), b"first\n");
        assert!(!sut.fs.getattr(READER, ino, None).unwrap().shared);
        sut.fs.release(r2.fh);
        sut.fs.release(w.fh);
    });
}

/// A committed file's entry may be cached for everyone until a draft takes
/// its name over; from then on neither the reader's nor the writer's answer
/// is cached, and a name the draft does not touch stays cached.
#[test]
fn a_name_a_draft_takes_over_is_not_cached() {
    let sut = Sut::new();
    let n = sut.committed_node("first\n");
    let shared = |c: Caller, name: &str| {
        let dir = sut.resolve(c, &n).unwrap();
        sut.fs.lookup(c, dir, name).unwrap().shared
    };
    assert!(shared(READER, "content.md") && shared(WRITER, "content.md"));
    sut.write(WRITER, &n, "content.md", "second\n").unwrap();
    assert!(!shared(READER, "content.md"));
    assert!(!shared(WRITER, "content.md"));
    assert!(shared(READER, ".abstract.md"));
    sut.write(WRITER, &n, ".meta.json", r#"{"status":"ACTIVE"}"#)
        .unwrap();
    assert!(shared(READER, "content.md") && shared(WRITER, "content.md"));
}
