//! The best any eviction could do: Belady's rule as an upper bound on the prefix-hit ratio.
//!
//! **What is computed.** The *accesses* are every block of every request, request after request
//! in arrival order and block after block in a request, each `(identity, tokens)` as cut by
//! [`super::stats::Blocks`]. They are treated as independent: an access hits the tokens of its
//! block that the cache holds, whatever happened to the blocks before it in the request. The
//! cache holds at most `capacity` tokens, a block taking its length (a partial last block its
//! real length, as in the LRU figure), and it follows Belady's rule with bypass: after each
//! access, of all the tokens held and the accessed block's own, the ones whose block is
//! accessed again furthest in the future go first, so a block that comes back later than
//! everything held is not kept at all, and a block never accessed again is never kept. The
//! cache may keep part of a block (the split falls on the block used furthest ahead); a block
//! longer than the capacity is never held. This is Belady's rule on single tokens, where the
//! tokens of a block are always accessed together: when every block is whole and `capacity` is
//! a multiple of the block size no block is ever split, and it is exactly Belady's OPT over
//! blocks with `capacity / block size` slots.
//!
//! **Why it bounds every eviction policy.** Take any cache of blocks that never holds more than
//! `capacity` tokens when a request looks its blocks up, and stores a block only when a request
//! brings it (the LRU of [`super::stats::Blocks::lru_hit_ratio`] is one). (1) Its prefix hits
//! are at most its hits on the independent accesses: a prefix hit of a request is a block held
//! when the request looks up, and every block before it in the request hits too, so nothing is
//! stored, and nothing evicted, before it is reached. (2) Such a cache is one way of holding at
//! most `capacity` single tokens, and on unit-size items Belady's rule with bypass gives the
//! most hits of all (Belady 1966, Mattson et al. 1970); blocks longer than the capacity never
//! hit in either. So the ratio here is at least the prefix-hit ratio of the LRU, or of any
//! eviction, with that capacity on that trace. With a capacity that holds every distinct block
//! only first accesses miss, and it equals the unbounded prefix-hit ratio: block hashes are
//! chained, so a block seen before means its whole prefix was.
//!
//! **Why tokens, not whole-block slots.** The LRU figure charges a partial block its real
//! length, so with blocks of 2 tokens an LRU of 3 tokens holds `[1,2]` and `[3]` and hits 3 of
//! the 6 tokens of `[1,2,3], [1,2,3]`; Belady over one whole-block slot would hit only 2, below
//! the LRU. Counting the capacity in tokens keeps the bound above every cache the LRU figure
//! could describe, at the cost of a part of a block that no real cache could keep.
//!
//! **Cost.** One backward pass with a hash map gives every access the position of the next
//! access of its block; the forward pass keeps the held tokens in an ordered map keyed by that
//! next position (each position is the next access of at most one earlier access, so the key
//! names the block): O(n log n) time, O(n) memory for n accesses.

use std::collections::{BTreeMap, HashMap};

use crate::hash::IdBuildHasher;

/// The next position of an access whose block is never accessed again.
pub const NEVER: usize = usize::MAX;

/// For every access, the position of the next access of the same block, or [`NEVER`].
pub fn next_uses(accesses: &[(u64, u32)]) -> Vec<usize> {
    let mut later: HashMap<u64, usize, IdBuildHasher> = HashMap::default();
    let mut next = vec![NEVER; accesses.len()];
    for (i, &(key, _)) in accesses.iter().enumerate().rev() {
        if let Some(j) = later.insert(key, i) {
            next[i] = j;
        }
    }
    next
}

