//! The stored invariants (numbered as in `docs/SEMANTICS.md`, "Stored
//! invariants") and one checker for them, used by `ctxfs fsck` and the tests.

use super::redb::{
    decode, split_key, BLOBS, COUNTERS, DIRS, DLQ, DLQ_BY_NODE, DRAFTS, EXPIRY, HIGH_WATER, NODES,
    OUTBOX, OUTBOX_BY_NODE, SCRATCH, VERSIONS,
};
use super::{DraftRec, Status};
use crate::error::{Error, Result};
use crate::schema::place::{self, DirPlace};
use ::redb::{ReadTransaction, ReadableDatabase, ReadableTable};
use std::collections::{BTreeMap, HashMap, HashSet};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: u8,
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "I{}: {}", self.invariant, self.what)
    }
}

fn se<E: std::error::Error + Send + Sync + 'static>(e: E) -> Error {
    Error::store_from("redb", e)
}

/// What `fsck` found in a data dir's store: the violations (invariant 0
/// is the files themselves: readable, and a log that is not damaged) and
/// notes that are no fault (a torn tail, records the next mount applies).
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub notes: Vec<String>,
}

/// The message of a panic, for the report.
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

/// `f`, with a panic (redb meeting a corrupt page) turned into an error
/// and kept off stderr.
pub(super) fn guarded<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(panic_text);
    std::panic::set_hook(hook);
    r
}

/// Check the embedded store at `db_path` and its write-ahead log without
/// changing a byte of either: the store is checked on a copy made beside
/// it (page checksums, every row of every table, the invariants), then
/// the copy is removed.
pub fn fsck_file(db_path: &std::path::Path) -> Result<Report> {
    let mut r = Report::default();
    let salvage = format!(
        "salvage what can be read into a new data dir with: ctxfs salvage --data {} --out NEW_DIR",
        db_path
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .display()
    );
    let sc = super::wal::read(&db_path.with_extension("wal"))?;
    if !sc.after_damage.is_empty() {
        r.violations.push(Violation {
            invariant: 0,
            what: format!(
                "the write-ahead log is damaged at byte {} of {}: {} intact record(s) follow \
                 the damage (acknowledged commits the store may not hold); {salvage}",
                sc.valid,
                sc.total,
                sc.after_damage.len()
            ),
        });
    } else if sc.valid < sc.total {
        r.notes.push(format!(
            "the write-ahead log has a torn tail of {} byte(s) after its last intact record \
             (a crash mid-append; never acknowledged): the next mount cuts it",
            sc.total - sc.valid
        ));
    }
    // The store is checked on a copy beside it: redb verifies its page
    // checksums only in `check_integrity`, which needs a writable database
    // and repairs what it can, and a store not closed cleanly opens only by
    // being repaired. The original is never opened for writing.
    let unclean = matches!(
        guarded(|| {
            ::redb::Builder::new()
                .set_cache_size(super::redb::CACHE_BYTES)
                .open_read_only(db_path)
                .map(drop)
        }),
        Ok(Err(::redb::DatabaseError::RepairAborted))
    );
    if unclean {
        r.notes.push(
            "the store was not closed cleanly (a killed daemon): the next mount repairs it \
             (this check repaired a copy)"
                .into(),
        );
    }
    // Beside the store; where its disk has no room, in a private
    // directory (0700) of the system's temporary directory.
    let mut copy = db_path.with_extension("redb.fsck");
    let mut scratch = None;
    let _ = std::fs::remove_file(&copy);
    if let Err(e) = std::fs::copy(db_path, &copy) {
        let _ = std::fs::remove_file(&copy);
        let dir = tempfile::Builder::new()
            .prefix("ctxfs-fsck-")
            .tempdir()
            .map_err(|e2| {
                Error::store_from(format!("no room for a copy of the store ({e})"), e2)
            })?;
        copy = dir.path().join("ctxfs.redb");
        std::fs::copy(db_path, &copy).map_err(|e| {
            Error::store_from(
                format!(
                    "copying the store to {} for its check (fsck needs room for a copy)",
                    copy.display()
                ),
                e,
            )
        })?;
        r.notes.push(format!(
            "no room beside the store for its copy ({e}): checked a copy in {}",
            dir.path().display()
        ));
        scratch = Some(dir);
    }
    let checked = guarded(|| -> Result<Vec<Violation>> {
        let mut db = ::redb::Builder::new()
            .set_cache_size(super::redb::CACHE_BYTES)
            .create(&copy)
            .map_err(se)?;
        if !db.check_integrity().map_err(se)? {
            return Err(Error::store(
                "page checksums do not verify: pages of the file were changed outside redb",
            ));
        }
        check_all(&db)
    });
    let _ = std::fs::remove_file(&copy);
    drop(scratch);
    match checked {
        Ok(Ok(v)) => r.violations.extend(v),
        Ok(Err(e)) => r.violations.push(Violation {
            invariant: 0,
            what: format!("the store cannot be read: {}; {salvage}", e.report()),
        }),
        Err(p) => r.violations.push(Violation {
            invariant: 0,
            what: format!("the store file is corrupt (reading it failed: {p}); {salvage}"),
        }),
    }
    let intact = sc.records.len() + sc.after_damage.len();
    if intact > 0 && r.violations.is_empty() {
        r.notes.push(format!(
            "{intact} write-ahead log record(s) since the last checkpoint: the next mount \
             applies those the store does not hold"
        ));
    }
    Ok(r)
}

