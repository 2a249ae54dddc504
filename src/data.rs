//! The data directory and what opens it, below both the daemon and the
//! offline commands: its files, its lock, the store in it, the settings
//! (config file and command-line overrides) and the search index over it.

use crate::config::{IndexSection, Settings, Tenancy};
use crate::store::seal::{KeySource, MasterKey, Sealed};
use crate::store::{RedbStore, Store};
use anyhow::{anyhow, bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const DB_FILE: &str = "ctxfs.redb";
pub const LOCK_FILE: &str = "lock";
pub const LOG_FILE: &str = "ctxfs.log";
/// The data dir's format marker: written once its store exists, so a store
/// file that goes missing or empty later is known to be lost, not new.
pub const FORMAT_FILE: &str = "ctxfs.format";
/// The format of the embedded data dir this build reads and writes. A data
/// dir without the marker was written before it existed: the same format.
pub const FORMAT: u32 = 1;

/// The config (or the single-owner default) with the command line's overrides.
pub fn settings(
    config: Option<&Path>,
    embedder: Option<&String>,
    model_dir: Option<&PathBuf>,
) -> Result<Settings> {
    let mut s = match config {
        Some(p) => Settings::load(p)?,
        None => Settings {
            // SAFETY: getuid(2) has no preconditions and cannot fail.
            tenancy: Tenancy::Owner(unsafe { libc::getuid() }),
            index: IndexSection::default(),
            redaction: Default::default(),
            quotas: Default::default(),
            store_url: None,
            llm: None,
            review: Default::default(),
            unindexed: Vec::new(),
            encryption: None,
        },
    };
    if let Some(e) = embedder {
        s.index.embedder = Some(e.clone());
    }
    if let Some(d) = model_dir {
        s.index.model_dir = Some(d.clone());
    }
    crate::index::validate_section(&s.index).map_err(|e| anyhow!("{e}"))?;
    Ok(s)
}

/// Where the master key comes from: the config's `[encryption]`, else the
/// environment (`CTXFS_KEY_FILE` or `CTXFS_KEY_COMMAND`, for the offline
/// commands); `None`: no encryption.
pub fn key_source(s: Option<&Settings>) -> Result<Option<KeySource>> {
    if let Some(e) = s.and_then(|s| s.encryption.as_ref()) {
        return Ok(match (&e.key_file, &e.key_command) {
            (Some(f), _) => Some(KeySource::File(f.clone())),
            (None, Some(c)) => Some(KeySource::Command(c.clone())),
            (None, None) => None,
        });
    }
    let file = std::env::var_os(KEY_FILE_ENV).filter(|v| !v.is_empty());
    let cmd = std::env::var(KEY_COMMAND_ENV)
        .ok()
        .filter(|v| !v.is_empty());
    match (file, cmd) {
        (Some(f), None) => Ok(Some(KeySource::File(PathBuf::from(f)))),
        (None, Some(c)) => Ok(Some(KeySource::Command(c))),
        (None, None) => Ok(None),
        (Some(_), Some(_)) => bail!("set {KEY_FILE_ENV} or {KEY_COMMAND_ENV}, not both"),
    }
}

pub const KEY_FILE_ENV: &str = "CTXFS_KEY_FILE";
pub const KEY_COMMAND_ENV: &str = "CTXFS_KEY_COMMAND";

/// `store` sealed with the master key of `source` (see `store::seal`); a
/// store that has a keyring is refused without one.
pub fn seal(store: Arc<dyn Store>, source: Option<&KeySource>) -> Result<Arc<dyn Store>> {
    seal_with(store, read_key(source)?)
}

/// The master key of `source`, read (and checked: a key file must be
/// this uid's and private) before anything of the data dir is touched, so
/// a bad key leaves no trace (`None`: no encryption).
pub fn read_key(source: Option<&KeySource>) -> Result<Option<MasterKey>> {
    source
        .map(|src| src.read().map_err(|e| anyhow!("{}", e.report())))
        .transpose()
}

/// [`seal`] with a master key already read.
pub fn seal_with(store: Arc<dyn Store>, master: Option<MasterKey>) -> Result<Arc<dyn Store>> {
    Ok(match sealed_by(store.clone(), master)? {
        Some(s) => s,
        None => store,
    })
}

/// Like [`seal`], with the sealed store itself (`None`: not encrypted).
pub fn sealed(store: Arc<dyn Store>, source: Option<&KeySource>) -> Result<Option<Arc<Sealed>>> {
    sealed_by(store, read_key(source)?)
}

fn sealed_by(store: Arc<dyn Store>, master: Option<MasterKey>) -> Result<Option<Arc<Sealed>>> {
    match master {
        Some(master) => {
            let s = Sealed::open(store, master).map_err(|e| anyhow!("{}", e.report()))?;
            Ok(Some(s))
        }
        None => {
            if let Some(fp) =
                crate::store::seal::master_of(&*store).map_err(|e| anyhow!("{}", e.report()))?
            {
                bail!(
                    "this store is encrypted (master key {fp}): give its master key with \
                     [encryption] key_file or key_command in the config, or {KEY_FILE_ENV} or \
                     {KEY_COMMAND_ENV} in the environment"
                );
            }
            Ok(None)
        }
    }
}

/// The search index over `store`, with the embedder the settings choose.
pub fn open_index(
    store: &Arc<dyn crate::store::Store>,
    data: &Path,
    s: &Settings,
) -> Result<Arc<crate::index::Index>> {
    let sec = &s.index;
    let mut cfg = crate::index::IndexConfig::from_section(sec);
    cfg.embed_tokens_per_day = s
        .quotas
        .iter()
        .filter_map(|(a, q)| q.embed_tokens_per_day.map(|t| (a.clone(), t)))
        .collect();
    let (emb, note) = crate::index::choose_embedder(sec, data).map_err(|e| anyhow!("{e}"))?;
    tracing::info!(model = emb.id(), "{note}");
    cfg.ann = crate::index::ann_params(sec, emb.kind());
    cfg.redaction = s.redaction.clone();
    cfg.unindexed = s.unindexed.clone();
    cfg.dumps = !store.sealed();
    crate::index::Index::new(store.clone(), &data.join("index"), emb, note, cfg)
        .map_err(anyhow::Error::from)
}

/// The data dir, owner-only, as PostgreSQL treats its own: created `0700`;
/// an existing empty one is taken and set `0700` (as initdb does); one that
/// holds anything and that group or others may reach, or that another uid
/// owns, is refused with the command that fixes it.
pub fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let md = match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| anyhow::anyhow!("cannot create data dir {}: {e}", dir.display()));
        }
        r => r.map_err(|e| anyhow::anyhow!("data dir {} is not usable: {e}", dir.display()))?,
    };
    if !md.is_dir() {
        bail!("data dir {} is not a directory", dir.display());
    }
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        bail!(
            "data dir {} is owned by uid {}, not by uid {me} that runs ctxfs; \
             fix it with: chown -R {me} {}",
            dir.display(),
            md.uid(),
            dir.display()
        );
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let empty = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("data dir {} is not readable: {e}", dir.display()))?
        .next()
        .is_none();
    if empty {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| anyhow::anyhow!("cannot chmod data dir {}: {e}", dir.display()))?;
        return Ok(());
    }
    bail!(
        "data dir {} has group or other access (mode {mode:04o}): every local user could \
         read its tenants' memories; fix it with: chmod 0700 {}",
        dir.display(),
        dir.display()
    )
}

