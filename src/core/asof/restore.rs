//! `.as-of/T/restore` and `ctxfs restore --as-of`: a subtree committed
//! again as it was at T, every node or none.

use crate::config::Access;
use crate::core::{Caller, Control, Fs, Handle, Opened, RestoreHandle};
use crate::error::{Error, Result};
use crate::schema::place::{self, NODE_FILES};
use crate::store::{NodeRec, Status};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

const RESTORE_HELP: &str = "Write a path of this account here (users/alice, \
users/alice/memories/notes/x, or / for all of it) to commit every node under it \
that has changed since this time as it was then, each as its next version, in one \
transaction:\n  echo users/alice > restore\nNodes made since are left as they are; \
deleted nodes have no past. Reading this file after a restore gives its result.\n";

impl Fs {
    /// Do two versions of a node hold the same files and status (their
    /// `.meta.json` aside, which says when and which version)?
    fn same_files(&self, a: &NodeRec, b: &NodeRec) -> Result<bool> {
        if a.status != b.status {
            return Ok(false);
        }
        for name in NODE_FILES.iter().filter(|n| **n != place::META) {
            match (a.file(name), b.file(name)) {
                (None, None) => {}
                (Some(x), Some(y)) if x.blob == y.blob => {}
                (Some(x), Some(y)) if x.size == y.size => {
                    let one = self.store.read_blob(a.account(), x.blob, x.size)?;
                    if one != self.store.read_blob(b.account(), y.blob, y.size)? {
                        return Ok(false);
                    }
                }
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// What reading a view's `restore` gives `c`: the rules, then its last
    /// restore's result in this account.
    pub(super) fn as_of_restore_text(&self, c: Caller, account: &str) -> String {
        match self.as_of.restored.get(account, c.uid) {
            Some(r) => format!(
                "{RESTORE_HELP}\nLast restore:\n{}",
                String::from_utf8_lossy(&r)
            ),
            None => RESTORE_HELP.to_string(),
        }
    }

    /// Open `.as-of/T/restore`: read, the rules and the last result; write,
    /// a path to restore (writers).
    pub(in crate::core) fn as_of_restore_open(
        &self,
        c: Caller,
        account: &Arc<str>,
        at: i128,
        write: bool,
    ) -> Result<Opened> {
        if write {
            self.gate_writes_in(c, account)?;
            let fh = self.new_handle(Handle::Restore(RestoreHandle::new(
                account.clone(),
                Control::RestoreAsOf { at },
                c.by(Some("restore")),
            )));
            return Ok(Opened {
                fh,
                direct_io: true,
                keep_cache: false,
                no_flush: false,
            });
        }
        self.gate(c, account, false)?;
        let text = self.as_of_restore_text(c, account);
        let fh = self.new_handle(Handle::Data(Arc::from(text.into_bytes())));
        Ok(Opened {
            fh,
            direct_io: true,
            keep_cache: false,
            no_flush: true,
        })
    }

    /// Commit every node of `account` under the path written (`data`) that
    /// changed since `at` as it was then, each as its next version, in one
    /// transaction. Nodes made since are left alone; the result (a JSON
    /// line per node) is kept for the writer to read.
    pub(in crate::core) fn restore_as_of(
        &self,
        account: &str,
        at: i128,
        data: &[u8],
        by: crate::core::commit::rules::By,
    ) -> Result<()> {
        let text = String::from_utf8_lossy(data);
        let rel = text.trim().trim_matches('/');
        if rel.contains(['\n', '\0']) || rel.split('/').any(|c| c == "." || c == "..") {
            return Err(Error::Invalid(format!(
                "{} is not a path of the account (write e.g. `echo users/alice > restore`)",
                crate::schema::excerpt(text.trim())
            )));
        }
        let prefix = if rel.is_empty() {
            account.to_string()
        } else {
            format!("{account}/{rel}")
        };
        // A user's or an agent's uid restores inside its own part only.
        let may_write = |p: &str| {
            self.tenancy
                .access_at(by.uid, account, place::in_account(p))
                == Access::Write
        };
        if !may_write(&prefix) {
            return Err(Error::AccessDenied);
        }
        // Built now: a restore acts on what is there at this moment.
        self.as_of.forget(account, at);
        let view = self.as_of_view(account, at)?;
        let under = |p: &str| p == prefix || p.starts_with(&format!("{prefix}/"));
        if !view.is_dir(&prefix) && view.node(&prefix).is_none() {
            return Err(Error::NotFound);
        }
        let mut lines: Vec<Value> = Vec::new();
        let mut drafts = Vec::new();
        for (then, placed) in view.nodes.iter().filter(|(p, _)| under(p)) {
            let Some(cur) = self.live_node(&placed.now)? else {
                continue;
            };
            if cur.id != placed.id {
                continue;
            }
            let shown = place::in_account(&placed.now).to_string();
            if !may_write(&placed.now) {
                lines.push(json!({"node": shown, "skipped": "moved since to where this uid may not write"}));
                continue;
            }
            let old = if cur.version == placed.version {
                cur.clone()
            } else {
                match self
                    .store
                    .get_version(cur.account(), cur.id, placed.version)?
                {
                    Some(old) => old,
                    None => continue,
                }
            };
            // Restored already, or changed and changed back: nothing to do.
            if self.same_files(&cur, &old)? {
                lines.push(json!({"node": shown, "version": cur.version, "unchanged": true}));
                continue;
            }
            if old.status == Status::Broken {
                lines.push(
                    json!({"node": shown, "skipped": format!("version {} is BROKEN", old.version)}),
                );
                continue;
            }
            let mut line = json!({"node": shown, "restored_from": old.version});
            if **then != *placed.now {
                line["was_at"] = Value::from(place::in_account(then));
            }
            lines.push(line);
            drafts.push((
                placed.now.to_string(),
                cur.clone(),
                self.restore_draft(&cur, &old, by)?,
            ));
        }
        // The nodes made since under the path are left as they are; the
        // result says which.
        let then_ids: BTreeSet<u64> = view.nodes.values().map(|p| p.id).collect();
        let mut todo = vec![prefix.clone()];
        while let Some(dir) = todo.pop() {
            if place::classify_dir(&place::split(&dir)) == Ok(place::DirPlace::Node) {
                continue;
            }
            for (name, cur) in self.store.list_nodes(&dir)? {
                if !then_ids.contains(&cur.id) && !self.expired(&cur.path) {
                    let shown = place::in_account(&format!("{dir}/{name}")).to_string();
                    lines.push(json!({"node": shown, "made_since": true, "left": true}));
                }
            }
            for sub in self.subdirs(&dir)? {
                todo.push(format!("{dir}/{sub}"));
            }
        }
        if drafts.len() > crate::core::commit::MAX_BATCH_NODES {
            return Err(Error::Invalid(format!(
                "{} nodes changed since then under {rel:?}; restore at most {} at once (a narrower path)",
                drafts.len(),
                crate::core::commit::MAX_BATCH_NODES
            )));
        }
        let n = drafts.len();
        let versions = if drafts.is_empty() {
            Vec::new()
        } else {
            self.commit_all_or_none(account, drafts, crate::core::commit::Intent::Restore)?
        };
        let mut vs = versions.into_iter();
        for l in lines
            .iter_mut()
            .filter(|l| l.get("restored_from").is_some())
        {
            if let Some(v) = vs.next() {
                l["version"] = Value::from(v);
            }
        }
        let mut out = String::new();
        for l in &lines {
            out.push_str(&l.to_string());
            out.push('\n');
        }
        self.as_of.restored.keep(account, by.uid, out.into_bytes());
        tracing::info!(account, prefix = rel, nodes = n, "restored as of a time");
        Ok(())
    }
}
