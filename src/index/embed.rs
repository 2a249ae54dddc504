//! Embedders behind one trait (seed 002 `Embedder`): MiniLM in-process
//! (`bert.rs`), a dependency-free hashing fallback, and an OpenAI-compatible
//! HTTP client. Every vector is stored with the id of the model that made it.

use super::text;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub trait Embedder: Send + Sync {
    /// Stored beside every vector; a different id means a reindex.
    fn id(&self) -> &str;
    /// `minilm`, `hash` or `http`.
    fn kind(&self) -> &'static str;
    fn dim(&self) -> usize;
    /// One L2-normalised vector per text, in order.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String>;
    /// Batches worth embedding side by side on their own threads.
    fn lanes(&self) -> usize {
        1
    }
}

/// What a batch not embedded because of a stop says.
pub const STOPPED: &str = "the indexer is stopping";

/// Embed `texts` in batches of `batch`, up to `e.lanes()` batches at a time,
/// each on a thread of its own. One result per batch, in order.
///
/// Once `stop` is set the call returns within a few milliseconds: batches
/// not started are not embedded and batches under way are not waited for
/// (both answer [`STOPPED`]). Their threads own what they work on (the
/// embedder and a copy of the texts) and end when the batch in hand does,
/// so a stop never waits for a model's forward pass or an HTTP request
/// whose result would be dropped anyway.
pub fn embed_batches(
    e: &Arc<dyn Embedder>,
    texts: &[&str],
    batch: usize,
    stop: &AtomicBool,
) -> Vec<Result<Vec<Vec<f32>>, String>> {
    let parts: Arc<Vec<Vec<String>>> = Arc::new(
        texts
            .chunks(batch.max(1))
            .map(|p| p.iter().map(|t| t.to_string()).collect())
            .collect(),
    );
    let n = parts.len();
    let mut out: Vec<Option<Result<Vec<Vec<f32>>, String>>> = (0..n).map(|_| None).collect();
    let next = Arc::new(AtomicUsize::new(0));
    // Set when the caller stops listening: lanes take no further batch.
    let gone = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let mut started = 0;
    for lane in 0..e.lanes().max(1).min(n) {
        let (e, parts, next, gone, tx) = (
            e.clone(),
            parts.clone(),
            next.clone(),
            gone.clone(),
            tx.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name(format!("ctxfs-embed-{lane}"))
            .spawn(move || loop {
                if gone.load(Ordering::Relaxed) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(p) = parts.get(i) else { break };
                let refs: Vec<&str> = p.iter().map(String::as_str).collect();
                if tx.send((i, e.embed(&refs))).is_err() {
                    break;
                }
            });
        if spawned.is_ok() {
            started += 1;
        }
    }
    drop(tx);
    if started == 0 {
        // No thread to be had: embed here, still checking `stop` between batches.
        for (i, p) in parts.iter().enumerate() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let refs: Vec<&str> = p.iter().map(String::as_str).collect();
            out[i] = Some(e.embed(&refs));
        }
    } else {
        let mut got = 0;
        while got < n && !stop.load(Ordering::Relaxed) {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok((i, r)) => {
                    out[i] = Some(r);
                    got += 1;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        gone.store(true, Ordering::Relaxed);
    }
    let missing = if stop.load(Ordering::Relaxed) {
        STOPPED
    } else {
        "batch not embedded"
    };
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(missing.to_string())))
        .collect()
}

/// Scale `v` to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

/// Feature hashing of stemmed words, word pairs and character trigrams into
/// a fixed number of signed buckets. No model files, no network: the
/// fallback when MiniLM's files are absent. Finds shared words and word
/// forms, not paraphrases.
pub struct HashEmbedder {
    dim: usize,
    id: String,
}

impl HashEmbedder {
    pub fn new(dim: usize) -> Self {
        HashEmbedder {
            dim,
            id: format!("hash-v1-{dim}"),
        }
    }

    fn add(&self, v: &mut [f32], feature: &str, seed: u64, w: f32) {
        let h = xxh3_64_with_seed(feature.as_bytes(), seed);
        let i = (h % self.dim as u64) as usize;
        let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
        v[i] += sign * w;
    }

    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0f32; self.dim];
        let terms = text::terms(text);
        let mut counts: std::collections::HashMap<&str, u32> = Default::default();
        for t in &terms {
            *counts.entry(t.as_str()).or_default() += 1;
        }
        for (t, n) in &counts {
            let w = 1.0 + (*n as f32).ln();
            self.add(&mut v, t, 1, w);
            let padded = format!("#{t}#");
            let chars: Vec<char> = padded.chars().collect();
            let grams = chars.len().saturating_sub(2).max(1);
            for g in chars.windows(3) {
                let s: String = g.iter().collect();
                self.add(&mut v, &s, 2, 0.6 * w / grams as f32);
            }
        }
        for p in terms.windows(2) {
            self.add(&mut v, &format!("{} {}", p[0], p[1]), 3, 0.5);
        }
        normalize(&mut v);
        v
    }
}

impl Embedder for HashEmbedder {
    fn id(&self) -> &str {
        &self.id
    }
    fn kind(&self) -> &'static str {
        "hash"
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        Ok(texts.iter().map(|t| self.embed_one(t)).collect())
    }
}

/// An OpenAI-compatible `/v1/embeddings` endpoint (Ollama, vLLM, TEI...).
pub struct HttpEmbedder {
    url: String,
    model: String,
    dim: usize,
    id: String,
    agent: ureq::Agent,
}

