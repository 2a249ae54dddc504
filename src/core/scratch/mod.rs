//! The shared working area of a project (CONTRACT §3):
//! `projects/{p}/scratchpad/` holds any files and directories with plain
//! POSIX behaviour, no commit protocol and no indexing; the
//! `projects/{p}/activity_log.jsonl` beside it only grows.
//!
//! Entries live in the store's scratch table. A file open anywhere is one
//! shared buffer (every process sees every write at once); it is written
//! to the store at each close and made durable by `fsync`. `flock` is
//! served by the kernel, which keeps the locks of a FUSE file system that
//! does not take them itself, across all processes of this machine.

mod files;

pub(in crate::core) use files::{entry_of, key, ScratchFiles};

use super::draft::DFile;
use super::flock::Flocks;
use super::inodes::Key;
use super::{Attr, Caller, Fs, Handle, Kind, Opened, SetAttr};
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::schema::names::{ACTIVITY_LOG, SCRATCHPAD};
use crate::schema::place;
use crate::store::{Op, ScratchRec};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

/// The scratchpads' state in memory: the shared buffers of open files,
/// the lock serialising structural changes, how much of each open activity
/// log is stored, and the `flock` table.
#[derive(Default)]
pub(crate) struct Scratchpads {
    /// Open files, by path: one buffer per file.
    open: Mutex<HashMap<String, Arc<RwLock<DFile>>>>,
    /// Serialises structural changes (and the inbox's records beside them).
    structure: Mutex<()>,
    /// Activity logs open here: how many bytes of the shared buffer are in
    /// the store (the rest are appended at the next close or fsync).
    log_synced: Mutex<HashMap<String, usize>>,
    /// `flock` locks, taken by the daemon on a shared store.
    pub(super) flocks: Flocks,
}

impl Scratchpads {
    /// Held while the scratch table changes shape.
    pub(crate) fn structure(&self) -> MutexGuard<'_, ()> {
        lock(&self.structure)
    }

    /// The open buffer of `path`, if any.
    fn buffer(&self, path: &str) -> Option<Arc<RwLock<DFile>>> {
        lock(&self.open).get(path).cloned()
    }

    /// Bytes of activity log `path` already stored.
    fn synced(&self, path: &str) -> usize {
        lock(&self.log_synced).get(path).copied().unwrap_or(0)
    }

    fn set_synced(&self, path: &str, len: usize) {
        lock(&self.log_synced).insert(path.to_string(), len);
    }

    /// Drop `path`'s buffer once no handle holds it.
    fn release(&self, path: &str) {
        let mut open = lock(&self.open);
        if open.get(path).is_some_and(|f| Arc::strong_count(f) == 1) {
            open.remove(path);
            lock(&self.log_synced).remove(path);
        }
    }

    /// Forget `path`'s buffer and log state (removed from the store).
    fn forget(&self, path: &str) {
        lock(&self.open).remove(path);
        lock(&self.log_synced).remove(path);
    }
}

/// Where a path (under `accounts/`) falls in a project's shared area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// `{a}/projects/{p}/scratchpad`
    Root,
    /// Anything below it.
    Entry,
    /// `{a}/projects/{p}/activity_log.jsonl`
    Log,
}

pub fn area(path: &str) -> Option<Area> {
    let c: Vec<&str> = path.splitn(5, '/').collect();
    if c.len() < 4 || c[1] != "projects" {
        return None;
    }
    match (c[3], c.len()) {
        (SCRATCHPAD, 4) => Some(Area::Root),
        (SCRATCHPAD, _) => Some(Area::Entry),
        (ACTIVITY_LOG, 4) => Some(Area::Log),
        _ => None,
    }
}

/// `{a}/projects/{p}` of a path in a shared area.
fn project_of(path: &str) -> &str {
    let mut n = 0;
    for (i, b) in path.bytes().enumerate() {
        if b == b'/' {
            n += 1;
            if n == 3 {
                return &path[..i];
            }
        }
    }
    path
}

