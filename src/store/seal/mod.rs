//! Encryption at rest (`[encryption]` in the config): a [`Store`] that
//! seals what another store keeps, so the redb file, its write-ahead log, a
//! PostgreSQL database and every backup of them hold ciphertext only.
//!
//! Keys: every scope (an account, one of its users, one of its agents) has
//! data keys of its own (XChaCha20-Poly1305, 256-bit, random), stored in the
//! store wrapped by the operator's master key (`key_file` or `key_command`).
//! A value is sealed with the key of the scope its path belongs to; its
//! header names the key, so a reader needs no path. Deleting a scope's
//! directory deletes its key rows in the same transaction: what was sealed
//! with them can never be opened again (crypto-shredding). Copies of a key
//! row that outlive the delete (free pages, PostgreSQL's WAL, a backup) are
//! wrapped by the master key: `ctxfs rekey` re-wraps the live keys under a
//! new master key, and destroying the old one makes those copies useless.
//!
//! What is sealed: node blobs (every version), index documents and
//! vectors, drafts, scratchpad files and activity-log appends, stored
//! conversations, and the payload of every outbox event that carries text.
//! What is not: paths and names, node records (sizes, times, statuses),
//! counters, and the payloads of events that carry no text (deletes,
//! moves). The key rows live under the reserved name `.keyring` of the
//! store's small-entries table, which no account can take (names never
//! start with a dot).
//!
//! Here: the sealing `Store` and what it does to each op and read. In
//! `keys.rs`: the master key, the data keys, the seal format, the keyring.

mod keys;

pub use self::keys::{master_of, KeySource, MasterKey, KEYRING, OVERHEAD};

use self::keys::{from_hex, hex, key_id_of, Keyring, Kind};
use super::{NodeRec, Op, RemoteChange, ScratchRec, Store, StoredEvent};
use crate::error::{Error, Result};
use crate::locks::lock;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// The scope a store path belongs to: `A/users/U`, `A/agents/G`, else the account `A`.
pub fn scope_of(path: &str) -> &str {
    let mut it = path.splitn(4, '/');
    let a = it.next().unwrap_or("");
    match (it.next(), it.next()) {
        (Some(kind @ ("users" | "agents")), Some(name)) if !name.is_empty() => {
            &path[..a.len() + 1 + kind.len() + 1 + name.len()]
        }
        _ => a,
    }
}

/// Is `path` a scope itself (an account, a user, an agent)?
fn is_scope(path: &str) -> bool {
    !path.is_empty() && scope_of(path) == path
}

/// Does `store` hold any text (a node, a draft, an index document)?
fn holds_text(store: &dyn Store) -> Result<bool> {
    let mut any = false;
    let r = store.scan_nodes(&mut |_| {
        any = true;
        Err(Error::store("found"))
    });
    if any {
        return Ok(true);
    }
    r?;
    if !store.drafts()?.is_empty() {
        return Ok(true);
    }
    let mut ix = false;
    let r = store.scan_ix("", &mut |_, _| {
        ix = true;
        Err(Error::store("found"))
    });
    if ix {
        return Ok(true);
    }
    r?;
    Ok(false)
}

/// A store whose every text is sealed: see the module documentation.
pub struct Sealed {
    inner: Arc<dyn Store>,
    ring: Arc<Keyring>,
    /// Opened outbox events by (sequence, hash of the stored bytes);
    /// emptied whenever a key is destroyed (an event of a forgotten scope
    /// must read as its delete from then on).
    opened: Arc<Mutex<OpenedEvents>>,
}

/// Opened events by (sequence, hash of the stored bytes).
type OpenedEvents = HashMap<(u64, u64), Vec<u8>>;

/// Opened events kept at most (a few MB).
const OPENED_EVENTS: usize = 4096;

/// What opening a sealed value gave.
enum Opened {
    Plain(Vec<u8>),
    /// Its key was destroyed: the value is forgotten.
    Gone,
}

