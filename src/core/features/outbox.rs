//! `NODE/.outbox/`: the node's events not yet taken by the indexer, one
//! JSON file each (`{event_id}.json`, read-only), and `.outbox/dlq/`, the
//! events it gave up on. A dead letter is tried again by moving it back
//! (`mv .outbox/dlq/ID.json .outbox/`) and given up for good by removing
//! it; both are writes of the node. Reached by path, never listed in the
//! node's directory.

use super::Feature;
use crate::core::inodes::{Key, VKey};
use crate::core::{Attr, Caller, Fs, Kind, Opened};
use crate::error::{Error, Result};
use crate::schema::event::{event_id, event_seq, EventStatus, OutboxEvent};
use crate::schema::names::OUTBOX_DLQ;
use crate::schema::place::{self, OUTBOX};
use crate::store::{Op, StoredEvent};

pub(super) struct Outbox;

const ID: &str = "outbox";

/// What of a node's outbox a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// `.outbox/`
    Pending,
    /// `.outbox/dlq/`
    Dead,
    /// `.outbox/{id}.json`
    Event(u64),
    /// `.outbox/dlq/{id}.json`
    DeadEvent(u64),
}

/// The name a key of `at` carries (the node is its `dir`).
fn name_of(at: At) -> String {
    match at {
        At::Pending => OUTBOX.to_string(),
        At::Dead => format!("{OUTBOX}/{OUTBOX_DLQ}"),
        At::Event(seq) => format!("{OUTBOX}/{}.json", event_id(seq)),
        At::DeadEvent(seq) => format!("{OUTBOX}/{OUTBOX_DLQ}/{}.json", event_id(seq)),
    }
}

fn key(node: &str, at: At) -> Key {
    Key::Virtual(VKey::new(ID, node, &name_of(at)))
}

/// What `key` names (its name is always one [`name_of`] made).
fn at(key: &VKey) -> Result<At> {
    let rest = key.name.strip_prefix(OUTBOX).ok_or(Error::NotFound)?;
    let dead = format!("/{OUTBOX_DLQ}");
    Ok(match rest {
        "" => At::Pending,
        r if r == dead => At::Dead,
        r => match r.strip_prefix(&dead) {
            Some(file) => At::DeadEvent(seq_of(file.trim_start_matches('/'))?),
            None => At::Event(seq_of(r.trim_start_matches('/'))?),
        },
    })
}

fn seq_of(name: &str) -> Result<u64> {
    event_seq(name).ok_or(Error::NotFound)
}

/// Event `seq` among `events`.
fn find(events: Vec<StoredEvent>, seq: u64) -> Result<StoredEvent> {
    events
        .into_iter()
        .find(|e| e.seq == seq)
        .ok_or(Error::NotFound)
}

/// The file bytes of event `seq` among `events`: its JSON and a newline.
fn event_file(events: Vec<StoredEvent>, seq: u64) -> Result<Vec<u8>> {
    let mut j = find(events, seq)?.json;
    j.push(b'\n');
    Ok(j)
}

/// The bytes of a pending event (`dead`: of a dead letter), for a caller
/// who may read the node.
fn file(fs: &Fs, c: Caller, node: &str, seq: u64, dead: bool) -> Result<Vec<u8>> {
    let access = fs.gate(c, node, false)?;
    if dead {
        return event_file(fs.store().dead_events(node)?, seq);
    }
    fs.node_for(node, access)?;
    event_file(fs.store().node_events(node)?, seq)
}