/// Is `path` a project directory (`{a}/projects/{p}`)?
pub fn is_project(path: &str) -> bool {
    let c = crate::schema::place::split(path);
    c.len() == 3 && c[1] == "projects"
}

fn check_name(name: &str) -> Result<()> {
    crate::schema::place::check_file_name(name)
}

/// The stored form of an open file's buffer.
fn rec_of(f: &DFile) -> ScratchRec {
    ScratchRec {
        dir: false,
        data: f.data.clone(),
        mode: f.mode,
        mtime_ns: crate::schema::time::ns_of(f.mtime),
    }
}

pub(crate) struct ScratchHandle {
    path: String,
    file: Arc<RwLock<DFile>>,
    append: bool,
    writable: bool,
    log: bool,
    dirty: AtomicBool,
    /// Who writes through this handle (the audit trail's line).
    by: super::commit::rules::By,
}

impl Fs {
    fn scratch_rec(&self, path: &str) -> Result<Option<ScratchRec>> {
        match self.store.get_scratch(path)? {
            Some(b) => Ok(Some(ScratchRec::decode(&b)?)),
            None => Ok(None),
        }
    }

    fn project_there(&self, c: Caller, path: &str, write: bool) -> Result<()> {
        self.gate(c, path, write)?;
        if !self.store.dir_exists(project_of(path))? {
            return Err(Error::NotFound);
        }
        Ok(())
    }

    pub(super) fn scratch_attr(&self, c: Caller, path: &str, ino: u64) -> Result<Attr> {
        self.project_there(c, path, false)?;
        let open = self.scratch.buffer(path);
        if let Some(f) = open {
            let f = crate::locks::read(&f);
            return Ok(self.plain_attr(ino, Kind::File, f.data.len() as u64, f.mode, f.mtime));
        }
        match (area(path), self.scratch_rec(path)?) {
            (Some(Area::Root), _) => {
                Ok(self.plain_attr(ino, Kind::Dir, 0, 0o755, self.shown.started))
            }
            (_, Some(r)) => Ok(self.plain_attr(
                ino,
                if r.dir { Kind::Dir } else { Kind::File },
                r.data.len() as u64,
                r.mode,
                crate::schema::time::time_of(r.mtime_ns),
            )),
            (Some(Area::Log), None) => {
                Ok(self.plain_attr(ino, Kind::File, 0, 0o644, self.shown.started))
            }
            _ => Err(Error::NotFound),
        }
    }

    /// Other processes change these at any time: never cached (`shared` false).
    fn plain_attr(&self, ino: u64, kind: Kind, size: u64, mode: u16, mtime: SystemTime) -> Attr {
        match kind {
            Kind::Dir => self.shown.dir(
                ino,
                if mode == 0 { 0o755 } else { mode & 0o7777 },
                mtime,
                false,
            ),
            Kind::File => self.shown.file(ino, size, mode, mtime, false),
        }
    }

    /// The key of `name` inside shared-area directory `dir`.
    pub(super) fn scratch_child(&self, c: Caller, dir: &str, name: &str) -> Result<Key> {
        self.project_there(c, dir, false)?;
        check_name(name).map_err(|_| Error::NotFound)?;
        Ok(key(&format!("{dir}/{name}")))
    }

    /// Entries of a shared-area directory.
    pub(super) fn scratch_list(&self, c: Caller, dir: &str) -> Result<Vec<(String, Kind)>> {
        self.project_there(c, dir, false)?;
        let mut out = Vec::new();
        for (name, b) in self.store.list_scratch(dir)? {
            let r = ScratchRec::decode(&b)?;
            out.push((name, if r.dir { Kind::Dir } else { Kind::File }));
        }
        Ok(out)
    }

    fn dir_is_there(&self, dir: &str) -> Result<()> {
        match area(dir) {
            Some(Area::Root) => Ok(()),
            Some(Area::Entry) => match self.scratch_rec(dir)? {
                Some(r) if r.dir => Ok(()),
                Some(_) => Err(Error::NotDir),
                None => Err(Error::NotFound),
            },
            _ => Err(Error::NotDir),
        }
    }

