//! all-MiniLM-L6-v2 in-process: a small BERT encoder, mean pooling over
//! the tokens and L2 normalisation, as sentence-transformers computes it.
//! The files come from the model directory (`config.json`,
//! `tokenizer.json`, `model.safetensors`); candle reads the weights, and
//! the forward pass runs on plain f32 buffers with the `gemm` crate:
//!
//! - the texts of a batch are packed row after row, without padding: each
//!   dense layer is one multiplication over every real token of the batch,
//!   and attention runs per text over its own rows (no mask, no padded
//!   rows to compute);
//! - bias and residual are written into the destination first and the
//!   product is accumulated onto them (no pass to add them after);
//! - query, key and value are read in place from the one projection that
//!   computes them together, and each head's context is written in place
//!   into the rows of the next layer's input (no head split or merge copies);
//! - the buffers of a batch are kept for the next batch (no page faults on
//!   fresh memory, no zeroing), up to [`KEEP_BYTES`] per lane.

use super::embed::{normalize, Embedder};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use gemm::Parallelism;
use rayon::prelude::*;
use std::path::Path;
use std::sync::Mutex;
use tokenizers::{Tokenizer, TruncationParams};

pub const MODEL_ID: &str = "all-MiniLM-L6-v2";
/// Files a model directory must hold.
pub const FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];
/// Word pieces read per text (sentence-transformers' `max_seq_length`).
const MAX_TOKENS: usize = 256;
/// Buffers kept for the next batch, per lane. A batch of 32 texts of 60
/// word pieces needs about 30 MB; a larger batch gets buffers of its own,
/// freed after it.
const KEEP_BYTES: usize = 64 << 20;

#[derive(serde::Deserialize)]
struct Config {
    hidden_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    intermediate_size: usize,
    vocab_size: usize,
    max_position_embeddings: usize,
    type_vocab_size: usize,
    layer_norm_eps: f64,
}

type CResult<T> = candle_core::Result<T>;

/// The f32 values of a tensor, row-major.
fn values(t: &Tensor) -> CResult<Vec<f32>> {
    t.flatten_all()?.to_vec1()
}

/// A dense layer: the weight transposed to `[in, out]` (row-major) and
/// the bias.
struct Dense {
    wt: Vec<f32>,
    b: Vec<f32>,
    inp: usize,
    out: usize,
}

impl Dense {
    /// The layers under `names`, side by side along the output (one
    /// multiplication computes query, key and value together), each
    /// scaled by its factor in `scales` (1 when absent).
    fn load(
        vb: &VarBuilder,
        names: &[&str],
        scales: &[f64],
        inp: usize,
        out: usize,
    ) -> CResult<Self> {
        let mut w = Vec::new();
        let mut b = Vec::new();
        for (i, n) in names.iter().enumerate() {
            let f = scales.get(i).copied().unwrap_or(1.0);
            w.push((vb.pp(n).get((out, inp), "weight")? * f)?);
            b.push((vb.pp(n).get(out, "bias")? * f)?);
        }
        Ok(Dense {
            wt: values(&Tensor::cat(&w, 0)?.t()?.contiguous()?)?,
            b: values(&Tensor::cat(&b, 0)?)?,
            inp,
            out: out * names.len(),
        })
    }

    /// `y[n, out] += x[n, in] · W` (the caller fills `y` with the bias,
    /// plus a residual, first).
    fn accumulate(&self, x: &[f32], y: &mut [f32], n: usize) {
        assert!(x.len() >= n * self.inp && y.len() >= n * self.out);
        let threads = rayon::current_num_threads();
        let par = if threads > 1 && n > 1 {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        // SAFETY: the three matrices lie inside their slices (asserted
        // above, strides as described), `y` is not aliased by `x` or `wt`.
        unsafe {
            mul(
                (n, self.out, self.inp),
                y.as_mut_ptr(),
                self.out,
                true,
                Mat {
                    p: x.as_ptr(),
                    rs: self.inp as isize,
                    cs: 1,
                },
                Mat {
                    p: self.wt.as_ptr(),
                    rs: self.out as isize,
                    cs: 1,
                },
                par,
            )
        }
    }

    /// `y` (`[n, out]`) := the bias in every row, plus `res` (`[n, out]`).
    fn start(&self, y: &mut Vec<f32>, n: usize, res: Option<&[f32]>) {
        y.clear();
        match res {
            Some(r) => y.extend(
                r[..n * self.out]
                    .chunks_exact(self.out)
                    .flat_map(|row| row.iter().zip(&self.b).map(|(a, b)| a + b)),
            ),
            None => (0..n).for_each(|_| y.extend_from_slice(&self.b)),
        }
    }
}

/// A row-major matrix operand: `rows` apart by `rs` values, columns by `cs`.
#[derive(Clone, Copy)]
struct Mat {
    p: *const f32,
    rs: isize,
    cs: isize,
}

/// `dst[m, n] (rows dst_rs apart) = (dst if acc) + a[m, k] · b[k, n]`.
///
/// # Safety
/// Every element the shapes and strides address lies inside its buffer,
/// and `dst` aliases neither operand.
unsafe fn mul(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    dst_rs: usize,
    acc: bool,
    a: Mat,
    b: Mat,
    par: Parallelism,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        acc,
        a.p,
        a.cs,
        a.rs,
        b.p,
        b.cs,
        b.rs,
        if acc { 1.0 } else { 0.0 },
        1.0,
        false,
        false,
        false,
        par,
    )
}

