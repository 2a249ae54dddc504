//! Durable state behind one interface. redb (`redb/`) is the embedded
//! default; a networked backend (PostgreSQL) implements the same trait: every
//! `apply` is one transaction.

use crate::schema::place;
mod check;
mod fsck;
mod pg;
mod redb;
pub mod seal;
mod wal;

pub use self::check::check;
pub use self::fsck::{fsck, fsck_file, Report as FsckReport, Violation};
pub use self::pg::{shown_url, PgStore};
pub use self::redb::{salvage, RedbStore, Salvaged};
pub use self::wal::{read as read_wal, Scan as WalScan};

use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use crate::schema::Status;

/// One file of a committed version. Content lives in the blob table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRec {
    pub name: String,
    pub blob: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub mode: u16,
}

/// A committed node version. The current one is in `nodes`, every one in `versions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRec {
    pub id: u64,
    /// Path under `accounts/` at the time of this version.
    pub path: String,
    pub status: Status,
    pub version: u32,
    pub created_at: String,
    pub updated_at: String,
    pub updated_ns: i128,
    pub files: Vec<FileRec>,
}

impl NodeRec {
    /// The account the node belongs to (its path's first segment).
    pub fn account(&self) -> &str {
        place::account_of(&self.path)
    }

    pub fn file(&self, name: &str) -> Option<&FileRec> {
        self.files.iter().find(|f| f.name == name)
    }
}

/// One change inside a transaction (also the unit of the write-ahead log).
/// Event ids at and above this are placeholders for ids a shared store
/// takes in the commit's transaction (`Store::shared`).
pub const EVENT_PLACEHOLDER: u64 = 1 << 62;

/// The scratch entry where a store records the embedding model every index
/// document was made with, once an indexer has checked them all: a later
/// start with that model skips the check (`crate::index`). A model's name,
/// no text: kept plain on an encrypted store, like its keyring.
pub const MODEL_MARK: &str = ".index/model";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    PutNode {
        path: String,
        rec: NodeRec,
    },
    DelNode {
        path: String,
    },
    PutDir {
        path: String,
    },
    DelDir {
        path: String,
    },
    PutVersion {
        rec: NodeRec,
    },
    /// Remove every version of a node, and the blobs only they reference.
    DropHistory {
        node_id: u64,
    },
    PutBlob {
        id: u64,
        data: Arc<[u8]>,
    },
    PutEvent {
        seq: u64,
        node_path: String,
        account: String,
        json: Vec<u8>,
    },
    PutDraft {
        path: String,
        data: Vec<u8>,
    },
    DelDraft {
        path: String,
    },
    /// Add `delta` to a named counter (node counts per account and status...).
    Count {
        key: String,
        delta: i64,
    },
    /// Raise an id high-water mark (ids are allocated in memory; a shared
    /// store hands out node, blob and event ids itself and skips these).
    HighWater {
        key: String,
        value: u64,
    },
    /// The indexer is done with a pending event: remove it.
    DoneEvent {
        seq: u64,
        node_path: String,
        account: String,
    },
    /// Rewrite a pending event in place (retry count, next try, last error).
    UpdateEvent {
        seq: u64,
        json: Vec<u8>,
    },
    /// Move a pending event to the dead-letter queue (with its final JSON).
    DeadEvent {
        seq: u64,
        node_path: String,
        account: String,
        json: Vec<u8>,
    },
    /// Move a dead letter back to the pending outbox (a retry asked by a user).
    ReviveEvent {
        seq: u64,
        node_path: String,
        account: String,
        json: Vec<u8>,
    },
    /// Drop a dead letter for good.
    DropDead {
        seq: u64,
        node_path: String,
        account: String,
    },
    /// The indexed state of one node (postcard, owned by `crate::index`).
    PutIx {
        path: String,
        data: Vec<u8>,
    },
    DelIx {
        path: String,
    },
    /// An embedding, by model and content hash (embeddings are never computed twice).
    PutVec {
        model: String,
        hash: u128,
        data: Vec<u8>,
    },
    /// A file or directory of a project's shared area (postcard `ScratchRec`).
    PutScratch {
        path: String,
        data: Vec<u8>,
    },
    DelScratch {
        path: String,
    },
    /// When a node expires (ns since the epoch; `expires_at` of its `.meta.json`).
    PutExpiry {
        path: String,
        at_ns: u64,
    },
    DelExpiry {
        path: String,
    },
    /// Remove one blob (a redacted version's file no other version uses).
    DelBlob {
        id: u64,
    },
    /// Forget an embedding (no indexed text has it any more).
    DelVec {
        model: String,
        hash: u128,
    },
    /// Append `data` to the project activity log at `path` as it is in the
    /// store now (made, with `mode`, if missing): appends from several
    /// daemons all land, none overwrites another's.
    AppendLog {
        path: String,
        data: Vec<u8>,
        mode: u16,
        mtime_ns: i128,
    },
    /// A blob of `account` (every new blob: the account is part of its
    /// key on a shared store; `PutBlob` remains for logs written before).
    PutBlobOf {
        account: String,
        id: u64,
        data: Arc<[u8]>,
    },
    /// The node at `path` is at `version` (`None`: no node there), or the
    /// whole transaction fails with `Error::Conflict`: the compare-and-set
    /// of a commit planned on that version (another daemon may have
    /// committed since).
    Expect {
        path: String,
        version: Option<u32>,
    },
    /// An embedding of a text of the node (or conversation) at `owner`: on
    /// an encrypted store it is sealed with the key of the owner's scope
    /// and found by a keyed hash; elsewhere it is `PutVec`.
    PutVecOf {
        owner: String,
        model: String,
        hash: u128,
        data: Vec<u8>,
    },
}

