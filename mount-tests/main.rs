//! Real-mount tests: each test mounts ctxfs through /dev/fuse and drives it
//! with real processes (sh, cat, cp, sed, python3, other uids via setpriv).
//! One file a topic; `harness.rs` mounts and runs commands.

mod agent;
mod asof;
mod atrest;
mod commit;
mod daemon;
mod faults;
mod fronts;
mod harness;
mod hostile;
mod hosts;
mod inbox;
mod lifecycle;
mod members;
mod ops;
mod search;
mod tenancy;
mod tenants;
mod together;
mod tree;
mod views;
