//! The block hashes of the trace's prompts, computed once per shared prefix.
//!
//! [`Trace::block_hashes`] folds every prompt token into the chain of block hashes: about
//! 4,000 multiplies for a SQuAD prompt, at every instance a request reaches and again at a
//! `kv-aware` router. But prompts are made of segments that many prompts share (a system
//! prompt and a context before a question), and the hashes of the blocks before the last
//! segment depend only on the segments before it. So the state of the chain after every
//! segment but the last (the hashes of its full blocks, and the partial block's hash in the
//! making, a [`PartialBlock`]) is kept under that list of segments, and a prompt is hashed
//! from there: the result is exactly [`Trace::block_hashes`]'s (a test checks it).
//!
//! **Hashed four at a time.** A block's hash is one dependent multiply a token, so hashing one
//! context window (4,128 tokens) keeps one multiply in flight and the processor mostly idle.
//! When the memo lacks a request's leading segments, it also takes those of the next requests
//! (up to [`LOOKAHEAD`] of them) that it lacks, up to four lists in all, and folds them in
//! lockstep ([`crate::hash::chains`]). A `sim_scale` round at 2,240 GPUs hashes 3,405
//! windows (14 M tokens) this way; its third run (32 GPUs, the full cluster's requests a GPU)
//! hashes a new window for every other request.
//!
//! **Asked for ahead.** Requests reach the instances in id order, so hashing a prompt asks
//! the processor for what hashing the next few will read first (their records, lists of
//! segments, questions' entries and tokens: `PromptHashes::prefetch_ahead`); at cluster
//! scale each was a cache miss waiting on the one before.
//!
//! **Shared, not copied.** A prompt's hashes are a [`ChainHashes`]: the memo's array for its
//! leading segments, shared, then its last segment's blocks (in place when they are few, as
//! a question's are; else an array of their own). Every
//! request with the same leading segments, and every pool segment that registers their
//! blocks (see [`crate::serving::block_pool`]), holds the same array: at cluster scale, where
//! a copy of a SQuAD prompt's 2 KiB of hashes per request and per registration was a stream
//! of cache misses (and the pools' copies hundreds of MiB), the leading hashes are in memory
//! once per list of segments.
//!
//! **Lists by number.** At the first prompt hashed, every request's list of leading segments
//! is given a number, the same for equal lists (`Leads`: one pass over the trace, a map from a
//! list's 64-bit hash to its number, with the list compared on a hit), and the memo is an
//! array by that number (an entry a list: 40 bytes, besides the 4 bytes a request of the
//! numbers; bounded by the trace). A prompt's chain is then one read of a known place, which can be asked for
//! ahead like the requests' records: the memo was a hash map keyed by a hash of the block
//! size and the list, whose probe, entry and kept list were three cold reads a request at
//! cluster scale (`perf`: the probe's first load alone was 29 % of `chain_hashes`' samples in
//! `sim_scale`'s local-prefix round at 2,240 GPUs, `chain_hashes` 9 % of the round's). Three-
//! round pairs at 2,240 GPUs, this against the map: local-prefix medians 1.018 and 1.029,
//! evostore 1.036; the pass that numbers the lists is in the timed run. An entry keeps its
//! block size, so a chain of another block size is replaced.
//! The memo is bounded: when it holds more than [`MEMO_HASHES`] hashes it is emptied and
//! filled again as prompts come (the arrays that requests and pools still hold live on with
//! them, and go with the last of them). It only ever saves work, so its contents never change
//! a result. One memo serves every actor of a simulation (a lock that is never contended: a
//! simulation runs on one thread).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::hash::{IdBuildHasher, PartialBlock, mix64};
use crate::workload::{ReqId, SegId, Trace};

/// Most hashes the memo holds (8 bytes each: 32 MiB).
pub const MEMO_HASHES: usize = 1 << 22;

/// The chain after a list of segments.
#[derive(Debug)]
struct Chain {
    /// The block size it is the chain of.
    block_size: usize,
    hashes: Arc<[u64]>,
    /// The partial block at the end (fewer tokens than a block; none if the segments end
    /// at a block's end), after the last full block.
    rest: PartialBlock,
}

