//! The block hashes of the trace's prompts, computed once per shared prefix.
//!
//! [`Trace::block_hashes`] folds every prompt token into the chain of block hashes: about
//! 4,000 multiplies for a SQuAD prompt, at every instance a request reaches and again at a
//! KV router. But prompts are made of segments that many prompts share (a system
//! prompt and a context before a question), and the hashes of the blocks before the last
//! segment depend only on the segments before it. So the state of the chain after every
//! segment but the last (the hashes of its full blocks, and the partial block's hash in the
//! making, a [`PartialBlock`]) is kept under that list of segments, and a prompt is hashed
//! from there: the result is exactly [`Trace::block_hashes`]'s (a test checks it).
//!
//! **Hashed four at a time.** A block's hash is one dependent multiply a token, so hashing one
//! context window (4,128 tokens) keeps one multiply in flight and the processor mostly idle. When
//! the memo lacks a request's leading segments, it also takes those of the next requests (up to
//! [`LOOKAHEAD`] of them) that it lacks, up to four lists in all, and folds them in lockstep
//! ([`crate::hash::chains`]). A run at cluster scale hashes thousands of windows this way, and a
//! smaller one with as many requests a GPU hashes a new window for about every other request.
//!
//! **Shared, not copied.** A prompt's hashes are a [`ChainHashes`]: the memo's array for its
//! leading segments, shared, then its last segment's blocks (in place when they are few, as a
//! question's are; else an array of their own). Every request with the same leading segments, and
//! every pool segment that registers their blocks (see [`crate::serving::kv`]), holds the same
//! array: at cluster scale, where a copy of a SQuAD prompt's 2 KiB of hashes per request and per
//! registration would be a stream of cache misses (and the pools' copies hundreds of MiB), the
//! leading hashes are in memory once per list of segments.
//!
//! **Lists by number.** At the first prompt hashed, every request's list of leading segments is
//! given a number, the same for equal lists (`Leads`: one pass over the trace, a map from a list's
//! 64-bit hash to its number, with the list compared on a hit), and the memo is an array by that
//! number (an entry a list: 40 bytes, besides the 4 bytes a request of the numbers; bounded by the
//! trace). A prompt's chain is then one read of a known place, which can be asked for ahead like
//! the requests' records, where a hash map keyed by a hash of the block size and the list would
//! cost a probe, an entry and a kept list: three cold reads a request at cluster scale. An entry
//! keeps its block size, so a chain of another block size is replaced. The memo is bounded: when it
//! holds more than [`MEMO_HASHES`] hashes it is emptied and filled again as prompts come (the
//! arrays that requests and pools still hold live on with them, and go with the last of them). It
//! only ever saves work, so its contents never change a result. One memo serves every actor of a
//! simulation (a lock that is never contended: a simulation runs on one thread).

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

/// Most lists of leading segments hashed together (see [`crate::hash::chains`]).
const LANES: usize = 4;

/// How many requests after one whose leading segments the memo lacks are looked at for
/// others it lacks, to hash them together.
const LOOKAHEAD: usize = 64;

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
        // Sized once: grown from empty, a SQuAD context's 250-odd hashes would take eight
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
mod tests;
