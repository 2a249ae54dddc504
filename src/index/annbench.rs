//! `ctxfs bench-ann`: the ANN graph against exact search on the same
//! vectors (recall@10 and queries per second), ann-benchmarks style.

use super::ann::{self, AnnParams};
use std::time::Instant;

/// Read a little-endian float32 2-D `.npy` file: (rows, dim, data).
pub fn read_npy(path: &std::path::Path) -> Result<(usize, usize, Vec<f32>), String> {
    let b = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err("not a .npy file".into());
    }
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        _ => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
    };
    let header = String::from_utf8_lossy(&b[start..start + hlen]);
    if !header.contains("'<f4'") {
        return Err(format!("need little-endian float32: {header}"));
    }
    let fortran = header.contains("'fortran_order': True");
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or("no shape")?;
    let dims: Vec<usize> = shape
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().map_err(|_| format!("bad shape {shape}")))
        .collect::<Result<_, _>>()?;
    if dims.len() != 2 {
        return Err(format!("need a 2-D array, got shape ({shape})"));
    }
    let data: Vec<f32> = b[start + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if data.len() != dims[0] * dims[1] {
        return Err("data size does not match the shape".into());
    }
    if fortran {
        // Column-major: element (i, j) is at j * rows + i.
        let (r, c) = (dims[0], dims[1]);
        let mut t = vec![0f32; data.len()];
        for j in 0..c {
            for i in 0..r {
                t[i * c + j] = data[j * r + i];
            }
        }
        return Ok((r, c, t));
    }
    Ok((dims[0], dims[1], data))
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Results of an approximate search that count for recall@10, as
/// ann-benchmarks counts them: those at least as similar as the exact
/// search's 10th (within 1e-3), so a vector tied with a true neighbour
/// counts. Sets with duplicate vectors (nodes sharing an abstract) have many
/// such ties, and which of them a search returns is arbitrary.
fn hits(found: &[(usize, f32)], truth: &[(usize, f32)]) -> usize {
    let floor = match truth.get(9) {
        Some(t) => t.1 - 1e-3,
        None => f32::NEG_INFINITY,
    };
    found.iter().take(10).filter(|f| f.1 >= floor).count()
}

/// Dot product in f32 (the truth of the recall count).
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            s[j] += x[j] * y[j];
        }
    }
    s.iter().sum::<f32>() + tail
}

/// Exact top 10 of `q` among `base` in f32.
fn truth_f32(q: &[f32], base: &[(usize, Vec<f32>)]) -> Vec<(usize, f32)> {
    let mut all: Vec<(usize, f32)> = base.iter().map(|(l, v)| (*l, dot_f32(q, v))).collect();
    let k = all.len().min(10);
    if k > 0 {
        all.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
    }
    all.truncate(k);
    all.sort_by(|a, b| b.1.total_cmp(&a.1));
    all
}

/// Run `search` for every query: latencies (ms), tie-aware hits, hits by
/// id, and queries per second.
fn measure(
    qs: &[ann::Vector],
    truth: &[Vec<(usize, f32)>],
    search: impl Fn(&[ann::Half]) -> Vec<(usize, f32)>,
) -> (Vec<f64>, usize, usize, f64) {
    let mut lat = Vec::with_capacity(qs.len());
    let (mut hit, mut same_id) = (0, 0);
    let t = Instant::now();
    for (q, tr) in qs.iter().zip(truth) {
        let t = Instant::now();
        let r = search(q);
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        hit += hits(&r, tr);
        same_id += r
            .iter()
            .filter(|(l, _)| tr.iter().any(|t| t.0 == *l))
            .count();
    }
    (
        lat,
        hit,
        same_id,
        qs.len() as f64 / t.elapsed().as_secs_f64(),
    )
}

/// Build a graph over `base` (rounded to half precision, as ctxfs holds
/// vectors), then for each `ef`: recall@10 against exact search over the
/// f32 vectors (ties counted, and by ids) and single-thread queries/s,
/// beside exact search's over the half-precision vectors (what ctxfs runs
/// for small scopes), whose own recall shows what the rounding loses.
pub fn run(
    base: Vec<(usize, Vec<f32>)>,
    queries: &[Vec<f32>],
    p: AnnParams,
    efs: &[usize],
) -> String {
    use rayon::prelude::*;
    let mut out = String::new();
    let held: Vec<(usize, ann::Vector)> = base.iter().map(|(l, v)| (*l, ann::half(v))).collect();
    let qs: Vec<ann::Vector> = queries.iter().map(|q| ann::half(q)).collect();
    let t = Instant::now();
    let g = ann::build(&p, &held);
    let build = t.elapsed().as_secs_f64();
    out.push_str(&format!(
        "vectors {} dim {} queries {} | build {:.1}s ({:.0} inserts/s, m={} ef_construction={})\n",
        base.len(),
        base.first().map(|b| b.1.len()).unwrap_or(0),
        queries.len(),
        build,
        base.len() as f64 / build,
        p.m,
        p.ef_construction
    ));
    let truth: Vec<Vec<(usize, f32)>> = queries.par_iter().map(|q| truth_f32(q, &base)).collect();
    // Exact search over the held vectors: the baseline's speed.
    let all = (10 * queries.len()).max(1) as f64;
    let (mut lat, hit, same_id, exact_qps) = measure(&qs, &truth, |q| {
        ann::exact(q, 10, held.iter().map(|(l, v)| (*l, &v[..])))
    });
    out.push_str(&format!(
        "exact        recall@10 {:.4} (same ids {:.4})  {:>9.0} q/s  p50 {:.3} ms  p99 {:.3} ms\n",
        hit as f64 / all,
        same_id as f64 / all,
        exact_qps,
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99)
    ));
    for &ef in efs {
        let pe = AnnParams { ef_search: ef, ..p };
        let (mut lat, hit, same_id, qps) =
            measure(&qs, &truth, |q| ann::search(&g, &pe, q, 10, None));
        out.push_str(&format!(
            "hnsw ef={ef:<4} recall@10 {:.4} (same ids {:.4})  {:>9.0} q/s  p50 {:.3} ms  p99 {:.3} ms  ({:.1}x exact)\n",
            hit as f64 / all,
            same_id as f64 / all,
            qps,
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            qps / exact_qps
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::hits;

    #[test]
    fn recall_counts_ties_with_the_tenth_neighbour() {
        let truth: Vec<(usize, f32)> = (0..10).map(|i| (i, 1.0 - i as f32 * 0.01)).collect();
        // Label 42 ties with the 10th true neighbour (0.91); 43 is worse.
        let mut found: Vec<(usize, f32)> = (0..9).map(|i| (i, 1.0 - i as f32 * 0.01)).collect();
        found.push((42, 0.9105));
        assert_eq!(hits(&found, &truth), 10);
        found[9] = (43, 0.85);
        assert_eq!(hits(&found, &truth), 9);
        // Fewer than 10 vectors in all: whatever is found counts.
        assert_eq!(hits(&found[..3], &truth[..3]), 3);
    }
}
