//! `ctxfs export` and `ctxfs import`: every ACTIVE node as a plain directory
//! tree in the seed 000 layout (`accounts/{a}/users/{u}/memories/{c}/{slug}/`
//! with the five node files), and back.
//!
//! An import commits each node through the normal commit (checks,
//! redaction, derived fields, outbox events), keeping the exported
//! `version`, `created_at`, `updated_at` and summary marks, so export →
//! import → export gives the same bytes.

use super::commit::{Committed, Intent};
use super::draft::{DFile, Draft, Slot};
use super::{commit, Fs};
use crate::error::{Error, Result};
use crate::schema::place::{self, DirPlace, META, NODE_FILES};
use crate::schema::time::now_ns;
use crate::schema::time::ns_of;
use crate::store::{NodeRec, Status};
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// What an imported node keeps from its export.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    pub version: u32,
    pub created_at: String,
    pub updated_at: String,
    pub updated_ns: i128,
    pub derived: Vec<String>,
    pub redacted: u64,
}

/// One node read from an export, checked as far as a commit would check it.
#[derive(Debug)]
pub struct ImportNode {
    /// Path under `accounts/`.
    pub node: String,
    pub files: Vec<(String, Vec<u8>)>,
    pub imported: Imported,
}

/// Check the files of node directory `node` (path under `accounts/`) and
/// read what the import keeps; `Err` is the reason it cannot be imported.
pub fn check_import(node: &str, files: Vec<(String, Vec<u8>)>) -> Result<ImportNode, String> {
    let comps = place::split(node);
    match place::classify_dir(&comps) {
        Ok(DirPlace::Node) => {}
        Ok(_) => return Err("not a node place (a container or structural directory)".into()),
        Err(e) => return Err(e.to_string()),
    }
    for (name, _) in &files {
        if !NODE_FILES.contains(&name.as_str()) {
            return Err(format!("{name:?} is not a node file"));
        }
    }
    let get = |n: &str| files.iter().find(|(f, _)| f == n).map(|(_, b)| b);
    let meta = get(META).ok_or(".meta.json is missing")?;
    let obj = match commit::rules::parse_meta(meta)? {
        commit::rules::MetaIntent::Commit(Status::Active | Status::Archived, o) => o,
        _ => return Err(".meta.json has no ACTIVE or ARCHIVED status".into()),
    };
    if get(place::CONTENT).is_none() {
        return Err("content.md is missing".into());
    }
    let mut size = 0;
    for (name, bytes) in &files {
        match name.as_str() {
            place::ABSTRACT => commit::rules::check_abstract(bytes)?,
            place::RELATIONS => {
                commit::rules::check_relations(bytes, node)?;
            }
            _ => {
                commit::rules::check_utf8(name, bytes)?;
            }
        }
        if name != META {
            size += bytes.len() as u64;
        }
    }
    if size > crate::schema::derive::NODE_BUDGET_BYTES {
        return Err(format!(
            "the node's files hold {size} bytes; a node holds at most {}",
            crate::schema::derive::NODE_BUDGET_BYTES
        ));
    }
    let mut check = obj.clone();
    super::ttl::expiry_of(&mut check, now_ns())?;
    let time = |k: &str| -> Result<(String, i128), String> {
        match obj.get(k) {
            None => {
                let now = now_ns();
                Ok((crate::schema::time::rfc3339(now), now))
            }
            Some(Value::String(s)) => humantime::parse_rfc3339_weak(s)
                .map(|t| (crate::schema::time::rfc3339(ns_of(t)), ns_of(t)))
                .map_err(|e| {
                    format!(
                        "{k} {} is not an RFC 3339 time: {e}",
                        crate::schema::excerpt(s)
                    )
                }),
            Some(v) => Err(format!("{k} must be a string, not {v}")),
        }
    };
    let (created_at, _) = time("created_at")?;
    let (updated_at, updated_ns) = time("updated_at")?;
    let version = match obj.get("version") {
        None => 1,
        Some(v) => v
            .as_u64()
            .filter(|v| (1..=u32::MAX as u64).contains(v))
            .ok_or(format!("version must be a whole number from 1, not {v}"))?
            as u32,
    };
    let derived = obj
        .get("derived")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter(|s| *s == "abstract" || *s == "overview")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let redacted = obj.get("redacted").and_then(Value::as_u64).unwrap_or(0);
    Ok(ImportNode {
        node: node.to_string(),
        files,
        imported: Imported {
            version,
            created_at,
            updated_at,
            updated_ns,
            derived,
            redacted,
        },
    })
}

impl Fs {
    /// Every ACTIVE, unexpired node, in path order.
    pub fn export_nodes(&self) -> Result<Vec<NodeRec>> {
        let mut out = Vec::new();
        self.store.scan_nodes(&mut |r| {
            if r.status == Status::Active && !self.expired(&r.path) {
                out.push(r);
            }
            Ok(())
        })?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The files of a committed version, in protocol order.
    pub fn node_files(&self, rec: &NodeRec) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        for name in NODE_FILES {
            if let Some(f) = rec.file(name) {
                out.push((
                    name.to_string(),
                    self.store.read_blob(rec.account(), f.blob, f.size)?,
                ));
            }
        }
        Ok(out)
    }

    /// Is there a node (or a draft of one) at `node` already?
    pub fn node_exists(&self, node: &str) -> Result<bool> {
        Ok(self.live_node(node)?.is_some() || self.draft(node).is_some())
    }

    /// Commit one checked node of an export, whole or not at all.
    pub fn import_node(&self, n: &ImportNode) -> Result<u32> {
        let _g = self.drafts.stripe(&n.node);
        if self.live_node(&n.node)?.is_some() || self.draft(&n.node).is_some() {
            return Err(Error::Exists);
        }
        let mut draft = Draft::new(None);
        // An exported version keeps who made it (a lossless round trip);
        // one without says it was imported.
        let exported = n
            .files
            .iter()
            .find(|(name, _)| name == META)
            .and_then(|(_, b)| serde_json::from_slice::<serde_json::Value>(b).ok())
            .and_then(|m| {
                let b = &m["committed_by"];
                let uid = u32::try_from(b["uid"].as_u64()?).ok()?;
                let via = super::commit::rules::VIAS
                    .iter()
                    .find(|v| b["via"] == **v)?;
                Some(super::commit::rules::By { uid, via })
            });
        draft.by = Some(exported.unwrap_or(super::commit::rules::By {
            uid: 0,
            via: "import",
        }));
        for (name, bytes) in &n.files {
            draft
                .files
                .insert(name.clone(), Slot::File(DFile::new(bytes.clone(), 0o644)));
        }
        let draft = Arc::new(Mutex::new(draft));
        match self.commit_as(&n.node, &draft, Intent::Import(&n.imported), None)? {
            Committed::Version(v) => Ok(v),
            Committed::StillPending => Err(Error::Invalid(
                ".meta.json does not commit (no ACTIVE or ARCHIVED status)".into(),
            )),
        }
    }
}
