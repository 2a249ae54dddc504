//! `ctxfs export` and `ctxfs import` on an unmounted data dir, with
//! progress bars. The node logic is in `core::transfer`.

use crate::config::{Settings, Tenancy};
use crate::core::transfer::{check_import, ImportNode};
use crate::core::Fs;
use crate::data::CommandStore;
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::new(len);
    b.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{bar:40}} {{pos}}/{{len}} {what}  {{per_sec}}  eta {{eta}}"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}

/// `ctxfs export --data DIR OUT`.
pub fn export(data: Option<&Path>, url: Option<&str>, out: &Path) -> Result<i32> {
    if out.exists() {
        bail!("{} exists; export writes a new directory", out.display());
    }
    let cs = CommandStore::open(data, url, false)?;
    let fs = Fs::new(cs.store.clone(), Tenancy::Owner(0))?;
    let t = Instant::now();
    let nodes = fs.export_nodes()?;
    let name = out
        .file_name()
        .ok_or_else(|| anyhow!("{} has no file name", out.display()))?;
    let tmp = out.with_file_name(format!(
        ".{}.partial-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::create_dir_all(tmp.join("accounts"))
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    let b = bar(nodes.len() as u64, "nodes");
    let mut bytes = 0u64;
    for rec in &nodes {
        let dir = tmp.join("accounts").join(&rec.path);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, data) in fs.node_files(rec)? {
            bytes += data.len() as u64;
            std::fs::write(dir.join(&name), data)
                .with_context(|| format!("cannot write {}/{name}", dir.display()))?;
        }
        b.inc(1);
    }
    b.finish_and_clear();
    std::fs::rename(&tmp, out)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))?;
    drop(fs);
    cs.close();
    println!(
        "exported {} node(s), {bytes} bytes, to {} in {:.1}s",
        nodes.len(),
        out.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// Node directories under `root` (any directory holding a file), as paths
/// under `accounts/`, with their files; directories inside a node are
/// reported as bad nodes.
/// A node directory found in an export: its path and its files, or why not.
type Found = (String, Result<Vec<(String, Vec<u8>)>, String>);

fn scan(root: &Path) -> Result<Vec<Found>> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut files = Vec::new();
        let mut subdirs = Vec::new();
        for e in
            std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))?
        {
            let e = e?;
            let ft = e.file_type()?;
            let name = e.file_name().to_string_lossy().into_owned();
            if ft.is_dir() {
                subdirs.push(e.path());
            } else if ft.is_file() {
                files.push((name, e.path()));
            } else {
                files.push((name, PathBuf::new())); // a link or device: reported
            }
        }
        let rel = dir
            .strip_prefix(root)
            .unwrap_or(&dir)
            .to_string_lossy()
            .into_owned();
        if files.is_empty() {
            stack.extend(subdirs);
            continue;
        }
        let read = (|| {
            if !subdirs.is_empty() {
                return Err("a node directory holds a directory".to_string());
            }
            let mut v = Vec::new();
            for (name, path) in files {
                if path.as_os_str().is_empty() {
                    return Err(format!("{name:?} is not a regular file"));
                }
                let data = std::fs::read(&path).map_err(|e| format!("cannot read {name}: {e}"))?;
                v.push((name, data));
            }
            Ok(v)
        })();
        out.push((rel, read));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// `ctxfs import --data DIR IN`.
pub fn import(
    data: Option<&Path>,
    url: Option<&str>,
    config: Option<&Path>,
    input: &Path,
    skip_bad: bool,
) -> Result<i32> {
    let root = input.join("accounts");
    if !root.is_dir() {
        bail!("{} has no accounts/ directory", input.display());
    }
    let (redaction, unindexed) = match config {
        Some(c) => {
            let s = Settings::load(c)?;
            (s.redaction, s.unindexed)
        }
        None => Default::default(),
    };
    let cs = CommandStore::open(data, url, true)?;
    let fs = Fs::new(cs.store.clone(), Tenancy::Owner(0))?;
    fs.set_redaction(redaction);
    fs.set_unindexed(unindexed);
    let t = Instant::now();

    // Check every node first.
    let found = scan(&root)?;
    let b = bar(found.len() as u64, "checked");
    let mut good: Vec<ImportNode> = Vec::new();
    let mut bad: Vec<(String, String)> = Vec::new();
    for (node, files) in found {
        let r = files.and_then(|f| check_import(&node, f)).and_then(|n| {
            match fs.node_exists(&n.node) {
                Ok(false) => Ok(n),
                Ok(true) => Err("a node exists at this path in the data dir".into()),
                Err(e) => Err(e.to_string()),
            }
        });
        match r {
            Ok(n) => good.push(n),
            Err(why) => bad.push((node, why)),
        }
        b.inc(1);
    }
    b.finish_and_clear();
    for (node, why) in &bad {
        eprintln!("bad node accounts/{node}: {why}");
    }
    if !bad.is_empty() && !skip_bad {
        drop(fs);
        cs.close();
        bail!(
            "{} bad node(s), nothing imported (fix them, or --skip-bad to import the {} good ones)",
            bad.len(),
            good.len()
        );
    }

    // Then commit them, oldest first, as if written in that order.
    good.sort_by(|a, b| (a.imported.updated_ns, &a.node).cmp(&(b.imported.updated_ns, &b.node)));
    let b = bar(good.len() as u64, "imported");
    let mut imported = 0;
    let mut failed = bad.len();
    for n in &good {
        match fs.import_node(n) {
            Ok(_) => imported += 1,
            Err(e) => {
                b.suspend(|| eprintln!("bad node accounts/{}: {e}", n.node));
                failed += 1;
            }
        }
        b.inc(1);
    }
    b.finish_and_clear();
    drop(fs);
    cs.close();
    println!(
        "imported {imported} node(s) from {} in {:.1}s; {failed} bad",
        input.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(if failed > 0 { 1 } else { 0 })
}
