//! File I/O: `open`, `create`, `read`, `write`, `flush` (the commit of
//! `.meta.json` at close), `release`, `fsync`, `setattr`, `access`.

use crate::config::Access;
use crate::core::ops::arc;
use crate::core::ops::read_lock;
use crate::core::ops::write_lock;
use crate::core::ops::Key;
use crate::core::Attr;
use crate::core::Caller;
use crate::core::DFile;
use crate::core::DraftHandle;
use crate::core::Fs;
use crate::core::Handle;
use crate::core::Kind;
use crate::core::Opened;
use crate::core::SetAttr;
use crate::core::Slot;
use crate::core::MAX_FILE_BYTES;
use crate::error::Error;
use crate::error::Result;
use crate::locks::lock;
use crate::schema::place;
use crate::schema::place::DirPlace;
use crate::schema::place::META;
use crate::schema::time::time_of;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::RwLock;
use std::time::SystemTime;

impl Fs {
    // ---- files --------------------------------------------------------------------

    /// Copy-on-write: the draft file `name` of `node`, made from the committed
    /// file when the draft does not have it yet. Caller holds the node stripe.
    pub(in crate::core) fn cow(
        &self,
        node: &str,
        name: &str,
        create_mode: Option<u16>,
    ) -> Result<Arc<RwLock<DFile>>> {
        let rec = self.live_node(node)?;
        let draft = match (&rec, self.draft(node)) {
            (_, Some(d)) => d,
            (Some(r), None) => self.draft_or_new(node, Some(r)),
            (None, None) => return Err(Error::NotFound),
        };
        let mut d = lock(&draft);
        if let Some(Slot::File(f)) = d.files.get(name) {
            return Ok(f.clone());
        }
        let whiteout = matches!(d.files.get(name), Some(Slot::Whiteout));
        let file = match rec
            .as_ref()
            .and_then(|r| r.file(name))
            .filter(|_| !whiteout)
        {
            Some(fr) => {
                // A copy of the committed file in memory: it counts.
                self.check_growth(place::account_of(node), 0, fr.size)?;
                let f = DFile::new(
                    self.store
                        .read_blob(place::account_of(node), fr.blob, fr.size)?,
                    fr.mode,
                );
                write_lock(&f).mtime = time_of(fr.mtime_ns);
                f
            }
            None => match create_mode {
                Some(mode) => DFile::new(Vec::new(), mode),
                None => return Err(Error::NotFound),
            },
        };
        write_lock(&file).attach(self.limits.draft_mem.charge_for(place::account_of(node)));
        d.files.insert(name.to_string(), Slot::File(file.clone()));
        d.touch();
        if rec.as_ref().and_then(|r| r.file(name)).is_some() {
            // The writer's next lookup must find the draft, not the cached version.
            self.invalidate(node, &[name], false);
        }
        Ok(file)
    }

