//! The approximate nearest-neighbour graph of one account: hnsw_rs with a
//! clamped dot-product distance on unit vectors, persisted with its own dump
//! format, rebuilt when tombstones pile up. Exact search over the same
//! vectors is here too (small scopes and the recall benchmark).

use hnsw_rs::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// A vector as held in memory and in the graph: IEEE half precision, as
/// bits. The store keeps the embedder's f32 output; memory holds half of
/// it, and the graph's inserts and searches, which wait on memory more than
/// on arithmetic, read half the bytes (BENCHMARKS journal, "Vectors in half precision").
pub type Half = u16;
/// A vector shared between the graph's owner and the documents.
pub type Vector = Arc<[Half]>;

/// Round an f32 vector to half precision.
pub fn half(v: &[f32]) -> Vector {
    v.iter()
        .map(|x| half::f16::from_f32(*x).to_bits())
        .collect()
}

/// `1 - dot` of unit vectors, clamped at 0 (rounding can put a self-dot
/// above 1; hnsw_rs's own `DistDot` asserts on that).
#[derive(Default, Clone, Copy)]
pub struct DistUnitDot;

/// Dot product of two half-precision vectors (the shorter length), summed
/// in f32. On x86_64 it runs with AVX-512 or AVX2+F16C+FMA when the CPU has
/// them (checked at run time: the binary is built for the baseline
/// x86_64), else portable code.
#[inline]
pub fn dot(a: &[Half], b: &[Half]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { simd::dot_avx512(a, b) };
        }
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2, F16C and FMA (checked just above).
            return unsafe { simd::dot_avx2(a, b) };
        }
    }
    dot_portable(a, b)
}

/// The portable dot product: eight accumulators, then the tail.
fn dot_portable(a: &[Half], b: &[Half]) -> f32 {
    let n = a.len().min(b.len());
    let f = |x: Half| half::f16::from_bits(x).to_f32();
    let mut s = [0f32; 8];
    let chunks = n / 8;
    for i in 0..chunks {
        for j in 0..8 {
            s[j] += f(a[i * 8 + j]) * f(b[i * 8 + j]);
        }
    }
    let mut t = 0f32;
    for i in chunks * 8..n {
        t += f(a[i]) * f(b[i]);
    }
    s.iter().sum::<f32>() + t
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::Half;
    use std::arch::x86_64::*;

    /// Both slices have the same length (the caller cuts them).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_avx512(a: &[Half], b: &[Half]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let load = |p: *const Half| _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 32 <= n {
            s0 = _mm512_fmadd_ps(load(pa.add(i)), load(pb.add(i)), s0);
            s1 = _mm512_fmadd_ps(load(pa.add(i + 16)), load(pb.add(i + 16)), s1);
            i += 32;
        }
        if i + 16 <= n {
            s0 = _mm512_fmadd_ps(load(pa.add(i)), load(pb.add(i)), s0);
            i += 16;
        }
        let t = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
        t + super::dot_portable(&a[i..], &b[i..])
    }

    /// Both slices have the same length (the caller cuts them).
    #[target_feature(enable = "avx2,f16c,fma")]
    pub unsafe fn dot_avx2(a: &[Half], b: &[Half]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let load = |p: *const Half| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            s0 = _mm256_fmadd_ps(load(pa.add(i)), load(pb.add(i)), s0);
            s1 = _mm256_fmadd_ps(load(pa.add(i + 8)), load(pb.add(i + 8)), s1);
            i += 16;
        }
        if i + 8 <= n {
            s0 = _mm256_fmadd_ps(load(pa.add(i)), load(pb.add(i)), s0);
            i += 8;
        }
        let s = _mm256_add_ps(s0, s1);
        let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
        let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
        _mm_cvtss_f32(q) + super::dot_portable(&a[i..], &b[i..])
    }
}

impl Distance<Half> for DistUnitDot {
    fn eval(&self, va: &[Half], vb: &[Half]) -> f32 {
        (1.0 - dot(va, vb)).max(0.0)
    }
}

pub type Graph = Hnsw<'static, Half, DistUnitDot>;
/// Vectors by label.
pub type Vectors = HashMap<usize, Vector>;
/// The dump's base name. Dumps of f32 graphs (base name `hnsw`, before
/// vectors were held in half precision) are not read: the graph is rebuilt
/// from the store's vectors, and the next dump replaces them.
pub(super) const DUMP: &str = "hnsw16";

/// HNSW parameters (validated: hnsw_rs exits the process on some bad ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnParams {
    /// Links per node and layer (hnsw_rs `max_nb_connection`), 4..=64.
    pub m: usize,
    /// Candidate list while building, 16..=1000.
    pub ef_construction: usize,
    /// Candidate list while searching, 10..=2000.
    pub ef_search: usize,
}

impl Default for AnnParams {
    fn default() -> Self {
        AnnParams {
            m: 16,
            ef_construction: 100,
            ef_search: 64,
        }
    }
}

