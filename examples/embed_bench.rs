//! MiniLM in process, without a mount: query-embedding latency on SciFact's
//! claims (one at a time), then passages/s on three-sentence passages of its
//! abstracts (batches of 32, one at a time and side by side; skipped with `QUERIES_ONLY=1`):
//! `cargo run --release --example embed_bench -- MODEL_DIR SCIFACT/queries.jsonl`.
use ctxfs::index::bert::MiniLm;
use ctxfs::index::embed::{embed_batches, Embedder};
use std::path::Path;
use std::time::Instant;

/// The `text` field of the first `n` lines of a JSONL file.
fn texts(path: &Path, n: usize) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .take(n)
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let m = MiniLm::load(Path::new(&a[1])).unwrap();
    let queries = Path::new(&a[2]);
    let qs = texts(queries, 200);
    for q in &qs[..5] {
        m.embed(&[q]).unwrap();
    }
    let mut ts = vec![];
    for q in &qs {
        let t = Instant::now();
        m.embed(&[q]).unwrap();
        ts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{} queries: p50 {:.2} ms p90 {:.2} p99 {:.2} min {:.2}",
        ts.len(),
        ts[ts.len() / 2],
        ts[ts.len() * 9 / 10],
        ts[ts.len() * 99 / 100],
        ts[0]
    );
    if std::env::var_os("QUERIES_ONLY").is_some() {
        return;
    }
    let mut docs: Vec<String> = texts(&queries.with_file_name("corpus.jsonl"), 256)
        .iter()
        .map(|t| t.split(". ").take(3).collect::<Vec<_>>().join(". "))
        .collect();
    // As the indexer embeds: by length, in batches of 32.
    docs.sort_by_key(String::len);
    let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
    let t = Instant::now();
    for part in refs.chunks(32) {
        m.embed(part).unwrap();
    }
    let one = refs.len() as f64 / t.elapsed().as_secs_f64();
    let m: std::sync::Arc<dyn ctxfs::index::embed::Embedder> = std::sync::Arc::new(m);
    let t = Instant::now();
    for r in embed_batches(&m, &refs, 32, &Default::default()) {
        r.unwrap();
    }
    println!(
        "{} passages of 3 sentences: {:.1} passages/s one batch at a time, {:.1} with {} lanes",
        refs.len(),
        one,
        refs.len() as f64 / t.elapsed().as_secs_f64(),
        m.lanes()
    );
}
