//! Query-embedding latency of MiniLM on SciFact's queries, in process:
//! `cargo run --release --example embed_bench -- MODEL_DIR QUERIES.jsonl`.
use ctxfs::index::bert::MiniLm;
use ctxfs::index::embed::Embedder;
use std::time::Instant;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let m = MiniLm::load(std::path::Path::new(&a[1])).unwrap();
    let qs: Vec<String> = std::fs::read_to_string(&a[2])
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .take(200)
        .collect();
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
    let docs: Vec<String> =
        std::fs::read_to_string(std::path::Path::new(&a[2]).with_file_name("corpus.jsonl"))
            .unwrap()
            .lines()
            .take(64)
            .map(|l| {
                let t = serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                    .as_str()
                    .unwrap()
                    .to_string();
                t.split(". ").take(3).collect::<Vec<_>>().join(". ")
            })
            .collect();
    let refs: Vec<&str> = docs.iter().map(|s| s.as_str()).collect();
    let t = Instant::now();
    let passages = if std::env::var_os("QUERIES_ONLY").is_some() {
        0
    } else {
        refs.len()
    };
    for part in refs[..passages].chunks(32) {
        m.embed(part).unwrap();
    }
    println!(
        "64 passages of 3 sentences: {:.1} passages/s",
        64.0 / t.elapsed().as_secs_f64()
    );
    println!(
        "{} queries: p50 {:.2} ms p90 {:.2} p99 {:.2} min {:.2}",
        ts.len(),
        ts[ts.len() / 2],
        ts[ts.len() * 9 / 10],
        ts[ts.len() * 99 / 100],
        ts[0]
    );
}