#[derive(Debug, Default)]
struct Memo {
    /// Chains by the number of their list of leading segments (see [`Leads`]).
    chains: Vec<Option<Chain>>,
    hashes: usize,
    /// Scratch for a prompt's own blocks' hashes.
    tail: Vec<u64>,
    /// Scratch for the tokens of the lists hashed together (at most [`LANES`] prompts'
    /// leading segments: a few times the longest prompt's tokens).
    gather: [Vec<u32>; LANES],
}

impl Memo {
    /// Asks for the memo's entries of the next requests' lists, in two steps: the entry of
    /// the request [`AHEAD`] twice after `i`, and the count of the shared array of the one
    /// [`AHEAD`] after it (whose entry the step before asked for), which taking the array
    /// changes. A hint only: it changes no result.
    #[inline]
    fn prefetch(&self, leads: &Leads, i: usize) {
        if let Some(n) = leads.get(i + 2 * AHEAD) {
            let slot = &self.chains[n as usize];
            crate::sim::prefetch::bytes(
                (slot as *const Option<Chain>).cast(),
                std::mem::size_of::<Option<Chain>>(),
            );
        }
        if let Some(n) = leads.get(i + AHEAD)
            && let Some(chain) = &self.chains[n as usize]
        {
            // The counts sit just before the hashes (two words: `Arc`'s layout today; a hint
            // to the wrong line would only be a wasted hint).
            let data: *const u8 = Arc::as_ptr(&chain.hashes).cast();
            crate::sim::prefetch::line(data.wrapping_sub(2 * std::mem::size_of::<usize>()));
        }
    }
}

/// Most lists of leading segments hashed together (see [`crate::hash::chains`]).
const LANES: usize = 4;

/// How many requests after one whose leading segments the memo lacks are looked at for
/// others it lacks, to hash them together.
const LOOKAHEAD: usize = 64;

/// Bytes of a request's last segment asked for ahead of hashing it (a SQuAD question is a
/// few dozen tokens).
const QUESTION_BYTES: usize = 128;

/// Requests between the steps of [`PromptHashes::prefetch_ahead`].
const AHEAD: usize = 2;

/// Most hashes a [`ChainHashes`] keeps in place after its shared array. A SQuAD prompt's
/// own blocks (the end of its context's partial block and its question) are one to three:
/// kept in place, they cost a request no allocation, and the pools that register them no
/// reference count on a line of their own (a cold miss at each registration and release at
/// cluster scale).
pub const INLINE_TAIL: usize = 3;

/// The hashes after a chain's shared array: in place if few, else an array of their own,
/// shared by the clones.
#[derive(Clone, Debug)]
enum Tail {
    Inline { len: u8, hashes: [u64; INLINE_TAIL] },
    Shared(Arc<[u64]>),
}

impl Default for Tail {
    fn default() -> Tail {
        Tail::new(&[])
    }
}

impl Tail {
    fn new(v: &[u64]) -> Tail {
        if v.len() <= INLINE_TAIL {
            let mut hashes = [0; INLINE_TAIL];
            hashes[..v.len()].copy_from_slice(v);
            Tail::Inline {
                len: v.len() as u8,
                hashes,
            }
        } else {
            Tail::Shared(Arc::from(v))
        }
    }

    #[inline]
    fn as_slice(&self) -> &[u64] {
        match self {
            Tail::Inline { len, hashes } => &hashes[..*len as usize],
            Tail::Shared(a) => a,
        }
    }

    /// Whether `self` and `other` hold the same hashes because they are the same array (or,
    /// in place, equal).
    fn same(&self, other: &Tail) -> bool {
        match (self, other) {
            (Tail::Shared(a), Tail::Shared(b)) => Arc::ptr_eq(a, b),
            (Tail::Inline { .. }, Tail::Inline { .. }) => self.as_slice() == other.as_slice(),
            _ => false,
        }
    }
}