    fn put_op(path: &str, rec: &ScratchRec) -> Result<Op> {
        Ok(Op::PutScratch {
            path: path.to_string(),
            data: rec.encode()?,
        })
    }

    pub(super) fn scratch_mkdir(&self, c: Caller, dir: &str, name: &str, mode: u32) -> Result<()> {
        self.project_there(c, dir, true)?;
        check_name(name)?;
        let _g = self.scratch.structure();
        self.dir_is_there(dir)?;
        let path = format!("{dir}/{name}");
        if self.store.get_scratch(&path)?.is_some() {
            return Err(Error::Exists);
        }
        let rec = ScratchRec {
            dir: true,
            data: Vec::new(),
            mode: (mode & 0o7777) as u16,
            mtime_ns: crate::schema::time::now_ns(),
        };
        self.store.apply(vec![Self::put_op(&path, &rec)?], false)
    }

    /// Create (or with O_TRUNC, empty) a file and open it.
    pub(super) fn scratch_create(
        &self,
        c: Caller,
        dir: &str,
        name: &str,
        mode: u32,
        flags: i32,
    ) -> Result<Opened> {
        self.project_there(c, dir, true)?;
        check_name(name)?;
        let path = format!("{dir}/{name}");
        {
            let _g = self.scratch.structure();
            self.dir_is_there(dir)?;
            match self.scratch_rec(&path)? {
                Some(_) if flags & libc::O_EXCL != 0 => return Err(Error::Exists),
                Some(r) if r.dir => return Err(Error::IsDir),
                Some(_) => {}
                None => {
                    let rec = ScratchRec {
                        dir: false,
                        data: Vec::new(),
                        mode: (mode & 0o7777) as u16,
                        mtime_ns: crate::schema::time::now_ns(),
                    };
                    self.store.apply(vec![Self::put_op(&path, &rec)?], false)?;
                }
            }
        }
        self.scratch_open(c, &path, flags)
    }

    /// The shared buffer of file `path`, loaded on first open.
    fn scratch_file(&self, path: &str) -> Result<Arc<RwLock<DFile>>> {
        let mut open = lock(&self.scratch.open);
        if let Some(f) = open.get(path) {
            return Ok(f.clone());
        }
        let f = match (self.scratch_rec(path)?, area(path)) {
            (Some(r), _) if r.dir => return Err(Error::IsDir),
            (Some(r), _) => {
                let f = DFile::new(r.data, r.mode);
                crate::locks::write(&f).mtime = crate::schema::time::time_of(r.mtime_ns);
                f
            }
            (None, Some(Area::Log)) => DFile::new(Vec::new(), 0o644),
            (None, _) => return Err(Error::NotFound),
        };
        if area(path) == Some(Area::Log) {
            let len = crate::locks::read(&f).data.len();
            self.scratch.set_synced(path, len);
        }
        crate::locks::write(&f).attach(self.limits.draft_mem.charge_for(place::account_of(path)));
        open.insert(path.to_string(), f.clone());
        Ok(f)
    }

