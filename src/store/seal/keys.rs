//! The keys of an encrypted store: where the operator's master key comes
//! from, the data keys it wraps (one or more per scope), the seal format
//! they write, and the keyring rows that hold them in the store
//! (`.keyring/k{id}` and `.keyring/master` of the small-entries table).

use super::super::{Op, Store};
use crate::error::{Error, Result};
use crate::locks::lock;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

/// The reserved name of the key rows (an account name never starts with a dot).
pub const KEYRING: &str = ".keyring";
/// The row proving which master key wraps the keyring.
const MASTER_ROW: &str = "master";
/// Sealed values start with these bytes.
const MAGIC: [u8; 2] = [0xC7, 0x5E];
const NONCE: usize = 24;
const HEADER: usize = 2 + 8 + NONCE;
/// What sealing adds to a value: the header and the authentication tag.
pub const OVERHEAD: usize = HEADER + 16;

/// What a sealed value is; part of its authenticated data, so a value
/// cannot be passed off as one of another kind.
#[derive(Clone, Copy)]
#[repr(u8)]
pub(super) enum Kind {
    Blob = 1,
    Ix = 2,
    Vector = 3,
    Draft = 4,
    Scratch = 5,
    Event = 6,
}

/// Where the operator's master key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A file holding 64 hex digits (or 32 raw bytes), owner-only.
    File(PathBuf),
    /// A command (run by `sh -c`) that prints the key in hex, as a KMS or
    /// Vault client would.
    Command(String),
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::File(p) => write!(f, "key file {}", p.display()),
            KeySource::Command(c) => write!(f, "key command `{c}`"),
        }
    }
}

impl KeySource {
    /// Read the master key. A key file must belong to this uid and be
    /// unreadable by group and others.
    pub fn read(&self) -> Result<MasterKey> {
        let bytes = match self {
            KeySource::File(p) => {
                use std::os::unix::fs::MetadataExt;
                let md = std::fs::metadata(p)
                    .map_err(|e| Error::store(format!("cannot read {self}: {e}")))?;
                // SAFETY: geteuid(2) has no preconditions and cannot fail.
                let me = unsafe { libc::geteuid() };
                if md.uid() != me {
                    return Err(Error::store(format!(
                        "{self} belongs to uid {}, not to this process's uid {me}: \
                         chown {me} {}",
                        md.uid(),
                        p.display()
                    )));
                }
                if md.mode() & 0o077 != 0 {
                    return Err(Error::store(format!(
                        "{self} may be read by group or others (mode {:o}): chmod 600 {}",
                        md.mode() & 0o777,
                        p.display()
                    )));
                }
                std::fs::read(p).map_err(|e| Error::store(format!("cannot read {self}: {e}")))?
            }
            KeySource::Command(c) => {
                let out = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(c)
                    .stdin(std::process::Stdio::null())
                    .output()
                    .map_err(|e| Error::store(format!("cannot run {self}: {e}")))?;
                if !out.status.success() {
                    return Err(Error::store(format!(
                        "{self} failed ({}): {}",
                        out.status,
                        crate::schema::excerpt(String::from_utf8_lossy(&out.stderr).trim())
                    )));
                }
                out.stdout
            }
        };
        MasterKey::from_bytes(&bytes).map_err(|why| Error::store(format!("{self}: {why}")))
    }
}

/// The operator's key: wraps the data keys, never seals data itself.
pub struct MasterKey {
    cipher: XChaCha20Poly1305,
    /// A short public name of the key (not a secret: a hash of it).
    pub fingerprint: String,
}

