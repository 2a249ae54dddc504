//! Expiring nodes (seed 001 "TTL semantics"): `.meta.json` may carry
//! `expires_at` (RFC 3339) or `ttl_seconds`. From that instant the node is
//! not found anywhere (lookup, listings, search, the memory map); the
//! sweeper deletes it later, with its `DELETE_CONTEXT` event.
//!
//! The expiry times live in the store (`Op::PutExpiry`) and in memory here,
//! so the check on every lookup is one map probe.

use super::Fs;
use crate::error::Result;
use crate::locks::lock;
use crate::locks::{read, write};
use crate::schema::place;
use crate::schema::time::now_ns;
use crate::store::Op;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::RwLock;

/// `expires_at` / `ttl_seconds` of a commit request, as ns since the epoch.
/// `ttl_seconds` is turned into `expires_at` (the stored `.meta.json` keeps
/// only the absolute time, so a later edit does not push it back).
pub fn expiry_of(obj: &mut Map<String, Value>, now: i128) -> Result<Option<u64>, String> {
    if let Some(ttl) = obj.remove("ttl_seconds") {
        let secs = ttl
            .as_u64()
            .filter(|s| (1..=100 * 365 * 86_400).contains(s))
            .ok_or_else(|| {
                format!(
                    "ttl_seconds must be a whole number of seconds from 1 to 100 years, not {}",
                    crate::schema::excerpt_json(&ttl)
                )
            })?;
        let at = now as u64 + secs * 1_000_000_000;
        obj.insert(
            "expires_at".into(),
            Value::String(crate::schema::time::rfc3339(at as i128)),
        );
        return Ok(Some(at));
    }
    match obj.get("expires_at") {
        None | Some(Value::Null) => {
            obj.remove("expires_at");
            Ok(None)
        }
        Some(Value::String(s)) => {
            let t = humantime::parse_rfc3339_weak(s).map_err(|e| {
                format!(
                    "expires_at {} is not an RFC 3339 time (e.g. 2027-01-31T12:00:00Z): {e}",
                    crate::schema::excerpt(s)
                )
            })?;
            let at = crate::schema::time::ns_of(t);
            if at <= now {
                return Err(format!(
                    "expires_at {} is in the past",
                    crate::schema::excerpt(s)
                ));
            }
            Ok(Some(at as u64))
        }
        Some(other) => Err(format!(
            "expires_at must be an RFC 3339 string, not {}",
            crate::schema::excerpt_json(other)
        )),
    }
}

/// The nodes with an expiry time (ns since the epoch), as in the store:
/// the check on every lookup is one map probe under a read lock.
#[derive(Default)]
pub(super) struct Expiry {
    map: RwLock<HashMap<String, u64>>,
}

impl Expiry {
    pub(super) fn load(&self, entries: impl IntoIterator<Item = (String, u64)>) {
        write(&self.map).extend(entries);
    }

    /// Take the store's expiry times as they are now (another daemon set some).
    pub(super) fn replace(&self, entries: impl IntoIterator<Item = (String, u64)>) {
        let mut map = write(&self.map);
        map.clear();
        map.extend(entries);
    }

    /// Has `node` expired at `now`? (False for nodes without an expiry.)
    fn expired(&self, node: &str, now: i128) -> bool {
        let map = read(&self.map);
        !map.is_empty() && map.get(node).is_some_and(|&at| at as i128 <= now)
    }

    fn at(&self, node: &str) -> Option<u64> {
        read(&self.map).get(node).copied()
    }

    fn any(&self) -> bool {
        !read(&self.map).is_empty()
    }

    fn set(&self, node: &str, at: Option<u64>) {
        let mut map = write(&self.map);
        match at {
            Some(at) => map.insert(node.to_string(), at),
            None => map.remove(node),
        };
    }

    /// The nodes whose expiry has passed at `now`.
    fn due(&self, now: i128) -> Vec<String> {
        read(&self.map)
            .iter()
            .filter(|(_, &at)| at as i128 <= now)
            .map(|(p, _)| p.clone())
            .collect()
    }
}

