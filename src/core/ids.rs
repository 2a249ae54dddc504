//! Ids of nodes, blobs and events: counted in memory on one daemon; on a
//! shared store taken from the store (node and blob ids in blocks; event
//! ids of commits by the store in the commit's transaction, others one at
//! a time).

use crate::error::Result;
use crate::locks::lock;
use crate::schema::counters;
use crate::store::{Store, EVENT_PLACEHOLDER};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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

/// The id counters: in memory on one daemon, blocks taken from a shared
/// store. Owns its state; the rest of the core asks it for ids.
pub(crate) struct Ids {
    store: Arc<dyn Store>,
    next_blob: AtomicU64,
    next_node: AtomicU64,
    next_event: AtomicU64,
    /// On a shared store: blocks of node and blob ids taken from it (next, end).
    blocks: Mutex<HashMap<&'static str, (u64, u64)>>,
}

impl Ids {
    /// Counters continuing from the store's high-water marks.
    pub(crate) fn new(store: Arc<dyn Store>) -> Result<Ids> {
        Ok(Ids {
            next_blob: AtomicU64::new(store.high_water(counters::BLOB_ID)? + 1),
            next_node: AtomicU64::new(store.high_water(counters::NODE_ID)? + 1),
            next_event: AtomicU64::new(store.high_water(counters::EVENT_ID)? + 1),
            blocks: Mutex::new(HashMap::new()),
            store,
        })
    }

    /// The next id of counter `key`: in memory on one daemon; on a shared
    /// store, from the store, so no two daemons hand out the same one (node
    /// and blob ids in blocks; event ids one at a time, since the indexer
    /// applies a node's events in id order and a commit takes its ids after
    /// reading the version it builds on).
    fn next(&self, key: &'static str, local: &AtomicU64) -> Result<u64> {
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
        let mut blocks = lock(&self.blocks);
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
    pub(crate) fn defer_events(&self) -> EventIds {
        if self.store.shared() {
            DEFERRED_EVENTS.set(Some(0));
        }
        EventIds
    }

    pub(crate) fn blob(&self) -> Result<u64> {
        self.next(counters::BLOB_ID, &self.next_blob)
    }

    pub(crate) fn node(&self) -> Result<u64> {
        self.next(counters::NODE_ID, &self.next_node)
    }

    pub(crate) fn event(&self) -> Result<u64> {
        self.next(counters::EVENT_ID, &self.next_event)
    }

    /// The last event id committed before now (by any daemon).
    pub(crate) fn last_event(&self) -> Result<u64> {
        if self.store.shared() {
            return self.store.high_water(counters::EVENT_ID);
        }
        Ok(self.next_event.load(Ordering::SeqCst).saturating_sub(1))
    }
}