/// A prompt's chain of block hashes, from its first block: the hashes of its leading
/// segments' full blocks (`lead`, an array shared by every prompt with those leading
/// segments), then the rest (`tail`: in place if at most [`INLINE_TAIL`]). A clone shares
/// the arrays (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct ChainHashes {
    /// `None` for a chain of its own. Not the standard library's shared empty `Arc`: making
    /// and dropping that changes its count atomically, and an atomic change waits for every
    /// store before it to reach the cache (at cluster scale, stores to cold lines): four such
    /// changes a request as a finished request's record is kept and reused.
    lead: Option<Arc<[u64]>>,
    tail: Tail,
}

impl ChainHashes {
    /// A chain whose first hashes are `lead` (shared) and the rest `tail`.
    pub fn from_parts(lead: Arc<[u64]>, tail: Vec<u64>) -> ChainHashes {
        ChainHashes {
            lead: Some(lead),
            tail: Tail::new(&tail),
        }
    }

    /// The shared leading hashes.
    #[inline]
    fn lead(&self) -> &[u64] {
        self.lead.as_deref().unwrap_or(&[])
    }

    pub fn len(&self) -> usize {
        self.lead().len() + self.tail.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hash of block `i`. Panics if `i` is out of range.
    #[inline]
    pub fn get(&self, i: usize) -> u64 {
        let lead = self.lead();
        match lead.get(i) {
            Some(&h) => h,
            None => self.tail.as_slice()[i - lead.len()],
        }
    }

    /// The hashes in chain order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.lead().iter().chain(self.tail.as_slice()).copied()
    }

    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }

    /// Whether `self` and `other` share their arrays (and so hold the same hashes).
    pub fn same_arrays(&self, other: &ChainHashes) -> bool {
        let lead = match (&self.lead, &other.lead) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        lead && self.tail.same(&other.tail)
    }
}

impl From<Vec<u64>> for ChainHashes {
    /// A chain of its own (nothing shared).
    fn from(v: Vec<u64>) -> ChainHashes {
        ChainHashes {
            lead: None,
            tail: Tail::new(&v),
        }
    }
}

/// A list of segments' key in [`Leads`]' map: well mixed, as the map's hasher takes it as
/// it is.
fn list_key(segments: &[SegId]) -> u64 {
    let mut h = mix64((segments.len() as u64) << 32);
    for s in segments {
        h = mix64(h ^ s.0 as u64);
    }
    h
}

/// No list of leading segments: a prompt of one segment (or none), hashed on its own.
const NO_LEAD: u32 = u32::MAX;

/// The number of every request's list of leading segments (all its segments but the last),
/// equal lists numbered alike, in order of first appearance (see the module doc).
#[derive(Debug, Default)]
struct Leads {
    /// By request: its list's number, or [`NO_LEAD`].
    of: Vec<u32>,
    /// How many lists.
    lists: usize,
}

impl Leads {
    fn new(trace: &Trace) -> Leads {
        Leads::with_key(trace, list_key)
    }

    /// With `key` for the lists' keys (a test gives every list the same one).
    fn with_key(trace: &Trace, key: impl Fn(&[SegId]) -> u64) -> Leads {
        // By number, the request that first had the list: compared on a hit, without a copy
        // of the lists (as long as the trace's own, for a trace of block ids). Few requests
        // (one a context window on SQuAD), so their lists stay in the caches.
        let mut first: Vec<u32> = Vec::new();
        let mut by_key: HashMap<u64, u32, IdBuildHasher> = HashMap::default();
        let list_of = |r: u32| {
            let segments = &trace.requests[r as usize].segments;
            &segments[..segments.len() - 1]
        };
        let mut of = Vec::with_capacity(trace.requests.len());
        for (i, r) in trace.requests.iter().enumerate() {
            let lead = match r.segments.split_last() {
                Some((_, lead)) if !lead.is_empty() => lead,
                _ => {
                    of.push(NO_LEAD);
                    continue;
                }
            };
            let mut k = key(lead);
            // Another list under the same key moves on to the next key: bounded, as each step
            // passes a list already numbered, and there are at most as many as requests.
            let n = loop {
                match by_key.get(&k) {
                    Some(&n) if list_of(first[n as usize]) == lead => break n,
                    Some(_) => k = mix64(k ^ 0x9e37_79b9_7f4a_7c15),
                    None => {
                        let n = first.len() as u32;
                        first.push(i as u32);
                        by_key.insert(k, n);
                        break n;
                    }
                }
            };
            of.push(n);
        }
        Leads {
            of,
            lists: first.len(),
        }
    }

