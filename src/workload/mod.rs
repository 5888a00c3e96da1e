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
pub mod optimal;
pub mod output;
pub mod qa;
pub mod replay;
pub mod reuse;
pub mod stats;
pub mod tokenize;

pub use error::TraceError;

use crate::hash::{PartialBlock, ROOT_PARENT};
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

/// Most tokens the stored segments of a trace may hold together (a canonical trace file's
/// `tokens` segments, a reuse pool's contexts).
pub const MAX_ARENA_TOKENS: u64 = 1 << 31;

/// Token ids of every segment: stored back to back, or, for a segment of pseudo tokens (a
/// block of a trace that gives only block ids, such as Mooncake's), kept as its key and length
/// and made when read ([`crate::hash::pseudo_tokens`]): 16 bytes for a 512-token block instead
/// of 2 KiB, so a trace's memory grows with its blocks, not their tokens.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenArena {
    tokens: Vec<u32>,
    /// Start offset of each segment in `tokens`; segment `i`'s stored tokens end where
    /// `i + 1`'s start (a pseudo segment stores none).
    starts: Vec<u32>,
    /// The pseudo segments, by segment id, in id order.
    pseudo: Vec<(SegId, Pseudo)>,
}

/// A segment of pseudo tokens: `pseudo_tokens(key, len, vocab)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pseudo {
    pub key: u64,
    pub len: u32,
    pub vocab: u32,
}

impl Pseudo {
    /// Its tokens, made one by one.
    pub fn tokens(&self) -> crate::hash::PseudoTokens {
        crate::hash::pseudo_tokens(self.key, self.len as u64, self.vocab)
    }
}

/// The tokens of one segment, stored or made on the fly.
pub enum SegTokens<'a> {
    Stored(std::iter::Copied<std::slice::Iter<'a, u32>>),
    Pseudo(crate::hash::PseudoTokens),
}

impl Iterator for SegTokens<'_> {
    type Item = u32;

    #[inline]
    fn next(&mut self) -> Option<u32> {
        match self {
            SegTokens::Stored(i) => i.next(),
            SegTokens::Pseudo(i) => i.next(),
        }
    }
}

impl TokenArena {
    /// Appends a segment made of `tokens`.
    pub fn push(&mut self, tokens: impl IntoIterator<Item = u32>) -> SegId {
        let id = SegId(self.starts.len() as u32);
        self.starts.push(self.tokens.len() as u32);
        self.tokens.extend(tokens);
        id
    }

    /// Appends a segment of `len` pseudo tokens of `key` below `vocab` (see
    /// [`crate::hash::pseudo_tokens`]), stored as its key.
    pub fn push_pseudo(&mut self, key: u64, len: u32, vocab: u32) -> SegId {
        let id = SegId(self.starts.len() as u32);
        self.starts.push(self.tokens.len() as u32);
        self.pseudo.push((id, Pseudo { key, len, vocab }));
        id
    }

    /// The pseudo segment `id` is, if it is one.
    pub fn pseudo(&self, id: SegId) -> Option<Pseudo> {
        self.pseudo
            .binary_search_by_key(&id, |p| p.0)
            .ok()
            .map(|i| self.pseudo[i].1)
    }

    /// Stored tokens of segment `id` (none for a pseudo segment).
    fn stored(&self, id: SegId) -> &[u32] {
        let i = id.0 as usize;
        let start = self.starts[i] as usize;
        let end = self
            .starts
            .get(i + 1)
            .map_or(self.tokens.len(), |&e| e as usize);
        &self.tokens[start..end]
    }