/// What another daemon changed (the change feed of a shared store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeKind {
    /// A node's record: committed, moved, deleted, expired.
    Node,
    /// A container directory made or removed.
    Dir,
    /// A scratchpad file or directory.
    Scratch,
    /// A node's index document.
    Ix,
    /// A node's expiry time.
    Expiry,
    /// Changes were missed (the feed was pruned past this daemon's
    /// cursor): drop every cache.
    Reset,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteChange {
    pub kind: ChangeKind,
    /// The store path (`ACCOUNT/…`) it concerns.
    pub path: String,
}

/// A file or directory of `projects/{p}/scratchpad/` (or the activity log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScratchRec {
    pub dir: bool,
    pub data: Vec<u8>,
    pub mode: u16,
    pub mtime_ns: i128,
}

impl ScratchRec {
    /// Its time in ns since the epoch, unsigned (0 before the epoch): a
    /// stored conversation's identity in the index (`IxDoc::source`).
    pub fn time_ns(&self) -> u64 {
        u64::try_from(self.mtime_ns).unwrap_or(0)
    }

    /// The log record after appending `data` to `old` (the stored record, if any).
    pub fn appended(old: Option<&[u8]>, data: &[u8], mode: u16, mtime_ns: i128) -> Result<Vec<u8>> {
        let mut rec = match old {
            Some(b) => Self::decode(b)?,
            None => ScratchRec {
                dir: false,
                data: Vec::new(),
                mode,
                mtime_ns,
            },
        };
        rec.data.extend_from_slice(data);
        rec.mtime_ns = mtime_ns;
        rec.encode()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        postcard::from_bytes(bytes)
            .map_err(|e| crate::error::Error::store_from("corrupt scratch entry", e))
    }
    pub fn encode(&self) -> Result<Vec<u8>> {
        postcard::to_stdvec(self).map_err(|e| crate::error::Error::store_from("encoding", e))
    }
}

/// A pending index event as stored.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub seq: u64,
    pub json: Vec<u8>,
}

