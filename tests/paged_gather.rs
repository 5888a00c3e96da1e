//! The live paged backend ([`PagedCandleBackend`]) gathers a sequence's cached K/V from its
//! blocks position by position: when the cached prefix ends inside a block that holds more
//! positions than that (another sequence wrote the whole prompt into it), only the asked
//! positions may be read back. The case is a full-prompt hit whose prompt length is not a
//! multiple of the block size: every token but the last is reused from the blocks another
//! sequence wrote, and the last one is recomputed. Its logits must equal the unpaged model's
//! on the whole prompt; reading the whole last block instead would hand the model one
//! position too many.

use std::sync::Arc;

use candle_core::{DType, Device};
use meshsim::backend::{BatchBackend, BlockId, Member, PagedCandleBackend, Sampled};
use meshsim::exec::model::{argmax, max_abs_diff};
use meshsim::exec::{
    ShardInput, ShardModel, ShardOutput, TransformerConfig, WeightSource, weights,
};
use meshsim::model::cost::BatchShape;
use meshsim::units::Nanos;
use meshsim::workload::{ReqId, Request, TokenArena, Trace, seeded_prompt};

const BLOCK: u32 = 16;

/// The tiny preset with weights drawn from a seeded ChaCha8 stream (candle's own random
/// tensors cannot be seeded), so every run computes the same logits.
fn model() -> ShardModel {
    let cfg = TransformerConfig::preset("tiny").unwrap();
    let vb = weights::var_builder(
        &cfg,
        0..cfg.layers,
        &WeightSource::Seeded(11),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    ShardModel::new(&cfg, 0..cfg.layers, vb).unwrap()
}

/// Two requests with the same prompt (the second hits the first's blocks).
fn trace(prompt: &[u32]) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let seg = arena.push(prompt.iter().copied());
    let request = Request {
        arrival: Nanos::ZERO,
        segments: vec![seg],
        prompt_tokens: prompt.len() as u32,
        output_tokens: 2,
        context: 0,
    };
    Arc::new(Trace {
        arena,
        requests: vec![request.clone(), request],
        contexts: 1,
    })
}

/// One iteration of request `req` alone: `n` tokens from position `computed`.
fn step(
    b: &mut PagedCandleBackend,
    req: u32,
    blocks: &[BlockId],
    computed: u32,
    n: u32,
) -> Option<Sampled> {
    let mut m = [Member {
        req: ReqId(req),
        blocks,
        computed,
        n,
        generated: &[],
        sampled: None,
    }];
    b.iteration(&BatchShape::default(), &mut m).unwrap();
    m[0].sampled.take()
}

/// The unpaged model's logits after the whole prompt.
fn unpaged_logits(prompt: &[u32]) -> Vec<f32> {
    let reference = model();
    let mut kv = reference.new_cache();
    let ShardOutput::Logits(l) = reference
        .forward(ShardInput::Tokens(prompt), 0, &mut kv)
        .unwrap()
    else {
        panic!("the whole model ends with logits");
    };
    l.to_vec1::<f32>().unwrap()
}

#[test]
fn a_full_prompt_hit_that_ends_inside_a_block_gives_the_unpaged_models_logits() {
    // Prompt lengths whose last cached position falls 13, 5 and 14 positions into a block.
    for len in [30usize, 38, 47] {
        let prompt = seeded_prompt(21, len as u32, len, 1024);
        let want = unpaged_logits(&prompt);
        let mut b = PagedCandleBackend::new(model(), trace(&prompt), BLOCK, 8, None).unwrap();
        // The first request computes its whole prompt into scattered blocks.
        let table: Vec<BlockId> = [6, 1, 4].into_iter().take(len.div_ceil(16)).collect();
        let first = step(&mut b, 0, &table, 0, len as u32).unwrap();
        let d = max_abs_diff(first.logits.as_ref().unwrap(), &want);
        assert!(d < 1e-4, "len {len}: first request off by {d}");
        // The second takes the same blocks and reuses every token but the last: its cached
        // prefix ends one position before the end of what its last block holds.
        let hit = step(&mut b, 1, &table, len as u32 - 1, 1).unwrap();
        let got = hit.logits.expect("a first token keeps its logits");
        let d = max_abs_diff(&got, &want);
        assert!(d < 1e-4, "len {len}: full-prompt hit off by {d}");
        assert_eq!(hit.token, argmax(&want), "len {len}");
    }
}