    /// Request `i`'s list's number, if it has leading segments.
    #[inline]
    fn get(&self, i: usize) -> Option<u32> {
        self.of.get(i).copied().filter(|&n| n != NO_LEAD)
    }
}

/// Block hashes of a trace's prompts (see the module doc).
#[derive(Debug)]
pub struct PromptHashes {
    trace: Arc<Trace>,
    /// Numbered at the first prompt hashed: an actor made with a memo of its own, and given
    /// the simulation's before it runs, costs no pass over the trace.
    leads: OnceLock<Leads>,
    memo: Mutex<Memo>,
}

impl PromptHashes {
    pub fn new(trace: Arc<Trace>) -> PromptHashes {
        PromptHashes {
            trace,
            leads: OnceLock::new(),
            memo: Mutex::new(Memo::default()),
        }
    }

    #[cfg(test)]
    fn with_leads(leads: Leads, trace: Arc<Trace>) -> PromptHashes {
        let memo = PromptHashes::new(trace);
        memo.leads.set(leads).expect("not numbered yet");
        memo
    }

    /// The lists' numbers, made at the first call.
    fn leads(&self) -> &Leads {
        self.leads.get_or_init(|| Leads::new(&self.trace))
    }

    /// Chained hashes of the prompt's full blocks of `block_size` tokens, as
    /// [`Trace::block_hashes`] gives them, into `out`.
    pub fn block_hashes(&self, id: ReqId, block_size: usize, out: &mut Vec<u64>) {
        out.clear();
        out.extend(self.chain_hashes(id, block_size).iter());
    }

    /// Chained hashes of the prompt's full blocks of `block_size` tokens, as
    /// [`Trace::block_hashes`] gives them, sharing the memo's array of its leading segments'
    /// blocks (see the module doc).
    pub fn chain_hashes(&self, id: ReqId, block_size: usize) -> ChainHashes {
        self.prefetch_ahead(id);
        let segments = &self.trace.request(id).segments;
        let Some((last, leading)) = segments.split_last() else {
            return ChainHashes::default();
        };
        if leading.is_empty() {
            let mut own = Vec::new();
            self.trace.block_hashes(id, block_size, &mut own);
            return ChainHashes::from(own);
        }
        // A poisoned lock only means another simulation's thread panicked; the memo's
        // contents are still valid chains.
        let mut memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        let memo = &mut *memo;
        let i = id.0 as usize;
        let leads = self.leads();
        if memo.chains.len() != leads.lists {
            // The first call (the memo is never emptied by shrinking).
            memo.chains.resize_with(leads.lists, || None);
        }
        let Some(lead) = leads.get(i) else {
            unreachable!("request {i} has leading segments but no list number");
        };
        memo.prefetch(leads, i);
        let has = |memo: &Memo, n: u32| {
            memo.chains[n as usize]
                .as_ref()
                .is_some_and(|c| c.block_size == block_size)
        };
        if !has(memo, lead) {
            // Hashed with the next few requests' leading segments that the memo lacks too:
            // the chains are folded in lockstep. The memo only saves work, so what it holds
            // early changes no result.
            let mut lists: Vec<(u32, &[SegId])> = vec![(lead, leading)];
            let next = i + 1;
            let ahead = &self.trace.requests[next.min(self.trace.requests.len())..];
            for (j, r) in ahead.iter().enumerate().take(LOOKAHEAD) {
                if lists.len() == LANES {
                    break;
                }
                let Some(n) = leads.get(next + j) else {
                    continue;
                };
                if lists.iter().any(|&(m, _)| m == n) || has(memo, n) {
                    continue;
                }
                let (_, list) = r.segments.split_last().expect("a list numbered");
                lists.push((n, list));
            }
            let made = self.chains(&lists, block_size, &mut memo.gather);
            // The others first: if the bounded memo must be emptied to take a chain, the one
            // asked for is never the one dropped.
            for ((n, _), chain) in lists.iter().zip(made).rev() {
                if memo.hashes + chain.hashes.len() > MEMO_HASHES {
                    memo.chains.iter_mut().for_each(|c| *c = None);
                    memo.hashes = 0;
                }
                memo.hashes += chain.hashes.len();
                // A chain of another block size is replaced.
                if let Some(old) = memo.chains[*n as usize].replace(chain) {
                    memo.hashes -= old.hashes.len();
                }
            }
        }
        // Just made if it was missing.
        let chain = memo.chains[lead as usize]
            .as_ref()
            .expect("the chain just made");
        if chain.rest.len() + self.trace.arena.len(*last) < block_size {
            // The last segment fills no block: its tokens are not read.
            return ChainHashes {
                lead: Some(chain.hashes.clone()),
                tail: Tail::default(),
            };
        }
        memo.tail.clear();
        // A pseudo segment is made here.
        chain
            .rest
            .fold(&self.trace.arena.segment(*last), block_size, &mut memo.tail);
        ChainHashes {
            lead: Some(chain.hashes.clone()),
            tail: Tail::new(&memo.tail),
        }
    }

