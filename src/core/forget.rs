//! An administrator's delete of a whole account, or of one user's or
//! agent's memory (seed 002 `delete_account_data`, `delete_by_owner_space`),
//! in one transaction: every node with its history and expiry (each with its
//! `DELETE_CONTEXT` event, so the index forgets it), every draft, the
//! containers, and for an account its projects' shared areas.

use super::Fs;
use crate::error::{Error, Result};
use crate::schema::place::{self, DirPlace};
use crate::store::Op;

/// What a delete removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Deleted {
    pub nodes: usize,
    pub drafts: usize,
    pub containers: usize,
    /// Conversations stored in the users' inboxes.
    pub conversations: usize,
    /// Every other file kept beside the tree: scratchpad entries, the
    /// inboxes' job records and hashes.
    pub scratch_entries: usize,
}

impl Fs {
    /// Delete everything under `prefix` (`acme`, `acme/users/alice` or
    /// `acme/agents/bot`) in one durable transaction.
    pub fn delete_subtree(&self, prefix: &str) -> Result<Deleted> {
        let comps = place::split(prefix);
        let ok = match comps.len() {
            1 => place::classify_dir(&comps) == Ok(DirPlace::Account),
            3 => {
                matches!(comps[1], "users" | "agents")
                    && place::classify_dir(&comps) == Ok(DirPlace::Container)
            }
            _ => false,
        };
        if !ok {
            return Err(Error::Invalid(format!(
                "{} is not an account, a user or an agent",
                crate::schema::excerpt(prefix)
            )));
        }
        let under = |p: &str| p == prefix || p.starts_with(&format!("{prefix}/"));
        let mut done = Deleted::default();
        let mut ops = Vec::new();
        let mut recs = Vec::new();
        self.store.scan_nodes(&mut |r| {
            if under(&r.path) {
                recs.push(r);
            }
            Ok(())
        })?;
        for r in &recs {
            ops.extend(self.remove_ops(&r.path, r)?);
            done.nodes += 1;
        }
        for (path, _) in self.drafts.snapshot() {
            if under(&path) {
                ops.push(Op::DelDraft { path });
                done.drafts += 1;
            }
        }
        // Containers, deepest first; and the shared areas of projects.
        let mut dirs = Vec::new();
        let mut stack = vec![prefix.to_string()];
        while let Some(d) = stack.pop() {
            for child in self.store.list_dirs(&d)? {
                stack.push(format!("{d}/{child}"));
            }
            // Fixed directories (users/, memories/...) hold containers too.
            let comps = place::split(&d);
            if let Ok(placed) = place::classify_dir(&comps) {
                for f in place::fixed_children(&comps, &placed) {
                    stack.push(format!("{d}/{}", f.name()));
                }
            }
            dirs.push(d);
        }
        let mut scratch = Vec::new();
        let mut sstack: Vec<String> = dirs
            .iter()
            .filter(|d| super::scratch::is_project(d))
            .flat_map(|p| {
                [
                    format!("{p}/{}", crate::schema::names::SCRATCHPAD),
                    format!("{p}/{}", crate::schema::names::ACTIVITY_LOG),
                ]
            })
            .collect();
        // A user's inbox: conversations, their jobs and content hashes.
        for u in dirs.iter().filter(|d| super::inbox::is_user(d)) {
            let inbox = format!("{u}/{}", super::inbox::INBOX);
            sstack.extend(super::inbox::stored_dirs(&inbox));
        }
        // Directory summaries written by the LLM.
        sstack.extend(dirs.iter().map(|d| super::inbox::summaries::row_path(d)));
        while let Some(s) = sstack.pop() {
            for (name, _) in self.store.list_scratch(&s)? {
                sstack.push(format!("{s}/{name}"));
            }
            if self.store.get_scratch(&s)?.is_some() {
                scratch.push(s);
            }
        }
        for path in scratch {
            // A stored conversation's messages leave the index with it.
            if super::inbox::is_conversation_path(&path) {
                if let Some(conv) = self.stored_conversation(&path)? {
                    ops.extend(self.message_event_ops(&path, &conv, None)?);
                }
                ops.extend(self.conversation_bytes_op(&path)?);
                done.conversations += 1;
            } else {
                done.scratch_entries += 1;
            }
            ops.push(Op::DelScratch { path });
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
        for path in dirs {
            if self.store.dir_exists(&path)? {
                ops.push(Op::DelDir { path });
                done.containers += 1;
            } else if path == prefix {
                // An account of the config has no stored directory: its
                // delete still destroys its keys on an encrypted store.
                ops.push(Op::DelDir { path });
            }
        }
        ops.extend(self.audit_ops(
            comps[0],
            super::commit::rules::By {
                uid: 0,
                via: "delete",
            },
            serde_json::json!({
                "op": "admin-delete",
                "prefix": prefix,
                "nodes": done.nodes,
            }),
        )?);
        self.store.apply(ops, true)?;
        self.as_of.forget_account(place::account_of(prefix));
        for r in &recs {
            self.set_expiry(&r.path, None);
        }
        for (path, _) in self.drafts.snapshot() {
            if under(&path) {
                self.drafts.remove(&path);
            }
        }
        self.notify_index();
        Ok(done)
    }
}
