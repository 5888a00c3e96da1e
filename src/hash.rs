//! Fixed hash functions for everything whose value decides behaviour.
//!
//! `std`'s `DefaultHasher` is randomly keyed per process and its algorithm may change, so
//! meshsim never lets it decide behaviour (DESIGN contract 2). Block identities use
//! [`block_hash`]: starting from the parent block's hash, each token id `t` is folded in as
//! `h = (rotl(h, 5) xor t) x 0x9E3779B97F4A7C15` (the FxHash step, one multiply per token),
//! and the result is finished with the SplitMix64 mixer so that every bit depends on every
//! token. It is not cryptographic: two different 16-token blocks collide with probability
//! about 2^-64, far below anything a simulated run can reach. [`IdHasher`] lets maps keyed by
//! such hashes skip rehashing; only lookups go through those maps, never iteration.

use std::hash::{BuildHasherDefault, Hasher};

const FX_K: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64 finaliser.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `h` within namespace `ns`: equal pairs give equal ids, and an id of one namespace equals
/// one of another with probability about 2^-64 (a store's scope, see
/// [`crate::serving::policy::Scope`]).
pub fn mix(h: u64, ns: u64) -> u64 {
    mix64(h ^ mix64(ns.wrapping_add(FX_K)))
}

/// One token folded into a block's hash in the making: the FxHash step (the module doc).
#[inline(always)]
fn fx_step(h: u64, t: u32) -> u64 {
    (h.rotate_left(5) ^ t as u64).wrapping_mul(FX_K)
}

/// The hash of the first block of a prompt uses this as its parent.
pub const ROOT_PARENT: u64 = 0;

/// Chained block hash: identifies a block by its tokens *and* everything before it.
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut block = PartialBlock::new(parent);
    block.push(tokens);
    block.finish()
}

/// A block's hash in the making: its parent and the tokens folded in so far, so that a
/// block whose tokens come in pieces (a prompt's segments end mid-block) is hashed as they
/// come, without gathering them first. `finish` gives [`block_hash`] of the parent and
/// every token pushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartialBlock {
    h: u64,
    tokens: usize,
}

impl PartialBlock {
    /// A block after `parent`, with no token yet.
    pub fn new(parent: u64) -> PartialBlock {
        PartialBlock {
            h: mix64(parent ^ FX_K),
            tokens: 0,
        }
    }

    /// Folds `tokens` in, in order.
    #[inline]
    pub fn push(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.h = fx_step(self.h, t);
        }
        self.tokens += tokens.len();
    }

    /// Tokens folded in so far.
    pub fn len(&self) -> usize {
        self.tokens
    }

    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// The block's hash.
    pub fn finish(self) -> u64 {
        mix64(self.h)
    }

    /// Folds `tokens` in, in order, appending to `out` the hash of every block of
    /// `block_size` tokens that fills and starting the next after it; returns the partial
    /// block at the end.
    pub fn fold(mut self, mut tokens: &[u32], block_size: usize, out: &mut Vec<u64>) -> Self {
        // Bounded: every round takes at least one token.
        while !tokens.is_empty() {
            let take = (block_size - self.len()).min(tokens.len());
            self.push(&tokens[..take]);
            if self.len() == block_size {
                let h = self.finish();
                out.push(h);
                self = PartialBlock::new(h);
            }
            tokens = &tokens[take..];
        }
        self
    }
}

