//! Ids of nodes, blobs and events: counted in memory on one daemon; on a
//! shared store taken from the store (node and blob ids in blocks; event
//! ids of commits by the store in the commit's transaction, others one at
//! a time).

use super::Fs;
use crate::error::Result;
use crate::locks::lock;
use crate::schema::counters;
use crate::store::EVENT_PLACEHOLDER;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    /// Placeholders handed out by `next_id` on this thread while a batch
    /// is planned (`Some(count)`), else `None`.
    static DEFERRED_EVENTS: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// A commit's deferred event ids on a shared store: its events carry
/// placeholders, and the store gives them ids inside the commit's
/// transaction (`Store::shared`), after the versions they build on were
/// read. No round trip of its own, one for a whole batch chunk.
pub(crate) struct EventIds;

impl Drop for EventIds {
    fn drop(&mut self) {
        DEFERRED_EVENTS.set(None);
    }
}

impl Fs {
    /// The next id of counter `key`: in memory on one daemon; on a shared
    /// store, from the store, so no two daemons hand out the same one (node
    /// and blob ids in blocks; event ids one at a time, since the indexer
    /// applies a node's events in id order and a commit takes its ids after
    /// reading the version it builds on).
    fn next_id(&self, key: &'static str, local: &AtomicU64) -> Result<u64> {
        if !self.store.shared() {
            return Ok(local.fetch_add(1, Ordering::Relaxed));
        }
        if key == counters::EVENT_ID {
            // A commit or batch being planned: a placeholder, replaced by
            // the store in the commit's transaction (`EventIds`).
            if let Some(i) = DEFERRED_EVENTS.get() {
                DEFERRED_EVENTS.set(Some(i + 1));
                return Ok(EVENT_PLACEHOLDER + i);
            }
            return self.store.alloc(key, 1);
        }
        const BLOCK: u64 = 256;
        let mut blocks = lock(&self.id_blocks);
        let b = blocks.entry(key).or_insert((0, 0));
        if b.0 >= b.1 {
            let first = self.store.alloc(key, BLOCK)?;
            *b = (first, first + BLOCK);
        }
        b.0 += 1;
        Ok(b.0 - 1)
    }

    /// Start deferring this thread's event ids (a commit or a batch on a
    /// shared store); the guard stops it, also on an early return.
    pub(crate) fn defer_event_ids(&self) -> EventIds {
        if self.store.shared() {
            DEFERRED_EVENTS.set(Some(0));
        }
        EventIds
    }

    pub(in crate::core) fn blob_id(&self) -> Result<u64> {
        self.next_id(counters::BLOB_ID, &self.next_blob)
    }

    pub(crate) fn node_id(&self) -> Result<u64> {
        self.next_id(counters::NODE_ID, &self.next_node)
    }

    pub(crate) fn event_seq(&self) -> Result<u64> {
        self.next_id(counters::EVENT_ID, &self.next_event)
    }

    /// The last event id committed before now (by any daemon).
    pub(crate) fn last_event(&self) -> Result<u64> {
        if self.store.shared() {
            return self.store.high_water(counters::EVENT_ID);
        }
        Ok(self.next_event.load(Ordering::SeqCst).saturating_sub(1))
    }
}
