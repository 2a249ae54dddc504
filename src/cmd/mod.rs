//! The offline commands (`fsck`, `repair`, `reindex`, `export`, `import`,
//! `bench-ann`) and `search` over a mount, each taking plain options: only
//! `crate::cli` knows clap.

use crate::schema::place;
mod transfer;

pub use self::transfer::{export, import};
use crate::config::Tenancy;
use crate::core::Fs;
use crate::data::{open_index, open_offline, settings, CommandStore};
use crate::store::Store;
use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `ctxfs migrate`: copy an unmounted data dir's embedded store, with its
/// versions, index documents, vectors and pending events, into an empty
/// PostgreSQL database, in transactions of at most 1,000 rows (so a failed
/// run leaves a database to drop and migrate again, never a half-copied
/// one that looks complete: the schema records the migration last).
pub fn migrate(data: &Path, url: &str) -> Result<i32> {
    let t = Instant::now();
    let (_lock, src) = open_offline(data)?;
    let scratch = data.join("migrate.tmp");
    let dst = crate::store::PgStore::open(url, &scratch).map_err(|e| anyhow!("{}", e.report()))?;
    if dst.holds_data()? {
        bail!(
            "{} already holds ctxfs data: migrate into an empty database",
            dst.url()
        );
    }
    let mut batch = Vec::new();
    let mut counts: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let mut rows = 0u64;
    let drafts = src.export_ops(&mut |table, op| {
        *counts.entry(table).or_default() += 1;
        rows += 1;
        batch.push(op);
        if batch.len() >= 1000 {
            dst.apply(std::mem::take(&mut batch), false)?;
            if rows % 20_000 < 1000 {
                eprintln!("migrate: {rows} rows copied ({table})");
            }
        }
        Ok(())
    })?;
    dst.apply(std::mem::take(&mut batch), true)?;
    dst.close();
    drop(dst);
    let _ = std::fs::remove_dir_all(&scratch);
    let mut out = std::io::stdout().lock();
    for (table, n) in &counts {
        writeln!(out, "{table}: {n}")?;
    }
    writeln!(
        out,
        "migrated {rows} rows from {} in {:.1} s",
        data.display(),
        t.elapsed().as_secs_f64()
    )?;
    if drafts > 0 {
        writeln!(
            out,
            "note: {drafts} saved draft(s) stay in {} (uncommitted work is a daemon's own): \
             mount it, commit or remove them, and migrate again to carry them",
            data.display()
        )?;
    }
    Ok(0)
}

