//! The Repair Job (seed 000, "Repair Job Branch Logic"), over drafts that
//! outlived their writer: persisted by `fsync` or at unmount, or left by a
//! daemon that was killed. Committed nodes (ACTIVE, ARCHIVED, BROKEN) are skipped.

use super::commit::{Committed, Intent};
use super::draft::{DFile, Slot};
use super::Fs;
use crate::error::Result;
use crate::locks::lock;
use crate::schema::place::{ABSTRACT, CONTENT, META, OVERVIEW, RELATIONS};
use crate::schema::time::now_ns;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Fs {
    /// Apply the seed's branches to every new-node draft untouched for `grace`.
    /// Returns one line per action.
    pub fn repair(&self, grace: Duration) -> Result<Vec<String>> {
        let cutoff = now_ns() - grace.as_nanos() as i128;
        let mut nodes: Vec<String> = self.drafts.snapshot().into_iter().map(|(k, _)| k).collect();
        nodes.sort();
        let mut actions = Vec::new();
        for node in nodes {
            let _g = self.drafts.stripe(&node);
            let Some(draft) = self.draft(&node) else {
                continue;
            };
            if self.store.get_node(&node)?.is_some() {
                continue; // an edit of a committed node: ACTIVE and BROKEN are skipped
            }
            let (has, modified) = {
                let d = lock(&draft);
                let has = |n: &str| matches!(d.files.get(n), Some(Slot::File(_)));
                (
                    [CONTENT, RELATIONS, ABSTRACT, OVERVIEW, META].map(has),
                    d.last_modified_ns(),
                )
            };
            if modified > cutoff {
                continue; // a writer may still be at work
            }
            let [content, relations, abstract_, overview, meta] = has;
            if !meta {
                if !content {
                    continue; // nothing to repair
                }
                lock(&draft).files.insert(
                    META.to_string(),
                    Slot::File(DFile::new(b"{\"status\":\"PENDING\"}\n".to_vec(), 0o644)),
                );
                actions.push(format!("{node}: orphan content.md, .meta.json recreated"));
            }
            if content {
                // As the AGFS failure table says: what an ordinary commit
                // of these files derives (abstract, overview) or takes as
                // empty (relations) completes the node.
                let missing: Vec<&str> = [RELATIONS, ABSTRACT, OVERVIEW]
                    .into_iter()
                    .zip([relations, abstract_, overview])
                    .filter(|(_, h)| !h)
                    .map(|(n, _)| n)
                    .collect();
                self.set_meta_status(&draft, "ACTIVE");
                lock(&draft).by = Some(super::commit::rules::By {
                    uid: 0,
                    via: "repair",
                });
                match self.commit_as(&node, &draft, Intent::Close, None) {
                    Ok(Committed::Version(v)) if missing.is_empty() => {
                        actions.push(format!(
                            "{node}: PENDING with all files, activated as version {v}"
                        ));
                        continue;
                    }
                    Ok(Committed::Version(v)) => {
                        actions.push(format!(
                            "{node}: PENDING without {}, completed as a commit would \
                             (summaries derived, no relations) and activated as version {v}",
                            missing.join(", ")
                        ));
                        continue;
                    }
                    Ok(Committed::StillPending) => {}
                    Err(e) => {
                        let reason = format!("activation refused: {e}");
                        self.commit_as(&node, &draft, Intent::Broken(&reason), None)?;
                        actions.push(format!("{node}: {reason}; marked BROKEN"));
                        continue;
                    }
                }
            } else {
                // Nothing can stand in for the content itself.
                let reason = format!("missing {CONTENT}: nothing to complete the node from");
                self.commit_as(&node, &draft, Intent::Broken(&reason), None)?;
                actions.push(format!("{node}: PENDING with {reason}; marked BROKEN"));
            }
        }
        self.metrics
            .nodes
            .repairs
            .fetch_add(actions.len() as u64, Ordering::Relaxed);
        for a in &actions {
            tracing::warn!(action = %a, "repair");
        }
        Ok(actions)
    }

    fn set_meta_status(
        &self,
        draft: &std::sync::Arc<std::sync::Mutex<super::Draft>>,
        status: &str,
    ) {
        let d = lock(draft);
        if let Some(Slot::File(f)) = d.files.get(META) {
            let mut f = crate::locks::write(f);
            let mut obj = match serde_json::from_slice::<serde_json::Value>(&f.data) {
                Ok(serde_json::Value::Object(o)) => o,
                _ => serde_json::Map::new(),
            };
            obj.insert("status".into(), serde_json::Value::String(status.into()));
            f.data = serde_json::to_vec(&obj).unwrap_or_default();
            f.recharge();
        }
    }
}