    /// Asks the processor for what hashing the next requests' prompts reads first, in four
    /// steps a few requests apart: the request's record, its list of segments, its last
    /// segment's entry in the arena, that segment's tokens. Requests arrive at the instances
    /// in id order, so the calls for the next ones come within a few events, and at cluster
    /// scale each of these reads was a cache miss that waited for the one before (`perf`:
    /// each step needs two calls between its hint and its read, one was too few). A hint
    /// only: it changes no result.
    fn prefetch_ahead(&self, id: ReqId) {
        let requests = &self.trace.requests;
        let i = id.0 as usize;
        if let Some(r) = requests.get(i + 4 * AHEAD) {
            let at: *const u8 = (r as *const crate::workload::Request).cast();
            crate::sim::prefetch::line(at);
            crate::sim::prefetch::line(at.wrapping_add(std::mem::size_of_val(r) - 1));
        }
        if let Some(r) = requests.get(i + 3 * AHEAD) {
            crate::sim::prefetch::line(r.segments.as_ptr().cast());
        }
        let arena = &self.trace.arena;
        if let Some(&last) = requests.get(i + 2 * AHEAD).and_then(|r| r.segments.last()) {
            crate::sim::prefetch::line(arena.entry_addr(last));
        }
        if let Some(&last) = requests.get(i + AHEAD).and_then(|r| r.segments.last())
            && let Some(at) = arena.tokens_addr(last)
        {
            crate::sim::prefetch::bytes(at, QUESTION_BYTES);
        }
    }

    /// The chains after each list of segments (at most [`LANES`]), from the start of a
    /// prompt, hashed together.
    fn chains(
        &self,
        lists: &[(u32, &[SegId])],
        block_size: usize,
        gather: &mut [Vec<u32>; LANES],
    ) -> Vec<Chain> {
        assert!((1..=LANES).contains(&lists.len()), "one to {LANES} lists");
        for (buf, (_, list)) in gather.iter_mut().zip(lists) {
            buf.clear();
            for &s in *list {
                // A pseudo segment is made here, one segment at a time.
                buf.extend_from_slice(&self.trace.arena.segment(s));
            }
        }
        // Sized once: grown from empty, a SQuAD context's 250-odd hashes took eight
        // reallocations, the last three large enough that glibc first merges every small
        // free chunk it holds.
        let mut outs: Vec<Vec<u64>> = gather[..lists.len()]
            .iter()
            .map(|t| Vec::with_capacity(t.len() / block_size))
            .collect();
        let rests = match lists.len() {
            1 => lanes::<1>(gather, block_size, &mut outs),
            2 => lanes::<2>(gather, block_size, &mut outs),
            3 => lanes::<3>(gather, block_size, &mut outs),
            _ => lanes::<4>(gather, block_size, &mut outs),
        };
        lists
            .iter()
            .zip(outs)
            .zip(rests)
            .map(|((_, hashes), rest)| Chain {
                block_size,
                hashes: hashes.into(),
                rest,
            })
            .collect()
    }
}