impl Sealed {
    /// `inner` sealed with data keys wrapped by `master`. A store without a
    /// keyring gets one if it holds no text yet; one that holds text
    /// written in the clear is refused (no store is encrypted in place).
    pub fn open(inner: Arc<dyn Store>, master: MasterKey) -> Result<Arc<Sealed>> {
        if !keys::check_master(&*inner, &master)? {
            if holds_text(&*inner)? {
                return Err(Error::store(
                    "this store holds text written without encryption, and ctxfs does not \
                     encrypt a store in place: `ctxfs export` it, then `ctxfs import` the \
                     tree into a new data dir mounted with the master key",
                ));
            }
            keys::write_master_row(&*inner, &master, vec![])?;
        }
        let ring = Arc::new(Keyring::new(master));
        ring.load(&*inner)?;
        Ok(Arc::new(Sealed {
            inner,
            ring,
            opened: Arc::new(Mutex::new(HashMap::new())),
        }))
    }

    /// Re-wrap every data key under `new` in one transaction; no sealed
    /// value is rewritten. The number of keys re-wrapped.
    pub fn rekey(&self, new: &MasterKey) -> Result<usize> {
        self.ring.rewrap(&*self.inner, new)
    }

    /// How many data keys the store holds.
    pub fn key_count(&self) -> usize {
        self.ring.count()
    }

    fn seal(&self, scope: &str, kind: Kind, plain: &[u8]) -> Result<Vec<u8>> {
        self.ring.key_for(&*self.inner, scope)?.seal(kind, plain)
    }

    fn unseal(&self, kind: Kind, sealed: &[u8]) -> Result<Opened> {
        let Some(id) = key_id_of(sealed) else {
            return Err(Error::store(
                "a value of an encrypted store is not sealed (written without the key?)",
            ));
        };
        Ok(match self.ring.lookup(&*self.inner, id)? {
            Some(key) => Opened::Plain(key.open(kind, sealed)?),
            None => Opened::Gone,
        })
    }

    fn open_opt(&self, kind: Kind, sealed: Option<Vec<u8>>) -> Result<Option<Vec<u8>>> {
        match sealed {
            None => Ok(None),
            Some(b) => Ok(match self.unseal(kind, &b)? {
                Opened::Plain(p) => Some(p),
                Opened::Gone => None,
            }),
        }
    }

    /// The text of blob `id` of `account` from its sealed bytes.
    fn open_blob(&self, account: &str, id: u64, sealed: &[u8]) -> Result<Vec<u8>> {
        match self.unseal(Kind::Blob, sealed)? {
            Opened::Plain(p) => Ok(p),
            Opened::Gone => Err(Error::store(format!(
                "blob {id} of {account} was sealed with a key since destroyed (its user or \
                 account was deleted)"
            ))),
        }
    }

    /// A small entry sealed: a scratchpad file or log (a `ScratchRec`, whose
    /// data becomes one sealed frame, so that appends can add frames) or
    /// any other value (an inbox job, a content hash's name), sealed whole.
    /// Both read back as written: a record is taken as one only when it
    /// encodes back to the same bytes, and a value sealed whole starts with
    /// the seal's magic, which no record does (its first byte is a bool).
    fn seal_scratch(&self, path: &str, bytes: &[u8]) -> Result<Vec<u8>> {
        let scope = scope_of(path);
        match ScratchRec::decode(bytes) {
            Ok(mut rec) if rec.encode().ok().as_deref() == Some(bytes) => {
                if !rec.data.is_empty() {
                    rec.data = frame(&self.seal(scope, Kind::Scratch, &rec.data)?);
                }
                rec.encode()
            }
            _ => self.seal(scope, Kind::Scratch, bytes),
        }
    }