    /// The tokens of segment `id`: borrowed if stored, made if pseudo.
    pub fn segment(&self, id: SegId) -> std::borrow::Cow<'_, [u32]> {
        match self.pseudo(id) {
            Some(p) => std::borrow::Cow::Owned(p.tokens().collect()),
            None => std::borrow::Cow::Borrowed(self.stored(id)),
        }
    }

    /// The tokens of segment `id`, one by one, without materialising a pseudo segment.
    pub fn tokens(&self, id: SegId) -> SegTokens<'_> {
        match self.pseudo(id) {
            Some(p) => SegTokens::Pseudo(p.tokens()),
            None => SegTokens::Stored(self.stored(id).iter().copied()),
        }
    }

    /// Tokens in segment `id`.
    pub fn len(&self, id: SegId) -> usize {
        match self.pseudo(id) {
            Some(p) => p.len as usize,
            None => self.stored(id).len(),
        }
    }

    /// Makes room for `tokens` more stored tokens in `segments` more segments.
    pub fn reserve(&mut self, tokens: usize, segments: usize) {
        self.tokens.reserve_exact(tokens);
        self.starts.reserve_exact(segments);
    }

    /// Number of segments.
    pub fn segments(&self) -> usize {
        self.starts.len()
    }

    /// Tokens stored (pseudo segments store none): what the arena's memory grows with.
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
        let mut last_pseudo = None;
        for (id, p) in &a.pseudo {
            if id.0 as usize >= a.starts.len() || last_pseudo.is_some_and(|l| l >= *id) {
                return Err("trace: pseudo segments out of order or beyond its segments".into());
            }
            if !a.stored(*id).is_empty() || p.vocab > vocab || p.vocab <= 3 {
                return Err(format!(
                    "trace: pseudo segment {} of a {}-id vocabulary, in a {vocab}-id one",
                    id.0, p.vocab
                ));
            }
            last_pseudo = Some(*id);
        }
        let mut last = Nanos::ZERO;
        for (i, r) in self.requests.iter().enumerate() {
            let mut n = 0u64;
            for s in &r.segments {
                if s.0 as usize >= a.starts.len() {
                    return Err(format!("trace: request {i} names segment {}", s.0));
                }
                n += a.len(*s) as u64;
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
            .flat_map(|&s| self.arena.tokens(s))
    }

    /// Chained hashes of the prompt's full blocks of `block_size` tokens (a partial last
    /// block has no hash: only full blocks can be shared).
    pub fn block_hashes(&self, id: ReqId, block_size: usize, out: &mut Vec<u64>) {
        out.clear();
        let mut block = PartialBlock::new(ROOT_PARENT);
        for t in self.prompt(id) {
            block.push(&[t]);
            if block.len() == block_size {
                let h = block.finish();
                out.push(h);
                block = PartialBlock::new(h);
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

#[cfg(test)]
mod pseudo_tests {
    use super::*;
    use crate::hash::pseudo_tokens;

    /// A trace of two requests over the arena, sharing its first segment.
    fn trace(arena: TokenArena, segs: &[SegId]) -> Trace {
        let n: u32 = segs.iter().map(|&s| arena.len(s) as u32).sum();
        let r = |rest: &[SegId]| Request {
            arrival: Nanos::ZERO,
            segments: [&segs[..1], rest].concat(),
            prompt_tokens: arena.len(segs[0]) as u32
                + rest.iter().map(|&s| arena.len(s) as u32).sum::<u32>(),
            output_tokens: 1,
            context: 0,
        };
        assert!(n > 0);
        Trace {
            requests: vec![r(&segs[1..]), r(&[])],
            arena,
            contexts: 1,
        }
    }

    #[test]
    fn a_pseudo_segment_reads_as_its_stored_tokens_would_and_stores_none() {
        let mut stored = TokenArena::default();
        let mut compact = TokenArena::default();
        let mut a = Vec::new();
        let mut b = Vec::new();
        for (i, &(key, len)) in [(7u64, 512u32), (9, 100), (7, 37)].iter().enumerate() {
            a.push(stored.push(pseudo_tokens(key, len as u64, 32000)));
            b.push(compact.push_pseudo(key, len, 32000));
            assert_eq!(a[i], b[i]);
        }
        let plain = compact.push([1, 2, 3]);
        assert_eq!(plain, stored.push([1, 2, 3]));
        a.push(plain);
        b.push(plain);
        assert_eq!(compact.total_tokens(), 3, "pseudo segments store nothing");
        for &s in &b {
            assert_eq!(compact.segment(s), stored.segment(s));
            assert_eq!(compact.len(s), stored.len(s));
            assert!(compact.tokens(s).eq(stored.tokens(s)));
        }
        assert_eq!(compact.pseudo(b[1]).map(|p| p.key), Some(9));
        assert_eq!(compact.pseudo(plain), None);
        let (t1, t2) = (trace(stored, &a), trace(compact, &b));
        for id in [ReqId(0), ReqId(1)] {
            let (mut h1, mut h2) = (Vec::new(), Vec::new());
            t1.block_hashes(id, 16, &mut h1);
            t2.block_hashes(id, 16, &mut h2);
            assert_eq!(h1, h2);
            assert!(t1.prompt(id).eq(t2.prompt(id)));
        }
        t2.check(32000).unwrap();
        let e = t2.check(1000).unwrap_err();
        assert!(
            e.contains("pseudo segment 0 of a 32000-id vocabulary"),
            "{e}"
        );
    }
}