/// Layer normalisation of each row of `x`, in place.
struct Norm {
    g: Vec<f32>,
    b: Vec<f32>,
    eps: f32,
}

impl Norm {
    fn load(vb: VarBuilder, h: usize, eps: f64) -> CResult<Self> {
        Ok(Norm {
            g: values(&vb.get(h, "weight")?)?,
            b: values(&vb.get(h, "bias")?)?,
            eps: eps as f32,
        })
    }

    fn apply(&self, x: &mut [f32]) {
        let h = self.g.len();
        for row in x.chunks_exact_mut(h) {
            let mean = row.iter().sum::<f32>() / h as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            for ((v, g), b) in row.iter_mut().zip(&self.g).zip(&self.b) {
                *v = (*v - mean) * inv * g + b;
            }
        }
    }
}

struct Layer {
    qkv: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    inter: Dense,
    out: Dense,
    out_norm: Norm,
}

struct Bert {
    word: Vec<f32>,
    pos: Vec<f32>,
    typ: Vec<f32>,
    norm: Norm,
    layers: Vec<Layer>,
    h: usize,
    heads: usize,
    max_pos: usize,
}

/// The buffers of one forward pass, kept between batches.
#[derive(Default)]
struct Work {
    x: Vec<f32>,
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    a: Vec<f32>,
    inter: Vec<f32>,
}

impl Work {
    fn bytes(&self) -> usize {
        4 * [&self.x, &self.qkv, &self.ctx, &self.a, &self.inter]
            .iter()
            .map(|v| v.capacity())
            .sum::<usize>()
    }
}

