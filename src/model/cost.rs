//! Analytic cost of one batched forward pass (one serving iteration): a roofline.
//!
//! An iteration of continuous batching runs one forward pass over every token scheduled in it:
//! prompt chunks of sequences being prefilled and one token of each sequence being decoded.
//! The batch is summarised by four sums ([`BatchShape`]): new tokens `N`, sequences that sample
//! a token `S`, attention pairs `A` (over every new token, the number of positions it attends
//! to, itself included) and KV tokens read `R` (per sequence, its context plus its new tokens).
//! A prompt chunk of `n` tokens after `c` cached tokens adds `n` to `N`,
//! `n*c + n*(n+1)/2` to `A` (causal attention) and `c + n` to `R`.
//!
//! With `P` the parameters of all blocks, `P_head = hidden x vocab`, `L` layers, `H` query heads
//! of dimension `d`, `b` bytes per element and `kv` KV bytes per token:
//!
//! ```text
//! FLOPs = 2 P N  +  2 P_head S  +  4 L H d A          (matmuls; QK^T and PV for attention)
//! Bytes = b (P + P_head)  +  kv R  +  kv N            (weights once, KV read, new KV written)
//! t     = max(FLOPs / (tp x peak x eff_compute), Bytes / (tp x bw x eff_memory))
//!         + allreduce + overhead
//! ```
//!
//! With tensor parallelism over `tp` GPUs, both sums split evenly and every layer adds two
//! ring all-reduces of `N x hidden x b` bytes over NVLink, each costing
//! `2 (tp-1)/tp x bytes / nvlink_bw + 2 (tp-1) x nvlink_latency`, with `nvlink_bw` the link's
//! achievable bandwidth (line rate x efficiency). `overhead` is a fixed
//! per-iteration cost (scheduling, sampling, kernel launches) from the scenario.
//!
//! Ignored, on purpose: activations' memory traffic (small next to weights and KV at these
//! batch sizes), embedding lookups, norms' and rotary embeddings' FLOPs (well under 1 %), and
//! the overlap of communication with compute (the all-reduce is charged in full).

use crate::hardware::{GpuSpec, LinkSpec};
use crate::model::ModelConfig;
use crate::units::Nanos;

/// The four sums that decide the cost of a batch (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchShape {
    /// Sequences with work in the iteration (its members).
    pub seqs: u64,
    pub new_tokens: u64,
    pub sampling_seqs: u64,
    pub attention_pairs: u64,
    pub kv_read_tokens: u64,
    /// Cached tokens of the members that compute more than one new token (prefill chunks
    /// after a cache: a causal mask and matrix-matrix attention over the cache, where a
    /// one-token member's attention is a vector-matrix product). Only a measured profile
    /// prices it ([`crate::model::batch_profile`]); the roofline's attention is in the pairs.
    pub chunk_cached_tokens: u64,
    /// Members that compute more than one new token (prefill chunks). Only a measured
    /// profile prices them ([`crate::model::batch_profile`]).
    pub chunk_seqs: u64,
}

impl BatchShape {
    /// Adds `n` new tokens of one sequence that already has `cached` tokens in its KV cache.
    /// `samples` says whether this chunk ends the sequence's known tokens (and so samples one).
    pub fn add(&mut self, n: u64, cached: u64, samples: bool) {
        self.seqs += 1;
        self.new_tokens += n;
        self.sampling_seqs += samples as u64;
        self.attention_pairs += n * cached + n * (n + 1) / 2;
        self.kv_read_tokens += cached + n;
        if n > 1 {
            self.chunk_cached_tokens += cached;
            self.chunk_seqs += 1;
        }
    }

    /// Adds `count` sequences that each compute one new token and sample one, whose cached
    /// tokens sum to `cached`: the same as `count` calls of [`Self::add`]`(1, c, true)`.
    pub fn add_decoding(&mut self, count: u64, cached: u64) {
        self.seqs += count;
        self.new_tokens += count;
        self.sampling_seqs += count;
        self.attention_pairs += cached + count;
        self.kv_read_tokens += cached + count;
    }

