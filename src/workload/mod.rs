//! Workloads: the requests a run serves, as a trace shared by every policy.
//!
//! A prompt is a sequence of *segments* (a system prompt, the paragraphs of a context, a
//! question). A segment's token ids are stored once in a [`TokenArena`] and every prompt that
//! contains it refers to the same ids, so prompts that share a context share a real prefix of
//! token ids: the block hashes of a prefix cache see exactly the sharing a tokenizer would
//! produce for the same text.
//!
//! Every policy of a run replays the same [`Trace`] (same prompts, arrival times and output
//! lengths), so their results differ only by what the policies do.

mod error;
pub mod qa;
pub mod replay;
pub mod reuse;
pub mod stats;
pub mod tokenize;

pub use error::TraceError;

use crate::hash::{ROOT_PARENT, block_hash};
use crate::units::Nanos;

/// What a scenario's requests come from.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadSpec {
    /// A built-in generator with the published shape of a dataset.
    Generated(qa::QaWorkload),
    /// A dataset or trace file.
    Replay(replay::ReplaySpec),
}

/// Index of a request in its trace.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ReqId(pub u32);

/// Index of a segment in a [`TokenArena`].
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct SegId(pub u32);

/// Token ids of every segment, stored back to back.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenArena {
    tokens: Vec<u32>,
    /// Start offset of each segment; segment `i` ends where `i + 1` starts.
    starts: Vec<u32>,
}

impl TokenArena {
    /// Appends a segment made of `tokens`.
    pub fn push(&mut self, tokens: impl IntoIterator<Item = u32>) -> SegId {
        let id = SegId(self.starts.len() as u32);
        self.starts.push(self.tokens.len() as u32);
        self.tokens.extend(tokens);
        id
    }

    pub fn segment(&self, id: SegId) -> &[u32] {
        let i = id.0 as usize;
        let start = self.starts[i] as usize;
        let end = self
            .starts
            .get(i + 1)
            .map_or(self.tokens.len(), |&e| e as usize);
        &self.tokens[start..end]
    }

    /// Makes room for `tokens` more tokens in `segments` more segments.
    pub fn reserve(&mut self, tokens: usize, segments: usize) {
        self.tokens.reserve_exact(tokens);
        self.starts.reserve_exact(segments);
    }

    /// Number of segments.
    pub fn segments(&self) -> usize {
        self.starts.len()
    }

    pub fn total_tokens(&self) -> usize {
        self.tokens.len()
    }
}

/// One request: when it arrives, its prompt and how many tokens it generates.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub arrival: Nanos,
    pub segments: Vec<SegId>,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// The context (document window) the prompt is about; for reports and tests.
    pub context: u32,
}

/// A workload: requests sorted by arrival, and the token ids of their prompts.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    pub arena: TokenArena,
    pub requests: Vec<Request>,
    /// Number of distinct contexts the prompts draw on.
    pub contexts: u32,
}

impl Trace {
    /// Checks a trace that came from elsewhere (another process): segment starts in order
    /// and within the tokens, every request's segments there and its prompt length theirs,
    /// arrivals in order, token ids below `vocab`.
    pub fn check(&self, vocab: u32) -> Result<(), String> {
        let a = &self.arena;
        if a.starts.windows(2).any(|w| w[0] > w[1])
            || a.starts
                .last()
                .is_some_and(|&s| s as usize > a.tokens.len())
        {
            return Err("trace: segments out of order or beyond its tokens".into());
        }
        if let Some(t) = a.tokens.iter().find(|&&t| t >= vocab) {
            return Err(format!("trace: token id {t} of a {vocab}-id vocabulary"));
        }
        let mut last = Nanos::ZERO;
        for (i, r) in self.requests.iter().enumerate() {
            let mut n = 0u64;
            for s in &r.segments {
                if s.0 as usize >= a.starts.len() {
                    return Err(format!("trace: request {i} names segment {}", s.0));
                }
                n += a.segment(*s).len() as u64;
            }
            if n != r.prompt_tokens as u64 {
                return Err(format!(
                    "trace: request {i} has {} prompt tokens, its segments {n}",
                    r.prompt_tokens
                ));
            }
            if r.arrival < last {
                return Err(format!(
                    "trace: request {i} arrives before request {}",
                    i - 1
                ));
            }
            last = r.arrival;
        }
        Ok(())
    }

    pub fn request(&self, id: ReqId) -> &Request {
        &self.requests[id.0 as usize]
    }

    /// The token ids of a request's prompt, in order.
    pub fn prompt(&self, id: ReqId) -> impl Iterator<Item = u32> + '_ {
        self.request(id)
            .segments
            .iter()
            .flat_map(|&s| self.arena.segment(s).iter().copied())
    }

    /// Chained hashes of the prompt's full blocks of `block_size` tokens (a partial last
    /// block has no hash: only full blocks can be shared).
    pub fn block_hashes(&self, id: ReqId, block_size: usize, out: &mut Vec<u64>) {
        out.clear();
        let mut block = Vec::with_capacity(block_size);
        let mut parent = ROOT_PARENT;
        for t in self.prompt(id) {
            block.push(t);
            if block.len() == block_size {
                parent = block_hash(parent, &block);
                out.push(parent);
                block.clear();
            }
        }
    }
}

/// `n` seeded token ids below `vocab` for request `id` (ChaCha8 stream `id` of `seed`).
pub fn seeded_prompt(seed: u64, id: u32, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = crate::rng::Stream::new(seed, 0x11fe_0000 + id as u64);
    (0..n).map(|_| rng.below(vocab as u64) as u32).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn seeded_prompts_are_reproducible_and_in_the_vocabulary() {
        let a = super::seeded_prompt(1, 0, 64, 4096);
        assert_eq!(a, super::seeded_prompt(1, 0, 64, 4096));
        assert_ne!(a, super::seeded_prompt(1, 1, 64, 4096));
        assert!(a.iter().all(|&t| t < 4096));
    }

    use super::*;

    #[test]
    fn prompts_sharing_segments_share_block_hashes_up_to_where_they_diverge() {
        let mut arena = TokenArena::default();
        let system = arena.push(0..20);
        let ctx = arena.push(100..140);
        let q1 = arena.push([7, 8, 9]);
        let q2 = arena.push([7, 8, 10]);
        let req = |segs: Vec<SegId>| Request {
            arrival: Nanos::ZERO,
            prompt_tokens: segs.iter().map(|&s| arena.segment(s).len() as u32).sum(),
            segments: segs,
            output_tokens: 1,
            context: 0,
        };
        let trace = Trace {
            requests: vec![req(vec![system, ctx, q1]), req(vec![system, ctx, q2])],
            arena: arena.clone(),
            contexts: 1,
        };
        assert_eq!(trace.requests[0].prompt_tokens, 63);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        trace.block_hashes(ReqId(0), 16, &mut a);
        trace.block_hashes(ReqId(1), 16, &mut b);
        // 63 tokens: 3 full blocks; the questions diverge at token 62, in the partial block.
        assert_eq!(a.len(), 3);
        assert_eq!(a, b);
        trace.block_hashes(ReqId(0), 8, &mut a);
        trace.block_hashes(ReqId(1), 8, &mut b);
        // With 8-token blocks, block 7 (tokens 56..64) is partial: 7 full blocks, all equal.
        assert_eq!(a, b);
        trace.block_hashes(ReqId(0), 1, &mut a);
        trace.block_hashes(ReqId(1), 1, &mut b);
        // One-token blocks: equal up to token 61, different from token 62 on.
        assert_eq!(a[..62], b[..62]);
        assert_ne!(a[62], b[62]);
    }
}