impl Bert {
    fn load(vb: VarBuilder, c: &Config) -> CResult<Self> {
        let e = vb.pp("embeddings");
        let h = c.hidden_size;
        if c.num_attention_heads == 0 || !h.is_multiple_of(c.num_attention_heads) {
            return Err(candle_core::Error::Msg(format!(
                "config.json: hidden_size {h} is not a multiple of num_attention_heads {}",
                c.num_attention_heads
            )));
        }
        let mut layers = Vec::new();
        for i in 0..c.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let qkv = [
                "attention.self.query",
                "attention.self.key",
                "attention.self.value",
            ];
            // The attention's 1/sqrt(head size) folded into the query
            // projection: no pass over the scores to scale them.
            let scale = 1.0 / ((h / c.num_attention_heads) as f64).sqrt();
            let eps = c.layer_norm_eps;
            layers.push(Layer {
                qkv: Dense::load(&l, &qkv, &[scale], h, h)?,
                attn_out: Dense::load(&l, &["attention.output.dense"], &[], h, h)?,
                attn_norm: Norm::load(l.pp("attention.output.LayerNorm"), h, eps)?,
                inter: Dense::load(&l, &["intermediate.dense"], &[], h, c.intermediate_size)?,
                out: Dense::load(&l, &["output.dense"], &[], c.intermediate_size, h)?,
                out_norm: Norm::load(l.pp("output.LayerNorm"), h, eps)?,
            });
        }
        let table = |name: &str, rows: usize| -> CResult<Vec<f32>> {
            values(&e.pp(name).get((rows, h), "weight")?)
        };
        Ok(Bert {
            word: table("word_embeddings", c.vocab_size)?,
            pos: table("position_embeddings", c.max_position_embeddings)?,
            typ: table("token_type_embeddings", c.type_vocab_size)?,
            norm: Norm::load(e.pp("LayerNorm"), h, c.layer_norm_eps)?,
            layers,
            h,
            heads: c.num_attention_heads,
            max_pos: c.max_position_embeddings,
        })
    }

    /// The word-piece ids of each text → its mean-pooled hidden state.
    fn forward(&self, texts: &[&[u32]], w: &mut Work) -> CResult<Vec<Vec<f32>>> {
        let h = self.h;
        // Row ranges of the texts in the packed batch.
        let mut spans = Vec::with_capacity(texts.len());
        let mut n = 0;
        for t in texts {
            if t.len() > self.max_pos {
                return Err(candle_core::Error::Msg(format!(
                    "{} word pieces, more than the model's {} positions",
                    t.len(),
                    self.max_pos
                )));
            }
            spans.push(n..n + t.len());
            n += t.len();
        }
        // Embeddings: word + position + type 0, normalised.
        w.x.clear();
        for t in texts {
            for (p, &id) in t.iter().enumerate() {
                let id = id as usize;
                if (id + 1) * h > self.word.len() {
                    return Err(candle_core::Error::Msg(format!(
                        "word piece {id} is outside the vocabulary"
                    )));
                }
                let (wr, pr) = (&self.word[id * h..][..h], &self.pos[p * h..][..h]);
                w.x.extend(
                    wr.iter()
                        .zip(pr)
                        .zip(&self.typ[..h])
                        .map(|((a, b), c)| a + b + c),
                );
            }
        }
        self.norm.apply(&mut w.x);
        for l in &self.layers {
            l.qkv.start(&mut w.qkv, n, None);
            l.qkv.accumulate(&w.x, &mut w.qkv, n);
            self.attention(&w.qkv, &mut w.ctx, &spans);
            l.attn_out.start(&mut w.a, n, Some(&w.x));
            l.attn_out.accumulate(&w.ctx, &mut w.a, n);
            l.attn_norm.apply(&mut w.a);
            l.inter.start(&mut w.inter, n, None);
            l.inter.accumulate(&w.a, &mut w.inter, n);
            gelu(&mut w.inter);
            l.out.start(&mut w.x, n, Some(&w.a));
            l.out.accumulate(&w.inter, &mut w.x, n);
            l.out_norm.apply(&mut w.x);
        }
        // Mean over each text's tokens.
        Ok(spans
            .iter()
            .map(|r| {
                let mut v = vec![0f32; h];
                for row in w.x[r.start * h..r.end * h].chunks_exact(h) {
                    v.iter_mut().zip(row).for_each(|(a, b)| *a += b);
                }
                let k = r.len().max(1) as f32;
                v.iter_mut().for_each(|a| *a /= k);
                v
            })
            .collect())
    }

    /// Self-attention of each text over its own rows: `qkv` holds
    /// `[query | key | value]` per row (the query already scaled), `ctx`
    /// gets every head's output side by side per row.
    fn attention(&self, qkv: &[f32], ctx: &mut Vec<f32>, spans: &[std::ops::Range<usize>]) {
        let h = self.h;
        let n = spans.last().map_or(0, |r| r.end);
        ctx.clear();
        ctx.resize(n * h, 0.0);
        // Each text's rows of `ctx`, one task per text.
        let mut parts = Vec::with_capacity(spans.len());
        let mut rest: &mut [f32] = ctx;
        for r in spans {
            let (mine, more) = rest.split_at_mut(r.len() * h);
            parts.push((r.clone(), mine));
            rest = more;
        }
        let one = |(r, out): (std::ops::Range<usize>, &mut [f32])| {
            self.attend(&qkv[r.start * 3 * h..r.end * 3 * h], out, r.len())
        };
        if parts.len() > 1 {
            parts.into_par_iter().for_each(one);
        } else {
            parts.into_iter().for_each(one);
        }
    }

    /// One text of `len` tokens: `qkv` its rows, `out` its context rows.
    fn attend(&self, qkv: &[f32], out: &mut [f32], len: usize) {
        let (h, hd) = (self.h, self.h / self.heads);
        let mut att = vec![0f32; len * len];
        let row = 3 * h as isize;
        for head in 0..self.heads {
            let (q, k, v) = (head * hd, h + head * hd, 2 * h + head * hd);
            // SAFETY: every index read is `t * 3h + c + d` with t < len,
            // c + d < 3h (c one of q, k, v; d < hd), inside `qkv`; `att` is
            // len × len; `out` rows are `h` apart with `head * hd + hd <= h`.
            unsafe {
                // att = Q · Kᵀ
                mul(
                    (len, len, hd),
                    att.as_mut_ptr(),
                    len,
                    false,
                    Mat {
                        p: qkv.as_ptr().add(q),
                        rs: row,
                        cs: 1,
                    },
                    Mat {
                        p: qkv.as_ptr().add(k),
                        rs: 1,
                        cs: row,
                    },
                    Parallelism::None,
                );
            }
            for r in att.chunks_exact_mut(len) {
                let m = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut s = 0.0;
                for x in r.iter_mut() {
                    *x = (*x - m).exp();
                    s += *x;
                }
                let inv = 1.0 / s;
                r.iter_mut().for_each(|x| *x *= inv);
            }
            // SAFETY: as above.
            unsafe {
                // out[:, head] = softmax(att) · V
                mul(
                    (len, hd, len),
                    out.as_mut_ptr().add(head * hd),
                    h,
                    false,
                    Mat {
                        p: att.as_ptr(),
                        rs: len as isize,
                        cs: 1,
                    },
                    Mat {
                        p: qkv.as_ptr().add(v),
                        rs: row,
                        cs: 1,
                    },
                    Parallelism::None,
                );
            }
        }
    }
}