/// [`crate::hash::chains`] of the first `N` token lists of `gather` into the first `N` of
/// `outs`.
fn lanes<const N: usize>(
    gather: &[Vec<u32>],
    block_size: usize,
    outs: &mut [Vec<u64>],
) -> Vec<PartialBlock> {
    let mut each = outs.iter_mut();
    let out = std::array::from_fn(|_| each.next().expect("an output a list"));
    crate::hash::chains::<N>(
        std::array::from_fn(|l| gather[l].as_slice()),
        block_size,
        out,
    )
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::Nanos;
    use crate::workload::{Request, TokenArena};

    /// A trace of one request per prompt (a list of segments of `arena`).
    fn trace_of(arena: TokenArena, prompts: Vec<Vec<SegId>>) -> Arc<Trace> {
        let requests = prompts
            .into_iter()
            .map(|segs| Request {
                arrival: Nanos::ZERO,
                prompt_tokens: segs.iter().map(|&s| arena.len(s) as u32).sum(),
                segments: segs,
                output_tokens: 1,
                context: 0,
            })
            .collect();
        Arc::new(Trace {
            requests,
            arena,
            contexts: 2,
        })
    }

    #[test]
    fn lists_under_the_same_key_get_numbers_of_their_own_and_their_own_chains() {
        // Three prompts, [a, q], [b, q], [a, q], every list under one key (as colliding
        // lists' keys would have them): [a] and [b] must get numbers of their own, and each
        // prompt its own chain.
        let mut arena = TokenArena::default();
        let a = arena.push(0..40);
        let b = arena.push(500..540);
        let q = arena.push(900..910);
        let trace = trace_of(arena, vec![vec![a, q], vec![b, q], vec![a, q], vec![q]]);
        let leads = Leads::with_key(&trace, |_| 7);
        assert_eq!(leads.of, [0, 1, 0, NO_LEAD]);
        assert_eq!(leads.lists, 2);
        let memo = PromptHashes::with_leads(leads, trace.clone());
        let (mut want, mut got) = (Vec::new(), Vec::new());
        for id in trace.ids() {
            memo.block_hashes(id, 16, &mut got);
            trace.block_hashes(id, 16, &mut want);
            assert_eq!(got, want, "request {}", id.0);
        }
        // [a]'s 2 full blocks and [b]'s.
        assert_eq!(memo.memo.lock().unwrap().hashes, 4);
    }

    #[test]
    fn a_chain_of_another_block_size_is_replaced() {
        let mut arena = TokenArena::default();
        let a = arena.push(0..40);
        let q = arena.push(900..910);
        let trace = trace_of(arena, vec![vec![a, q]]);
        let memo = PromptHashes::new(trace.clone());
        let (mut want, mut got) = (Vec::new(), Vec::new());
        for block_size in [16, 8, 16] {
            memo.block_hashes(ReqId(0), block_size, &mut got);
            trace.block_hashes(ReqId(0), block_size, &mut want);
            assert_eq!(got, want, "blocks of {block_size}");
            let m = memo.memo.lock().unwrap();
            assert_eq!(m.chains[0].as_ref().unwrap().block_size, block_size);
            assert_eq!(
                m.hashes,
                40 / block_size,
                "the replaced chain's hashes not counted"
            );
        }
    }

    #[test]
    fn prompts_with_the_same_leading_segments_share_one_array_of_their_hashes() {
        let mut arena = TokenArena::default();
        let ctx = arena.push(0..100);
        let other = arena.push(200..300);
        let (q1, q2) = (arena.push(900..920), arena.push(950..990));
        let trace = trace_of(
            arena,
            vec![vec![ctx, q1], vec![ctx, q2], vec![other, q1], vec![q1]],
        );
        let memo = PromptHashes::new(trace.clone());
        let c: Vec<ChainHashes> = trace.ids().map(|id| memo.chain_hashes(id, 16)).collect();
        // 100 tokens: 6 full blocks in the shared array; the question's blocks are the
        // prompt's own (the partial block's 4 tokens go on into them).
        assert_eq!((c[0].lead().len(), c[0].tail.as_slice().len()), (6, 1));
        assert_eq!((c[1].lead().len(), c[1].tail.as_slice().len()), (6, 2));
        let lead = |c: &ChainHashes| c.lead.clone().expect("a shared array");
        assert!(
            Arc::ptr_eq(&lead(&c[0]), &lead(&c[1])),
            "one array for [ctx]"
        );
        assert!(!Arc::ptr_eq(&lead(&c[0]), &lead(&c[2])));
        assert!(c[3].lead.is_none(), "no leading segments: all its own");
        let mut want = Vec::new();
        for (id, chain) in trace.ids().zip(&c) {
            trace.block_hashes(id, 16, &mut want);
            assert_eq!(chain.to_vec(), want);
            assert_eq!(chain.len(), want.len());
            assert!((0..want.len()).all(|i| chain.get(i) == want[i]));
        }
        // Emptying the memo leaves the arrays to those who hold them.
        memo.memo
            .lock()
            .unwrap()
            .chains
            .iter_mut()
            .for_each(|c| *c = None);
        trace.block_hashes(ReqId(0), 16, &mut want);
        assert_eq!(c[0].to_vec(), want);
    }

    #[test]
    fn a_missing_chain_is_hashed_with_the_next_missing_ones() {
        // Six prompts: contexts a, b, a, c, d, e (each after a system prompt), one question.
        let mut arena = TokenArena::default();
        let system = arena.push(0..32);
        let ctx: Vec<SegId> = (0..5).map(|i| arena.push(100 * i..100 * i + 70)).collect();
        let q = arena.push(900..920);
        let order = [0, 1, 0, 2, 3, 4];
        let trace = trace_of(
            arena,
            order.iter().map(|&c| vec![system, ctx[c], q]).collect(),
        );
        let memo = PromptHashes::new(trace.clone());
        let first = memo.chain_hashes(ReqId(0), 16);
        // The first miss hashed a, b, c and d together (a's repeat is not hashed twice), and
        // counts their hashes: 102 tokens, 6 full blocks each.
        {
            let m = memo.memo.lock().unwrap();
            // Lists are numbered in order of first appearance: a 0, b 1, c 2, d 3, e 4.
            assert_eq!(memo.leads().of, [0, 1, 0, 2, 3, 4]);
            let held: Vec<bool> = m.chains.iter().map(Option::is_some).collect();
            assert_eq!(held, [true, true, true, true, false]);
            assert_eq!(m.hashes, 24);
        }
        // Every chain is the trace's; the later requests share the arrays made early.
        let mut want = Vec::new();
        for id in trace.ids() {
            let got = memo.chain_hashes(id, 16);
            trace.block_hashes(id, 16, &mut want);
            assert_eq!(got.to_vec(), want, "request {}", id.0);
        }
        let again = memo.chain_hashes(ReqId(2), 16);
        assert!(Arc::ptr_eq(
            first.lead.as_ref().unwrap(),
            again.lead.as_ref().unwrap()
        ));
        let m = memo.memo.lock().unwrap();
        assert!(m.chains.iter().all(Option::is_some));
    }

    #[test]
    fn memoised_hashes_are_the_traces_for_every_block_size_and_segment_split() {
        let mut arena = TokenArena::default();
        let system = arena.push(0..5);
        let ctx_a = arena.push(100..137);
        let ctx_b = arena.push(200..216);
        let questions: Vec<SegId> = (0..4)
            .map(|i| arena.push(1000 * i..1000 * i + 9 * i))
            .collect();
        let mut prompts = Vec::new();
        for &q in &questions {
            prompts.extend([
                vec![system, ctx_a, q],
                vec![system, ctx_b, ctx_a, q],
                vec![q],
                vec![ctx_b, q],
            ]);
        }
        let trace = trace_of(arena, prompts);
        let memo = PromptHashes::new(trace.clone());
        let (mut want, mut got) = (Vec::new(), Vec::new());
        for block_size in [1, 4, 5, 16, 64] {
            for round in 0..2 {
                for id in trace.ids() {
                    trace.block_hashes(id, block_size, &mut want);
                    got.push(round as u64);
                    memo.block_hashes(id, block_size, &mut got);
                    assert_eq!(got, want, "request {} blocks of {block_size}", id.0);
                }
            }
        }
    }
}