/// `ctxfs compact`: forget what deleted nodes left behind in an unmounted
/// data dir. Dead letters of nodes that no longer exist and vectors no index
/// document uses are dropped; every live row is written into a new database
/// file (so no freed page of the old one survives) that replaces the old;
/// the write-ahead log is emptied; graph dumps are removed (the next mount
/// rebuilds them from the stored vectors); the daemon's log files are
/// emptied (they may name deleted nodes). Refused while index events wait:
/// they may hold the text of deleted versions until the indexer applies them.
pub fn compact(data: &Path) -> Result<i32> {
    let t = Instant::now();
    let db = data.join(crate::data::DB_FILE);
    let before = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
    let (lock, store) = open_offline(data)?;
    let sealed = crate::data::seal(store.clone(), crate::data::key_source(None)?.as_ref())?;
    let waiting = sealed.outbox_head(1)?.len();
    if waiting > 0 {
        bail!(
            "index events are still waiting in the outbox (they may hold the text of deleted \
             versions): mount the data dir, `cat MOUNT/.ctxfs/sync`, unmount, then compact"
        );
    }
    let mut ops = Vec::new();
    let mut dead = 0;
    for (node, seq) in store.dead_letters()? {
        if store.get_node(&node)?.is_none() {
            let account = place::account_of(&node).to_string();
            ops.push(crate::store::Op::DropDead {
                seq,
                node_path: node,
                account,
            });
            dead += 1;
        }
    }
    let used = crate::index::referenced_vectors(&*sealed)?;
    drop(sealed);
    let mut vectors = 0;
    for (model, hash) in store.vector_keys()? {
        if !used.contains(&(model.clone(), hash)) {
            ops.push(crate::store::Op::DelVec { model, hash });
            vectors += 1;
        }
    }
    for part in ops.chunks(4096) {
        store.apply(part.to_vec(), true)?;
    }
    // The committer stops and checkpoints: the log is empty from here.
    store.close();
    let tmp = data.join(format!("{}.compact", crate::data::DB_FILE));
    let _ = std::fs::remove_file(&tmp);
    let rows = store.rewrite_into(&tmp)?;
    drop(store);
    std::fs::rename(&tmp, &db)?;
    let dumps = data.join("index");
    if dumps.exists() {
        std::fs::remove_dir_all(&dumps)?;
    }
    let log = data.join(crate::data::LOG_FILE);
    if log.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&log)?
            .set_len(0)?;
    }
    let _ = std::fs::remove_file(data.join(format!("{}.1", crate::data::LOG_FILE)));
    drop(lock);
    let after = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
    println!(
        "compacted {}: {rows} rows kept, {dead} dead letter(s) of deleted nodes and {vectors} \
         unused vector(s) dropped, {before} -> {after} bytes, graph dumps and logs cleared, {:.1}s",
        data.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// `ctxfs rekey`: every data key re-wrapped under a new master key, in one
/// transaction.
pub fn rekey(
    data: Option<&Path>,
    url: Option<&str>,
    new_key_file: Option<PathBuf>,
    new_key_command: Option<String>,
) -> Result<i32> {
    use crate::store::seal::KeySource;
    let new = match (new_key_file, new_key_command) {
        (Some(f), None) => KeySource::File(f),
        (None, Some(c)) => KeySource::Command(c),
        _ => bail!("give the new master key: --new-key-file FILE or --new-key-command CMD"),
    };
    let new = new.read().map_err(|e| anyhow!("{}", e.report()))?;
    let cs = CommandStore::open(data, url, false)?;
    let Some(sealed) = cs.sealed.clone() else {
        bail!(
            "this store is not encrypted: give the current master key in {} or {} (a store \
             without one was never encrypted, and is not encrypted in place)",
            crate::data::KEY_FILE_ENV,
            crate::data::KEY_COMMAND_ENV
        );
    };
    let n = sealed.rekey(&new).map_err(|e| anyhow!("{}", e.report()))?;
    drop(sealed);
    cs.close();
    println!(
        "rekeyed: {n} data key(s) now wrapped by master key {}; give it from now on, and \
         destroy the old one",
        new.fingerprint
    );
    Ok(0)
}

/// `ctxfs delete`: an administrator's delete of a whole account, or of one
/// user's or agent's memory, in one transaction, with a count of what went.
pub fn delete(data: &Path, account: &str, user: Option<&str>, agent: Option<&str>) -> Result<i32> {
    let prefix = match (user, agent) {
        (Some(u), None) => format!("{account}/users/{u}"),
        (None, Some(g)) => format!("{account}/agents/{g}"),
        (None, None) => account.to_string(),
        (Some(_), Some(_)) => bail!("give --user or --agent, not both"),
    };
    let (_lock, store) = open_offline(data)?;
    let sealed = crate::data::seal(store.clone(), crate::data::key_source(None)?.as_ref())?;
    let fs = Fs::new(sealed, Tenancy::Owner(0))?;
    let d = fs.delete_subtree(&prefix)?;
    drop(fs);
    store.close();
    println!(
        "deleted accounts/{prefix}: {} node(s) with their versions, {} draft(s), {} container(s), \
         {} conversation(s), {} other record(s) (scratchpad files, inbox jobs); the next mount's \
         indexer forgets them, then `ctxfs compact` removes every trace from the data dir",
        d.nodes, d.drafts, d.containers, d.conversations, d.scratch_entries
    );
    Ok(0)
}

/// Options of `ctxfs bench-ann`.
#[derive(Debug, Clone)]
pub struct BenchAnnOpts {
    pub npy: Option<PathBuf>,
    pub limit: Option<usize>,
    pub data: Option<PathBuf>,
    pub account: Option<String>,
    pub queries_file: Option<PathBuf>,
    pub queries: usize,
    pub config: Option<PathBuf>,
    pub embedder: Option<String>,
    pub model_dir: Option<PathBuf>,
    pub m: usize,
    pub ef_construction: usize,
}

pub fn fsck(data: Option<&Path>, url: Option<&str>) -> Result<i32> {
    let report = match (data, url) {
        // The embedded store is checked read-only: fsck reports, it never
        // writes (repair and salvage are commands of their own).
        (Some(d), None) => {
            let _lock = crate::data::lock_data_dir(d).context("unmount it first")?;
            crate::data::check_data_dir(d)?;
            let db = d.join(crate::data::DB_FILE);
            if !db.exists() {
                bail!(
                    "{} holds no ctxfs data ({} missing)",
                    d.display(),
                    crate::data::DB_FILE
                );
            }
            crate::store::fsck_file(&db)?
        }
        _ => {
            let cs = CommandStore::open(data, url, false)?;
            let violations = crate::store::check(&*cs.store)?;
            cs.close();
            crate::store::FsckReport {
                violations,
                notes: Vec::new(),
            }
        }
    };
    for n in &report.notes {
        println!("note: {n}");
    }
    if report.violations.is_empty() {
        println!("clean");
        Ok(0)
    } else {
        for x in &report.violations {
            println!("{x}");
        }
        println!("{} violation(s)", report.violations.len());
        Ok(1)
    }
}

/// `ctxfs salvage`: what can be read of a damaged data dir, into a new one.
pub fn salvage(data: &Path, out: &Path) -> Result<i32> {
    let _lock = crate::data::lock_data_dir(data).context("unmount it first")?;
    if std::fs::read_dir(out).is_ok_and(|mut d| d.next().is_some()) {
        bail!(
            "{} is not empty: salvage writes a new data dir",
            out.display()
        );
    }
    crate::data::private_dir(out)?;
    let src = data.join(crate::data::DB_FILE);
    let dst = out.join(crate::data::DB_FILE);
    let s = crate::store::salvage(&src, &dst)?;
    for (table, n) in &s.rows {
        println!("{table}: {n} row(s)");
    }
    println!("write-ahead log: {} record(s) applied", s.records);
    for l in &s.lost {
        println!("lost: {l}");
    }
    if !s.missing_seqs.is_empty() {
        println!(
            "lost: {} commit batch(es) of the write-ahead log (records {}) were damaged",
            s.missing_seqs.len(),
            s.missing_seqs
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // Mark the new data dir and check it, as a mount would open it.
    let (lock, store) = open_offline(out)?;
    let violations = crate::store::fsck(&store)?;
    store.close();
    drop(store);
    drop(lock);
    for v in &violations {
        println!("check: {v}");
    }
    println!(
        "salvaged into {}: {} violation(s) of the stored invariants; the search index is \
         rebuilt at its first mount. To serve it: mv {} {}.damaged && mv {} {}",
        out.display(),
        violations.len(),
        data.display(),
        data.display(),
        out.display(),
        data.display()
    );
    Ok(if s.lost.is_empty() && s.missing_seqs.is_empty() {
        0
    } else {
        1
    })
}

/// `ctxfs repair`: the Repair Job over the saved drafts of a data dir (on a
/// PostgreSQL store, against the shared nodes: `--data` and `--store`).
pub fn repair(data: Option<&Path>, url: Option<&str>, grace: Duration) -> Result<i32> {
    if data.is_none() {
        bail!("repair works on the saved drafts of a data dir: give --data DIR (and --store URL for a PostgreSQL store)");
    }
    let cs = CommandStore::open(data, url, false)?;
    let fs = Fs::new(cs.store.clone(), Tenancy::Owner(0))?;
    let actions = fs.repair(grace)?;
    for a in &actions {
        println!("{a}");
    }
    println!("repair: {} action(s)", actions.len());
    drop(fs);
    cs.close();
    Ok(0)
}

/// `ctxfs reindex`: rebuild every search index of an unmounted data dir
/// from its committed nodes, with a progress bar.
pub fn reindex(
    data: Option<&Path>,
    url: Option<&str>,
    config: Option<&Path>,
    embedder: Option<&String>,
    model_dir: Option<&PathBuf>,
) -> Result<i32> {
    let s = settings(config, embedder, model_dir)?;
    let cs = CommandStore::open(data, url, false)?;
    // On a shared store the indexer of a daemon allocates graph labels:
    // reindex only while no daemon indexes (it holds the same role).
    if !cs.store.leader("indexer") {
        bail!("a daemon is indexing this store: unmount the daemons (or reindex from one of them) first");
    }
    let index = open_index(&cs.store, &cs.dir, &s)?;
    println!(
        "embedder: {} ({})",
        index.embedder().id(),
        index.embedder().kind()
    );
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} nodes  {per_sec}  eta {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let t = Instant::now();
    let n = index.reindex_all(&mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    index.shutdown();
    drop(index);
    cs.close();
    println!("reindexed {n} node(s) in {:.1}s", t.elapsed().as_secs_f64());
    Ok(0)
}

/// `ctxfs search`: ask a mounted ctxfs through its search files.
pub fn search(
    dir: &Path,
    query: &str,
    k: Option<usize>,
    json: bool,
    mode: Option<&str>,
    budget: Option<usize>,
) -> Result<i32> {
    if query.contains('/') {
        bail!("a query cannot contain '/' (it is a file name)");
    }
    let mut opts = Vec::new();
    if let Some(k) = k {
        opts.push(format!("k={k}"));
    }
    if json {
        opts.push("format=json".into());
    }
    if let Some(m) = mode {
        opts.push(format!("mode={m}"));
    }
    if let Some(b) = budget {
        opts.push(format!("budget={b}"));
    }
    // The options start at the file name's last '?': a query holding one
    // ("what?k=0") always gets the options written after it.
    if opts.is_empty() && query.contains('?') {
        opts.push(format!("k={}", crate::core::search::DEFAULT_K));
    }
    let opts = if opts.is_empty() {
        String::new()
    } else {
        format!("?{}", opts.join("&"))
    };
    // A query is a file name: a longer one is searched by its first words.
    let (q, cut) = crate::schema::fit_name(query, 255usize.saturating_sub(opts.len()));
    if cut {
        eprintln!(
            "ctxfs: the query is longer than a file name allows; searched for its first {} bytes: {}",
            q.len(),
            crate::schema::excerpt(q)
        );
    }
    let name = format!("{q}{opts}");
    let path = dir.join(crate::schema::names::SEARCH_DIR).join(&name);
    let bytes = std::fs::read(&path).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR) => format!(
                " (is {} a directory inside a ctxfs account?)",
                dir.display()
            ),
            Some(libc::EINVAL) => " (the daemon refused the query or an option: \
                 see `cat MOUNT/.ctxfs/help`)"
                .to_string(),
            _ => String::new(),
        };
        anyhow!("{}: {e}{hint}", path.display())
    })?;
    std::io::stdout().write_all(&bytes)?;
    Ok(0)
}