/// Every row of every table read (a corrupt page anywhere is found), then
/// the invariants checked.
fn check_all(db: &impl ReadableDatabase) -> Result<Vec<Violation>> {
    let txn = db.begin_read().map_err(se)?;
    let mut unreadable = Vec::new();
    for table in super::redb::TABLES {
        match guarded(|| super::redb::read_table(&txn, table)) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => unreadable.push(format!("table {table}: {}", e.report())),
            Err(p) => unreadable.push(format!("table {table}: corrupt ({p})")),
        }
    }
    drop(txn);
    if !unreadable.is_empty() {
        return Err(Error::store(unreadable.join("; ")));
    }
    check_db(db)
}

/// Check the stored invariants of an open store (the model tests).
pub fn fsck(store: &super::RedbStore) -> Result<Vec<Violation>> {
    check_db(&*store.db()?)
}

/// Check the stored invariants of an open database.
/// One of the two event queues, as the check of I9 reads it.
struct Queue {
    rows: ::redb::TableDefinition<'static, u64, &'static [u8]>,
    by_node: ::redb::TableDefinition<'static, (&'static str, u64), ()>,
    /// How a violation names the index table and a row.
    index: &'static str,
    row: &'static str,
    /// A row must name its event type too.
    typed: bool,
    /// The counter of an account's rows.
    count: fn(&str) -> String,
}

const PENDING: Queue = Queue {
    rows: OUTBOX,
    by_node: OUTBOX_BY_NODE,
    index: "outbox_by_node",
    row: "event",
    typed: true,
    count: crate::schema::counters::outbox_key,
};

const DEAD: Queue = Queue {
    rows: DLQ,
    by_node: DLQ_BY_NODE,
    index: "dlq_by_node",
    row: "dead letter",
    typed: false,
    count: crate::schema::counters::dlq_key,
};

/// One check of a store: the violations found, and what one invariant's
/// check learns that another's needs (blob sizes, containers, node ids and
/// paths, the highest ids in use, the counters recounted).
#[derive(Default)]
struct Fsck {
    v: Vec<Violation>,
    /// An encrypted store (a keyring): blobs hold their text sealed, which
    /// adds `seal::OVERHEAD` bytes; the text itself is not checked here.
    sealed: bool,
    overhead: u64,
    /// Blob sizes, by id.
    blob_size: HashMap<u64, u64>,
    /// Containers: (parent, name).
    dir_set: HashSet<(String, String)>,
    account_of_id: HashMap<u64, String>,
    node_paths: HashSet<String>,
    max_node: u64,
    max_blob: u64,
    max_event: u64,
    /// The counters as the stored state says they must be.
    recount: BTreeMap<String, i64>,
}

/// Check the stored invariants of an open database, one group at a time.
pub fn check_db(db: &impl ReadableDatabase) -> Result<Vec<Violation>> {
    let txn = db.begin_read().map_err(se)?;
    let mut f = Fsck::open(&txn)?;
    f.nodes(&txn)?;
    f.versions(&txn)?;
    f.containers();
    f.outbox(&txn)?;
    f.dead_letters(&txn)?;
    f.scratch(&txn)?;
    f.counters(&txn)?;
    f.expiry(&txn)?;
    f.drafts(&txn)?;
    f.high_water(&txn)?;
    Ok(f.v)
}