/// Exclusive hold of a data dir, released when the process ends (even by SIGKILL).
pub struct DataLock(#[allow(dead_code)] File);

pub fn lock_data_dir(data: &Path) -> Result<DataLock> {
    private_dir(data)?;
    let path = data.join(LOCK_FILE);
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: the fd belongs to `f`, open for the whole call.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        bail!(
            "data dir {} is already served by another ctxfs daemon ({})",
            data.display(),
            holder.trim()
        );
    }
    f.set_len(0)?;
    writeln!(f, "pid {}", std::process::id())?;
    Ok(DataLock(f))
}

/// The store an offline command works on: the embedded store of an
/// unmounted data dir, or a shared PostgreSQL store (`--store URL`; the data
/// dir, if given, holds this process's local files, else a temporary one).
pub struct CommandStore {
    pub store: Arc<dyn crate::store::Store>,
    /// The local directory (index dumps, drafts of a PostgreSQL store).
    pub dir: PathBuf,
    /// The store as sealed, when it is encrypted.
    pub sealed: Option<Arc<Sealed>>,
    redb: Option<Arc<RedbStore>>,
    pg: Option<Arc<crate::store::PgStore>>,
    _lock: Option<DataLock>,
    tmp: bool,
}

impl CommandStore {
    pub fn open(data: Option<&Path>, url: Option<&str>, create: bool) -> Result<CommandStore> {
        match (data, url) {
            (_, Some(url)) => {
                let (dir, tmp, lock) = match data {
                    Some(d) => (
                        d.to_path_buf(),
                        false,
                        Some(lock_data_dir(d).context("unmount it first")?),
                    ),
                    None => {
                        let d =
                            std::env::temp_dir().join(format!("ctxfs-cmd-{}", std::process::id()));
                        (d, true, None)
                    }
                };
                let pg = crate::store::PgStore::open(url, &dir)
                    .map_err(|e| anyhow!("{}", e.report()))?;
                let sealed = sealed(pg.clone(), key_source(None)?.as_ref())?;
                Ok(CommandStore {
                    store: match &sealed {
                        Some(s) => s.clone(),
                        None => pg.clone(),
                    },
                    sealed,
                    dir,
                    redb: None,
                    pg: Some(pg),
                    _lock: lock,
                    tmp,
                })
            }
            (Some(d), None) => {
                let (lock, redb) = open_data(d, create)?;
                let sealed = sealed(redb.clone(), key_source(None)?.as_ref())?;
                Ok(CommandStore {
                    store: match &sealed {
                        Some(s) => s.clone(),
                        None => redb.clone(),
                    },
                    sealed,
                    dir: d.to_path_buf(),
                    redb: Some(redb),
                    pg: None,
                    _lock: Some(lock),
                    tmp: false,
                })
            }
            (None, None) => {
                bail!("give --data DIR (the embedded store) or --store URL (PostgreSQL)")
            }
        }
    }