    pub fn is_empty(&self) -> bool {
        self.new_tokens == 0
    }
}

/// The cost model of one serving instance: a model on `tp` GPUs of one kind.
#[derive(Clone, Debug)]
pub struct CostModel {
    model: ModelConfig,
    /// The link of the tensor-parallel all-reduce (none on one GPU).
    nvlink: Option<LinkSpec>,
    tp: u64,
    overhead: Nanos,
    terms: Terms,
}

/// The factors of the roofline that depend only on the model, the GPU and `tp` (see the
/// module doc), computed once: an iteration is priced millions of times in a run at cluster
/// scale, and these were close to half of its instructions. Each is the left part of the
/// per-iteration product or quotient it stands for (`2.0 * p * n` is `(2.0 * p) * n`), so an
/// iteration's price has the same bits as when they were computed every time.
#[derive(Clone, Copy, Debug)]
struct Terms {
    /// `2 P`: FLOPs a new token.
    token_flops: f64,
    /// `2 P_head`: FLOPs a sampled token.
    sample_flops: f64,
    /// `4 L H d`: FLOPs an attention pair.
    pair_flops: f64,
    /// `b (P + P_head)`: bytes of weights read once an iteration.
    weight_bytes: f64,
    /// KV bytes a token.
    kv: u64,
    /// `tp x peak x eff_compute`, FLOP/s.
    compute_rate: f64,
    /// `tp x bw x eff_memory`, bytes/s.
    memory_rate: f64,
}

impl Terms {
    fn new(m: &ModelConfig, gpu: &GpuSpec, tp: u64) -> Terms {
        let blocks = m.layers * m.params_per_layer();
        let weights = (blocks + m.lm_head_params()) * m.bytes_per_element;
        let tp = tp as f64;
        Terms {
            token_flops: 2.0 * blocks as f64,
            sample_flops: 2.0 * m.lm_head_params() as f64,
            pair_flops: 4.0 * (m.layers * m.heads * m.head_dim) as f64,
            weight_bytes: weights as f64,
            kv: m.kv_bytes_per_token(),
            compute_rate: tp * gpu.peak_flops * gpu.compute_efficiency,
            memory_rate: tp * gpu.memory_bandwidth * gpu.memory_efficiency,
        }
    }
}

impl CostModel {
    pub fn new(
        model: ModelConfig,
        gpu: GpuSpec,
        nvlink: LinkSpec,
        tp: u32,
        overhead: Nanos,
    ) -> CostModel {
        CostModel {
            terms: Terms::new(&model, &gpu, tp as u64),
            model,
            nvlink: Some(nvlink),
            tp: tp as u64,
            overhead,
        }
    }

    /// `model` on one GPU: no tensor parallelism, so no all-reduce link.
    pub fn single_gpu(model: ModelConfig, gpu: GpuSpec, overhead: Nanos) -> CostModel {
        CostModel {
            terms: Terms::new(&model, &gpu, 1),
            model,
            nvlink: None,
            tp: 1,
            overhead,
        }
    }

    pub fn flops(&self, b: &BatchShape) -> f64 {
        let t = &self.terms;
        t.token_flops * b.new_tokens as f64
            + t.sample_flops * b.sampling_seqs as f64
            + t.pair_flops * b.attention_pairs as f64
    }

    pub fn bytes(&self, b: &BatchShape) -> f64 {
        let t = &self.terms;
        t.weight_bytes + (t.kv * b.kv_read_tokens) as f64 + (t.kv * b.new_tokens) as f64
    }

    fn allreduce(&self, b: &BatchShape) -> Nanos {
        let Some(nvlink) = self.nvlink.filter(|_| self.tp > 1 && !b.is_empty()) else {
            return Nanos::ZERO;
        };
        let m = &self.model;
        let tp = self.tp as f64;
        let bytes = (b.new_tokens * m.hidden * m.bytes_per_element) as f64;
        let one = 2.0 * (tp - 1.0) / tp * bytes / nvlink.achievable()
            + 2.0 * (tp - 1.0) * nvlink.latency.as_secs_f64();
        Nanos::from_secs_f64(2.0 * m.layers as f64 * one)
    }