/// `ctxfs restore --as-of T DIR`: the path of DIR in its account written to
/// `accounts/A/.as-of/T/restore`, then the result read back.
pub fn restore_as_of(dir: &Path, time: &str) -> Result<i32> {
    if time.contains('/') {
        bail!("{time:?} is not a time (give e.g. 2026-11-20T10:00:00Z)");
    }
    let full = std::path::absolute(dir).with_context(|| format!("{}", dir.display()))?;
    let comps: Vec<&std::ffi::OsStr> = full.iter().collect();
    // The mount is the directory holding `accounts/` and `.ctxfs/`.
    let at = (1..comps.len().saturating_sub(1))
        .rev()
        .find(|&i| {
            comps[i] == "accounts" && {
                let root: PathBuf = comps[..i].iter().collect();
                root.join(crate::schema::names::CTXFS_DIR).is_dir()
            }
        })
        .ok_or_else(|| {
            anyhow!(
                "{} is not inside an account of a ctxfs mount (MOUNT/accounts/ACCOUNT/…)",
                dir.display()
            )
        })?;
    let account: PathBuf = comps[..=at + 1].iter().collect();
    let rel: Vec<String> = comps[at + 2..]
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let rel = if rel.is_empty() {
        "/".to_string()
    } else {
        rel.join("/")
    };
    let file = account
        .join(crate::schema::names::AS_OF_DIR)
        .join(time)
        .join(crate::schema::names::RESTORE);
    let hint = |e: std::io::Error| {
        let why = match e.raw_os_error() {
            Some(libc::EINVAL) => " (a bad time or path: see `cat` of the file)",
            Some(libc::ENOENT) => " (nothing was there then, or the time is in the future)",
            Some(libc::EROFS) => " (only the account's writers restore)",
            Some(libc::EBUSY) => " (a node has uncommitted changes)",
            Some(libc::ESTALE) => " (a node changed meanwhile; nothing was committed, try again)",
            _ => "",
        };
        anyhow!("{}: {e}{why}", file.display())
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .map_err(hint)?;
    f.write_all(format!("{rel}\n").as_bytes()).map_err(hint)?;
    drop(f);
    let text = std::fs::read_to_string(&file).map_err(hint)?;
    let result = text.split_once("Last restore:\n").map_or("", |(_, r)| r);
    std::io::stdout().write_all(result.as_bytes())?;
    Ok(0)
}

/// `ctxfs bench-ann`: recall and speed of the graph against exact search.
pub fn bench_ann(o: BenchAnnOpts) -> Result<i32> {
    use crate::index::{ann::AnnParams, annbench, embed::normalize};
    let p = AnnParams {
        m: o.m,
        ef_construction: o.ef_construction,
        ..AnnParams::default()
    };
    p.validate().map_err(|e| anyhow!("{e}"))?;
    let base: Vec<(usize, Vec<f32>)>;
    let queries: Vec<Vec<f32>>;
    (base, queries) = if let Some(npy) = &o.npy {
        let (rows, dim, data) = annbench::read_npy(npy).map_err(|e| anyhow!("{e}"))?;
        let rows = o.limit.unwrap_or(rows).min(rows);
        let mut vs: Vec<Vec<f32>> = (0..rows)
            .map(|i| {
                let mut v = data[i * dim..(i + 1) * dim].to_vec();
                normalize(&mut v);
                v
            })
            .collect();
        let q = vs.split_off(rows - o.queries.min(rows / 2));
        (vs.into_iter().enumerate().collect(), q)
    } else {
        let data = o.data.as_ref().context("give --npy or --data")?;
        let account = o.account.as_ref().context("--data needs --account")?;
        let s = settings(
            o.config.as_deref(),
            o.embedder.as_ref(),
            o.model_dir.as_ref(),
        )?;
        let (_lock, store) = open_offline(data)?;
        let sealed = crate::data::seal(store.clone(), crate::data::key_source(Some(&s))?.as_ref())?;
        let index = open_index(&sealed, data, &s)?;
        let base = index.live_vectors(account)?;
        let file = o
            .queries_file
            .as_ref()
            .context("--data needs --queries-file")?;
        let texts: Vec<String> = std::fs::read_to_string(file)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .take(o.queries)
            .map(String::from)
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let mut q = Vec::new();
        for part in refs.chunks(32) {
            q.extend(index.embedder().embed(part).map_err(|e| anyhow!("{e}"))?);
        }
        store.close();
        (base, q)
    };
    print!(
        "{}",
        annbench::run(base, &queries, p, &[16, 32, 64, 128, 256, 512, 1024])
    );
    Ok(0)
}