    /// The embedded store, when that is what was opened.
    pub fn redb(&self) -> Option<&Arc<RedbStore>> {
        self.redb.as_ref()
    }

    pub fn close(self) {
        if let Some(r) = &self.redb {
            r.close();
        }
        if let Some(p) = &self.pg {
            p.close();
        }
        if self.tmp {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The store of an unmounted data dir that must exist.
pub fn open_offline(data: &Path) -> Result<(DataLock, Arc<RedbStore>)> {
    open_data(data, false)
}

/// The store of a data dir no daemon serves; with `create`, a new one is made.
pub fn open_data(data: &Path, create: bool) -> Result<(DataLock, Arc<RedbStore>)> {
    let db = data.join(DB_FILE);
    if !db.exists() && !create {
        bail!(
            "{} holds no ctxfs data ({} missing)",
            data.display(),
            DB_FILE
        );
    }
    let lock = lock_data_dir(data).context("unmount it first")?;
    let store = open_redb(data)?;
    Ok((lock, store))
}

/// The format a data dir's marker names (`None`: no marker).
fn format_of(data: &Path) -> Result<Option<u32>> {
    let path = data.join(FORMAT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!("cannot read {}: {e}", path.display()),
    };
    text.trim()
        .strip_prefix("ctxfs-data ")
        .and_then(|v| v.parse().ok())
        .map(Some)
        .ok_or_else(|| {
            anyhow!(
                "{} is not a ctxfs format marker ({:?}); it should read \"ctxfs-data {FORMAT}\"",
                path.display(),
                text.trim()
            )
        })
}

/// What in `data` says a store lived there: the format marker, a log with
/// intact records, search index dumps.
fn store_traces(data: &Path) -> Vec<String> {
    let mut t = Vec::new();
    if data.join(FORMAT_FILE).exists() {
        t.push(format!("the format marker {FORMAT_FILE}"));
    }
    let wal = data.join(DB_FILE).with_extension("wal");
    if let Ok(sc) = crate::store::read_wal(&wal) {
        let n = sc.records.len() + sc.after_damage.len();
        if n > 0 {
            t.push(format!("{n} record(s) in the write-ahead log"));
        }
    }
    let dumps = std::fs::read_dir(data.join("index"))
        .map(|d| d.count())
        .unwrap_or(0);
    if dumps > 0 {
        t.push(format!("{dumps} search index dump(s) in index/"));
    }
    t
}

/// Refuse what must not be opened as a store: a store file that is
/// missing or empty where traces of a store remain (it was lost: a new
/// empty store would serve an empty tree as if nothing had been there),
/// and a data dir of a newer format than this build reads.
pub fn check_data_dir(data: &Path) -> Result<()> {
    let db = data.join(DB_FILE);
    if let Some(f) = format_of(data)? {
        if f > FORMAT {
            bail!(
                "data dir {} has format {f}, written by a newer ctxfs; this one reads format \
                 {FORMAT} and changes nothing: run the newer ctxfs (or `ctxfs export` with it)",
                data.display()
            );
        }
    }
    let size = std::fs::metadata(&db).map(|m| m.len()).ok();
    if size.unwrap_or(0) == 0 {
        let traces = store_traces(data);
        if !traces.is_empty() {
            bail!(
                "the store file {} is {}, but the data dir holds traces of a store ({}): \
                 it was lost, and ctxfs will not start an empty store in its place. Restore \
                 {DB_FILE} from a backup, or salvage what the log holds with: \
                 ctxfs salvage --data {} --out NEW_DIR; to start afresh, move the data dir aside",
                db.display(),
                if size.is_none() { "missing" } else { "empty" },
                traces.join(", "),
                data.display()
            );
        }
    }
    Ok(())
}

/// Open the embedded store of `data` (created if new) after
/// [`check_data_dir`], and mark the data dir with its format.
pub fn open_redb(data: &Path) -> Result<Arc<RedbStore>> {
    check_data_dir(data)?;
    let store = RedbStore::open(&data.join(DB_FILE))?;
    let marker = data.join(FORMAT_FILE);
    if !marker.exists() {
        let tmp = data.join(format!("{FORMAT_FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            writeln!(f, "ctxfs-data {FORMAT}")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &marker)?;
            File::open(data)?.sync_all()
        };
        write().with_context(|| format!("cannot write {}", marker.display()))?;
    }
    Ok(store)
}