impl Fsck {
    /// The store's shape before any check: sealed or not, blob sizes, containers.
    fn open(txn: &ReadTransaction) -> Result<Fsck> {
        let mut f = Fsck {
            sealed: txn
                .open_table(SCRATCH)
                .map_err(se)?
                .get((super::seal::KEYRING, "master"))
                .map_err(se)?
                .is_some(),
            ..Default::default()
        };
        if f.sealed {
            f.overhead = super::seal::OVERHEAD as u64;
        }
        for item in txn.open_table(BLOBS).map_err(se)?.iter().map_err(se)? {
            let (k, val) = item.map_err(se)?;
            *f.blob_size.entry(k.value().0).or_default() += val.value().len() as u64;
        }
        f.dir_set = txn
            .open_table(DIRS)
            .map_err(se)?
            .iter()
            .map_err(se)?
            .map(|r| {
                r.map(|(k, _)| (k.value().0.to_string(), k.value().1.to_string()))
                    .map_err(se)
            })
            .collect::<Result<_>>()?;
        Ok(f)
    }

    fn bad(&mut self, invariant: u8, what: String) {
        self.v.push(Violation { invariant, what });
    }

    /// I1–I4, I7: each node at a node place with its path, its current version stored, a unique id, its files and `.meta.json`, its containers.
    fn nodes(&mut self, txn: &ReadTransaction) -> Result<()> {
        let nodes = txn.open_table(NODES).map_err(se)?;
        let versions = txn.open_table(VERSIONS).map_err(se)?;
        let blobs = txn.open_table(BLOBS).map_err(se)?;
        let mut ids = HashSet::new();
        for item in nodes.iter().map_err(se)? {
            let (k, val) = item.map_err(se)?;
            let (parent, name) = k.value();
            let path = if parent.is_empty() {
                name.to_string()
            } else {
                format!("{parent}/{name}")
            };
            let rec = match decode(val.value()) {
                Ok(r) => r,
                Err(e) => {
                    self.bad(1, format!("{path}: {e}"));
                    continue;
                }
            };
            let comps = place::split(&path);
            if place::classify_dir(&comps) != Ok(DirPlace::Node) {
                self.bad(1, format!("{path}: not a node place"));
                continue;
            }
            if rec.path != path {
                self.bad(1, format!("{path}: record says path {}", rec.path));
            }
            if rec.version == 0 {
                self.bad(2, format!("{path}: version 0"));
            }
            match versions.get((rec.id, rec.version)).map_err(se)? {
                Some(g) => match decode(g.value()) {
                    Ok(vr) if vr == rec => {}
                    _ => self.bad(
                        2,
                        format!("{path}: version {} differs from current", rec.version),
                    ),
                },
                None => self.bad(2, format!("{path}: version {} missing", rec.version)),
            }
            if !ids.insert(rec.id) {
                self.bad(3, format!("{path}: node id {} used twice", rec.id));
            }
            self.max_node = self.max_node.max(rec.id);
            if rec.status != Status::Broken {
                for f in [place::CONTENT, place::META] {
                    if rec.file(f).is_none() {
                        self.bad(
                            4,
                            format!("{path}: {} node without {f}", rec.status.as_str()),
                        );
                    }
                }
            }
            if let Some(m) = rec.file(place::META) {
                if let Some(bytes) = read_blob(&blobs, m.blob).ok().filter(|_| !self.sealed) {
                    match serde_json::from_slice::<serde_json::Value>(&bytes) {
                        Ok(serde_json::Value::Object(o)) => {
                            let want = [
                                ("status", serde_json::json!(rec.status.as_str())),
                                ("uri", serde_json::json!(place::uri_of(&path))),
                                ("version", serde_json::json!(rec.version)),
                            ];
                            for (key, w) in want {
                                if o.get(key) != Some(&w) {
                                    self.bad(4, format!("{path}: .meta.json {key} is not {w}"));
                                }
                            }
                        }
                        _ => self.bad(4, format!("{path}: .meta.json is not a JSON object")),
                    }
                }
            }
            for (parent, name) in place::ancestor_containers(&comps) {
                if !self.dir_set.contains(&(parent.clone(), name.clone())) {
                    self.bad(7, format!("{path}: container {parent}/{name} missing"));
                }
            }
            *self
                .recount
                .entry(crate::schema::counters::nodes_key(comps[0], rec.status))
                .or_default() += 1;
            self.account_of_id.insert(rec.id, comps[0].to_string());
            self.node_paths.insert(path.clone());
        }
        Ok(())
    }