    pub(in crate::core) fn draft_handle(
        &self,
        node: &str,
        name: &str,
        file: Arc<RwLock<DFile>>,
        flags: i32,
    ) -> Result<Opened> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writable {
            read_lock(&file).writers.fetch_add(1, Ordering::Relaxed);
        }
        let trunc = writable && flags & libc::O_TRUNC != 0;
        if trunc {
            let mut f = write_lock(&file);
            f.data.clear();
            f.recharge();
            f.mtime = SystemTime::now();
        }
        let fh = self.new_handle(Handle::Draft(DraftHandle {
            node: arc(node),
            name: name.to_string(),
            file,
            append: flags & libc::O_APPEND != 0,
            writable,
            dirty: AtomicBool::new(false),
        }));
        Ok(Opened {
            fh,
            direct_io: true,
            keep_cache: false,
            no_flush: !(writable && name == META),
        })
    }

    pub fn open(&self, c: Caller, ino: u64, flags: i32) -> Result<Opened> {
        let key = self.key_of(ino)?;
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        match &key {
            Key::Virtual(v) => crate::core::features::owner(v)?.open(self, c, v, flags),
            Key::File {
                node,
                name,
                id,
                version,
            } => {
                let access = self.gate(c, node, write)?;
                if access == Access::Write {
                    let g = self.drafts.stripe(node);
                    let in_draft = self
                        .draft(node)
                        .map(|d| matches!(lock(&d).files.get(&**name), Some(Slot::File(_))))
                        .unwrap_or(false);
                    if write || in_draft {
                        let file = self.cow(node, name, None)?;
                        let opened = self.draft_handle(node, name, file, flags);
                        drop(g);
                        if write && opened.is_ok() {
                            // The kernel truncates and resizes this inode for
                            // everyone once this open returns (see `Cached`).
                            self.kernel.cached.taint(ino);
                        }
                        return opened;
                    }
                }
                let (rec, stale) = self.current_rec(node, *id, *version, access)?;
                let f = rec.file(name).ok_or(Error::NotFound)?;
                let bytes = self.store.read_blob(rec.account(), f.blob, f.size)?;
                let fh = self.new_handle(Handle::Data(Arc::from(bytes)));
                let stale = stale || !self.kernel.cached.open(ino, fh);
                // A current inode's pages never change (a new version is a
                // new inode), so the kernel keeps them. A stale inode serves
                // the current version's bytes around its cached pages.
                Ok(Opened {
                    fh,
                    direct_io: stale,
                    keep_cache: !stale,
                    no_flush: true,
                })
            }
            Key::Draft { node, name } => match self.draft_file(c, node, name) {
                Ok(file) => self.draft_handle(node, name, file, flags),
                // Another writer committed between the lookup and this open:
                // the file left the draft and is the committed version now.
                Err(Error::NotFound) => {
                    let access = self.gate(c, node, write)?;
                    let rec = self.visible_node(node, access)?.ok_or(Error::NotFound)?;
                    let key = Key::File {
                        node: node.clone(),
                        name: name.clone(),
                        id: rec.id,
                        version: rec.version,
                    };
                    rec.file(name).ok_or(Error::NotFound)?;
                    let ino = self.ino_lookup(key);
                    let opened = self.open(c, ino, flags);
                    self.forget(ino, 1);
                    opened
                }
                Err(e) => Err(e),
            },
            _ => Err(Error::IsDir),
        }
    }

    pub fn create(
        &self,
        c: Caller,
        parent: u64,
        name: &str,
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Opened)> {
        let pkey = self.key_of(parent)?;
        self.refuse_in_read_only(&pkey)?;
        if let Key::Virtual(dir) = &pkey {
            return crate::core::features::owner(dir)?.create(self, c, dir, name, mode, flags);
        }
        let node = match &pkey {
            Key::Dir(p) => p.clone(),
            Key::Accounts => {
                return Err(Error::Invalid(
                    "accounts/ holds account directories only".into(),
                ))
            }
            _ => return Err(Error::NotPermitted("no files can be created here")),
        };
        self.gate(c, &node, true)?;
        if place::classify_dir(&place::split(&node))? != DirPlace::Node {
            return Err(Error::Invalid(
                "files live inside node directories only; create the node directory first".into(),
            ));
        }
        place::check_file_name(name)?;
        let file = {
            let _g = self.drafts.stripe(&node);
            self.node_for(&node, Access::Write)?;
            let exists = self.node_child_key(&node, name, Access::Write).is_ok();
            if exists && flags & libc::O_EXCL != 0 {
                return Err(Error::Exists);
            }
            self.cow(&node, name, Some((mode & 0o7777) as u16))?
        };
        let opened = self.draft_handle(&node, name, file, flags)?;
        let attr = self.lookup(c, parent, name)?;
        Ok((attr, opened))
    }

    /// `mknod` of a regular file (some tools create files this way).
    pub fn mknod(&self, c: Caller, parent: u64, name: &str, mode: u32) -> Result<Attr> {
        if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
            return Err(Error::NotPermitted(
                "only regular files and directories are stored",
            ));
        }
        let (attr, opened) = self.create(c, parent, name, mode, libc::O_WRONLY | libc::O_EXCL)?;
        self.release(opened.fh);
        Ok(attr)
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let h = self.handle(fh)?;
        match &*h {
            Handle::Data(d) => Ok(crate::core::draft::slice_at(d, offset, size)),
            Handle::Draft(d) => Ok(read_lock(&d.file).read_at(offset, size)),
            Handle::Scratch(s) => Ok(Self::scratch_read(s, offset, size)),
            Handle::Restore(_) | Handle::Batch(_) | Handle::Inbox(_) => Err(Error::BadHandle),
        }
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.handle(fh)?;
        if let Handle::Scratch(s) = &*h {
            return self.scratch_write(s, offset, data);
        }
        if let Handle::Restore(r) = &*h {
            return self.restore_write(r, data);
        }
        if let Handle::Inbox(i) = &*h {
            return self.inbox_write(i, offset, data);
        }
        if let Handle::Batch(b) = &*h {
            let mut buf = lock(&b.buf);
            let (now, end) = (buf.len(), buf.len() + data.len());
            if end > MAX_FILE_BYTES as usize {
                return Err(Error::TooBig);
            }
            // Buffered bytes count as uncommitted ones (draft memory, quota).
            self.check_growth(&b.account, now as u64, end as u64)?;
            buf.write_at(now, data);
            return Ok(data.len() as u32);
        }
        let Handle::Draft(d) = &*h else {
            return Err(Error::BadHandle);
        };
        if !d.writable {
            return Err(Error::BadHandle);
        }
        let mut f = write_lock(&d.file);
        let start = if d.append {
            f.data.len() as u64
        } else {
            offset
        };
        // Uncommitted bytes count against the account's byte quota and the
        // daemon's draft memory: refused at the write, before they are held.
        let grown = start.saturating_add(data.len() as u64);
        self.check_growth(place::account_of(&d.node), f.data.len() as u64, grown)?;
        let n = f.write_at(start, data)?;
        d.dirty.store(true, Ordering::Relaxed);
        Ok(n)
    }

    /// `close(2)`: closing a written `.meta.json` is the commit point.
    pub fn flush(&self, c: Caller, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        if let Handle::Draft(d) = &*h {
            if d.name == META && d.dirty.swap(false, Ordering::AcqRel) {
                if let Some(dr) = self.draft(&d.node) {
                    lock(&dr).by = Some(c.by(None));
                }
                self.commit(&d.node, Some(&d.file))?;
            }
        }
        if let Handle::Scratch(s) = &*h {
            self.scratch_persist(s, false)?;
        }
        if let Handle::Restore(r) = &*h {
            self.restore_flush(r)?;
        }
        if let Handle::Inbox(i) = &*h {
            self.inbox_flush(i)?;
        }
        if let Handle::Batch(b) = &*h {
            let bytes = lock(&b.buf).take();
            if !bytes.is_empty() {
                let keep = |result: Vec<u8>| {
                    self.handles
                        .batch_results
                        .keep(&b.account, b.caller.uid, result)
                };
                // The fronts commit through batch lines: theirs is the name.
                let via = match b.caller.front() {
                    "shell" => "batch",
                    front => front,
                };
                let (result, refused) = match self.commit_batch(b.caller, &b.account, &bytes, via) {
                    Ok(r) => r,
                    // A batch refused whole (too many nodes, not UTF-8):
                    // reading the file gives the reason, as for a node.
                    Err(e @ (Error::Invalid(_) | Error::Quota(_))) => {
                        let mut line = serde_json::to_vec(
                            &serde_json::json!({"line": 0, "node": "", "error": e.to_string()}),
                        )
                        .unwrap_or_default();
                        line.push(b'\n');
                        keep(line);
                        return Err(e);
                    }
                    Err(e) => return Err(e),
                };
                let lines = result.iter().filter(|b| **b == b'\n').count();
                keep(result);
                if refused > 0 {
                    return Err(Error::BadCommit(format!(
                        "{refused} of {lines} nodes refused (the others are committed); \
                         read accounts/{}/.ctxfs/batch for which and why",
                        b.account
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn release(&self, fh: u64) {
        self.kernel.cached.release(fh);
        let h = self.handles.remove(fh);
        if let Some(h) = h {
            if let Handle::Inbox(i) = &*h {
                self.inbox_released(i);
            }
            if let Handle::Scratch(s) = &*h {
                let path = s.path().to_string();
                if let Err(e) = self.scratch_persist(s, false) {
                    tracing::error!(%path, error = %e, "scratch file not written back");
                }
                drop(h);
                self.scratch_released(&path);
            }
        }
    }

    /// `fsync` of a draft file makes the node's whole draft durable.
    pub fn fsync(&self, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        if let Handle::Scratch(s) = &*h {
            return self.scratch_persist(s, true);
        }
        if let Handle::Draft(d) = &*h {
            let _g = self.drafts.stripe(&d.node);
            if let Some(draft) = self.draft(&d.node) {
                let op = self.persist_draft_op(&d.node, &lock(&draft))?;
                self.store.apply(vec![op], true)?;
            }
        }
        Ok(())
    }

    /// `fsync` of a directory: everything acknowledged before is durable.
    pub fn fsyncdir(&self) -> Result<()> {
        self.store.apply(Vec::new(), true)
    }

    pub fn setattr(&self, c: Caller, ino: u64, fh: Option<u64>, sa: SetAttr) -> Result<Attr> {
        let key = self.key_of(ino)?;
        if let Key::Virtual(v) = &key {
            if let Some(r) = crate::core::features::owner(v)?.change_attr(self, c, v, ino, &sa) {
                return r;
            }
        }
        let (node, name) = match &key {
            Key::File { node, name, .. } | Key::Draft { node, name } => {
                (node.clone(), name.clone())
            }
            Key::Dir(path) => {
                // Directory attributes are not stored; accepted for writers.
                self.gate(c, path, true)?;
                return self.attr_of(c, &key, ino);
            }
            Key::Root | Key::Accounts | Key::CtxfsDir => return self.attr_of(c, &key, ino),
            Key::Virtual(v) if !crate::core::features::owner(v)?.takes_writes(v) => {
                return Err(crate::core::features::owner(v)?.setattr(self, c, v));
            }
            Key::Virtual(v)
                if sa.mode.is_none()
                    && sa.size == Some(0)
                    && crate::core::features::owner(v)?.takes_writes(v) =>
            {
                return self.attr_of(c, &key, ino)
            }
            _ => return Err(Error::NotPermitted("read-only virtual file")),
        };
        self.gate(c, &node, true)?;
        if sa.uid.is_some_and(|u| u != c.uid) || sa.gid.is_some_and(|g| g != c.gid) {
            return Err(Error::NotPermitted(
                "files belong to their account; chown is refused",
            ));
        }
        let from_handle = fh
            .and_then(|fh| self.handle(fh).ok())
            .and_then(|h| match &*h {
                Handle::Draft(d) => Some(d.file.clone()),
                _ => None,
            });
        let file = match from_handle {
            Some(f) => f,
            None => {
                let _g = self.drafts.stripe(&node);
                self.cow(&node, &name, None)?
            }
        };
        {
            let mut f = write_lock(&file);
            if let Some(size) = sa.size {
                self.check_growth(place::account_of(&node), f.data.len() as u64, size)?;
            }
            f.set_attr(&sa)?;
        }
        let f = read_lock(&file);
        Ok(self
            .shown
            .file(ino, f.data.len() as u64, f.mode, f.mtime, false))
    }

    pub fn access(&self, c: Caller, ino: u64, mask: i32) -> Result<()> {
        let key = self.key_of(ino)?;
        let attr = self.attr_of(c, &key, ino)?;
        if mask & libc::W_OK != 0 {
            match &key {
                Key::Dir(p) => {
                    self.gate(c, p, true)?;
                }
                Key::File { node, .. } | Key::Draft { node, .. } => {
                    self.gate(c, node, true)?;
                }
                Key::Virtual(v) => crate::core::features::owner(v)?.writable(self, c, v)?,
                _ => return Err(Error::AccessDenied),
            }
        }
        if mask & libc::X_OK != 0 && attr.kind == Kind::File {
            return Err(Error::AccessDenied);
        }
        Ok(())
    }
}