    pub(super) fn scratch_open(&self, c: Caller, path: &str, flags: i32) -> Result<Opened> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        self.project_there(c, path, writable)?;
        if area(path) == Some(Area::Root) {
            return Err(Error::IsDir);
        }
        let log = area(path) == Some(Area::Log);
        let file = self.scratch_file(path)?;
        if flags & libc::O_TRUNC != 0 && writable {
            let mut f = crate::locks::write(&file);
            if log && !f.data.is_empty() {
                return Err(Error::NotPermitted("activity_log.jsonl is append-only"));
            }
            f.data.clear();
            f.recharge();
            f.mtime = SystemTime::now();
        }
        let h = ScratchHandle {
            path: path.to_string(),
            file,
            append: flags & libc::O_APPEND != 0,
            writable,
            log,
            dirty: AtomicBool::new(flags & libc::O_TRUNC != 0 && writable),
            by: c.by(None),
        };
        Ok(Opened {
            fh: self.new_handle(Handle::Scratch(h)),
            direct_io: true,
            keep_cache: false,
            no_flush: !writable,
        })
    }

    pub(super) fn scratch_write(&self, h: &ScratchHandle, offset: u64, data: &[u8]) -> Result<u32> {
        if !h.writable {
            return Err(Error::BadHandle);
        }
        let mut f = crate::locks::write(&h.file);
        let len = f.data.len() as u64;
        // The log only grows: a write must start at its end (O_APPEND or not).
        let start = if h.append { len } else { offset };
        if h.log && start != len {
            return Err(Error::NotPermitted("activity_log.jsonl is append-only"));
        }
        let end = start.saturating_add(data.len() as u64);
        self.check_growth(place::account_of(&h.path), len, end)?;
        if !h.dirty.load(Ordering::Relaxed) {
            // Its write-back counts as one of the account's writes of the
            // day (`writes_per_day`), appends to the log included.
            self.check_write_quota(place::account_of(&h.path), 0)?;
        }
        let n = f.write_at(start, data)?;
        h.dirty.store(true, Ordering::Relaxed);
        Ok(n)
    }

    pub(super) fn scratch_read(h: &ScratchHandle, offset: u64, size: u32) -> Vec<u8> {
        crate::locks::read(&h.file).read_at(offset, size)
    }

    /// Write the file's bytes to the store (at close; durable at fsync).
    pub(super) fn scratch_persist(&self, h: &ScratchHandle, durable: bool) -> Result<()> {
        let changed = h.dirty.swap(false, Ordering::AcqRel);
        if !changed && !durable {
            return Ok(());
        }
        // The snapshot is taken under the lock so that writes reach the
        // store in the order the buffer went through them.
        let _g = self.scratch.structure();
        if h.log {
            // Only the bytes this daemon added since it last wrote the log
            // go to the store, appended to the log as stored: other
            // daemons' lines in between are kept.
            let (tail, len, mode, mtime_ns) = {
                let f = crate::locks::read(&h.file);
                let synced = self.scratch.synced(&h.path);
                let synced = synced.min(f.data.len());
                (
                    f.data[synced..].to_vec(),
                    f.data.len(),
                    f.mode,
                    crate::schema::time::ns_of(f.mtime),
                )
            };
            if tail.is_empty() && !durable {
                return Ok(());
            }
            let mut ops = Vec::new();
            if !tail.is_empty() {
                ops.extend(self.write_quota_ops(&h.path, 0)?);
                // Every append says who made it, in the account's trail.
                ops.extend(self.audit_ops(
                    place::account_of(&h.path),
                    h.by,
                    serde_json::json!({
                        "op": "log-append",
                        "path": place::in_account(&h.path),
                        "bytes": tail.len(),
                    }),
                )?);
            }
            ops.push(Op::AppendLog {
                path: h.path.clone(),
                data: tail,
                mode,
                mtime_ns,
            });
            self.store.apply(ops, durable)?;
            self.scratch.set_synced(&h.path, len);
            return Ok(());
        }
        let rec = rec_of(&crate::locks::read(&h.file));
        // Removed or renamed meanwhile: nothing to write back to.
        if self.store.get_scratch(&h.path)?.is_none() && !h.log {
            return Ok(());
        }
        let mut ops = Vec::new();
        if changed {
            ops.extend(self.write_quota_ops(&h.path, 0)?);
            ops.extend(self.audit_ops(
                place::account_of(&h.path),
                h.by,
                serde_json::json!({
                    "op": "scratch-write",
                    "path": place::in_account(&h.path),
                    "bytes": rec.data.len(),
                }),
            )?);
        }
        ops.push(Self::put_op(&h.path, &rec)?);
        self.store.apply(ops, durable)
    }

    /// After the handle is gone: drop the shared buffer once nobody holds it.
    pub(super) fn scratch_released(&self, path: &str) {
        self.scratch.release(path);
    }

    pub(super) fn scratch_setattr(
        &self,
        c: Caller,
        path: &str,
        ino: u64,
        sa: &SetAttr,
    ) -> Result<Attr> {
        self.project_there(c, path, true)?;
        if sa.uid.is_some_and(|u| u != c.uid) || sa.gid.is_some_and(|g| g != c.gid) {
            return Err(Error::NotPermitted(
                "files belong to their account; chown is refused",
            ));
        }
        let a = area(path);
        if a == Some(Area::Root) {
            return self.scratch_attr(c, path, ino);
        }
        let is_dir = self.scratch_rec(path)?.is_some_and(|r| r.dir);
        if is_dir {
            let _g = self.scratch.structure();
            if let Some(mut r) = self.scratch_rec(path)? {
                if let Some(m) = sa.mode {
                    r.mode = (m & 0o7777) as u16;
                }
                if let Some(t) = sa.mtime {
                    r.mtime_ns = crate::schema::time::ns_of(t);
                }
                self.store.apply(vec![Self::put_op(path, &r)?], false)?;
            }
            return self.scratch_attr(c, path, ino);
        }
        let file = self.scratch_file(path)?;
        let g = self.scratch.structure();
        let mut ops = Vec::new();
        let rec = {
            let mut f = crate::locks::write(&file);
            if a == Some(Area::Log) && sa.size.is_some_and(|n| n != f.data.len() as u64) {
                return Err(Error::NotPermitted("activity_log.jsonl is append-only"));
            }
            if let Some(size) = sa.size {
                self.check_growth(place::account_of(path), f.data.len() as u64, size)?;
                if size < f.data.len() as u64 {
                    // What was cut off stays on record (by whom, how much).
                    ops = self.audit_ops(
                        place::account_of(path),
                        c.by(None),
                        serde_json::json!({
                            "op": "scratch-truncate",
                            "path": place::in_account(path),
                            "bytes": size,
                            "was": f.data.len(),
                        }),
                    )?;
                }
            }
            f.set_attr(sa)?;
            rec_of(&f)
        };
        ops.push(Self::put_op(path, &rec)?);
        self.store.apply(ops, false)?;
        drop(g);
        drop(file);
        self.scratch_released(path);
        self.scratch_attr(c, path, ino)
    }

    pub(super) fn scratch_unlink(
        &self,
        c: Caller,
        dir: &str,
        name: &str,
        want_dir: bool,
    ) -> Result<()> {
        let path = format!("{dir}/{name}");
        self.project_there(c, &path, true)?;
        match area(&path) {
            Some(Area::Log) => {
                return Err(Error::NotPermitted("activity_log.jsonl is append-only"))
            }
            Some(Area::Root) => return Err(Error::NotPermitted("the scratchpad itself stays")),
            _ => {}
        }
        let _g = self.scratch.structure();
        let r = self.scratch_rec(&path)?.ok_or(Error::NotFound)?;
        match (r.dir, want_dir) {
            (true, false) => return Err(Error::IsDir),
            (false, true) => return Err(Error::NotDir),
            (true, true) if !self.store.list_scratch(&path)?.is_empty() => {
                return Err(Error::NotEmpty)
            }
            _ => {}
        }
        // Who removed another writer's file stays on record.
        let mut ops = self.audit_ops(
            place::account_of(&path),
            c.by(None),
            serde_json::json!({
                "op": "scratch-remove",
                "path": place::in_account(&path),
                "bytes": r.data.len(),
            }),
        )?;
        ops.push(Op::DelScratch { path: path.clone() });
        self.store.apply(ops, false)?;
        lock(&self.scratch.open).remove(&path);
        Ok(())
    }

    /// `rename` inside one project's scratchpad (anything else: EXDEV).
    pub(super) fn scratch_rename(
        &self,
        c: Caller,
        sdir: &str,
        name: &str,
        ddir: &str,
        newname: &str,
        noreplace: bool,
    ) -> Result<()> {
        let src = format!("{sdir}/{name}");
        let dst = format!("{ddir}/{newname}");
        self.project_there(c, &src, true)?;
        self.project_there(c, &dst, true)?;
        if area(&src) == Some(Area::Log) || area(&dst) == Some(Area::Log) {
            return Err(Error::NotPermitted("activity_log.jsonl is append-only"));
        }
        if area(&src) != Some(Area::Entry) || area(&dst) != Some(Area::Entry) {
            return Err(Error::CrossDevice);
        }
        if project_of(&src) != project_of(&dst) {
            return Err(Error::CrossDevice);
        }
        check_name(newname)?;
        if src == dst {
            return Ok(());
        }
        if dst.starts_with(&format!("{src}/")) {
            return Err(Error::Invalid(
                "a directory cannot move inside itself".into(),
            ));
        }
        let _g = self.scratch.structure();
        self.dir_is_there(ddir)?;
        let s = self.scratch_rec(&src)?.ok_or(Error::NotFound)?;
        let mut ops = Vec::new();
        if let Some(d) = self.scratch_rec(&dst)? {
            if noreplace {
                return Err(Error::Exists);
            }
            match (s.dir, d.dir) {
                (false, true) => return Err(Error::IsDir),
                (true, false) => return Err(Error::NotDir),
                (true, true) if !self.store.list_scratch(&dst)?.is_empty() => {
                    return Err(Error::NotEmpty)
                }
                _ => {}
            }
            ops.push(Op::DelScratch { path: dst.clone() });
        }
        // The entry and, for a directory, everything below it.
        let mut moves = vec![(src.clone(), dst.clone(), s)];
        let mut i = 0;
        while i < moves.len() {
            let (from, to, rec) = (moves[i].0.clone(), moves[i].1.clone(), moves[i].2.dir);
            if rec {
                for (n, b) in self.store.list_scratch(&from)? {
                    moves.push((
                        format!("{from}/{n}"),
                        format!("{to}/{n}"),
                        ScratchRec::decode(&b)?,
                    ));
                }
            }
            i += 1;
        }
        for (from, to, rec) in &moves {
            ops.push(Op::DelScratch { path: from.clone() });
            ops.push(Self::put_op(to, rec)?);
        }
        ops.extend(self.audit_ops(
            place::account_of(&src),
            c.by(None),
            serde_json::json!({
                "op": "scratch-rename",
                "from": place::in_account(&src),
                "to": place::in_account(&dst),
            }),
        )?);
        self.store.apply(ops, false)?;
        let mut open = lock(&self.scratch.open);
        for (from, to, _) in moves {
            if let Some(f) = open.remove(&from) {
                open.insert(to, f);
            }
        }
        Ok(())
    }

    /// Remove the activity log of project `project` (uid 0 only).
    pub(super) fn scratch_drop_log(&self, project: &str) -> Result<()> {
        let path = format!("{project}/{ACTIVITY_LOG}");
        let _g = self.scratch.structure();
        if self.scratch_rec(&path)?.is_none() {
            // Never written: the log is implicit, like an empty structural
            // directory; removing it changes nothing.
            return Ok(());
        }
        self.store
            .apply(vec![Op::DelScratch { path: path.clone() }], true)?;
        self.scratch.forget(&path);
        tracing::info!(project, "activity log removed by uid 0");
        Ok(())
    }

    /// Does the project at `path` hold anything in its shared area?
    pub(super) fn project_busy(&self, path: &str) -> Result<bool> {
        Ok(!self
            .store
            .list_scratch(&format!("{path}/{SCRATCHPAD}"))?
            .is_empty()
            || self
                .scratch_rec(&format!("{path}/{ACTIVITY_LOG}"))?
                .is_some_and(|r| !r.data.is_empty()))
    }
}

impl ScratchHandle {
    pub fn path(&self) -> &str {
        &self.path
    }
    pub fn file(&self) -> &Arc<RwLock<DFile>> {
        &self.file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn areas() {
        assert_eq!(area("a/projects/p/scratchpad"), Some(Area::Root));
        assert_eq!(area("a/projects/p/scratchpad/x/y"), Some(Area::Entry));
        assert_eq!(area("a/projects/p/activity_log.jsonl"), Some(Area::Log));
        assert_eq!(area("a/projects/p/other"), None);
        assert_eq!(area("a/users/p/scratchpad"), None);
        assert_eq!(project_of("a/projects/p/scratchpad/x"), "a/projects/p");
        assert!(is_project("a/projects/p"));
    }
}