    /// I2, I5, I6: every version decodes, its blobs hold the sizes it records, every blob is referenced.
    fn versions(&mut self, txn: &ReadTransaction) -> Result<()> {
        let versions = txn.open_table(VERSIONS).map_err(se)?;
        // Versions and the blobs they reference.
        let mut referenced = HashSet::new();
        for item in versions.iter().map_err(se)? {
            let (k, val) = item.map_err(se)?;
            let (id, ver) = k.value();
            let Ok(rec) = decode(val.value()) else {
                self.bad(2, format!("version ({id}, {ver}) does not decode"));
                continue;
            };
            for f in &rec.files {
                if !referenced.contains(&f.blob) {
                    if let Some(a) = self.account_of_id.get(&id) {
                        *self
                            .recount
                            .entry(crate::schema::counters::bytes_key(a))
                            .or_default() += f.size as i64;
                    }
                }
                referenced.insert(f.blob);
                self.max_blob = self.max_blob.max(f.blob);
                match self.blob_size.get(&f.blob) {
                    Some(s) if *s == f.size + self.overhead => {}
                    Some(s) => self.bad(
                        5,
                        format!(
                            "{} v{ver} {}: blob has {s} bytes, record {}",
                            rec.path, f.name, f.size
                        ),
                    ),
                    None => self.bad(
                        5,
                        format!("{} v{ver} {}: blob {} missing", rec.path, f.name, f.blob),
                    ),
                }
            }
        }
        let mut unreferenced: Vec<u64> = self
            .blob_size
            .keys()
            .filter(|id| !referenced.contains(*id))
            .copied()
            .collect();
        unreferenced.sort_unstable();
        for id in unreferenced {
            self.bad(6, format!("blob {id} is referenced by no version"));
        }
        Ok(())
    }

    /// I7: every container is at a container place.
    fn containers(&mut self) {
        // The last check to need them.
        let dirs = std::mem::take(&mut self.dir_set);
        for (parent, name) in &dirs {
            let path = if parent.is_empty() {
                name.clone()
            } else {
                format!("{parent}/{name}")
            };
            match place::classify_dir(&place::split(&path)) {
                Ok(DirPlace::Account | DirPlace::Container) => {}
                _ => self.bad(
                    7,
                    format!("dirs holds {path}, which is not a container place"),
                ),
            }
        }
    }

    /// I9: the outbox indexed by node both ways, its events valid.
    fn outbox(&mut self, txn: &ReadTransaction) -> Result<()> {
        self.queue(txn, &PENDING, None)
    }

    /// I9: the dead letters indexed by node both ways, valid, never also pending.
    fn dead_letters(&mut self, txn: &ReadTransaction) -> Result<()> {
        let outbox = txn.open_table(OUTBOX).map_err(se)?;
        self.queue(txn, &DEAD, Some(&outbox))
    }

    /// A queue's rows and its by-node index agree both ways, each row is an
    /// event (with `pending`: none is in that queue too), and its rows are
    /// counted per account.
    fn queue(
        &mut self,
        txn: &ReadTransaction,
        q: &Queue,
        pending: Option<&::redb::ReadOnlyTable<u64, &[u8]>>,
    ) -> Result<()> {
        let rows = txn.open_table(q.rows).map_err(se)?;
        let by_node = txn.open_table(q.by_node).map_err(se)?;
        let mut indexed = HashSet::new();
        for item in by_node.iter().map_err(se)? {
            let (k, _) = item.map_err(se)?;
            let (node, seq) = k.value();
            indexed.insert(seq);
            if rows.get(seq).map_err(se)?.is_none() {
                self.bad(9, format!("{} ({node}, {seq}) has no {}", q.index, q.row));
            }
        }
        for item in rows.iter().map_err(se)? {
            let (k, val) = item.map_err(se)?;
            let seq = k.value();
            self.max_event = self.max_event.max(seq);
            if !indexed.contains(&seq) {
                self.bad(9, format!("{} {seq} is not indexed by node", q.row));
            }
            if let Some(p) = pending {
                if p.get(seq).map_err(se)?.is_some() {
                    self.bad(9, format!("event {seq} is both pending and dead"));
                }
            }
            match serde_json::from_slice::<serde_json::Value>(val.value()) {
                Ok(e) if e["event_id"].is_string() && (!q.typed || e["event_type"].is_string()) => {
                    let account = e["uri"]
                        .as_str()
                        .and_then(place::node_of_uri)
                        .map(place::account_of)
                        .unwrap_or("");
                    *self.recount.entry((q.count)(account)).or_default() += 1;
                }
                _ => self.bad(9, format!("{} {seq} is not a valid event", q.row)),
            }
        }
        Ok(())
    }