impl AnnParams {
    /// Defaults for the vectors of an embedder kind. Feature-hashing
    /// vectors are sparse and of high intrinsic dimension: hnsw_rs inserts
    /// them with a short candidate list (48) and searches with a long one
    /// (128), which reaches the recall that 100/64 gives at 2.2x the insert
    /// rate and +0.25 ms per query (BENCHMARKS journal, "The ANN graph alone").
    pub fn for_embedder(kind: &str) -> Self {
        match kind {
            "hash" => AnnParams {
                ef_construction: 48,
                ef_search: 128,
                ..AnnParams::default()
            },
            _ => AnnParams::default(),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(4..=64).contains(&self.m) {
            return Err(format!("hnsw_m = {} (must be 4..=64)", self.m));
        }
        if !(16..=1000).contains(&self.ef_construction) {
            return Err(format!(
                "hnsw_ef_construction = {} (must be 16..=1000)",
                self.ef_construction
            ));
        }
        if !(10..=2000).contains(&self.ef_search) {
            return Err(format!(
                "hnsw_ef_search = {} (must be 10..=2000)",
                self.ef_search
            ));
        }
        Ok(())
    }
}

pub fn new_graph(p: &AnnParams, capacity: usize) -> Graph {
    Hnsw::new(p.m, capacity.max(1024), 16, p.ef_construction, DistUnitDot)
}

/// Insert labelled vectors into `g` (on the rayon pool when more than one).
pub fn insert(g: &Graph, items: &[(usize, Vector)]) {
    let data: Vec<(&[Half], usize)> = items.iter().map(|(l, v)| (&v[..], *l)).collect();
    match data.as_slice() {
        [] => {}
        [one] => g.insert_slice(*one),
        _ => g.parallel_insert_slice(&data),
    }
}

/// Build a fresh graph from vectors (several threads).
pub fn build(p: &AnnParams, items: &[(usize, Vector)]) -> Graph {
    let g = new_graph(p, items.len());
    insert(&g, items);
    g
}

/// Nearest `k` labels to `q` by the graph; with `keep`, only those it
/// accepts (hnsw_rs's filtered search, which explores more of the graph).
pub fn search(
    g: &Graph,
    p: &AnnParams,
    q: &[Half],
    k: usize,
    keep: Option<&dyn Fn(usize) -> bool>,
) -> Vec<(usize, f32)> {
    if g.get_nb_point() == 0 || k == 0 {
        return Vec::new();
    }
    let ef = p.ef_search.max(k);
    let found = match keep {
        Some(keep) => {
            let filter = |id: &usize| keep(*id);
            g.search_filter(q, k, ef, Some(&filter))
        }
        None => g.search(q, k, ef),
    };
    found
        .into_iter()
        .map(|n| (n.d_id, 1.0 - n.distance))
        .collect()
}

/// Exact top `k` of `q` among `items` (similarity = dot of unit vectors).
pub fn exact<'a>(
    q: &[Half],
    k: usize,
    items: impl Iterator<Item = (usize, &'a [Half])>,
) -> Vec<(usize, f32)> {
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<(OrdF32, usize)>> =
        Default::default();
    for (l, v) in items {
        let s = OrdF32(dot(q, v));
        if heap.len() < k {
            heap.push(std::cmp::Reverse((s, l)));
        } else if heap.peek().is_some_and(|m| s > m.0 .0) {
            heap.pop();
            heap.push(std::cmp::Reverse((s, l)));
        }
    }
    let mut out: Vec<(usize, f32)> = heap.into_iter().map(|r| (r.0 .1, r.0 .0 .0)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

#[derive(Clone, Copy, PartialEq)]
struct OrdF32(f32);
impl Eq for OrdF32 {}
impl PartialOrd for OrdF32 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdF32 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// Write the graph into `dir` (replacing what was there) with hnsw_rs's
/// dump, through a temporary directory renamed into place.
pub fn dump(g: &Graph, dir: &Path) -> Result<(), String> {
    let tmp = dir.with_extension("tmp");
    let old = dir.with_extension("old");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    if g.get_nb_point() > 0 {
        g.file_dump(&tmp, DUMP)
            .map_err(|e| format!("hnsw dump: {e}"))?;
    }
    for f in std::fs::read_dir(&tmp).map_err(|e| e.to_string())? {
        let f = f.map_err(|e| e.to_string())?;
        std::fs::File::open(f.path())
            .and_then(|f| f.sync_all())
            .map_err(|e| e.to_string())?;
    }
    let _ = std::fs::remove_dir_all(&old);
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(|e| e.to_string())?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// Load a dump written by `dump`, with the vectors of its points by label.
/// A missing, empty or damaged dump gives `None` (the caller rebuilds).
pub fn load(dir: &Path, dim: usize) -> Option<(Graph, Vectors)> {
    if !dir.join(format!("{DUMP}.hnsw.graph")).exists() {
        return None;
    }
    let dir = dir.to_path_buf();
    // hnsw_rs asserts on damaged files; a damaged dump must not take the daemon down.
    std::panic::catch_unwind(move || {
        // The loaded graph borrows its loader for its whole life.
        let io: &'static mut HnswIo = Box::leak(Box::new(HnswIo::new(&dir, DUMP)));
        let g: Graph = io.load_hnsw::<Half, DistUnitDot>().ok()?;
        let mut vecs = HashMap::new();
        if g.get_nb_point() > 0 {
            for p in g.get_point_indexation() {
                let v = p.get_v();
                if v.len() != dim {
                    return None;
                }
                vecs.insert(p.get_origin_id(), Arc::from(v));
            }
        }
        Some((g, vecs))
    })
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(seed: u64, dim: usize) -> Vec<f32> {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut v: Vec<f32> = (0..dim)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect();
        crate::index::embed::normalize(&mut v);
        v
    }

    #[test]
    fn simd_dot_matches_the_portable_one_at_every_length() {
        for dim in [
            0usize, 1, 7, 8, 15, 16, 17, 31, 32, 33, 50, 64, 300, 384, 385, 1536,
        ] {
            let (a, b) = (
                half(&unit(dim as u64 + 1, dim)),
                half(&unit(dim as u64 + 99, dim)),
            );
            let (fast, slow) = (dot(&a, &b), dot_portable(&a, &b));
            assert!((fast - slow).abs() < 1e-5, "dim {dim}: {fast} vs {slow}");
            if dim > 0 {
                assert!((dot(&a, &a) - 1.0).abs() < 2e-3, "dim {dim}: self-dot");
            }
        }
        // Unequal lengths: the shorter one counts.
        let (a, b) = (half(&unit(5, 40)), half(&unit(6, 33)));
        assert!((dot(&a, &b) - dot_portable(&a[..33], &b)).abs() < 1e-5);
    }

    /// Half precision moves a dot product of unit vectors by well under
    /// 1e-3, and widening a half vector is exact.
    #[test]
    fn half_precision_keeps_dot_products() {
        let mut worst = 0f32;
        for i in 0..200u64 {
            let (a, b) = (unit(i, 384), unit(i + 1000, 384));
            let f32_dot: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            worst = worst.max((dot(&half(&a), &half(&b)) - f32_dot).abs());
        }
        assert!(worst < 1e-3, "worst {worst}");
        let h = half(&unit(7, 50));
        let widened: Vec<f32> = h
            .iter()
            .map(|x| half::f16::from_bits(*x).to_f32())
            .collect();
        assert_eq!(half(&widened), h);
    }

    #[test]
    fn params_are_checked() {
        assert!(AnnParams::default().validate().is_ok());
        let bad = AnnParams {
            m: 300,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn graph_matches_exact_and_survives_dump() {
        let p = AnnParams::default();
        let items: Vec<(usize, Vector)> = (0..2000)
            .map(|i| (i + 10, half(&unit(i as u64, 32))))
            .collect();
        let g = build(&p, &items);
        let q = half(&unit(99_999, 32));
        let truth = exact(&q, 10, items.iter().map(|(l, v)| (*l, &v[..])));
        let got = search(&g, &p, &q, 10, None);
        let hit = got
            .iter()
            .filter(|(l, _)| truth.iter().any(|t| t.0 == *l))
            .count();
        assert!(hit >= 9, "recall {hit}/10");
        // Filter: only even labels.
        let even = search(&g, &p, &q, 10, Some(&|l| l % 2 == 0));
        assert!(even.iter().all(|(l, _)| l % 2 == 0));

        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("acct");
        dump(&g, &d).unwrap();
        dump(&g, &d).unwrap(); // replacing works
        let (g2, vecs) = load(&d, 32).expect("loads");
        assert_eq!(vecs.len(), 2000);
        assert_eq!(&vecs[&10][..], &items[0].1[..]);
        let got2 = search(&g2, &p, &q, 10, None);
        assert_eq!(got2.len(), 10);
        // A damaged dump is refused, not fatal.
        std::fs::write(d.join(format!("{DUMP}.hnsw.data")), b"garbage").unwrap();
        assert!(load(&d, 32).is_none());
        assert!(load(&dir.path().join("missing"), 32).is_none());
    }
}

#[cfg(test)]
mod reload_tests {
    use super::*;

    #[test]
    fn inserts_after_reload_are_found() {
        let p = AnnParams::default();
        let v = |i: usize| -> Vector {
            let mut x = vec![0f32; 8];
            x[i % 8] = 1.0;
            x[(i + 1) % 8] = 0.5;
            crate::index::embed::normalize(&mut x);
            half(&x)
        };
        let items: Vec<(usize, Vector)> = (1..=4).map(|i| (i, v(i))).collect();
        let g = build(&p, &items);
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("a");
        dump(&g, &d).unwrap();
        let (g2, _) = load(&d, 8).unwrap();
        for i in 5..=8 {
            g2.insert_slice((&v(i)[..], i));
        }
        let q = v(6);
        let all = search(&g2, &p, &q, 10, None);
        assert!(all.iter().any(|x| x.0 == 6), "{all:?}");
        let keep = |l: usize| l > 4;
        let f = search(&g2, &p, &q, 10, Some(&keep));
        assert!(f.iter().any(|x| x.0 == 6), "{f:?}");
    }
}
