//! `flock` across daemons on a shared store. On one daemon the kernel keeps
//! `flock` locks itself; with several, the daemon takes them (the FUSE
//! `FLOCK_LOCKS` capability): a lock table per daemon arbitrates between its
//! own open files, and the store holds one lock per path for the daemon as
//! a whole (PostgreSQL advisory locks on one session), so an exclusive lock
//! on one host excludes every holder on every other.

use super::inodes::Key;
use super::{Caller, Fs};
use crate::error::{Error, Result};
use crate::locks::lock;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// A blocking `flock` waits this long at most.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Blocking `flock` waits of one uid at once; of the daemon at once. Each
/// waits on a thread of its own, not on a FUSE worker; past these, a wait
/// is refused with `ENOLCK`.
pub const MAX_WAITS_PER_UID: usize = 8;
pub const MAX_WAITS: usize = 64;

#[derive(Default)]
pub(crate) struct Flocks {
    table: std::sync::Mutex<HashMap<String, Held>>,
    moved: std::sync::Condvar,
    /// Blocking waits under way, by uid.
    waits: std::sync::Mutex<HashMap<u32, usize>>,
}

/// A blocking `flock` wait counted against its uid until dropped.
pub struct WaitSlot {
    fs: std::sync::Arc<Fs>,
    uid: u32,
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        let mut w = lock(&self.fs.scratch.flocks.waits);
        if let Some(n) = w.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                w.remove(&self.uid);
            }
        }
    }
}

#[derive(Default)]
struct Held {
    exclusive: Option<u64>,
    shared: HashSet<u64>,
    /// What this daemon holds in the store for the path: `Some(true)` an
    /// exclusive lock, `Some(false)` a shared one.
    remote: Option<bool>,
}

impl Held {
    fn take(&mut self, owner: u64) -> Option<bool> {
        if self.exclusive == Some(owner) {
            self.exclusive = None;
            return Some(true);
        }
        self.shared.remove(&owner).then_some(false)
    }

    fn put(&mut self, owner: u64, exclusive: bool) {
        if exclusive {
            self.exclusive = Some(owner);
        } else {
            self.shared.insert(owner);
        }
    }

    fn is_empty(&self) -> bool {
        self.exclusive.is_none() && self.shared.is_empty()
    }
}

impl Fs {
    /// Should the daemon take `flock` requests (a shared store)?
    pub fn takes_flocks(&self) -> bool {
        self.store.shared()
    }

    /// The name a lock has on every daemon: the file's path.
    fn lock_name(&self, ino: u64) -> Result<String> {
        Ok(
            match lock(&self.kernel.inodes).key(ino).ok_or(Error::NotFound)? {
                k if crate::core::scratch::entry_of(&k).is_some() => {
                    format!(
                        "scratch:{}",
                        crate::core::scratch::entry_of(&k).unwrap_or("")
                    )
                }
                Key::File { node, name, .. } | Key::Draft { node, name } => {
                    format!("node:{node}/{name}")
                }
                Key::Dir(p) => format!("dir:{p}"),
                other => format!("{other:?}"),
            },
        )
    }

    /// `flock` (FUSE SETLK/SETLKW for a whole file): take a shared or
    /// exclusive lock for `owner` (an open file), or drop it. With `sleep`,
    /// wait for it (up to 60 s, or until `c` gets a signal): the FUSE
    /// adapter calls that on a thread of its own after [`Fs::flock_wait_slot`].
    pub fn flock(&self, c: Caller, ino: u64, owner: u64, typ: i32, sleep: bool) -> Result<()> {
        let name = self.lock_name(ino)?;
        match typ {
            libc::F_UNLCK => self.unlock_owner(&name, owner),
            libc::F_RDLCK | libc::F_WRLCK => {
                self.lock_owner(c, &name, owner, typ == libc::F_WRLCK, sleep)
            }
            _ => Err(Error::Invalid(format!("lock type {typ}"))),
        }
    }