    fn open_scratch(&self, path: &str, bytes: Vec<u8>) -> Result<Option<Vec<u8>>> {
        if path.starts_with(KEYRING) || path == super::MODEL_MARK {
            return Ok(Some(bytes));
        }
        if is_sealed(&bytes) {
            return Ok(match self.unseal(Kind::Scratch, &bytes)? {
                Opened::Plain(p) => Some(p),
                Opened::Gone => None,
            });
        }
        let mut rec = ScratchRec::decode(&bytes)?;
        let mut plain = Vec::new();
        for f in frames(&rec.data)? {
            match self.unseal(Kind::Scratch, f)? {
                Opened::Plain(p) => plain.extend_from_slice(&p),
                Opened::Gone => return Ok(None),
            }
        }
        rec.data = plain;
        Ok(Some(rec.encode()?))
    }

    /// An event's JSON with the payload sealed when it carries text.
    fn seal_event(&self, json: &[u8]) -> Result<Vec<u8>> {
        let mut v: Value =
            serde_json::from_slice(json).map_err(|e| Error::store_from("event not JSON", e))?;
        let carries_text = matches!(
            v.get("event_type").and_then(Value::as_str),
            Some("UPSERT_CONTEXT" | "UPSERT_MESSAGE" | "UPSERT_RELATION")
        );
        if !carries_text {
            return Ok(json.to_vec());
        }
        let node = v
            .get("uri")
            .and_then(Value::as_str)
            .and_then(crate::schema::place::node_of_uri)
            .unwrap_or("")
            .to_string();
        let payload = v.get("payload").cloned().unwrap_or(Value::Null);
        let p = serde_json::to_vec(&payload).map_err(|e| Error::store_from("encoding", e))?;
        v["payload"] = json!({ "sealed": hex(&self.seal(scope_of(&node), Kind::Event, &p)?) });
        serde_json::to_vec(&v).map_err(|e| Error::store_from("encoding", e))
    }

    /// An event as written; one whose key was destroyed (its node's user or
    /// account was deleted) reads as that node's delete, so the index
    /// forgets it.
    fn open_event(&self, mut ev: StoredEvent) -> Result<StoredEvent> {
        let Ok(mut v) = serde_json::from_slice::<Value>(&ev.json) else {
            return Ok(ev);
        };
        let Some(s) = v
            .get("payload")
            .and_then(|p| p.get("sealed"))
            .and_then(Value::as_str)
        else {
            return Ok(ev);
        };
        let bytes = from_hex(s).ok_or_else(|| Error::store("corrupt sealed event"))?;
        match self.unseal(Kind::Event, &bytes)? {
            Opened::Plain(p) => {
                v["payload"] = serde_json::from_slice(&p)
                    .map_err(|e| Error::store_from("corrupt sealed event", e))?;
            }
            Opened::Gone => {
                v["event_type"] = json!("DELETE_CONTEXT");
                v["payload"] = json!({});
            }
        }
        ev.json = serde_json::to_vec(&v).map_err(|e| Error::store_from("encoding", e))?;
        Ok(ev)
    }

    /// Events as written. The indexer reads the head of the outbox again
    /// at every step, so each opened event is kept (by its sequence number
    /// and a hash of its stored bytes, which an update changes) until the
    /// cache fills: a waiting event is parsed and opened once, not once per
    /// step.
    fn open_events(&self, evs: Vec<StoredEvent>) -> Result<Vec<StoredEvent>> {
        evs.into_iter()
            .map(|e| {
                let key = (e.seq, xxhash_rust::xxh3::xxh3_64(&e.json));
                if let Some(json) = lock(&self.opened).get(&key) {
                    return Ok(StoredEvent {
                        seq: e.seq,
                        json: json.clone(),
                    });
                }
                let out = self.open_event(e)?;
                let mut c = lock(&self.opened);
                if c.len() >= OPENED_EVENTS {
                    c.clear();
                }
                c.insert(key, out.json.clone());
                Ok(out)
            })
            .collect()
    }

