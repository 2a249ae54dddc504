//! Changes to the tree: `mkdir`, `rmdir`, `unlink` and `rename` of files,
//! nodes and containers, with the store operations of deletes and moves.

use crate::config::Access;
use crate::core::inbox;
use crate::core::ops::join;
use crate::core::ops::view_names;
use crate::core::ops::Intent;
use crate::core::ops::Key;
use crate::core::scratch;
use crate::core::Attr;
use crate::core::Caller;
use crate::core::DFile;
use crate::core::Draft;
use crate::core::Fs;
use crate::core::Slot;
use crate::error::Error;
use crate::error::Result;
use crate::locks::lock;
use crate::schema::counters;
use crate::schema::event::Change;
use crate::schema::event::OutboxEvent;
use crate::schema::place;
use crate::schema::place::DirPlace;
use crate::schema::place::META;
use crate::schema::time::now_ns;
use crate::schema::time::rfc3339_ms;
use crate::store::NodeRec;
use crate::store::Op;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::RwLock;

impl Fs {
    /// The path of directory `name` in `parent`, for a change by writer `c`
    /// (mkdir, rmdir). Node directories hold no directories: `Invalid`.
    pub(in crate::core) fn dir_child(&self, c: Caller, parent: u64, name: &str) -> Result<String> {
        let path = match self.key_of(parent)? {
            Key::Accounts => name.to_string(),
            Key::Dir(p) => {
                // The directory itself is what changes: a user's uid makes
                // its own user's directory in `users/`.
                self.gate(c, &p, false)?;
                if place::classify_dir(&place::split(&p))? == DirPlace::Node {
                    return Err(Error::Invalid("node directories hold files only".into()));
                }
                join(&p, name)
            }
            Key::Root | Key::CtxfsDir => return Err(Error::NotPermitted("fixed directory")),
            _ => return Err(Error::NotPermitted("virtual directory")),
        };
        self.gate(c, &path, true)?;
        Ok(path)
    }

    pub fn mkdir(&self, c: Caller, parent: u64, name: &str) -> Result<Attr> {
        let pkey = self.key_of(parent)?;
        if let Key::Virtual(dir) = &pkey {
            self.refuse_in_read_only(&pkey)?;
            crate::core::features::owner(dir)?.mkdir(self, c, dir, name, 0o755)?;
            return self.lookup(c, parent, name);
        }
        if pkey == Key::Accounts {
            place::check_name(name)?;
        }
        let path = self.dir_child(c, parent, name)?;
        let comps = place::split(&path);
        match place::classify_dir(&comps)? {
            DirPlace::Fixed(_) => return Err(Error::Exists),
            DirPlace::Account | DirPlace::Container => {
                if self.dir_present(&path, &comps)? {
                    return Err(Error::Exists);
                }
                let mut ops = self.container_ops(&path);
                ops.push(Op::PutDir { path: path.clone() });
                self.store.apply(ops, false)?;
                self.invalidate_views(&path);
            }
            DirPlace::Node => {
                let _g = self.drafts.stripe(&path);
                if self.live_node(&path)?.is_some() || self.draft(&path).is_some() {
                    return Err(Error::Exists);
                }
                self.drafts.insert(path.clone(), Draft::new(None));
            }
        }
        self.lookup(c, parent, name)
    }

    pub fn rmdir(&self, c: Caller, parent: u64, name: &str) -> Result<()> {
        self.rmdir_at(c, parent, name)?;
        self.detach_removed(parent, name);
        Ok(())
    }

    /// After a removal of `name` under `parent`: the inodes the kernel may
    /// still hold for it no longer own its place (`Inodes::detach`).
    fn detach_removed(&self, parent: u64, name: &str) {
        let Ok(pkey) = self.key_of(parent) else {
            return;
        };
        let mut inodes = lock(&self.kernel.inodes);
        match pkey {
            Key::Dir(p) => {
                let path: Arc<str> = Arc::from(join(&p, name));
                inodes.detach(&Key::Dir(path.clone()));
                inodes.detach(&scratch::key(&path));
                inodes.detach(&Key::Draft {
                    node: p,
                    name: Arc::from(name),
                });
            }
            ref k => {
                if let Some(dir) = scratch::entry_of(k) {
                    inodes.detach(&scratch::key(&join(dir, name)));
                }
            }
        }
    }

