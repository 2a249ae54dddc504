//! ctxfs: AI-agent memory served as a FUSE filesystem. See `docs/ARCHITECTURE.md`.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cli;
pub mod cmd;
pub mod config;
pub mod core;
pub mod daemon;
pub mod data;
pub mod error;
pub mod extract;
pub mod fronts;
pub mod fuse;
pub mod index;
pub mod locks;
pub mod schema;
pub mod store;