pub trait Store: Send + Sync {
    fn get_node(&self, path: &str) -> Result<Option<NodeRec>>;
    /// Version `version` of node `node_id` of `account` (the account is part
    /// of the key on a shared store: no read of a version names none).
    fn get_version(&self, account: &str, node_id: u64, version: u32) -> Result<Option<NodeRec>>;
    /// Committed nodes directly under `parent`, in name order.
    fn list_nodes(&self, parent: &str) -> Result<Vec<(String, NodeRec)>>;
    /// Does `parent` have any committed node or container child?
    fn has_children(&self, parent: &str) -> Result<bool>;
    fn dir_exists(&self, path: &str) -> Result<bool>;
    /// Container directories directly under `parent`, in name order.
    fn list_dirs(&self, parent: &str) -> Result<Vec<String>>;
    /// Blob `id` of `account`, which must hold `size` bytes.
    fn read_blob(&self, account: &str, id: u64, size: u64) -> Result<Vec<u8>>;
    /// `get_node` of many paths, in the order asked: one round trip on a
    /// store across the network (`fsck`).
    fn get_nodes(&self, paths: &[&str]) -> Result<Vec<Option<NodeRec>>> {
        paths.iter().map(|p| self.get_node(p)).collect()
    }
    /// `get_version` of many (account, node id, version), in the order asked.
    fn get_versions(&self, asks: &[(&str, u64, u32)]) -> Result<Vec<Option<NodeRec>>> {
        asks.iter()
            .map(|(a, id, v)| self.get_version(a, *id, *v))
            .collect()
    }
    /// `read_blob` of many (account, id, size), in the order asked, each
    /// with its own outcome (a missing or damaged blob fails alone).
    fn read_blobs(&self, asks: &[(&str, u64, u64)]) -> Result<Vec<Result<Vec<u8>>>> {
        Ok(asks
            .iter()
            .map(|(a, id, size)| self.read_blob(a, *id, *size))
            .collect())
    }
    /// The bytes of file `name` of the node version `rec`; `None` when the
    /// version has no such file.
    fn read_file(&self, rec: &NodeRec, name: &str) -> Result<Option<Vec<u8>>> {
        match rec.file(name) {
            Some(f) => Ok(Some(self.read_blob(rec.account(), f.blob, f.size)?)),
            None => Ok(None),
        }
    }
    fn node_events(&self, node_path: &str) -> Result<Vec<StoredEvent>>;
    fn drafts(&self) -> Result<Vec<(String, Vec<u8>)>>;
    fn counter(&self, key: &str) -> Result<i64>;
    /// `counter` of many keys, in the order asked.
    fn counters(&self, keys: &[String]) -> Result<Vec<i64>> {
        keys.iter().map(|k| self.counter(k)).collect()
    }
    fn high_water(&self, key: &str) -> Result<u64>;
    /// The first `limit` pending outbox events, in sequence order.
    fn outbox_head(&self, limit: usize) -> Result<Vec<StoredEvent>>;
    /// The dead letters of a node, in sequence order.
    fn dead_events(&self, node_path: &str) -> Result<Vec<StoredEvent>>;
    /// A stored index document.
    fn get_ix(&self, path: &str) -> Result<Option<Vec<u8>>>;
    /// Every index document whose path starts with `prefix`, in path order.
    fn scan_ix(&self, prefix: &str, f: &mut dyn FnMut(&str, &[u8]) -> Result<()>) -> Result<()>;
    /// How many index documents of nodes (not of conversation messages,
    /// whose paths hold a `#`) each account has.
    fn ix_node_counts(&self) -> Result<std::collections::HashMap<String, usize>> {
        let mut out = std::collections::HashMap::new();
        self.scan_ix("", &mut |path, _| {
            if !path.contains('#') {
                let account = place::account_of(path);
                *out.entry(account.to_string()).or_default() += 1;
            }
            Ok(())
        })?;
        Ok(out)
    }
    fn get_vec(&self, model: &str, hash: u128) -> Result<Option<Vec<u8>>>;
    /// The embedding of a text of the node at `owner` (see `Op::PutVecOf`).
    fn get_vec_of(&self, owner: &str, model: &str, hash: u128) -> Result<Option<Vec<u8>>> {
        let _ = owner;
        self.get_vec(model, hash)
    }
    /// `get_vec` of many hashes, in the order asked: one round trip on a
    /// store across the network.
    fn get_vecs(&self, model: &str, hashes: &[u128]) -> Result<Vec<Option<Vec<u8>>>> {
        hashes.iter().map(|h| self.get_vec(model, *h)).collect()
    }
    /// `get_vec_of` of many pairs of owner and hash, in the order asked.
    fn get_vecs_of(&self, model: &str, wants: &[(&str, u128)]) -> Result<Vec<Option<Vec<u8>>>> {
        let hashes: Vec<u128> = wants.iter().map(|(_, h)| *h).collect();
        self.get_vecs(model, &hashes)
    }
    /// Which owners share stored embeddings: `None` when every owner does
    /// (one row per text); on an encrypted store, the owner's scope.
    fn vec_scope(&self, owner: &str) -> Option<String> {
        let _ = owner;
        None
    }
    /// The hash a text of `owner` is stored under (`None`: nothing of the
    /// owner's scope can be stored now).
    fn stored_vec_hash(&self, owner: &str, hash: u128) -> Option<u128> {
        let _ = owner;
        Some(hash)
    }
    /// The name a digest of `bytes` of `owner`'s scope is stored under (a
    /// row name, never sealed): hex SHA-256; an encrypted store keys it
    /// with the scope's key (HMAC-SHA256), so it cannot confirm a guessed
    /// text and goes with the scope's keys.
    fn digest_name(&self, owner: &str, bytes: &[u8]) -> Result<String> {
        let _ = owner;
        use sha2::Digest;
        Ok(hex_of(&sha2::Sha256::digest(bytes)))
    }
    /// An entry of a project's shared area.
    fn get_scratch(&self, path: &str) -> Result<Option<Vec<u8>>>;
    /// The entries directly under `parent` in a project's shared area, in name order.
    fn list_scratch(&self, parent: &str) -> Result<Vec<(String, Vec<u8>)>>;
    /// Every node with an expiry time (path, ns since the epoch).
    fn expiries(&self) -> Result<Vec<(String, u64)>>;
    /// Every current node record (any status), in no particular order.
    fn scan_nodes(&self, f: &mut dyn FnMut(NodeRec) -> Result<()>) -> Result<()>;
    /// Apply ops atomically; `durable` waits until they are on disk. Concurrent
    /// callers may share one transaction (group commit).
    fn apply(&self, ops: Vec<Op>, durable: bool) -> Result<()>;