    /// A place for one more blocking wait of `uid`, or `ENOLCK` when it (or
    /// the daemon) has as many as it may.
    pub fn flock_wait_slot(self: &std::sync::Arc<Self>, uid: u32) -> Result<WaitSlot> {
        let mut w = lock(&self.scratch.flocks.waits);
        let all: usize = w.values().sum();
        let mine = w.get(&uid).copied().unwrap_or(0);
        if mine >= MAX_WAITS_PER_UID || all >= MAX_WAITS {
            return Err(Error::NoLocks(format!(
                "uid {uid} waits for {mine} locks, the daemon for {all} (at most \
                 {MAX_WAITS_PER_UID} per uid and {MAX_WAITS} in all)"
            )));
        }
        *w.entry(uid).or_default() += 1;
        Ok(WaitSlot {
            fs: self.clone(),
            uid,
        })
    }

    fn lock_owner(
        &self,
        c: Caller,
        name: &str,
        owner: u64,
        exclusive: bool,
        sleep: bool,
    ) -> Result<()> {
        let deadline = Instant::now() + MAX_WAIT;
        let mut t = lock(&self.scratch.flocks.table);
        loop {
            let h = t.entry(name.to_string()).or_default();
            // A conversion drops the old lock first (flock(2) does too).
            let had = h.take(owner);
            let free = if exclusive {
                h.is_empty()
            } else {
                h.exclusive.is_none()
            };
            if free {
                match self.remote_mode(name, h, exclusive) {
                    Ok(true) => {
                        h.put(owner, exclusive);
                        return Ok(());
                    }
                    Ok(false) => {}
                    Err(e) => {
                        if let Some(x) = had {
                            h.put(owner, x);
                        }
                        return Err(e);
                    }
                }
            }
            if let Some(x) = had {
                h.put(owner, x);
            }
            let now = Instant::now();
            if sleep && c.interrupted() {
                return Err(Error::Interrupted);
            }
            if !sleep || now >= deadline {
                return Err(Error::Unavailable(format!(
                    "{} is locked{}",
                    name.split_once(':').map(|x| x.1).unwrap_or(name),
                    if sleep { " (waited 60 s)" } else { "" }
                )));
            }
            // Local unlocks wake us; another daemon's are seen by polling.
            t = self
                .scratch
                .flocks
                .moved
                .wait_timeout(t, Duration::from_millis(20))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Make the store hold what `h` needs once one more owner (shared or
    /// exclusive) holds it; false when another daemon holds it against us.
    fn remote_mode(&self, name: &str, h: &mut Held, exclusive: bool) -> Result<bool> {
        let want = exclusive || h.remote == Some(true) && !h.is_empty();
        match h.remote {
            Some(have) if have == want => Ok(true),
            Some(have) => {
                // Shared → exclusive (the only owner converts): let go, retake.
                self.store.unlock_named(name, have)?;
                h.remote = None;
                let got = self.store.try_lock_named(name, want)?;
                if got {
                    h.remote = Some(want);
                }
                Ok(got)
            }
            None => {
                let got = self.store.try_lock_named(name, want)?;
                if got {
                    h.remote = Some(want);
                }
                Ok(got)
            }
        }
    }

    fn unlock_owner(&self, name: &str, owner: u64) -> Result<()> {
        let mut t = lock(&self.scratch.flocks.table);
        let Some(h) = t.get_mut(name) else {
            return Ok(());
        };
        h.take(owner);
        let r = if h.is_empty() {
            let r = match h.remote.take() {
                Some(have) => self.store.unlock_named(name, have),
                None => Ok(()),
            };
            t.remove(name);
            r
        } else {
            Ok(())
        };
        self.scratch.flocks.moved.notify_all();
        r
    }

    /// An open file is gone: drop every lock it held.
    pub fn release_flocks(&self, owner: u64) {
        let names: Vec<String> = lock(&self.scratch.flocks.table)
            .iter()
            .filter(|(_, h)| h.exclusive == Some(owner) || h.shared.contains(&owner))
            .map(|(n, _)| n.clone())
            .collect();
        for n in names {
            if let Err(e) = self.unlock_owner(&n, owner) {
                tracing::warn!(lock = %n, "cannot release a lock: {e}");
            }
        }
    }
}