impl MasterKey {
    /// 64 hex digits (whitespace around them ignored) or 32 raw bytes.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<MasterKey, String> {
        let text = std::str::from_utf8(bytes).map(str::trim).unwrap_or("");
        let raw: Vec<u8> = if text.len() == 64 {
            from_hex(text).ok_or("the key is 64 characters but not hex digits")?
        } else if bytes.len() == 32 {
            bytes.to_vec()
        } else {
            return Err(format!(
                "a master key is 64 hex digits (32 bytes), this is {} bytes; make one with: \
                 head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > FILE && chmod 600 FILE",
                bytes.len()
            ));
        };
        let mut h = Sha256::new();
        h.update(b"ctxfs master key fingerprint\0");
        h.update(&raw);
        let fingerprint = hex(&h.finalize()[..8]);
        Ok(MasterKey {
            cipher: XChaCha20Poly1305::new_from_slice(&raw).map_err(|e| e.to_string())?,
            fingerprint,
        })
    }

    fn wrap(&self, aad: &[u8], plain: &[u8]) -> Result<Vec<u8>> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let ct = self
            .cipher
            .encrypt(&nonce, Payload { msg: plain, aad })
            .map_err(|_| Error::store("wrapping a key failed"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ct);
        Ok(out)
    }

    fn unwrap(&self, aad: &[u8], wrapped: &[u8]) -> Option<Vec<u8>> {
        if wrapped.len() < NONCE {
            return None;
        }
        let (n, ct) = wrapped.split_at(NONCE);
        self.cipher
            .decrypt(XNonce::from_slice(n), Payload { msg: ct, aad })
            .ok()
    }
}

/// One data key of a scope.
pub(super) struct DataKey {
    pub(super) id: u64,
    scope: String,
    cipher: XChaCha20Poly1305,
    /// Keys the vector hashes of the scope (HMAC-SHA256).
    mac: Hmac<Sha256>,
}

impl DataKey {
    pub(super) fn new(id: u64, scope: &str, raw: &[u8]) -> Result<DataKey> {
        let bad = || Error::store("a data key has the wrong length");
        Ok(DataKey {
            id,
            scope: scope.to_string(),
            cipher: XChaCha20Poly1305::new_from_slice(raw).map_err(|_| bad())?,
            mac: <Hmac<Sha256> as Mac>::new_from_slice(raw).map_err(|_| bad())?,
        })
    }

    pub(super) fn seal(&self, kind: Kind, plain: &[u8]) -> Result<Vec<u8>> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let mut out = Vec::with_capacity(plain.len() + OVERHEAD);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&nonce);
        let mut aad = [0u8; HEADER + 1];
        aad[..HEADER].copy_from_slice(&out);
        aad[HEADER] = kind as u8;
        let ct = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .map_err(|_| Error::store("sealing failed"))?;
        out.extend_from_slice(&ct);
        Ok(out)
    }

    /// The text of a value this key sealed as `kind`; a value that does not
    /// authenticate (altered or damaged on disk) is an error, never data.
    pub(super) fn open(&self, kind: Kind, sealed: &[u8]) -> Result<Vec<u8>> {
        let mut aad = [0u8; HEADER + 1];
        aad[..HEADER].copy_from_slice(&sealed[..HEADER]);
        aad[HEADER] = kind as u8;
        let nonce = XNonce::from_slice(&sealed[10..HEADER]);
        let msg = &sealed[HEADER..];
        self.cipher
            .decrypt(nonce, Payload { msg, aad: &aad })
            .map_err(|_| {
                Error::store(format!(
                    "a value sealed with key {:016x} of {} does not authenticate: it was \
                     altered or damaged",
                    self.id, self.scope
                ))
            })
    }

    /// The stored hash of a vector of this scope: keyed, so equal texts of
    /// two scopes share no row and no hash can be checked against a guess.
    /// A row name for a digest of `bytes` (`Store::digest_name`).
    pub(super) fn digest_name(&self, bytes: &[u8]) -> String {
        let mut m = self.mac.clone();
        m.update(b"ctxfs name\0");
        m.update(bytes);
        crate::store::hex_of(&m.finalize().into_bytes())
    }

    pub(super) fn vec_hash(&self, hash: u128) -> u128 {
        let mut m = self.mac.clone();
        m.update(b"ctxfs vector\0");
        m.update(&hash.to_le_bytes());
        let d = m.finalize().into_bytes();
        u128::from_le_bytes(d[..16].try_into().unwrap_or([0; 16]))
    }
}

