//! all-MiniLM-L6-v2 in-process: a small BERT encoder on candle, mean
//! pooling with the attention mask and L2 normalisation, as
//! sentence-transformers computes it. The files come from the model
//! directory (`config.json`, `tokenizer.json`, `model.safetensors`).

use super::embed::{normalize, Embedder};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, VarBuilder};
use std::path::Path;
use std::sync::Mutex;
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

pub const MODEL_ID: &str = "all-MiniLM-L6-v2";
/// Files a model directory must hold.
pub const FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];
/// Word pieces read per text (sentence-transformers' `max_seq_length`).
const MAX_TOKENS: usize = 256;

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

/// A dense layer whose weight is stored transposed (`[in, out]`,
/// contiguous) once at load: a multiplication then reads it in place
/// instead of repacking a strided view on every call. The bias (and a
/// residual) is added in place, in one pass over the product.
struct Dense {
    wt: Tensor,
    b: Vec<f32>,
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
            let l = linear(inp, out, vb.pp(n))?;
            let bias = l
                .bias()
                .ok_or_else(|| candle_core::Error::Msg(format!("{n}: the layer has no bias")))?;
            let f = scales.get(i).copied().unwrap_or(1.0);
            w.push((l.weight() * f)?);
            b.push((bias * f)?);
        }
        Ok(Dense {
            wt: Tensor::cat(&w, 0)?.t()?.contiguous()?,
            b: Tensor::cat(&b, 0)?.to_vec1()?,
        })
    }

    /// `[n, in]` → `[n, out]`.
    fn forward(&self, x: &Tensor) -> CResult<Tensor> {
        let y = x.matmul(&self.wt)?;
        y.inplace_op1(&AddBias(&self.b))?;
        Ok(y)
    }

    /// `[n, in]` → `[n, out]` plus `res` (`[n, out]`).
    fn forward_add(&self, x: &Tensor, res: &Tensor) -> CResult<Tensor> {
        let y = x.matmul(&self.wt)?;
        y.inplace_op2(res, &AddBias(&self.b))?;
        Ok(y)
    }
}

/// The values of a contiguous f32 tensor (`what` names it in the error).
fn f32s<'v>(
    s: &'v candle_core::CpuStorage,
    l: &candle_core::Layout,
    what: &str,
) -> CResult<&'v [f32]> {
    match (s, l.contiguous_offsets()) {
        (candle_core::CpuStorage::F32(v), Some((a, z))) => Ok(&v[a..z]),
        _ => Err(candle_core::Error::Msg(format!(
            "{what}: a contiguous f32 tensor"
        ))),
    }
}

/// [`f32s`], to change in place.
fn f32s_mut<'v>(
    s: &'v mut candle_core::CpuStorage,
    l: &candle_core::Layout,
    what: &str,
) -> CResult<&'v mut [f32]> {
    match (s, l.contiguous_offsets()) {
        (candle_core::CpuStorage::F32(v), Some((a, z))) => Ok(&mut v[a..z]),
        _ => Err(candle_core::Error::Msg(format!(
            "{what}: a contiguous f32 tensor"
        ))),
    }
}

/// Adds a bias to every row of a contiguous f32 matrix in place, and with
/// a second operand of the same shape, that operand too.
struct AddBias<'a>(&'a [f32]);

impl AddBias<'_> {
    fn rows<'v>(
        &self,
        s: &'v mut candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> CResult<&'v mut [f32]> {
        let v = f32s_mut(s, l, "bias")?;
        if v.len() % self.0.len() != 0 {
            return Err(candle_core::Error::Msg(
                "bias: rows of a length other than the bias'".into(),
            ));
        }
        Ok(v)
    }
}

impl candle_core::InplaceOp1 for AddBias<'_> {
    fn name(&self) -> &'static str {
        "add-bias"
    }
    fn cpu_fwd(&self, s: &mut candle_core::CpuStorage, l: &candle_core::Layout) -> CResult<()> {
        for row in self.rows(s, l)?.chunks_exact_mut(self.0.len()) {
            for (x, b) in row.iter_mut().zip(self.0) {
                *x += b;
            }
        }
        Ok(())
    }
}

impl candle_core::InplaceOp2 for AddBias<'_> {
    fn name(&self) -> &'static str {
        "add-bias-residual"
    }
    fn cpu_fwd(
        &self,
        s: &mut candle_core::CpuStorage,
        l: &candle_core::Layout,
        r: &candle_core::CpuStorage,
        rl: &candle_core::Layout,
    ) -> CResult<()> {
        let y = self.rows(s, l)?;
        let res = f32s(r, rl, "residual")?;
        if res.len() != y.len() {
            return Err(candle_core::Error::Msg(
                "residual: a shape other than the product's".into(),
            ));
        }
        let n = self.0.len();
        for (row, rrow) in y.chunks_exact_mut(n).zip(res.chunks_exact(n)) {
            for ((x, b), r) in row.iter_mut().zip(self.0).zip(rrow) {
                *x += b + r;
            }
        }
        Ok(())
    }
}

struct Layer {
    qkv: Dense,
    attn_out: Dense,
    attn_norm: LayerNorm,
    inter: Dense,
    out: Dense,
    out_norm: LayerNorm,
}

struct Bert {
    word: Embedding,
    pos: Embedding,
    typ: Embedding,
    norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
}

type CResult<T> = candle_core::Result<T>;

