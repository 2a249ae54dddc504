//! Ids of nodes, blobs and events: counted in memory on one daemon; on a
//! shared store taken from the store (node and blob ids in blocks, event
//! ids one at a time, or one range for a batch chunk once it is planned).

use super::Fs;
use crate::error::{Error, Result};
use crate::locks::lock;
use crate::schema::counters;
use crate::store::{Op, Store};
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    /// Placeholders handed out by `next_id` on this thread while a batch
    /// is planned (`Some(count)`), else `None`.
    static DEFERRED_EVENTS: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Event ids at and above this are placeholders of a batch being planned.
const EVENT_PLACEHOLDER: u64 = 1 << 62;

/// A batch's deferred event ids on a shared store. A node's events must
/// take ids after the version they build on is read, so a batch takes its
/// range after planning all its nodes: one round trip for the chunk, not
/// one per event.
pub(crate) struct EventIds;

impl EventIds {
    /// Take a range for the placeholders handed out so far and write the
    /// real ids into `ops` (events, their JSON and the high-water mark),
    /// in the order they were handed out.
    pub(crate) fn assign(&self, store: &dyn Store, ops: &mut [Op]) -> Result<()> {
        let n = DEFERRED_EVENTS.replace(Some(0)).unwrap_or(0);
        if n == 0 {
            return Ok(());
        }
        let first = store.alloc(counters::EVENT_ID, n)?;
        let real = |s: u64| first + (s - EVENT_PLACEHOLDER);
        for op in ops {
            match op {
                Op::PutEvent { seq, json, .. } if *seq >= EVENT_PLACEHOLDER => {
                    *seq = real(*seq);
                    let mut ev = crate::schema::event::OutboxEvent::decode(json).map_err(|e| {
                        Error::store(format!("a planned event does not parse: {e}"))
                    })?;
                    ev.event_id = crate::schema::event::event_id(*seq);
                    *json = ev.encode();
                }
                Op::HighWater { key, value }
                    if key == counters::EVENT_ID && *value >= EVENT_PLACEHOLDER =>
                {
                    *value = real(*value);
                }
                _ => {}
            }
        }
        Ok(())
    }
}

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
            // A batch planning its nodes: a placeholder, replaced by a range
            // taken once the whole chunk is planned (`EventIds::assign`).
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

    /// Start deferring this thread's event ids (a batch on a shared
    /// store); the guard stops it, also on an early return.
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