    /// The conversations in inboxes and the audit trails, recounted for I8.
    fn scratch(&mut self, txn: &ReadTransaction) -> Result<()> {
        // The conversations stored in inboxes (`{a}/users/{u}/inbox/NAME.json`
        // or `.jsonl`): their bytes count in the account's quota.
        let scratch = txn.open_table(SCRATCH).map_err(se)?;
        for item in scratch.iter().map_err(se)? {
            let (k, val) = item.map_err(se)?;
            let (parent, name) = k.value();
            let c = place::split(parent);
            let conversation = c.len() == 4
                && c[1] == "users"
                && c[3] == crate::schema::names::INBOX
                && (name.ends_with(".json") || name.ends_with(".jsonl"));
            // An account's audit trail: its line count, per share (and of the
            // lines written before shares).
            if c.len() == 3 && c[1] == ".ctxfs" && c[2] == "audit" {
                *self
                    .recount
                    .entry(crate::schema::counters::audit_key(c[0]))
                    .or_default() += 1;
            }
            if c.len() == 4 && c[1] == ".ctxfs" && c[2] == "audit" {
                *self
                    .recount
                    .entry(crate::schema::counters::audit_share_key(c[0], c[3]))
                    .or_default() += 1;
            }
            if conversation {
                if let Ok(r) = super::ScratchRec::decode(val.value()) {
                    let n = if self.sealed {
                        super::seal::plain_len(&r.data).unwrap_or(0)
                    } else {
                        r.data.len()
                    };
                    *self
                        .recount
                        .entry(crate::schema::counters::inbox_bytes_key(c[0]))
                        .or_default() += n as i64;
                }
            }
        }
        Ok(())
    }

    /// I8: every stored counter is its recount.
    fn counters(&mut self, txn: &ReadTransaction) -> Result<()> {
        let counters = txn.open_table(COUNTERS).map_err(se)?;
        // Counters.
        let mut stored: BTreeMap<String, i64> = BTreeMap::new();
        for item in counters.iter().map_err(se)? {
            let (k, val) = item.map_err(se)?;
            stored.insert(k.value().to_string(), val.value());
        }
        // Usage of the day (writes, embedding tokens) is a history, not a
        // function of the stored state: not recounted.
        stored.retain(|k, _| !crate::schema::counters::is_daily(k));
        self.recount.retain(|_, n| *n != 0);
        let recount = std::mem::take(&mut self.recount);
        for (k, n) in &recount {
            if stored.get(k) != Some(n) {
                self.bad(
                    8,
                    format!("counter {k} is {:?}, recount {n}", stored.get(k)),
                );
            }
        }
        for (k, n) in &stored {
            if !recount.contains_key(k) {
                self.bad(8, format!("counter {k} is {n}, recount 0"));
            }
        }
        Ok(())
    }

    /// I12: every expiry names a current node.
    fn expiry(&mut self, txn: &ReadTransaction) -> Result<()> {
        let expiry = txn.open_table(EXPIRY).map_err(se)?;
        for item in expiry.iter().map_err(se)? {
            let (k, _) = item.map_err(se)?;
            if !self.node_paths.contains(k.value()) {
                self.bad(12, format!("expiry of {} names no current node", k.value()));
            }
        }
        Ok(())
    }