/// Tokens hit by Belady's rule with bypass on `accesses` (`(identity, tokens)`, in order) with
/// a cache of `capacity` tokens (the module doc): an upper bound on the prefix hits, in tokens,
/// of any eviction policy with that capacity.
pub fn optimal_hit_tokens(accesses: &[(u64, u32)], capacity: u64) -> u64 {
    let next = next_uses(accesses);
    // Tokens held of each block, keyed by the position of the block's next access.
    let mut held: BTreeMap<usize, u64> = BTreeMap::new();
    let mut used = 0u64;
    let mut hit = 0u64;
    for (i, &(_, len)) in accesses.iter().enumerate() {
        let len = len as u64;
        if len > capacity {
            // Never held: no whole-block cache of this capacity can hold it either.
            continue;
        }
        let h = held.remove(&i).unwrap_or(0);
        hit += h;
        used -= h;
        if next[i] == NEVER {
            continue;
        }
        held.insert(next[i], len);
        used += len;
        // Bounded: each round removes an entry or ends the loop.
        while used > capacity {
            let mut furthest = held.last_entry().expect("tokens held");
            let cut = (used - capacity).min(*furthest.get());
            used -= cut;
            if cut == *furthest.get() {
                furthest.remove();
            } else {
                *furthest.get_mut() -= cut;
            }
        }
    }
    hit
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::mix64;
    use crate::workload::stats::Blocks;

    /// The most tokens any cache of whole blocks of at most `capacity` tokens can hit on
    /// `accesses`: every choice, after every access, of which held blocks and whether the
    /// accessed one to keep (so bypass, and evicting several at once, are included).
    fn brute_force(accesses: &[(u64, u32)], capacity: u64) -> u64 {
        let mut ids: Vec<(u64, u64)> = Vec::new();
        for &(k, len) in accesses {
            if !ids.iter().any(|&(i, _)| i == k) {
                ids.push((k, len as u64));
            }
        }
        assert!(ids.len() <= 16);
        let bit = |k: u64| 1u32 << ids.iter().position(|&(i, _)| i == k).unwrap();
        let size = |m: u32| -> u64 {
            (0..ids.len())
                .filter(|b| m & (1 << b) != 0)
                .map(|b| ids[b].1)
                .sum()
        };
        let mut best: HashMap<u32, u64> = HashMap::from([(0, 0)]);
        for &(k, len) in accesses {
            let b = bit(k);
            let mut next: HashMap<u32, u64> = HashMap::new();
            for (&m, &h) in &best {
                let h = h + if m & b != 0 { len as u64 } else { 0 };
                let all = m | b;
                let mut s = all;
                loop {
                    if size(s) <= capacity {
                        let e = next.entry(s).or_insert(0);
                        *e = (*e).max(h);
                    }
                    if s == 0 {
                        break;
                    }
                    s = (s - 1) & all;
                }
            }
            best = next;
        }
        best.into_values().max().unwrap()
    }

    /// A counter-based random sequence.
    struct Rand(u64);

    impl Rand {
        fn below(&mut self, n: u64) -> u64 {
            self.0 += 1;
            mix64(self.0) % n
        }
    }

    fn random_accesses(r: &mut Rand, distinct: u64, lens: impl Fn(u64) -> u32) -> Vec<(u64, u32)> {
        let n = 1 + r.below(12);
        (0..n)
            .map(|_| {
                let k = r.below(distinct);
                (k, lens(k))
            })
            .collect()
    }

    #[test]
    fn a_hand_computed_example() {
        // One-token blocks a b c a b c, 2 tokens: keeps a and b, bypasses c (used last).
        let abc = [(1, 1), (2, 1), (3, 1), (1, 1), (2, 1), (3, 1)];
        assert_eq!(optimal_hit_tokens(&abc, 2), 2);
        assert_eq!(optimal_hit_tokens(&abc, 3), 3);
        assert_eq!(optimal_hit_tokens(&abc, 0), 0);
        assert_eq!(next_uses(&abc), vec![3, 4, 5, NEVER, NEVER, NEVER]);
        // Two-token blocks x y x y, 3 tokens: x is kept whole, one token of y (used after x).
        let xy = [(1, 2), (2, 2), (1, 2), (2, 2)];
        assert_eq!(optimal_hit_tokens(&xy, 3), 3);
        // A block longer than the capacity is never held.
        assert_eq!(optimal_hit_tokens(&xy, 1), 0);
        assert_eq!(optimal_hit_tokens(&xy, 4), 4);
    }

    #[test]
    fn it_is_the_best_of_every_eviction_choice_on_whole_blocks() {
        let mut r = Rand(1);
        for _ in 0..400 {
            let bs = 1 + r.below(2) as u32;
            let distinct = 1 + r.below(5);
            let acc = random_accesses(&mut r, distinct, |_| bs);
            for slots in 0..=4 {
                let c = slots * bs as u64;
                assert_eq!(
                    optimal_hit_tokens(&acc, c),
                    brute_force(&acc, c),
                    "{acc:?}, {c} tokens"
                );
            }
        }
    }

    #[test]
    fn it_is_the_best_on_single_tokens_and_above_whole_blocks_of_mixed_lengths() {
        let mut r = Rand(2);
        for _ in 0..300 {
            let lens: Vec<u32> = (0..3).map(|_| 1 + r.below(3) as u32).collect();
            let acc = random_accesses(&mut r, 3, |k| lens[k as usize]);
            for c in 0..=5 {
                let opt = optimal_hit_tokens(&acc, c);
                // Every token its own item; a block longer than the capacity cannot be held.
                let tokens: Vec<(u64, u32)> = acc
                    .iter()
                    .flat_map(|&(k, len)| {
                        let size = if len as u64 > c { c as u32 + 1 } else { 1 };
                        (0..len as u64).map(move |j| (k * 8 + j, size))
                    })
                    .collect();
                assert_eq!(opt, brute_force(&tokens, c), "{acc:?}, {c} tokens");
                assert!(opt >= brute_force(&acc, c), "{acc:?}, {c} tokens");
            }
        }
    }

    use crate::workload::stats::tests::trace;

    /// Prompts that share prefixes of three documents, with short random tails.
    fn random_prompts(r: &mut Rand) -> Vec<Vec<u32>> {
        (0..1 + r.below(16))
            .map(|_| {
                let doc = r.below(3) as u32;
                let mut p: Vec<u32> = (0..1 + r.below(12) as u32).map(|j| doc * 100 + j).collect();
                p.extend((0..r.below(3)).map(|_| 1 + r.below(2) as u32));
                p
            })
            .collect()
    }

    #[test]
    fn the_bound_is_at_least_the_lru_and_the_unbounded_ratio_when_everything_fits() {
        // The whole-block-slot bound would fall below the LRU here (module doc).
        let t = trace(&[vec![1, 2, 3], vec![1, 2, 3]]);
        let b = Blocks::of(&t, 2);
        assert_eq!(b.lru_hit_ratio(3), 0.5);
        assert_eq!(b.optimal_hit_ratio(3), 0.5);
        let mut r = Rand(3);
        for _ in 0..500 {
            let t = trace(&random_prompts(&mut r));
            let b = Blocks::of(&t, 1 + r.below(4) as u32);
            for c in 1..=40 {
                let (opt, lru) = (b.optimal_hit_ratio(c), b.lru_hit_ratio(c));
                assert!(opt >= lru, "{c} tokens: {opt} < {lru}");
            }
            assert_eq!(b.optimal_hit_ratio(u64::MAX), b.unbounded_hit_ratio());
            let all: u64 = t.requests.iter().map(|r| r.prompt_tokens as u64).sum();
            assert_eq!(b.optimal_hit_ratio(all), b.unbounded_hit_ratio());
        }
    }
}