/// GELU with the exact error function, as BERT defines it (`hidden_act =
/// gelu`), applied in place. `erf` is a rational approximation (odd degree
/// 13 over even degree 8, the form Eigen and XNNPACK use) that the compiler
/// vectorises: no library call per element.
fn gelu(v: &mut [f32]) {
    // A batch's activations (millions of values) on every core; a query's
    // (tens of thousands) on the caller's thread.
    const PART: usize = 1 << 16;
    if v.len() > 2 * PART {
        v.par_chunks_mut(PART).for_each(gelu_part);
    } else {
        gelu_part(v);
    }
}

fn gelu_part(v: &mut [f32]) {
    for x in v {
        *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
    }
}

#[inline(always)]
fn erf(x: f32) -> f32 {
    // Beyond ±4, erf is ±1 in f32. Plain multiply-adds: `mul_add` would be
    // a library call without the FMA target feature.
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.726_142_3e-10 + 2.770_681_4e-8;
    for c in [
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.954_6e-3,
        -1.609_603_3e-2,
    ] {
        p = x2 * p + c;
    }
    let mut q = x2 * -1.456_607_2e-5 - 2.133_740_6e-4;
    for c in [-1.682_827e-3, -7.373_329e-3, -1.426_473_9e-2] {
        q = x2 * q + c;
    }
    x * p / q
}

pub struct MiniLm {
    bert: Bert,
    tok: Mutex<Tokenizer>,
    /// Buffers of finished batches, for the next ones.
    works: Mutex<Vec<Work>>,
    dim: usize,
}

impl MiniLm {
    /// Does `dir` hold the model's files?
    pub fn present(dir: &Path) -> bool {
        FILES.iter().all(|f| dir.join(f).is_file())
    }

    pub fn load(dir: &Path) -> Result<Self, String> {
        let cfg: Config = serde_json::from_slice(
            &std::fs::read(dir.join("config.json")).map_err(|e| format!("config.json: {e}"))?,
        )
        .map_err(|e| format!("config.json: {e}"))?;
        let mut tok = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| format!("tokenizer.json: {e}"))?;
        // The shipped tokenizer pads every input to 128: the encoder packs
        // texts without padding, and reads up to 256 word pieces of each.
        tok.with_padding(None);
        tok.with_truncation(Some(TruncationParams {
            max_length: MAX_TOKENS,
            ..Default::default()
        }))
        .map_err(|e| format!("tokenizer: {e}"))?;
        // SAFETY: the weights file is mapped read-only and not modified while mapped.
        let vb = unsafe {
            VarBuilder::from_mmaped_safetensors(
                &[dir.join("model.safetensors")],
                DType::F32,
                &Device::Cpu,
            )
        }
        .map_err(|e| format!("model.safetensors: {e}"))?;
        let bert = Bert::load(vb, &cfg).map_err(|e| format!("model.safetensors: {e}"))?;
        Ok(MiniLm {
            bert,
            tok: Mutex::new(tok),
            works: Mutex::new(Vec::new()),
            dim: cfg.hidden_size,
        })
    }

    fn run(&self, texts: &[&str]) -> CResult<Vec<Vec<f32>>> {
        let enc = {
            let tok = crate::locks::lock(&self.tok);
            tok.encode_batch(texts.to_vec(), true)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?
        };
        let ids: Vec<&[u32]> = enc.iter().map(|e| e.get_ids()).collect();
        let taken = crate::locks::lock(&self.works).pop();
        let mut w = taken.unwrap_or_default();
        let out = self.bert.forward(&ids, &mut w);
        if w.bytes() <= KEEP_BYTES {
            crate::locks::lock(&self.works).push(w);
        }
        let mut out = out?;
        for v in &mut out {
            normalize(v);
        }
        Ok(out)
    }
}