/// The chains of `N` token lists at once, each from the start of a prompt: for each list, the
/// hashes of its full blocks of `block_size` tokens appended to its `out`, and its partial
/// block at the end, exactly as pushing the list into `PartialBlock::new(ROOT_PARENT)` and
/// starting a block after each full one gives them. A block's hash is one dependent multiply
/// a token (five cycles), so one chain leaves most of the processor idle; the lists' blocks
/// are folded in lockstep, so that `N` independent multiplies are in flight at a time.
pub fn chains<const N: usize>(
    tokens: [&[u32]; N],
    block_size: usize,
    out: [&mut Vec<u64>; N],
) -> [PartialBlock; N] {
    assert!(block_size > 0, "blocks hold at least one token");
    let mut h = [PartialBlock::new(ROOT_PARENT).h; N];
    let common = tokens
        .iter()
        .map(|t| t.len() / block_size)
        .min()
        .unwrap_or(0);
    for b in 0..common {
        let at = b * block_size;
        let blocks: [&[u32]; N] = std::array::from_fn(|l| &tokens[l][at..at + block_size]);
        // Token by token across the lists (the order that keeps `N` multiplies in flight),
        // not list by list as iterators would have it.
        #[allow(clippy::needless_range_loop)]
        for k in 0..block_size {
            for l in 0..N {
                h[l] = fx_step(h[l], blocks[l][k]);
            }
        }
        for l in 0..N {
            let done = PartialBlock {
                h: h[l],
                tokens: block_size,
            }
            .finish();
            out[l].push(done);
            h[l] = PartialBlock::new(done).h;
        }
    }
    // Each list's blocks beyond the shortest one's, alone.
    let mut lanes = out.into_iter();
    std::array::from_fn(|l| {
        let out = lanes.next().expect("one output a list");
        PartialBlock { h: h[l], tokens: 0 }.fold(&tokens[l][common * block_size..], block_size, out)
    })
}

/// A hasher for keys that are already well-mixed 64-bit hashes.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ b as u64 ^ (self.0 >> 56);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub type IdBuildHasher = BuildHasherDefault<IdHasher>;

/// Hash of a byte string: 64-bit FNV-1a finished with [`mix64`]. Used for pseudo token ids of
/// text pieces, so equal text always gives equal ids.
pub fn bytes_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// The `len` pseudo token ids of the block (or segment) named `key`: the SplitMix64 sequence
/// seeded with `mix64(key)`, that is token `i` is `h = mix64(mix64(key) + (i + 1) * 0x9E3779B97F4A7C15)`
/// (wrapping), mapped onto the ids `3..vocab` (0-2 are the special tokens) as
/// `3 + (h * (vocab - 3)) >> 64` in 128-bit arithmetic. Token `i` depends only on `key` and
/// `i`, so two blocks with the same key share their first tokens and a partial last block is a
/// prefix of the full block. One multiply-add and one mixer per token: this runs for every
/// token of a Mooncake trace.
pub fn pseudo_tokens(key: u64, len: u64, vocab: u32) -> PseudoTokens {
    PseudoTokens {
        seed: mix64(key),
        range: vocab as u128 - 3,
        i: 0,
        len,
    }
}

/// The iterator of [`pseudo_tokens`].
#[derive(Clone, Debug)]
pub struct PseudoTokens {
    seed: u64,
    range: u128,
    /// Tokens given so far.
    i: u64,
    len: u64,
}

impl Iterator for PseudoTokens {
    type Item = u32;

    #[inline]
    fn next(&mut self) -> Option<u32> {
        if self.i == self.len {
            return None;
        }
        self.i += 1;
        let h = mix64(self.seed.wrapping_add(self.i.wrapping_mul(FX_K)));
        Some(3 + ((h as u128 * self.range) >> 64) as u32)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.len - self.i) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for PseudoTokens {}

#[cfg(test)]
mod tests {
    use super::*;

    /// One list, one token at a time: the definition `chains` must give.
    fn one_by_one(tokens: &[u32], block_size: usize) -> (Vec<u64>, PartialBlock) {
        let (mut out, mut block) = (Vec::new(), PartialBlock::new(ROOT_PARENT));
        for &t in tokens {
            block.push(&[t]);
            if block.len() == block_size {
                let h = block.finish();
                out.push(h);
                block = PartialBlock::new(h);
            }
        }
        (out, block)
    }