impl Fs {
    /// Has `node` expired? (False for nodes without an expiry.)
    pub(super) fn expired(&self, node: &str) -> bool {
        self.expiry.expired(node, now_ns())
    }

    /// Does `node` carry an expiry? Such nodes are never cached by the
    /// kernel, so they vanish the instant they expire.
    pub(super) fn expires(&self, node: &str) -> bool {
        self.expiry.at(node).is_some()
    }

    /// Does any node carry an expiry?
    pub(super) fn any_expiry(&self) -> bool {
        self.expiry.any()
    }

    pub(super) fn expiry_at(&self, node: &str) -> Option<u64> {
        self.expiry.at(node)
    }

    pub(super) fn set_expiry(&self, node: &str, at: Option<u64>) {
        self.expiry.set(node, at);
    }

    /// Delete every expired node (the sweeper; also `ctxfs`'s tests call it).
    /// Returns the paths removed.
    pub fn sweep_expired(&self) -> Result<Vec<String>> {
        let now = now_ns();
        let due = self.expiry.due(now);
        let mut swept = Vec::new();
        for node in due {
            let _g = self.drafts.stripe(&node);
            if !self.expired(&node) {
                continue; // committed again with a later expiry meanwhile
            }
            let mut ops = Vec::new();
            let rec = self.store.get_node(&node)?;
            match &rec {
                Some(rec) => ops.extend(self.remove_ops(&node, rec)?),
                None => ops.push(Op::DelExpiry { path: node.clone() }),
            }
            // A draft over the expired version goes with it; a draft of a new
            // node written at the same path after the expiry stays.
            let drop_draft = match (&rec, self.draft(&node)) {
                (Some(r), Some(d)) => lock(&d).base.is_some_and(|(id, _)| id == r.id),
                _ => false,
            };
            if drop_draft {
                ops.push(Op::DelDraft { path: node.clone() });
            }
            self.store.apply(ops, true)?;
            self.notify_index();
            self.set_expiry(&node, None);
            if drop_draft {
                self.drafts.remove(&node);
            }
            if rec.is_some() {
                self.metrics.nodes.expired.fetch_add(1, Ordering::Relaxed);
                tracing::info!(node, "expired node removed");
                swept.push(node.clone());
            }
            self.invalidate_commit(&node, false);
            let (parent, name) = place::parent_name(&node);
            self.invalidate(parent, &[name], false);
        }
        Ok(swept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_fields() {
        let now = 1_700_000_000_000_000_000i128;
        let mut o = Map::new();
        o.insert("ttl_seconds".into(), 60.into());
        let at = expiry_of(&mut o, now).unwrap().unwrap();
        assert_eq!(at as i128, now + 60_000_000_000);
        assert!(o.get("ttl_seconds").is_none());
        assert!(o["expires_at"]
            .as_str()
            .unwrap()
            .starts_with("2023-11-14T22:14:20"));
        // The stored expires_at parses back to the same second.
        let again = expiry_of(&mut o, now).unwrap().unwrap();
        assert_eq!(again / 1_000_000_000, at / 1_000_000_000);

        let mut o = Map::new();
        assert_eq!(expiry_of(&mut o, now), Ok(None));
        o.insert("expires_at".into(), Value::Null);
        assert_eq!(expiry_of(&mut o, now), Ok(None));
        assert!(o.get("expires_at").is_none());
        for bad in [
            serde_json::json!({"ttl_seconds": 0}),
            serde_json::json!({"ttl_seconds": -5}),
            serde_json::json!({"ttl_seconds": "10"}),
            serde_json::json!({"expires_at": "tomorrow"}),
            serde_json::json!({"expires_at": "2001-01-01T00:00:00Z"}),
            serde_json::json!({"expires_at": 12}),
        ] {
            let Value::Object(mut o) = bad else { panic!() };
            assert!(expiry_of(&mut o, now).is_err(), "{o:?}");
        }
    }
}