impl Embedder for MiniLm {
    fn id(&self) -> &str {
        MODEL_ID
    }
    fn kind(&self) -> &'static str {
        "minilm"
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        self.run(texts).map_err(|e| format!("MiniLM: {e}"))
    }
    /// The matrix products use every core, but the steps between them
    /// (softmax, bias adds, copies) run on the calling thread: a second
    /// batch beside the first keeps both cores busy.
    fn lanes(&self) -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model directory of the test suite (`make model` fills it).
    pub fn test_model_dir() -> std::path::PathBuf {
        std::env::var_os("CTXFS_MODEL_DIR")
            .map(Into::into)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("models")
                    .join(MODEL_ID)
            })
    }

    /// The rational `erf` against the series/continued fraction in f64.
    #[test]
    fn erf_is_accurate() {
        fn erf64(x: f64) -> f64 {
            // Maclaurin series; converges well for |x| <= 3 in f64.
            let (mut term, mut sum, mut n) = (x, x, 0.0);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -x * x / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        }
        let mut worst = 0f64;
        for i in -3000..=3000 {
            let x = i as f64 / 1000.0;
            worst = worst.max((erf(x as f32) as f64 - erf64(x)).abs());
        }
        assert!(worst < 2e-6, "erf error {worst}");
        assert_eq!(erf(9.0), erf(4.0));
        assert!((erf(4.0) - 1.0).abs() < 1e-6 && (erf(-30.0) + 1.0).abs() < 1e-6);
        let mut g = [-10.0f32, -1.0, 0.0, 1.0, 10.0];
        gelu(&mut g);
        let want = [0.0f32, -0.158_655_26, 0.0, 0.841_344_7, 10.0];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{g:?}");
        }
    }

    /// Vectors of sentence-transformers 5 (mean pooling, L2 norm) for ten
    /// texts, from `tests/data/minilm_reference.json`: ours must agree to
    /// 1e-3 in cosine.
    #[test]
    fn matches_sentence_transformers() {
        let dir = test_model_dir();
        assert!(
            MiniLm::present(&dir),
            "MiniLM files missing in {} (run `make model`)",
            dir.display()
        );
        let m = MiniLm::load(&dir).unwrap();
        let r: serde_json::Value = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/minilm_reference.json"
        )))
        .unwrap();
        let sents: Vec<&str> = r["sentences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        // Batched (padding to the longest) and one by one must both match.
        let batch = m.embed(&sents).unwrap();
        for (i, want) in r["vectors"].as_array().unwrap().iter().enumerate() {
            let want: Vec<f32> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let single = m.embed(&[sents[i]]).unwrap().remove(0);
            for got in [&batch[i], &single] {
                let cos: f32 = got.iter().zip(&want).map(|(a, b)| a * b).sum();
                assert!(
                    (1.0 - cos).abs() < 1e-3,
                    "sentence {i} {:?}: cosine {cos}",
                    sents[i]
                );
            }
        }
    }

    /// Buffers kept from a larger batch serve a smaller one and then a
    /// larger one again with the same results; an empty text and one
    /// longer than 256 word pieces go through.
    #[test]
    fn reused_buffers_give_the_same_vectors() {
        let m = MiniLm::load(&test_model_dir()).unwrap();
        let long = "memory of an agent ".repeat(200);
        let texts = [
            "",
            "a short text",
            long.as_str(),
            "another one, a bit longer than that",
        ];
        let first = m.embed(&texts).unwrap();
        let small = m.embed(&texts[1..2]).unwrap();
        let again = m.embed(&texts).unwrap();
        assert_eq!(first, again);
        let cos: f32 = small[0].iter().zip(&first[1]).map(|(a, b)| a * b).sum();
        assert!((1.0 - cos).abs() < 1e-5, "alone vs in a batch: {cos}");
        for v in &first {
            let n: f32 = v.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-4 && v.iter().all(|x| x.is_finite()));
        }
    }
}