    /// The ops with every text sealed, the key rows of deleted scopes
    /// deleted, and the blobs of a node moved to another scope re-sealed
    /// with that scope's key; and the keys to drop from memory after.
    fn seal_ops(&self, ops: Vec<Op>) -> Result<(Vec<Op>, Vec<u64>)> {
        // The node each new blob belongs to (its scope's key seals it).
        let mut blob_node: HashMap<u64, String> = HashMap::new();
        let mut removed: Vec<&str> = Vec::new();
        for op in &ops {
            match op {
                Op::PutNode { rec, .. } | Op::PutVersion { rec } => {
                    for f in &rec.files {
                        blob_node.entry(f.blob).or_insert_with(|| rec.path.clone());
                    }
                }
                Op::DelNode { path } => removed.push(path),
                _ => {}
            }
        }
        let moves = if removed.is_empty() {
            Vec::new()
        } else {
            self.reseal_moves(&ops, &removed)?
        };
        let mut out = Vec::with_capacity(ops.len() + moves.len());
        let mut dropped = Vec::new();
        for mut op in ops {
            match &mut op {
                Op::PutBlobOf { account, id, data } => {
                    let scope = blob_node.get(id).map_or(account.as_str(), |p| scope_of(p));
                    *data = self.seal(scope, Kind::Blob, data)?.into();
                }
                Op::PutBlob { .. } | Op::PutVec { .. } => {
                    return Err(Error::store(
                        "a blob or vector without its owner cannot be sealed (an old log record?)",
                    ))
                }
                Op::PutDraft { path, data } => {
                    *data = self.seal(scope_of(path), Kind::Draft, data)?
                }
                // What the index derives from a scope's text never makes the
                // scope a key: without one the scope was deleted after the
                // indexer read its text, and what it derived is dropped.
                Op::PutIx { path, data } => {
                    match self.ring.existing(&*self.inner, scope_of(path))? {
                        Some(key) => *data = key.seal(Kind::Ix, data)?,
                        None => continue,
                    }
                }
                Op::PutVecOf {
                    owner,
                    model,
                    hash,
                    data,
                } => {
                    let Some(key) = self.ring.existing(&*self.inner, scope_of(owner))? else {
                        continue;
                    };
                    op = Op::PutVec {
                        model: std::mem::take(model),
                        hash: key.vec_hash(*hash),
                        data: key.seal(Kind::Vector, data)?,
                    };
                }
                Op::PutScratch { path, data }
                    if !path.starts_with(KEYRING) && path != super::MODEL_MARK =>
                {
                    *data = self.seal_scratch(path, data)?
                }
                Op::AppendLog { path, data, .. } => {
                    *data = frame(&self.seal(scope_of(path), Kind::Scratch, data)?)
                }
                Op::PutEvent { json, .. }
                | Op::UpdateEvent { json, .. }
                | Op::DeadEvent { json, .. }
                | Op::ReviveEvent { json, .. } => *json = self.seal_event(json)?,
                Op::DelDir { path } if is_scope(path) => dropped.extend(self.ring.ids_within(path)),
                _ => {}
            }
            out.push(op);
        }
        out.extend(dropped.iter().map(|id| Op::DelScratch {
            path: keys::key_row_path(*id),
        }));
        out.extend(moves);
        Ok((out, dropped))
    }