    fn check_lanes<const N: usize>(rng: &mut crate::rng::Stream) {
        let block_size = 1 + rng.below(20) as usize;
        let lists: Vec<Vec<u32>> = (0..N)
            .map(|_| {
                // Equal lengths (the common case: context windows), or any.
                let n = if rng.below(2) == 0 {
                    100
                } else {
                    rng.below(300) as usize
                };
                (0..n).map(|_| rng.below(32_000) as u32).collect()
            })
            .collect();
        let mut outs: Vec<Vec<u64>> = (0..N).map(|l| vec![l as u64; l]).collect();
        let mut it = outs.iter_mut();
        let out: [&mut Vec<u64>; N] = std::array::from_fn(|_| it.next().unwrap());
        let rests = chains::<N>(
            std::array::from_fn(|l| lists[l].as_slice()),
            block_size,
            out,
        );
        for l in 0..N {
            let (want, rest) = one_by_one(&lists[l], block_size);
            // Appended after what `out` held.
            assert_eq!(outs[l][..l], vec![l as u64; l][..]);
            assert_eq!(
                outs[l][l..],
                want[..],
                "list {l} of {N}, blocks of {block_size}"
            );
            assert_eq!(rests[l], rest, "list {l} of {N}, blocks of {block_size}");
        }
    }

    #[test]
    fn chains_in_lockstep_are_the_one_by_one_chains() {
        let mut rng = crate::rng::Stream::new(11, 0);
        for _ in 0..200 {
            check_lanes::<1>(&mut rng);
            check_lanes::<2>(&mut rng);
            check_lanes::<3>(&mut rng);
            check_lanes::<4>(&mut rng);
        }
    }

    #[test]
    fn a_block_hashed_in_pieces_is_the_block_hashed_whole() {
        let tokens: Vec<u32> = (0..16).map(|i| i * 7919 + 3).collect();
        let parent = block_hash(ROOT_PARENT, &[9, 9]);
        let whole = block_hash(parent, &tokens);
        for cut in 0..=tokens.len() {
            let mut b = PartialBlock::new(parent);
            b.push(&tokens[..cut]);
            assert_eq!(b.len(), cut);
            b.push(&[]);
            b.push(&tokens[cut..]);
            assert_eq!(b.len(), tokens.len());
            assert_eq!(b.finish(), whole, "cut at {cut}");
        }
        assert!(PartialBlock::new(parent).is_empty());
        assert_eq!(PartialBlock::new(parent).finish(), block_hash(parent, &[]));
    }

    #[test]
    fn block_hash_is_pinned_and_chained() {
        // Pinned value: changing the algorithm changes every result file, so it must be deliberate.
        let a = block_hash(ROOT_PARENT, &[1, 2, 3]);
        assert_eq!(a, 0x7f0c_70a6_a925_bc6b);
        let b = block_hash(a, &[1, 2, 3]);
        assert_ne!(
            a, b,
            "the same tokens under another parent are another block"
        );
        assert_ne!(block_hash(ROOT_PARENT, &[1, 3, 2]), a, "order matters");
    }

    #[test]
    fn byte_and_pseudo_token_hashes_are_pinned() {
        assert_eq!(bytes_hash(b""), mix64(0xcbf2_9ce4_8422_2325));
        assert_ne!(bytes_hash(b"ab"), bytes_hash(b"ba"));
        let a: Vec<u32> = pseudo_tokens(42, 8, 32_000).collect();
        assert!(a.iter().all(|t| (3..32_000).contains(t)));
        assert_eq!(a[..5], pseudo_tokens(42, 5, 32_000).collect::<Vec<_>>()[..]);
        assert_ne!(a, pseudo_tokens(43, 8, 32_000).collect::<Vec<_>>());
        assert_eq!(
            a[0],
            3 + ((mix64(mix64(42).wrapping_add(FX_K)) as u128 * 31_997) >> 64) as u32
        );
    }
}