/// The key a sealed value names (`None`: not a sealed value).
pub(super) fn key_id_of(sealed: &[u8]) -> Option<u64> {
    if sealed.len() < OVERHEAD || sealed[..2] != MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(sealed[2..10].try_into().ok()?))
}

/// Is `scope` `of` or inside it?
fn within(scope: &str, of: &str) -> bool {
    scope == of || (scope.starts_with(of) && scope.as_bytes().get(of.len()) == Some(&b'/'))
}

#[derive(Default)]
struct Keys {
    by_id: HashMap<u64, Arc<DataKey>>,
    /// The key each scope seals with (the lowest id, so that daemons which
    /// each made one for a new scope at once agree after a reload).
    by_scope: HashMap<String, Arc<DataKey>>,
}

/// The data keys of a store, unwrapped in memory.
pub(super) struct Keyring {
    master: MasterKey,
    keys: RwLock<Keys>,
    /// Held while a key is made, so one daemon makes one key per scope.
    making: Mutex<()>,
    /// Key ids found in no row after a reload: destroyed for good (a key's
    /// row is stored before anything is sealed with it), so values sealed
    /// with them read as gone without reading the keyring again.
    gone: Mutex<HashSet<u64>>,
}

fn key_aad(scope: &str, id: u64) -> Vec<u8> {
    let mut a = b"ctxfs data key\0".to_vec();
    a.extend_from_slice(scope.as_bytes());
    a.push(0);
    a.extend_from_slice(&id.to_le_bytes());
    a
}

const CHECK_AAD: &[u8] = b"ctxfs keyring check";

fn row_path(name: &str) -> String {
    format!("{KEYRING}/{name}")
}

fn key_row_name(id: u64) -> String {
    format!("k{id:016x}")
}

/// One key row as stored.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeyRow {
    scope: String,
    id: String,
    master: String,
    wrapped: String,
}