    fn rmdir_at(&self, c: Caller, parent: u64, name: &str) -> Result<()> {
        let pkey = self.key_of(parent)?;
        // A feature's directory in the tree answers for itself.
        if let Some(Ok((Key::Virtual(v), _))) = self.feature_lookup(c, &pkey, name) {
            if let Some(r) = crate::core::features::owner(&v)?.rmdir(self, c, &v) {
                return r;
            }
        }
        if let Key::Virtual(dir) = &pkey {
            self.refuse_in_read_only(&pkey)?;
            return crate::core::features::owner(dir)?.rmdir_in(self, c, dir, name);
        }
        let path = match self.dir_child(c, parent, name) {
            Err(Error::Invalid(_)) if name == place::OUTBOX => {
                return Err(Error::NotPermitted("virtual directory"))
            }
            Err(Error::Invalid(_)) => return Err(Error::NotFound),
            r => r?,
        };
        let comps = place::split(&path);
        let placed = match place::classify_dir(&comps) {
            Ok(p) => p,
            Err(_) => return Err(Error::NotFound),
        };
        match placed {
            DirPlace::Node => self.delete_node(c, &path),
            DirPlace::Fixed(_) | DirPlace::Account | DirPlace::Container => {
                if !self.dir_present(&path, &comps)? {
                    return Err(Error::NotFound);
                }
                if placed == DirPlace::Account && self.tenancy.is_configured(&path) {
                    return Err(Error::NotPermitted("the account is defined by the config"));
                }
                if self.subtree_holds(&path)?
                    || (scratch::is_project(&path) && self.project_busy(&path)?)
                {
                    return Err(Error::NotEmpty);
                }
                self.discard_pending_under(c, &path)?;
                match placed {
                    // Structural directories are implicit: an empty one is
                    // "removed" and shows again, so `rm -r` of an owner works.
                    DirPlace::Fixed(_) => Ok(()),
                    // A summary the LLM wrote of it goes with it.
                    _ => {
                        self.store.apply(
                            vec![
                                Op::DelScratch {
                                    path: inbox::summaries::row_path(&path),
                                },
                                Op::DelDir { path: path.clone() },
                            ],
                            true,
                        )?;
                        self.invalidate_views(&path);
                        Ok(())
                    }
                }
            }
        }
    }