    /// Duration of one iteration over `b`; zero for an empty batch.
    pub fn iteration(&self, b: &BatchShape) -> Nanos {
        if b.is_empty() {
            return Nanos::ZERO;
        }
        let compute = self.flops(b) / self.terms.compute_rate;
        let memory = self.bytes(b) / self.terms.memory_rate;
        Nanos::from_secs_f64(compute.max(memory)) + self.allreduce(b) + self.overhead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100(eff: f64) -> GpuSpec {
        GpuSpec::a100_40gb(eff, eff)
    }

    fn nvlink() -> LinkSpec {
        LinkSpec::ideal(300e9, Nanos(1_000))
    }

    /// The roofline as the module doc writes it, every factor computed for the iteration.
    fn in_full(m: &ModelConfig, gpu: &GpuSpec, tp: u64, b: &BatchShape) -> (f64, f64, [f64; 2]) {
        let p = (m.layers * m.params_per_layer()) as f64;
        let flops = 2.0 * p * b.new_tokens as f64
            + 2.0 * m.lm_head_params() as f64 * b.sampling_seqs as f64
            + 4.0 * (m.layers * m.heads * m.head_dim) as f64 * b.attention_pairs as f64;
        let weights = (m.layers * m.params_per_layer() + m.lm_head_params()) * m.bytes_per_element;
        let kv = m.kv_bytes_per_token();
        let bytes = weights as f64 + (kv * b.kv_read_tokens) as f64 + (kv * b.new_tokens) as f64;
        let tp = tp as f64;
        let compute = flops / (tp * gpu.peak_flops * gpu.compute_efficiency);
        let memory = bytes / (tp * gpu.memory_bandwidth * gpu.memory_efficiency);
        (flops, bytes, [compute, memory])
    }

    #[test]
    fn precomputed_factors_price_every_shape_to_the_same_bits_as_the_formula() {
        let mut rng = crate::rng::Stream::new(7, 0);
        for preset in crate::model::catalogue::PRESETS {
            let m = &preset.model;
            for (tp, eff) in [(1, 0.5), (2, 0.7), (3, 0.61), (6, 0.33), (8, 1.0)] {
                // Peaks whose products round (an A100's 312e12 and 1.555e12 multiply exactly).
                let mut gpu = GpuSpec::a100_40gb(eff, eff * 0.9);
                gpu.peak_flops *= 1.0 + eff / 7.0;
                gpu.memory_bandwidth *= 1.0 + eff / 11.0;
                let cost = CostModel::new(m.clone(), gpu.clone(), nvlink(), tp, Nanos(5_000));
                for _ in 0..2_000 {
                    let mut b = BatchShape::default();
                    for _ in 0..=rng.below(8) {
                        let long = rng.below(2) == 0;
                        let n = 1 + rng.below(if long { 9_000 } else { 4 });
                        b.add(n, rng.below(40_000), rng.below(4) > 0);
                    }
                    b.add_decoding(rng.below(300), rng.below(3_000_000));
                    let (flops, bytes, [compute, memory]) = in_full(m, &gpu, tp as u64, &b);
                    assert_eq!(cost.flops(&b).to_bits(), flops.to_bits(), "{b:?}");
                    assert_eq!(cost.bytes(&b).to_bits(), bytes.to_bits(), "{b:?}");
                    let t = &cost.terms;
                    assert_eq!((flops / t.compute_rate).to_bits(), compute.to_bits());
                    assert_eq!((bytes / t.memory_rate).to_bits(), memory.to_bits());
                    assert_eq!(
                        cost.iteration(&b),
                        Nanos::from_secs_f64(compute.max(memory))
                            + cost.allreduce(&b)
                            + Nanos(5_000),
                        "{b:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn shapes_add_causal_attention_pairs() {
        let mut b = BatchShape::default();
        b.add(4, 0, true); // pairs 1+2+3+4 = 10
        b.add(1, 9, true); // decode at position 9 attends 10 positions
        b.add(2, 3, false); // a chunk after 3 cached tokens: positions 3, 4 attend 4 + 5 = 9
        assert_eq!(
            b,
            BatchShape {
                seqs: 3,
                new_tokens: 7,
                sampling_seqs: 2,
                attention_pairs: 29,
                kv_read_tokens: 19,
                chunk_cached_tokens: 3,
                chunk_seqs: 2,
            }
        );
    }

    #[test]
    fn decoding_one_token_of_mistral_is_bound_by_reading_the_weights() {
        // Hand computation: weights read = (32 x 218,112,000 + 4096 x 32000) x 2 B
        //   = 14,221,312,000 B; KV read + written = 2 x 131,072 B: 14,221,574,144 B.
        // At 1.555e12 B/s: 9.1457068 ms, rounded up to 9,145,707 ns. FLOPs = 2 x 6,979,584,000
        // + 2 x 131,072,000 + 4 x 32 x 32 x 128 = 14,221,836,288 -> 45.6 us: memory-bound.
        let cost = CostModel::new(
            crate::model::catalogue::MISTRAL_7B_V0_2.model,
            a100(1.0),
            nvlink(),
            1,
            Nanos::ZERO,
        );
        let mut b = BatchShape::default();
        b.add(1, 0, true);
        assert_eq!(cost.bytes(&b), 14_221_574_144.0);
        assert_eq!(cost.flops(&b), 14_221_836_288.0);
        assert_eq!(cost.iteration(&b), Nanos(9_145_707));
    }

    #[test]
    fn prefilling_4096_tokens_is_bound_by_compute_with_a_quadratic_attention_term() {
        // FLOPs = 2 x 6,979,584,000 x 4096 + 2 x 131,072,000 x 1 + 4 x 32 x 32 x 128
        //   x (4096 x 4097 / 2) = 57,176,752,128,000 + 262,144,000 + 4,399,120,252,928
        //   = 61,576,134,524,928; at 312e12 x 0.5 FLOP/s: 394.7188110 ms -> 394,718,812 ns.
        let cost = CostModel::new(
            crate::model::catalogue::MISTRAL_7B_V0_2.model,
            a100(0.5),
            nvlink(),
            1,
            Nanos::from_us(100),
        );
        let mut b = BatchShape::default();
        b.add(4096, 0, true);
        assert_eq!(cost.flops(&b), 61_576_134_524_928.0);
        assert_eq!(cost.iteration(&b), Nanos(394_718_812 + 100_000));
        // The attention term grows quadratically: 8192 tokens cost more than twice 4096.
        let mut b2 = BatchShape::default();
        b2.add(8192, 0, true);
        assert!(cost.iteration(&b2).0 > 2 * cost.iteration(&b).0);
    }

    #[test]
    fn tensor_parallelism_splits_work_and_adds_allreduces() {
        let m = crate::model::catalogue::MISTRAL_7B_V0_2.model;
        let one = CostModel::new(m.clone(), a100(1.0), nvlink(), 1, Nanos::ZERO);
        let two = CostModel::new(m, a100(1.0), nvlink(), 2, Nanos::ZERO);
        let mut b = BatchShape::default();
        b.add(1, 0, true);
        // Two all-reduces per layer of 4096 x 2 B: each 2 x 1/2 x 8192 / 300e9 s + 2 x 1 us
        // = 2.027307 us; x 64 = 129.7476 us, rounded up to 129,748 ns. The memory time halves:
        // 14,221,574,144 B / (2 x 1.555e12 B/s) = 4,572,854 ns.
        let expected = Nanos(4_572_854) + Nanos(129_748);
        assert_eq!(two.iteration(&b), expected);
        assert!(two.iteration(&b) < one.iteration(&b));
    }
}