impl KeyRow {
    /// A stored row and the key id it names.
    fn decode(bytes: &[u8]) -> Result<(KeyRow, u64)> {
        let row: KeyRow =
            serde_json::from_slice(bytes).map_err(|e| Error::store_from("corrupt key row", e))?;
        let id = u64::from_str_radix(&row.id, 16)
            .map_err(|e| Error::store_from("corrupt key row id", e))?;
        Ok((row, id))
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct MasterRow {
    master: String,
    check: String,
}

/// Does `master` open the keyring of `store`? `Ok(false)`: the store has
/// no keyring (it was never encrypted); another master key is an error.
pub(super) fn check_master(store: &dyn Store, master: &MasterKey) -> Result<bool> {
    let Some(b) = store.get_scratch(&row_path(MASTER_ROW))? else {
        return Ok(false);
    };
    let row: MasterRow = serde_json::from_slice(&b)
        .map_err(|e| Error::store_from("corrupt keyring master row", e))?;
    let ok = from_hex(&row.check)
        .and_then(|w| master.unwrap(CHECK_AAD, &w))
        .is_some();
    if !ok {
        return Err(Error::store(format!(
            "the master key given ({}) does not open this store's keyring, which \
             master key {} wraps: give that key (after `ctxfs rekey`, the new one)",
            master.fingerprint, row.master
        )));
    }
    Ok(true)
}

/// Apply `ops` with the row that proves `master` wraps the keyring.
pub(super) fn write_master_row(
    store: &dyn Store,
    master: &MasterKey,
    mut ops: Vec<Op>,
) -> Result<()> {
    let row = MasterRow {
        master: master.fingerprint.clone(),
        check: hex(&master.wrap(CHECK_AAD, b"ctxfs")?),
    };
    ops.push(Op::PutScratch {
        path: row_path(MASTER_ROW),
        data: serde_json::to_vec(&row).map_err(|e| Error::store_from("encoding", e))?,
    });
    store.apply(ops, true)
}

/// The store path of data key `id`'s row.
pub(super) fn key_row_path(id: u64) -> String {
    row_path(&key_row_name(id))
}

impl Keyring {
    pub(super) fn new(master: MasterKey) -> Keyring {
        Keyring {
            master,
            keys: RwLock::new(Keys::default()),
            making: Mutex::new(()),
            gone: Mutex::new(HashSet::new()),
        }
    }

    /// How many data keys are loaded.
    pub(super) fn count(&self) -> usize {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .len()
    }

    /// Key `id`: `None` when it was destroyed. A miss reads the rows again
    /// once (another daemon may have made it); a key still missing then
    /// is remembered as destroyed.
    pub(super) fn lookup(&self, store: &dyn Store, id: u64) -> Result<Option<Arc<DataKey>>> {
        if let Some(k) = self.by_id(id) {
            return Ok(Some(k));
        }
        if lock(&self.gone).contains(&id) {
            return Ok(None);
        }
        self.load(store)?;
        let k = self.by_id(id);
        if k.is_none() {
            lock(&self.gone).insert(id);
        }
        Ok(k)
    }

    /// The key `scope` seals with, never a new one (the rows are read again
    /// once on a miss: another daemon may have made it).
    pub(super) fn existing(&self, store: &dyn Store, scope: &str) -> Result<Option<Arc<DataKey>>> {
        if let Some(k) = self.current(scope) {
            return Ok(Some(k));
        }
        self.load(store)?;
        Ok(self.current(scope))
    }

    /// Re-wrap every data key row under `new` in one transaction; no sealed
    /// value is rewritten. The number of keys re-wrapped.
    pub(super) fn rewrap(&self, store: &dyn Store, new: &MasterKey) -> Result<usize> {
        if new.fingerprint == self.master.fingerprint {
            // Destroying "the old one" would then destroy the only key.
            return Err(Error::Invalid(format!(
                "the new master key is the one in use (fingerprint {}): nothing to rekey; \
                 give a new key",
                new.fingerprint
            )));
        }
        let mut ops = Vec::new();
        for (name, bytes) in store.list_scratch(KEYRING)? {
            if name == MASTER_ROW {
                continue;
            }
            let (mut row, id) = KeyRow::decode(&bytes)?;
            let aad = key_aad(&row.scope, id);
            let raw = from_hex(&row.wrapped)
                .and_then(|w| self.master.unwrap(&aad, &w))
                .ok_or_else(|| Error::store(format!("key {} does not open", row.id)))?;
            row.wrapped = hex(&new.wrap(&aad, &raw)?);
            row.master = new.fingerprint.clone();
            ops.push(Op::PutScratch {
                path: row_path(&name),
                data: serde_json::to_vec(&row).map_err(|e| Error::store_from("encoding", e))?,
            });
        }
        let n = ops.len();
        write_master_row(store, new, ops)?;
        Ok(n)
    }

    pub(super) fn load(&self, store: &dyn Store) -> Result<()> {
        let mut keys = Keys::default();
        for (name, bytes) in store.list_scratch(KEYRING)? {
            if name == MASTER_ROW {
                continue;
            }
            let (row, id) = KeyRow::decode(&bytes)?;
            let raw = from_hex(&row.wrapped)
                .and_then(|w| self.master.unwrap(&key_aad(&row.scope, id), &w))
                .ok_or_else(|| {
                    Error::store(format!(
                        "key {} of {} does not open with master key {} (it says it is \
                         wrapped by {}): give the master key this store was made or rekeyed with",
                        row.id, row.scope, self.master.fingerprint, row.master
                    ))
                })?;
            let k = Arc::new(DataKey::new(id, &row.scope, &raw)?);
            keys.by_id.insert(id, k.clone());
            let e = keys.by_scope.entry(row.scope.clone()).or_insert(k.clone());
            if k.id < e.id {
                *e = k;
            }
        }
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
        Ok(())
    }

    fn by_id(&self, id: u64) -> Option<Arc<DataKey>> {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .get(&id)
            .cloned()
    }

    pub(super) fn current(&self, scope: &str) -> Option<Arc<DataKey>> {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_scope
            .get(scope)
            .cloned()
    }

    /// The key `scope` seals with, made (and stored durably) if it has none.
    pub(super) fn key_for(&self, store: &dyn Store, scope: &str) -> Result<Arc<DataKey>> {
        if let Some(k) = self.current(scope) {
            return Ok(k);
        }
        let _g = self.making.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = self.current(scope) {
            return Ok(k);
        }
        let mut raw = [0u8; 32];
        OsRng.fill_bytes(&mut raw);
        let id = OsRng.next_u64();
        let row = KeyRow {
            scope: scope.to_string(),
            id: format!("{id:016x}"),
            master: self.master.fingerprint.clone(),
            wrapped: hex(&self.master.wrap(&key_aad(scope, id), &raw)?),
        };
        let bytes = serde_json::to_vec(&row).map_err(|e| Error::store_from("encoding", e))?;
        store.apply(
            vec![Op::PutScratch {
                path: row_path(&key_row_name(id)),
                data: bytes,
            }],
            true,
        )?;
        let k = Arc::new(DataKey::new(id, scope, &raw)?);
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        keys.by_id.insert(id, k.clone());
        keys.by_scope.insert(scope.to_string(), k.clone());
        Ok(k)
    }

    /// Every key of `scope` and the scopes inside it.
    pub(super) fn ids_within(&self, scope: &str) -> Vec<u64> {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .values()
            .filter(|k| within(&k.scope, scope))
            .map(|k| k.id)
            .collect()
    }

    pub(super) fn forget(&self, ids: &[u64]) {
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            if let Some(k) = keys.by_id.remove(id) {
                if keys.by_scope.get(&k.scope).map(|c| c.id) == Some(k.id) {
                    keys.by_scope.remove(&k.scope);
                }
            }
        }
        // A scope that had several keys seals with its lowest remaining one.
        let rest: Vec<Arc<DataKey>> = keys.by_id.values().cloned().collect();
        for k in rest {
            let e = keys.by_scope.entry(k.scope.clone()).or_insert(k.clone());
            if k.id < e.id {
                *e = k;
            }
        }
    }
}

/// Does `store` hold a keyring (was it made encrypted)? The fingerprint of
/// its master key if so.
pub fn master_of(store: &dyn Store) -> Result<Option<String>> {
    match store.get_scratch(&row_path(MASTER_ROW))? {
        Some(b) => {
            let row: MasterRow = serde_json::from_slice(&b)
                .map_err(|e| Error::store_from("corrupt keyring master row", e))?;
            Ok(Some(row.master))
        }
        None => Ok(None),
    }
}

pub(super) fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(b.len() * 2);
    for x in b {
        out.push(DIGITS[(x >> 4) as usize] as char);
        out.push(DIGITS[(x & 15) as usize] as char);
    }
    out
}

pub(super) fn from_hex(s: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_within_scopes() {
        assert!(within("acme/users/alice", "acme") && !within("acmex", "acme"));
    }

    #[test]
    fn master_keys_parse_and_refuse() {
        let k = MasterKey::from_bytes(format!("{}\n", "ab".repeat(32)).as_bytes()).unwrap();
        assert_eq!(k.fingerprint.len(), 16);
        assert!(MasterKey::from_bytes(b"short").is_err());
        assert!(MasterKey::from_bytes("zz".repeat(32).as_bytes()).is_err());
        let w = k.wrap(b"a", b"secret").unwrap();
        assert_eq!(k.unwrap(b"a", &w).unwrap(), b"secret");
        assert!(k.unwrap(b"b", &w).is_none());
    }

    #[test]
    fn hex_round_trips() {
        let b: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&hex(&b)).unwrap(), b);
        assert_eq!(hex(&[0xc7, 0x05]), "c705");
        assert!(from_hex("abc").is_none() && from_hex("zz").is_none());
    }
}