impl Bert {
    fn load(vb: VarBuilder, c: &Config) -> CResult<Self> {
        let e = vb.pp("embeddings");
        let h = c.hidden_size;
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
            layers.push(Layer {
                qkv: Dense::load(&l, &qkv, &[scale], h, h)?,
                attn_out: Dense::load(&l, &["attention.output.dense"], &[], h, h)?,
                attn_norm: layer_norm(h, c.layer_norm_eps, l.pp("attention.output.LayerNorm"))?,
                inter: Dense::load(&l, &["intermediate.dense"], &[], h, c.intermediate_size)?,
                out: Dense::load(&l, &["output.dense"], &[], c.intermediate_size, h)?,
                out_norm: layer_norm(h, c.layer_norm_eps, l.pp("output.LayerNorm"))?,
            });
        }
        Ok(Bert {
            word: embedding(c.vocab_size, h, e.pp("word_embeddings"))?,
            pos: embedding(c.max_position_embeddings, h, e.pp("position_embeddings"))?,
            typ: embedding(c.type_vocab_size, h, e.pp("token_type_embeddings"))?,
            norm: layer_norm(h, c.layer_norm_eps, e.pp("LayerNorm"))?,
            layers,
            heads: c.num_attention_heads,
        })
    }

    /// Token ids and mask `[batch, seq]` (u32) → hidden states `[batch, seq, h]`.
    /// `padded`: some mask entry is 0.
    fn forward(&self, ids: &Tensor, mask: &Tensor, padded: bool) -> CResult<Tensor> {
        let (b, s) = ids.dims2()?;
        let dev = ids.device();
        let pos = Tensor::arange(0u32, s as u32, dev)?
            .unsqueeze(0)?
            .broadcast_as((b, s))?;
        let typ = ids.zeros_like()?;
        let x = self
            .word
            .forward(ids)?
            .add(&self.pos.forward(&pos)?)?
            .add(&self.typ.forward(&typ)?)?;
        let h = x.dim(2)?;
        // Tokens as rows of one matrix from here: every dense layer is one
        // multiplication over the whole batch.
        let mut x = self.norm.forward(&x)?.reshape((b * s, h))?;
        // Additive mask: 0 for tokens, a large negative for padding; none
        // when nothing is padded (always so for a single text).
        let bias = if padded {
            let m = mask.to_dtype(DType::F32)?;
            Some(((m - 1.0)? * 1e4)?.reshape((b, 1, 1, s))?)
        } else {
            None
        };
        let hd = h / self.heads;
        for l in &self.layers {
            let qkv = l.qkv.forward(&x)?;
            let split = |i: usize| -> CResult<Tensor> {
                qkv.narrow(1, i * h, h)?
                    .reshape((b, s, self.heads, hd))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let (q, k, v) = (split(0)?, split(1)?, split(2)?);
            let mut att = q.matmul(&k.t()?)?;
            if let Some(bias) = &bias {
                att = att.broadcast_add(bias)?;
            }
            let att = candle_nn::ops::softmax_last_dim(&att)?;
            let ctx = att.matmul(&v)?.transpose(1, 2)?.reshape((b * s, h))?;
            let a = l.attn_norm.forward(&l.attn_out.forward_add(&ctx, &x)?)?;
            let i = l.inter.forward(&a)?;
            i.inplace_op1(&Gelu)?;
            x = l.out_norm.forward(&l.out.forward_add(&i, &a)?)?;
        }
        x.reshape((b, s, h))
    }
}

/// GELU with the exact error function, as BERT defines it (`hidden_act =
/// gelu`), applied in place. `erf` is a rational approximation (odd degree
/// 13 over even degree 8, the form Eigen and XNNPACK use) that the compiler
/// vectorises: no library call per element.
struct Gelu;

impl candle_core::InplaceOp1 for Gelu {
    fn name(&self) -> &'static str {
        "gelu-erf"
    }
    fn cpu_fwd(&self, s: &mut candle_core::CpuStorage, l: &candle_core::Layout) -> CResult<()> {
        gelu(f32s_mut(s, l, "gelu")?);
        Ok(())
    }
}

fn gelu(v: &mut [f32]) {
    // A batch's activations (millions of values) on every core; a query's
    // (tens of thousands) on the caller's thread.
    const PART: usize = 1 << 16;
    if v.len() > 2 * PART {
        use rayon::prelude::*;
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
        // The shipped tokenizer pads every input to 128: pad to the longest
        // of a batch instead, and read up to 256 word pieces.
        tok.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..Default::default()
        }));
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
            dim: cfg.hidden_size,
        })
    }

    fn run(&self, texts: &[&str]) -> CResult<Vec<Vec<f32>>> {
        let enc = {
            let tok = self.tok.lock().unwrap_or_else(|e| e.into_inner());
            tok.encode_batch(texts.to_vec(), true)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?
        };
        let b = enc.len();
        let s = enc
            .iter()
            .map(|e| e.get_ids().len())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut ids = Vec::with_capacity(b * s);
        let mut mask = Vec::with_capacity(b * s);
        for e in &enc {
            let (i, m) = (e.get_ids(), e.get_attention_mask());
            ids.extend_from_slice(i);
            mask.extend_from_slice(m);
            ids.resize(ids.len() + s - i.len(), 0);
            mask.resize(mask.len() + s - m.len(), 0);
        }
        let dev = Device::Cpu;
        let ids = Tensor::from_vec(ids, (b, s), &dev)?;
        let padded = mask.contains(&0);
        let mask = Tensor::from_vec(mask, (b, s), &dev)?;
        let hidden = self.bert.forward(&ids, &mask, padded)?;
        // Mean over real tokens.
        let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let sum = hidden.broadcast_mul(&m)?.sum(1)?;
        let n = m.sum(1)?.clamp(1e-9, f64::MAX)?;
        let mean = sum.broadcast_div(&n)?;
        let mut out: Vec<Vec<f32>> = mean.to_vec2()?;
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
}