    /// A node moved to another scope (a user's memory to another user):
    /// the ops sealing its blobs, every version's, again with the new
    /// scope's key, so deleting the old scope does not take them with it.
    fn reseal_moves(&self, ops: &[Op], removed: &[&str]) -> Result<Vec<Op>> {
        let new: HashSet<u64> = ops
            .iter()
            .filter_map(|o| match o {
                Op::PutBlobOf { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        let mut out = Vec::new();
        for src in removed {
            let Some(old) = self.inner.get_node(src)? else {
                continue;
            };
            for op in ops {
                if let Op::PutNode { path: dst, rec } = op {
                    if rec.id == old.id && scope_of(dst) != scope_of(src) {
                        out.extend(self.reseal_node(rec, scope_of(dst), &new)?);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The ops sealing the blobs of every version of `rec` with `scope`'s
    /// key (those of `new`, written in the same transaction, already are).
    fn reseal_node(&self, rec: &NodeRec, scope: &str, new: &HashSet<u64>) -> Result<Vec<Op>> {
        let key = self.ring.key_for(&*self.inner, scope)?;
        let account = rec.account().to_string();
        let mut files = rec.files.clone();
        for v in 1..rec.version {
            if let Some(old) = self.inner.get_version(&account, rec.id, v)? {
                files.extend(old.files);
            }
        }
        let mut seen = HashSet::new();
        let mut ops = Vec::new();
        for f in files {
            if !seen.insert(f.blob) || new.contains(&f.blob) {
                continue;
            }
            let sealed = self
                .inner
                .read_blob(&account, f.blob, f.size + OVERHEAD as u64)?;
            if key_id_of(&sealed) == Some(key.id) {
                continue;
            }
            if let Opened::Plain(p) = self.unseal(Kind::Blob, &sealed)? {
                ops.push(Op::PutBlobOf {
                    account: account.clone(),
                    id: f.blob,
                    data: key.seal(Kind::Blob, &p)?.into(),
                });
            }
        }
        Ok(ops)
    }
}

/// A sealed value as one length-prefixed frame (scratch entries and logs
/// hold a sequence of them: an append adds one).
fn frame(sealed: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + sealed.len());
    out.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
    out.extend_from_slice(sealed);
    out
}

fn frames(mut data: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        if data.len() < 4 {
            return Err(Error::store("corrupt sealed entry (truncated frame)"));
        }
        let n = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if data.len() < 4 + n {
            return Err(Error::store("corrupt sealed entry (truncated frame)"));
        }
        out.push(&data[4..4 + n]);
        data = &data[4 + n..];
    }
    Ok(out)
}

/// The length of the text a sealed scratch entry's data holds (fsck counts
/// it without the key).
pub fn plain_len(data: &[u8]) -> Option<usize> {
    let fs = frames(data).ok()?;
    Some(fs.iter().map(|f| f.len().saturating_sub(OVERHEAD)).sum())
}

/// Is `bytes` a sealed value?
pub fn is_sealed(bytes: &[u8]) -> bool {
    key_id_of(bytes).is_some()
}

impl Store for Sealed {
    fn get_node(&self, path: &str) -> Result<Option<NodeRec>> {
        self.inner.get_node(path)
    }
    fn get_version(&self, account: &str, node_id: u64, version: u32) -> Result<Option<NodeRec>> {
        self.inner.get_version(account, node_id, version)
    }
    fn list_nodes(&self, parent: &str) -> Result<Vec<(String, NodeRec)>> {
        self.inner.list_nodes(parent)
    }
    fn has_children(&self, parent: &str) -> Result<bool> {
        self.inner.has_children(parent)
    }
    fn dir_exists(&self, path: &str) -> Result<bool> {
        self.inner.dir_exists(path)
    }
    fn list_dirs(&self, parent: &str) -> Result<Vec<String>> {
        self.inner.list_dirs(parent)
    }
    fn read_blob(&self, account: &str, id: u64, size: u64) -> Result<Vec<u8>> {
        let sealed = self.inner.read_blob(account, id, size + OVERHEAD as u64)?;
        self.open_blob(account, id, &sealed)
    }
    fn get_nodes(&self, paths: &[&str]) -> Result<Vec<Option<NodeRec>>> {
        self.inner.get_nodes(paths)
    }
    fn get_versions(&self, asks: &[(&str, u64, u32)]) -> Result<Vec<Option<NodeRec>>> {
        self.inner.get_versions(asks)
    }
    fn read_blobs(&self, asks: &[(&str, u64, u64)]) -> Result<Vec<Result<Vec<u8>>>> {
        let sealed: Vec<(&str, u64, u64)> = asks
            .iter()
            .map(|(a, id, size)| (*a, *id, size + OVERHEAD as u64))
            .collect();
        Ok(self
            .inner
            .read_blobs(&sealed)?
            .into_iter()
            .zip(asks)
            .map(|(b, (a, id, _))| self.open_blob(a, *id, &b?))
            .collect())
    }
    fn node_events(&self, node_path: &str) -> Result<Vec<StoredEvent>> {
        self.open_events(self.inner.node_events(node_path)?)
    }
    fn drafts(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for (p, b) in self.inner.drafts()? {
            if let Opened::Plain(d) = self.unseal(Kind::Draft, &b)? {
                out.push((p, d));
            }
        }
        Ok(out)
    }
    fn counter(&self, key: &str) -> Result<i64> {
        self.inner.counter(key)
    }
    fn counters(&self, keys: &[String]) -> Result<Vec<i64>> {
        self.inner.counters(keys)
    }
    fn ix_node_counts(&self) -> Result<std::collections::HashMap<String, usize>> {
        // Paths are not sealed: the inner store counts them.
        self.inner.ix_node_counts()
    }
    fn high_water(&self, key: &str) -> Result<u64> {
        self.inner.high_water(key)
    }
    fn outbox_head(&self, limit: usize) -> Result<Vec<StoredEvent>> {
        self.open_events(self.inner.outbox_head(limit)?)
    }
    fn dead_events(&self, node_path: &str) -> Result<Vec<StoredEvent>> {
        self.open_events(self.inner.dead_events(node_path)?)
    }
    fn get_ix(&self, path: &str) -> Result<Option<Vec<u8>>> {
        self.open_opt(Kind::Ix, self.inner.get_ix(path)?)
    }
    fn scan_ix(&self, prefix: &str, f: &mut dyn FnMut(&str, &[u8]) -> Result<()>) -> Result<()> {
        self.inner
            .scan_ix(prefix, &mut |path, b| match self.unseal(Kind::Ix, b)? {
                Opened::Plain(p) => f(path, &p),
                Opened::Gone => Ok(()),
            })
    }
    fn get_vec(&self, model: &str, hash: u128) -> Result<Option<Vec<u8>>> {
        // Without an owner there is no scope: no vector of this store is
        // found by its plain hash.
        let _ = (model, hash);
        Ok(None)
    }
    fn get_vec_of(&self, owner: &str, model: &str, hash: u128) -> Result<Option<Vec<u8>>> {
        let Some(key) = self.ring.current(scope_of(owner)) else {
            return Ok(None);
        };
        self.open_opt(Kind::Vector, self.inner.get_vec(model, key.vec_hash(hash))?)
    }
    fn get_vecs_of(&self, model: &str, wants: &[(&str, u128)]) -> Result<Vec<Option<Vec<u8>>>> {
        // The stored rows are keyed per scope: ask the inner store for
        // those keys at once, then open what it has.
        let keyed: Vec<Option<u128>> = wants
            .iter()
            .map(|(owner, hash)| {
                self.ring
                    .current(scope_of(owner))
                    .map(|k| k.vec_hash(*hash))
            })
            .collect();
        let asked: Vec<u128> = keyed.iter().flatten().copied().collect();
        let mut found = self.inner.get_vecs(model, &asked)?.into_iter();
        keyed
            .iter()
            .map(|k| match k {
                Some(_) => self.open_opt(Kind::Vector, found.next().flatten()),
                None => Ok(None),
            })
            .collect()
    }
    fn vec_scope(&self, owner: &str) -> Option<String> {
        Some(scope_of(owner).to_string())
    }
    fn stored_vec_hash(&self, owner: &str, hash: u128) -> Option<u128> {
        self.ring.current(scope_of(owner)).map(|k| k.vec_hash(hash))
    }
    fn digest_name(&self, owner: &str, bytes: &[u8]) -> Result<String> {
        let k = self.ring.key_for(&*self.inner, scope_of(owner))?;
        Ok(k.digest_name(bytes))
    }
    fn get_scratch(&self, path: &str) -> Result<Option<Vec<u8>>> {
        match self.inner.get_scratch(path)? {
            Some(b) => self.open_scratch(path, b),
            None => Ok(None),
        }
    }
    fn list_scratch(&self, parent: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for (name, b) in self.inner.list_scratch(parent)? {
            if let Some(p) = self.open_scratch(&format!("{parent}/{name}"), b)? {
                out.push((name, p));
            }
        }
        Ok(out)
    }
    fn expiries(&self) -> Result<Vec<(String, u64)>> {
        self.inner.expiries()
    }
    fn scan_nodes(&self, f: &mut dyn FnMut(NodeRec) -> Result<()>) -> Result<()> {
        self.inner.scan_nodes(f)
    }
    fn apply(&self, ops: Vec<Op>, durable: bool) -> Result<()> {
        let (ops, dropped) = self.seal_ops(ops)?;
        self.inner.apply(ops, durable)?;
        if !dropped.is_empty() {
            self.ring.forget(&dropped);
            lock(&self.opened).clear();
        }
        Ok(())
    }
    fn sealed(&self) -> bool {
        true
    }
    fn data_keys(&self) -> Option<usize> {
        Some(self.key_count())
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    fn alloc(&self, key: &str, n: u64) -> Result<u64> {
        self.inner.alloc(key, n)
    }
    fn watch(self: Arc<Self>, f: Box<dyn Fn(Vec<RemoteChange>) + Send + Sync>) -> Result<()> {
        // Another daemon's key changes (a new scope's key, a deleted
        // scope's) reach this daemon's keyring before anything else.
        let ring = self.ring.clone();
        let opened = self.opened.clone();
        let inner = self.inner.clone();
        let store = inner.clone();
        inner.watch(Box::new(move |changes: Vec<RemoteChange>| {
            let keys_changed = changes
                .iter()
                .any(|c| c.path.starts_with(KEYRING) || c.kind == super::ChangeKind::Reset);
            if keys_changed {
                if let Err(e) = ring.load(&*store) {
                    tracing::error!(error = %e.report(), "reloading the keyring failed");
                }
                lock(&opened).clear();
            }
            f(changes)
        }))
    }
    fn leader(&self, role: &str) -> bool {
        self.inner.leader(role)
    }
    fn caught_up(&self) -> Result<()> {
        self.inner.caught_up()
    }
    fn try_lock_named(&self, name: &str, exclusive: bool) -> Result<bool> {
        self.inner.try_lock_named(name, exclusive)
    }
    fn unlock_named(&self, name: &str, exclusive: bool) -> Result<()> {
        self.inner.unlock_named(name, exclusive)
    }
    fn maintain_shared(&self) -> Result<()> {
        self.inner.maintain_shared()
    }
}

#[cfg(test)]
mod tests {
    use super::keys::DataKey;
    use super::*;

    #[test]
    fn scopes_of_paths() {
        assert_eq!(scope_of("acme"), "acme");
        assert_eq!(scope_of("acme/users"), "acme");
        assert_eq!(scope_of("acme/users/alice"), "acme/users/alice");
        assert_eq!(
            scope_of("acme/users/alice/memories/x/y"),
            "acme/users/alice"
        );
        assert_eq!(scope_of("acme/agents/bot/skills/s"), "acme/agents/bot");
        assert_eq!(scope_of("acme/projects/p/scratchpad/f"), "acme");
        assert!(is_scope("acme/users/alice") && is_scope("acme"));
        assert!(!is_scope("acme/users/alice/memories"));
    }

    #[test]
    fn frames_round_trip_and_count() {
        let k = DataKey::new(7, "acme", &[1u8; 32]).unwrap();
        let mut data = frame(&k.seal(Kind::Scratch, b"hello ").unwrap());
        data.extend(frame(&k.seal(Kind::Scratch, b"world").unwrap()));
        assert_eq!(plain_len(&data), Some(11));
        assert_eq!(frames(&data).unwrap().len(), 2);
        assert!(frames(&data[..data.len() - 1]).is_err());
    }

    #[test]
    fn sealed_values_read_back_and_go_with_their_scope() {
        use crate::store::{FileRec, RedbStore, Status};
        let dir = tempfile::tempdir().unwrap();
        let raw = RedbStore::open(&dir.path().join("db.redb")).unwrap();
        let master = || MasterKey::from_bytes("11".repeat(32).as_bytes()).unwrap();
        let sealed = Sealed::open(raw.clone(), master()).unwrap();
        let path = "acme/users/al/memories/c/n".to_string();
        let rec = NodeRec {
            id: 1,
            path: path.clone(),
            status: Status::Active,
            version: 1,
            created_at: String::new(),
            updated_at: String::new(),
            updated_ns: 0,
            files: vec![FileRec {
                name: "content.md".into(),
                blob: 9,
                size: 5,
                mtime_ns: 0,
                mode: 0o644,
            }],
        };
        sealed
            .apply(
                vec![
                    Op::PutBlobOf {
                        account: "acme".into(),
                        id: 9,
                        data: Arc::from(&b"hello"[..]),
                    },
                    Op::PutNode {
                        path: path.clone(),
                        rec: rec.clone(),
                    },
                    Op::PutIx {
                        path: path.clone(),
                        data: b"ixdoc".to_vec(),
                    },
                    Op::PutVecOf {
                        owner: path.clone(),
                        model: "m".into(),
                        hash: 42,
                        data: vec![1, 2, 3, 4],
                    },
                ],
                true,
            )
            .unwrap();
        // Plain through the seal, sealed underneath.
        assert_eq!(sealed.read_blob("acme", 9, 5).unwrap(), b"hello");
        let under = raw.read_blob("acme", 9, 5 + OVERHEAD as u64).unwrap();
        assert!(is_sealed(&under) && !under.windows(5).any(|w| w == b"hello"));
        assert_eq!(sealed.get_ix(&path).unwrap().unwrap(), b"ixdoc");
        assert_eq!(
            sealed.get_vec_of(&path, "m", 42).unwrap().unwrap(),
            vec![1, 2, 3, 4]
        );
        assert!(raw.get_vec("m", 42).unwrap().is_none(), "keyed per scope");
        // Read many at once: the same answers, in the order asked; another
        // scope (no key yet) finds nothing.
        assert_eq!(
            sealed
                .get_vecs_of(
                    "m",
                    &[(&path, 7), (&path, 42), ("acme/users/bo/memories/x/y", 42)]
                )
                .unwrap(),
            vec![None, Some(vec![1, 2, 3, 4]), None]
        );
        assert_eq!(sealed.data_keys(), Some(1));
        // The user's directory goes, and its key with it.
        sealed
            .apply(
                vec![
                    Op::DelNode { path: path.clone() },
                    Op::DelDir {
                        path: "acme/users/al".into(),
                    },
                ],
                true,
            )
            .unwrap();
        assert_eq!(sealed.data_keys(), Some(0));
        assert!(sealed.get_ix(&path).unwrap().is_none());
        assert!(sealed.read_blob("acme", 9, 5).is_err());
        // What the index derives late is dropped, never given a new key.
        sealed
            .apply(
                vec![Op::PutIx {
                    path: path.clone(),
                    data: b"late".to_vec(),
                }],
                true,
            )
            .unwrap();
        assert_eq!(sealed.data_keys(), Some(0));
        assert!(raw.get_ix(&path).unwrap().unwrap() != b"late".to_vec());
        // Only the master key that made it opens the store.
        drop(sealed);
        let other = MasterKey::from_bytes("22".repeat(32).as_bytes()).unwrap();
        assert!(Sealed::open(raw.clone(), other).is_err());
        assert!(Sealed::open(raw.clone(), master()).is_ok());
        raw.close();
    }
}