    // ---- several daemons on one store (the embedded store has one) -------

    /// Is every text of this store sealed (`[encryption]`)?
    fn sealed(&self) -> bool {
        false
    }

    /// How many data keys an encrypted store holds (`None`: not encrypted).
    fn data_keys(&self) -> Option<usize> {
        None
    }

    /// Do other daemons share this store? A shared store takes the event
    /// ids of a commit itself, inside its transaction: `PutEvent`s whose
    /// `seq` is at or above [`EVENT_PLACEHOLDER`] are placeholders, to be
    /// given increasing ids in their order (and their JSON's `event_id`).
    fn shared(&self) -> bool {
        false
    }

    /// Hand out `n` consecutive ids of counter `key` no other daemon gets;
    /// the first. Only for a shared store (one daemon allocates in memory).
    fn alloc(&self, key: &str, n: u64) -> Result<u64> {
        let _ = (key, n);
        Err(crate::error::Error::store(
            "ids are allocated in memory on this store",
        ))
    }

    /// Deliver other daemons' changes to `f`, in commit order, from now on.
    fn watch(self: Arc<Self>, f: Box<dyn Fn(Vec<RemoteChange>) + Send + Sync>) -> Result<()> {
        let _ = f;
        Ok(())
    }

    /// Does this daemon hold `role` (the indexer, the sweeper…)? One daemon
    /// at a time does; always this one on an unshared store.
    fn leader(&self, role: &str) -> bool {
        let _ = role;
        true
    }

    /// Wait until every change committed (by any daemon) before the call
    /// has been delivered to `watch`.
    fn caught_up(&self) -> Result<()> {
        Ok(())
    }

    /// Take the lock `name` for this daemon as a whole (shared or
    /// exclusive) without waiting: false when another daemon holds it
    /// against us. Only a shared store has other daemons.
    fn try_lock_named(&self, name: &str, exclusive: bool) -> Result<bool> {
        let _ = (name, exclusive);
        Ok(true)
    }

    /// Let go of a lock `try_lock_named` took.
    fn unlock_named(&self, name: &str, exclusive: bool) -> Result<()> {
        let _ = (name, exclusive);
        Ok(())
    }

    /// Periodic upkeep of a shared store (pruning its change feed).
    fn maintain_shared(&self) -> Result<()> {
        Ok(())
    }
}

/// A draft as persisted (on fsync and at unmount): the overlay of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraftRec {
    /// (node id, version) the overlay applies to; `None` for a new node.
    pub base: Option<(u64, u32)>,
    pub files: Vec<DraftFileRec>,
    pub modified_ns: i128,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraftFileRec {
    pub name: String,
    /// `None` is a whiteout: the committed file is deleted in the draft.
    pub data: Option<Vec<u8>>,
    pub mtime_ns: i128,
    pub mode: u16,
}

impl DraftRec {
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        postcard::from_bytes(bytes).map_err(|e| crate::error::Error::store_from("corrupt draft", e))
    }
    pub fn encode(&self) -> Result<Vec<u8>> {
        postcard::to_stdvec(self).map_err(|e| crate::error::Error::store_from("encoding", e))
    }
}

/// `bytes` in lowercase hex.
pub fn hex_of(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