impl HttpEmbedder {
    /// `url` is the server's base (`http://127.0.0.1:11434`) or the full
    /// `/v1/embeddings` address; `dim` is the model's output size.
    pub fn new(url: &str, model: &str, dim: usize, timeout: Duration) -> Self {
        let url = crate::schema::openai_endpoint(url, "embeddings");
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build()
            .into();
        HttpEmbedder {
            id: format!("http:{model}"),
            url,
            model: model.to_string(),
            dim,
            agent,
        }
    }
}

impl Embedder for HttpEmbedder {
    fn id(&self) -> &str {
        &self.id
    }
    fn kind(&self) -> &'static str {
        "http"
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let body = serde_json::json!({"model": self.model, "input": texts}).to_string();
        let mut resp = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/json")
            .send(body.as_bytes())
            .map_err(|e| format!("embedding server {}: {e}", self.url))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .map_err(|e| format!("embedding server {}: {e}", self.url))?;
        if status != 200 {
            let mut t = text.chars().take(200).collect::<String>();
            t = text::one_line(&t);
            return Err(format!(
                "embedding server {} answered {status}: {t}",
                self.url
            ));
        }
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("embedding server: bad JSON: {e}"))?;
        let data = v["data"]
            .as_array()
            .ok_or("embedding server: no `data` array")?;
        let mut out = vec![Vec::new(); texts.len()];
        for (i, d) in data.iter().enumerate() {
            let idx = d["index"].as_u64().map(|x| x as usize).unwrap_or(i);
            let e = d["embedding"]
                .as_array()
                .ok_or("embedding server: an item has no `embedding`")?;
            let mut vec: Vec<f32> = e
                .iter()
                .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
                .collect();
            if vec.len() != self.dim || vec.iter().any(|x| !x.is_finite()) {
                return Err(format!(
                    "embedding server: vector of {} values (configured dim {}) or not finite",
                    vec.len(),
                    self.dim
                ));
            }
            normalize(&mut vec);
            if idx >= out.len() {
                return Err("embedding server: index out of range".into());
            }
            out[idx] = vec;
        }
        if out.iter().any(|v| v.is_empty()) {
            return Err(format!(
                "embedding server: {} vectors for {} texts",
                data.len(),
                texts.len()
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cos(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// Embeds a text as its number; refuses texts holding "bad".
    struct Numbers;
    impl Embedder for Numbers {
        fn id(&self) -> &str {
            "numbers"
        }
        fn kind(&self) -> &'static str {
            "test"
        }
        fn dim(&self) -> usize {
            1
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
            std::thread::sleep(Duration::from_millis(2));
            texts
                .iter()
                .map(|t| t.parse::<f32>().map(|x| vec![x]).map_err(|_| t.to_string()))
                .collect()
        }
        fn lanes(&self) -> usize {
            3
        }
    }

    #[test]
    fn batches_side_by_side_keep_their_order_and_their_failures() {
        let texts: Vec<String> = (0..50)
            .map(|i| if i == 21 { "bad".into() } else { i.to_string() })
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let e: Arc<dyn Embedder> = Arc::new(Numbers);
        let out = embed_batches(&e, &refs, 4, &Default::default());
        assert_eq!(out.len(), 13);
        for (b, r) in out.iter().enumerate() {
            match r {
                Ok(vs) => {
                    let want: Vec<Vec<f32>> = (b * 4..(b * 4 + 4).min(50))
                        .map(|i| vec![i as f32])
                        .collect();
                    assert_eq!(vs, &want, "batch {b}");
                }
                Err(e) => assert_eq!((b, e.as_str()), (5, "bad")),
            }
        }
        assert!(out[5].is_err());
        assert!(embed_batches(&e, &[], 4, &Default::default()).is_empty());
    }

    /// A stop does not wait for batches under way: their results would be
    /// dropped, and a slow model must not hold up an unmount.
    #[test]
    fn a_stop_returns_without_waiting_for_batches_under_way() {
        struct Slow;
        impl Embedder for Slow {
            fn id(&self) -> &str {
                "slow"
            }
            fn kind(&self) -> &'static str {
                "test"
            }
            fn dim(&self) -> usize {
                1
            }
            fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
                std::thread::sleep(Duration::from_secs(3));
                Ok(texts.iter().map(|_| vec![1.0]).collect())
            }
            fn lanes(&self) -> usize {
                2
            }
        }
        let e: Arc<dyn Embedder> = Arc::new(Slow);
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            s2.store(true, Ordering::SeqCst);
        });
        let t = std::time::Instant::now();
        let out = embed_batches(&e, &["a", "b", "c", "d", "e"], 1, &stop);
        let took = t.elapsed();
        setter.join().unwrap();
        assert!(
            took < Duration::from_secs(2),
            "waited {took:?} for the batches under way"
        );
        assert_eq!(out.len(), 5);
        assert!(out
            .iter()
            .all(|r| r.as_ref().err().map(String::as_str) == Some(STOPPED)));
    }

    #[test]
    fn hashing_is_unit_and_similar_for_shared_words() {
        let e = HashEmbedder::new(384);
        let a = e.embed_one("The database stores embeddings of memories");
        let b = e.embed_one("embedding memory database");
        let c = e.embed_one("purple bicycles race downhill");
        assert!((cos(&a, &a) - 1.0).abs() < 1e-5);
        assert!(cos(&a, &b) > cos(&a, &c) + 0.2);
        assert_eq!(e.embed_one("").iter().filter(|x| **x != 0.0).count(), 0);
    }
}