    /// Has the subtree at `path` any committed node or container? (Drafts
    /// of never-committed nodes go with it: `discard_pending_under`.)
    fn subtree_holds(&self, path: &str) -> Result<bool> {
        if self.store.has_children(path)? {
            return Ok(true);
        }
        // Fixed children (users/, memories/...) are stored under their own path.
        let comps = place::split(path);
        if let Ok(placed) = place::classify_dir(&comps) {
            for f in place::fixed_children(&comps, &placed) {
                if self.subtree_holds(&join(path, f.name()))? {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Removing a directory that holds no committed node or container
    /// discards the drafts of the never-committed nodes under it: a PENDING
    /// node is in no listing, so `rm -r` cannot reach it to remove it by
    /// its path (as its writer could). Only a writer of the account.
    fn discard_pending_under(&self, c: Caller, path: &str) -> Result<()> {
        let pending = self.drafts.nodes_under(&format!("{path}/"));
        if pending.is_empty() {
            return Ok(());
        }
        self.gate(c, path, true)?;
        for node in pending {
            let _g = self.drafts.stripe(&node);
            // Committed meanwhile: a node the directory now holds.
            if self.store.get_node(&node)?.is_some() {
                return Err(Error::NotEmpty);
            }
            self.store
                .apply(vec![Op::DelDraft { path: node.clone() }], true)?;
            self.drafts.remove(&node);
            tracing::info!(node = %node, "draft of a never-committed node discarded with its directory");
        }
        Ok(())
    }

    pub(in crate::core) fn delete_node(&self, c: Caller, node: &str) -> Result<()> {
        let _g = self.drafts.stripe(node);
        let rec = self.live_node(node)?;
        let draft = self.draft(node);
        if rec.is_none() && draft.is_none() {
            return Err(Error::NotFound);
        }
        {
            let guard = draft.as_ref().map(|d| lock(d));
            if !view_names(rec.as_ref(), guard.as_deref()).is_empty() {
                return Err(Error::NotEmpty);
            }
        }
        let mut ops = vec![Op::DelDraft {
            path: node.to_string(),
        }];
        if let Some(rec) = &rec {
            ops.extend(self.remove_ops(node, rec)?);
            ops.extend(self.write_quota_ops(node, 0)?);
            ops.extend(self.audit_ops(
                place::account_of(node),
                c.by(None),
                serde_json::json!({
                    "op": "delete",
                    "node": place::in_account(node),
                    "version": rec.version,
                }),
            )?);
        }
        self.store.apply(ops, true)?;
        self.notify_index();
        self.set_expiry(node, None);
        self.drafts.remove(node);
        self.invalidate_views(node);
        self.as_of.forget_account(place::account_of(node));
        self.metrics.nodes.deletes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The ops that remove committed node `rec` at `node` with its history,
    /// its expiry and its `DELETE_CONTEXT` event (delete, expiry sweep, and
    /// a commit over an expired node).
    pub(in crate::core) fn remove_ops(&self, node: &str, rec: &NodeRec) -> Result<Vec<Op>> {
        let account = place::account_of(node).to_string();
        let seq = self.ids.event()?;
        let freed = self.history_bytes(rec)?;
        let mut ops = vec![
            Op::DelNode {
                path: node.to_string(),
            },
            Op::DropHistory { node_id: rec.id },
            Op::Count {
                key: crate::schema::counters::nodes_key(&account, rec.status),
                delta: -1,
            },
            Op::Count {
                key: counters::bytes_key(&account),
                delta: -(freed as i64),
            },
            Op::PutEvent {
                seq,
                node_path: node.to_string(),
                account,
                json: self.event(seq, node, Change::DeleteContext {}),
            },
            Op::HighWater {
                key: counters::EVENT_ID.into(),
                value: seq,
            },
        ];
        if self.expiry_at(node).is_some() {
            ops.push(Op::DelExpiry {
                path: node.to_string(),
            });
        }
        Ok(ops)
    }

    /// Bytes the versions of a node hold in the store (each blob once).
    pub(in crate::core) fn history_bytes(&self, rec: &NodeRec) -> Result<u64> {
        let mut seen = std::collections::HashSet::new();
        let mut total = 0;
        for v in 1..=rec.version {
            let r = if v == rec.version {
                Some(rec.clone())
            } else {
                self.store.get_version(rec.account(), rec.id, v)?
            };
            for f in r.map(|r| r.files).unwrap_or_default() {
                if seen.insert(f.blob) {
                    total += f.size;
                }
            }
        }
        Ok(total)
    }

    pub fn unlink(&self, c: Caller, parent: u64, name: &str) -> Result<()> {
        self.unlink_at(c, parent, name)?;
        self.detach_removed(parent, name);
        Ok(())
    }

    fn unlink_at(&self, c: Caller, parent: u64, name: &str) -> Result<()> {
        let pkey = self.key_of(parent)?;
        self.refuse_in_read_only(&pkey)?;
        if let Key::Virtual(dir) = &pkey {
            return crate::core::features::owner(dir)?.unlink_in(self, c, dir, name);
        }
        let Key::Dir(node) = &pkey else {
            return Err(Error::NotPermitted("virtual directory"));
        };
        self.gate(c, node, true)?;
        // A feature's name is its to remove (or refuse).
        if let Some(k) = self.feature_lookup(c, &pkey, name) {
            return match k?.0 {
                Key::Virtual(v) => crate::core::features::owner(&v)?.unlink(self, c, &v),
                _ => Err(Error::IsDir),
            };
        }
        if place::classify_dir(&place::split(node))? != DirPlace::Node {
            return self.child_key(c, &pkey, name).and(Err(Error::IsDir));
        }
        let _g = self.drafts.stripe(node);
        let rec = self.live_node(node)?;
        let in_committed = rec.as_ref().and_then(|r| r.file(name)).is_some();
        let draft = match self.draft(node) {
            Some(d) => d,
            None if in_committed => self.draft_or_new(node, rec.as_ref()),
            None => return Err(Error::NotFound),
        };
        let mut d = lock(&draft);
        match d.files.get(name) {
            Some(Slot::Whiteout) => return Err(Error::NotFound),
            Some(Slot::File(_)) => {
                d.files.remove(name);
            }
            None if !in_committed => return Err(Error::NotFound),
            None => {}
        }
        if in_committed {
            d.files.insert(name.to_string(), Slot::Whiteout);
        }
        d.touch();
        Ok(())
    }

    pub fn rename(
        &self,
        c: Caller,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        noreplace: bool,
    ) -> Result<()> {
        let (pk, nk) = (self.key_of(parent)?, self.key_of(newparent)?);
        self.refuse_in_read_only(&pk)?;
        self.refuse_in_read_only(&nk)?;
        // A feature's name in a directory of the tree answers for itself.
        if let Key::Dir(_) = &pk {
            if let Some(Ok((Key::Virtual(v), _))) = self.feature_lookup(c, &pk, name) {
                if let Some(r) = crate::core::features::owner(&v)?.renamed(self, c, &v) {
                    return r;
                }
            }
        }
        if let (Key::Virtual(from), Key::Virtual(to)) = (&pk, &nk) {
            if from.feature == to.feature {
                let f = crate::core::features::owner(from)?;
                return f.rename(self, c, from, name, to, newname, noreplace);
            }
        }
        for dir in [&pk, &nk] {
            if let Key::Virtual(v) = dir {
                if let Some(e) = crate::core::features::owner(v)?.rename_across(self, c, v) {
                    return Err(e);
                }
            }
        }
        let (Key::Dir(sp), Key::Dir(dp)) = (pk, nk) else {
            return Err(Error::NotPermitted(
                "only files and directories of accounts can be renamed",
            ));
        };
        let (sa, da) = (place::account_of(&sp), place::account_of(&dp));
        // Both ends, whole: a user's uid moves nothing into or out of its part.
        self.gate(c, &join(&sp, name), true)?;
        self.gate(c, &join(&dp, newname), true)?;
        if sa != da {
            return Err(Error::CrossDevice);
        }
        let s_place = place::classify_dir(&place::split(&sp))?;
        let d_place = place::classify_dir(&place::split(&dp))?;
        if s_place == DirPlace::Node {
            if d_place != DirPlace::Node {
                return Err(Error::Invalid(
                    "node files can only move into another node directory".into(),
                ));
            }
            return self.rename_file(c, &sp, name, &dp, newname, noreplace);
        }
        let src = join(&sp, name);
        let dst = join(&dp, newname);
        match place::classify_dir(&place::split(&src)) {
            Ok(DirPlace::Node) => {}
            Ok(DirPlace::Fixed(_)) => return Err(Error::NotPermitted("structural directory")),
            Ok(_) => return Err(Error::CrossDevice),
            Err(_) => return Err(Error::NotFound),
        }
        if place::classify_dir(&place::split(&dst))? != DirPlace::Node {
            return Err(Error::Invalid(
                "a node can only move to a node place".into(),
            ));
        }
        self.move_node(c, &src, &dst, noreplace)
    }

    pub(in crate::core) fn rename_file(
        &self,
        c: Caller,
        sn: &str,
        sname: &str,
        dn: &str,
        dname: &str,
        noreplace: bool,
    ) -> Result<()> {
        for n in [sname, dname] {
            if n == place::OUTBOX || n == place::COMMIT_ERROR {
                return Err(Error::NotPermitted("reserved virtual name"));
            }
        }
        place::check_file_name(dname)?;
        let _g = self.drafts.lock_two(sn, dn);
        if self.node_for(dn, Access::Write).is_err() {
            return Err(Error::NotFound);
        }
        let file = self.cow(sn, sname, None)?;
        let s_rec = self.live_node(sn)?;
        let d_rec = self.live_node(dn)?;
        let sdraft = self.draft(sn).ok_or(Error::NotFound)?;
        let ddraft = self.draft_or_new(dn, d_rec.as_ref());
        let same = Arc::ptr_eq(&sdraft, &ddraft);
        if sn == dn && sname == dname {
            return Ok(());
        }
        let old_src;
        let old_dst;
        {
            let mut s = lock(&sdraft);
            let d_exists = |d: &Draft| match d.files.get(dname) {
                Some(Slot::File(_)) => true,
                Some(Slot::Whiteout) => false,
                None => d_rec.as_ref().and_then(|r| r.file(dname)).is_some(),
            };
            if same {
                if noreplace && d_exists(&s) {
                    return Err(Error::Exists);
                }
                old_src = s.files.get(sname).cloned();
                old_dst = s.files.get(dname).cloned();
                apply_move(&mut s, sname, s_rec.as_ref(), None, dname, &file);
            } else {
                let mut d = lock(&ddraft);
                if noreplace && d_exists(&d) {
                    return Err(Error::Exists);
                }
                old_src = s.files.get(sname).cloned();
                old_dst = d.files.get(dname).cloned();
                apply_move(&mut s, sname, s_rec.as_ref(), Some(&mut d), dname, &file);
            }
        }
        if dname == META {
            // A rename onto `.meta.json` commits, as its close would.
            lock(&ddraft).by = Some(c.by(None));
            if let Err(e) = self.commit_as(dn, &ddraft, Intent::Close, None) {
                let restore = |d: &mut Draft, name: &str, old: Option<Slot>| match old {
                    Some(s) => {
                        d.files.insert(name.to_string(), s);
                    }
                    None => {
                        d.files.remove(name);
                    }
                };
                let mut s = lock(&sdraft);
                if same {
                    restore(&mut s, dname, old_dst);
                    restore(&mut s, sname, old_src);
                } else {
                    restore(&mut s, sname, old_src);
                    drop(s);
                    restore(&mut lock(&ddraft), dname, old_dst);
                }
                return Err(e);
            }
            // The kernel holds this directory's lock until rename returns.
            self.invalidate_commit(dn, false);
        }
        Ok(())
    }

    pub(in crate::core) fn container_ops(&self, node: &str) -> Vec<Op> {
        place::ancestor_containers(&place::split(node))
            .into_iter()
            .map(|(p, n)| Op::PutDir { path: join(&p, &n) })
            .collect()
    }

    /// The stored JSON of outbox event `seq` of `node`, created now.
    pub(in crate::core) fn event(&self, seq: u64, node: &str, change: Change) -> Vec<u8> {
        OutboxEvent::new(seq, node, change, rfc3339_ms(now_ns())).encode()
    }
}

/// Move draft file `file` from `sname` of draft `s` to `dname` of draft `d`
/// (or of `s` itself when `d` is `None`).
fn apply_move(
    s: &mut Draft,
    sname: &str,
    s_rec: Option<&NodeRec>,
    d: Option<&mut Draft>,
    dname: &str,
    file: &Arc<RwLock<DFile>>,
) {
    if s_rec.and_then(|r| r.file(sname)).is_some() {
        s.files.insert(sname.to_string(), Slot::Whiteout);
    } else {
        s.files.remove(sname);
    }
    s.touch();
    let target = match d {
        Some(d) => d,
        None => s,
    };
    target
        .files
        .insert(dname.to_string(), Slot::File(file.clone()));
    target.touch();
}