impl Feature for Outbox {
    fn id(&self) -> &'static str {
        ID
    }

    fn lookup(&self, fs: &Fs, c: Caller, parent: &Key, name: &str) -> Option<Result<Key>> {
        match parent {
            Key::Dir(_) => super::node_file(fs, c, parent, name, OUTBOX)
                .map(|n| n.map(|(n, _)| key(n, At::Pending))),
            Key::Virtual(v) if v.feature == ID => Some(at(v).and_then(|a| match a {
                At::Pending if name == OUTBOX_DLQ => Ok(key(&v.dir, At::Dead)),
                At::Pending => Ok(key(&v.dir, At::Event(seq_of(name)?))),
                At::Dead => Ok(key(&v.dir, At::DeadEvent(seq_of(name)?))),
                At::Event(_) | At::DeadEvent(_) => Err(Error::NotDir),
            })),
            _ => None,
        }
    }

    fn attr(&self, fs: &Fs, c: Caller, key: &VKey, ino: u64) -> Result<Attr> {
        let node = &key.dir;
        match at(key)? {
            At::Pending | At::Dead => {
                let access = fs.gate(c, node, false)?;
                fs.node_for(node, access)?;
                Ok(fs.shown.dir(ino, 0o555, fs.shown.started, false))
            }
            At::Event(seq) => {
                let json = file(fs, c, node, seq, false)?;
                Ok(fs
                    .shown
                    .file(ino, json.len() as u64, 0o444, fs.shown.started, false))
            }
            At::DeadEvent(seq) => {
                let json = file(fs, c, node, seq, true)?;
                Ok(fs
                    .shown
                    .file(ino, json.len() as u64, 0o644, fs.shown.started, false))
            }
        }
    }

    fn list(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<Vec<(Key, String, Kind)>> {
        let node = &key.dir;
        fs.gate(c, node, false)?;
        let mut out = Vec::new();
        let (events, dead) = match at(key)? {
            At::Pending => {
                out.push((self::key(node, At::Dead), OUTBOX_DLQ.to_string(), Kind::Dir));
                (fs.store().node_events(node)?, false)
            }
            At::Dead => (fs.store().dead_events(node)?, true),
            At::Event(_) | At::DeadEvent(_) => return Err(Error::NotDir),
        };
        for e in events {
            let at = if dead {
                At::DeadEvent(e.seq)
            } else {
                At::Event(e.seq)
            };
            let name = format!("{}.json", event_id(e.seq));
            out.push((self::key(node, at), name, Kind::File));
        }
        Ok(out)
    }

    fn open(&self, fs: &Fs, c: Caller, key: &VKey, flags: i32) -> Result<Opened> {
        let write = crate::core::features::writes(flags);
        let bytes = match at(key)? {
            At::Event(seq) => file(fs, c, &key.dir, seq, false)?,
            At::DeadEvent(seq) => file(fs, c, &key.dir, seq, true)?,
            At::Pending | At::Dead => return Err(Error::IsDir),
        };
        fs.read_only(bytes, write)
    }

    fn unlink(&self, fs: &Fs, c: Caller, key: &VKey) -> Result<()> {
        fs.gate(c, &key.dir, true)?;
        Err(Error::IsDir)
    }

    /// `rm NODE/.outbox/dlq/ID.json`: give up on the event.
    fn unlink_in(&self, fs: &Fs, c: Caller, dir: &VKey, name: &str) -> Result<()> {
        if at(dir)? != At::Dead {
            return Err(Error::NotPermitted("virtual directory"));
        }
        let node = &dir.dir;
        fs.gate(c, node, true)?;
        let seq = seq_of(name)?;
        find(fs.store().dead_events(node)?, seq)?;
        fs.store().apply(
            vec![Op::DropDead {
                seq,
                node_path: node.to_string(),
                account: place::account_of(node).to_string(),
            }],
            true,
        )
    }

    /// `mv NODE/.outbox/dlq/ID.json NODE/.outbox/`: try the event again.
    fn rename(
        &self,
        fs: &Fs,
        c: Caller,
        from: &VKey,
        name: &str,
        to: &VKey,
        newname: &str,
        _noreplace: bool,
    ) -> Result<()> {
        if (at(from)?, at(to)?) != (At::Dead, At::Pending) {
            return Err(Error::NotPermitted(
                "only files and directories of accounts can be renamed",
            ));
        }
        let node = &from.dir;
        fs.gate(c, node, true)?;
        if *node != to.dir || name != newname {
            return Err(Error::Invalid(
                "a dead letter can only move back to its own node's .outbox/, under its name"
                    .into(),
            ));
        }
        let seq = seq_of(name)?;
        let e = find(fs.store().dead_events(node)?, seq)?;
        // Pending again, with its tries counted from zero; a dead letter
        // that is no event of ours goes back as it is (and dies again).
        let json = match OutboxEvent::decode(&e.json) {
            Ok(mut ev) => {
                ev.status = EventStatus::Pending;
                ev.retry_count = 0;
                ev.next_retry_ms = None;
                ev.encode()
            }
            Err(_) => e.json,
        };
        fs.store().apply(
            vec![Op::ReviveEvent {
                seq,
                node_path: node.to_string(),
                account: place::account_of(node).to_string(),
                json,
            }],
            true,
        )?;
        fs.notify_index();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_place_of_an_outbox_is_named_and_found_again() {
        for a in [
            At::Pending,
            At::Dead,
            At::Event(0),
            At::Event(0x1234),
            At::DeadEvent(u64::MAX),
        ] {
            let Key::Virtual(k) = key("acme/users/u/memories/c/n", a) else {
                unreachable!()
            };
            assert_eq!(at(&k).unwrap(), a, "{a:?} as {}", k.name);
        }
        let odd = VKey::new(ID, "n", ".outbox/x.json");
        assert!(at(&odd).is_err());
    }
}