    /// I10: every draft decodes and sits at a node place.
    fn drafts(&mut self, txn: &ReadTransaction) -> Result<()> {
        let drafts = txn.open_table(DRAFTS).map_err(se)?;
        for item in drafts.iter().map_err(se)? {
            let (k, val) = item.map_err(se)?;
            let path = k.value();
            let undecodable = if self.sealed {
                !super::seal::is_sealed(val.value())
            } else {
                DraftRec::decode(val.value()).is_err()
            };
            if undecodable {
                self.bad(10, format!("draft {path} does not decode"));
            }
            if place::classify_dir(&place::split(path)) != Ok(DirPlace::Node) {
                self.bad(10, format!("draft {path} is not at a node place"));
            }
            let _ = split_key(path);
        }
        Ok(())
    }

    /// I11: no id in use is above its high-water mark.
    fn high_water(&mut self, txn: &ReadTransaction) -> Result<()> {
        let hw = txn.open_table(HIGH_WATER).map_err(se)?;
        for (key, max) in [
            ("node", self.max_node),
            ("blob", self.max_blob),
            ("event", self.max_event),
        ] {
            let h = hw.get(key).map_err(se)?.map(|g| g.value()).unwrap_or(0);
            if h < max {
                self.bad(11, format!("high-water {key} is {h}, but {max} is in use"));
            }
        }
        Ok(())
    }
}

fn read_blob(t: &::redb::ReadOnlyTable<(u64, u32), &[u8]>, id: u64) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for item in t.range((id, 0)..=(id, u32::MAX)).map_err(se)? {
        out.extend_from_slice(item.map_err(se)?.1.value());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NodeRec, Op, Store};
    use std::sync::Arc;

    fn node(id: u64, path: &str) -> NodeRec {
        NodeRec {
            id,
            path: path.into(),
            status: Status::Active,
            version: 1,
            created_at: String::new(),
            updated_at: String::new(),
            updated_ns: 0,
            files: Vec::new(),
        }
    }

    /// Each row breaks a fresh store one way; the check must name the
    /// invariants it breaks (and a store nothing broke, none).
    #[test]
    fn each_invariant_is_found_broken_as_a_table() {
        let n = "a/users/u/memories/c/n";
        let rows: Vec<(&str, Vec<Op>, &[u8])> = vec![
            ("nothing broken", vec![], &[]),
            (
                "a blob no version references",
                vec![Op::PutBlob {
                    id: 5,
                    data: Arc::from(&b"x"[..]),
                }],
                &[6],
            ),
            (
                "a node with no version, no files, no containers, no count",
                vec![Op::PutNode {
                    path: n.into(),
                    rec: node(7, n),
                }],
                &[2, 4, 7, 8, 11],
            ),
            (
                "a version whose blob is missing",
                vec![Op::PutVersion {
                    rec: NodeRec {
                        files: vec![crate::store::FileRec {
                            name: "content.md".into(),
                            blob: 9,
                            size: 3,
                            mode: 0o644,
                            mtime_ns: 0,
                        }],
                        ..node(8, n)
                    },
                }],
                &[5, 11],
            ),
            (
                "a counter nothing stored explains",
                vec![Op::Count {
                    key: crate::schema::counters::nodes_key("a", Status::Active),
                    delta: 1,
                }],
                &[8],
            ),
            (
                "a container at no container place",
                vec![Op::PutDir {
                    path: "a/users/u/memories/c/n/x".into(),
                }],
                &[7],
            ),
            (
                "an outbox event that is no event",
                vec![Op::PutEvent {
                    seq: 3,
                    node_path: n.into(),
                    account: "a".into(),
                    json: b"{}".to_vec(),
                }],
                // Counted for `a`, which the event does not name; above
                // the events' high-water mark.
                &[8, 9, 11],
            ),
            (
                "a draft that does not decode, at no node place",
                vec![Op::PutDraft {
                    path: "a/users".into(),
                    data: b"?".to_vec(),
                }],
                &[10],
            ),
            (
                "an expiry of no node",
                vec![Op::PutExpiry {
                    path: n.into(),
                    at_ns: 1,
                }],
                &[12],
            ),
        ];
        for (what, ops, want) in rows {
            let dir = tempfile::tempdir().unwrap();
            let store = super::super::RedbStore::open(&dir.path().join("s.redb")).unwrap();
            if !ops.is_empty() {
                store.apply(ops, true).unwrap();
            }
            let found = fsck(&store).unwrap();
            let mut got: Vec<u8> = found.iter().map(|v| v.invariant).collect();
            got.dedup();
            got.sort_unstable();
            got.dedup();
            assert_eq!(got, want, "{what}: {found:?}");
        }
    }
}
