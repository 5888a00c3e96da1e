//! The pool's records of registered blocks: segments ([`Seg`]), runs of the free queue
//! ([`Run`]) and where segments start ([`Starts`]) (see the module doc of [`super`]).

use std::cell::Cell;

use super::prompt_hashes::ChainHashes;
use super::{BlockId, NONE};

/// How many live segments start at each chain position, and a bit a position for whether any
/// does: registration looks for the next position a segment starts at past each block it
/// registers (a SQuAD prompt: 258 positions), and at cluster scale, where a pool's counts are
/// cold at every request, reading them a word a position would be a cache miss every 16
/// positions, where the bits of a prompt's positions are one line.
#[derive(Clone, Debug, Default)]
pub(super) struct Starts {
    pub(super) counts: Vec<u32>,
    /// Bit `p % 64` of word `p / 64`: whether `counts[p] > 0`.
    pub(super) any: Vec<u64>,
}

impl Starts {
    pub(super) fn add(&mut self, at: usize) {
        if self.counts.len() <= at {
            self.counts.resize(at + 1, 0);
            self.any.resize(at / 64 + 1, 0);
        }
        self.counts[at] += 1;
        self.any[at / 64] |= 1 << (at % 64);
    }

    pub(super) fn remove(&mut self, at: usize) {
        self.counts[at] -= 1;
        if self.counts[at] == 0 {
            self.any[at / 64] &= !(1 << (at % 64));
        }
    }

    #[inline]
    pub(super) fn any_at(&self, at: usize) -> bool {
        self.any
            .get(at / 64)
            .is_some_and(|&w| w >> (at % 64) & 1 == 1)
    }

    /// The first position from `from` below `upto` that a segment starts at, or `upto`.
    pub(super) fn next(&self, from: usize, upto: usize) -> usize {
        let mut w = from / 64;
        let mut bits = match self.any.get(w) {
            Some(&b) => b & (u64::MAX << (from % 64)),
            None => return upto,
        };
        // Bounded: one pass a word, up to the last.
        loop {
            if bits != 0 {
                return (w * 64 + bits.trailing_zeros() as usize).min(upto);
            }
            w += 1;
            if w * 64 >= upto || w >= self.any.len() {
                return upto;
            }
            bits = self.any[w];
        }
    }

    /// Whether the bits say what the counts do.
    pub(super) fn check(&self) -> Result<(), String> {
        let bits = (0..self.any.len() * 64).filter(|&p| self.any_at(p));
        if !bits.eq((0..self.counts.len()).filter(|&p| self.counts[p] > 0)) {
            return Err("segment start bits disagree with their counts".into());
        }
        Ok(())
    }
}

/// Registered blocks at consecutive chain positions (see the module doc). Positions are
/// relative to the segment's first block.
///
/// Two 64-byte lines, aligned (`repr(C)`): the first holds what a lookup reads (the chain,
/// where it starts, its length, where hashes last parted, where its free blocks begin), the
/// second what holding, releasing and registering change. Unaligned in a `Vec`, a segment's
/// 128 bytes would straddle three lines seven times in eight.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub(super) struct Seg {
    /// The chain its hashes are positions `start..start + len` of.
    pub(super) chain: ChainHashes,
    /// Chain position of its first block.
    pub(super) start: u32,
    /// Its blocks (positions `0..len`).
    pub(super) len: u32,
    /// Where the last lookup that entered it found the hashes parting from its own (0 if
    /// none did): tried first by the next (see [`BlockPool::step`]).
    pub(super) parted: Cell<u32>,
    /// Positions from here on are free: the longest holder's length (0 with none), kept
    /// in the record so that a lookup counting free hits does not read them.
    pub(super) free_from: u32,
    /// How many holders hold the longest prefix (0 with none).
    pub(super) at_max: u32,
    /// Its runs in the free queue: the one with its highest positions (nearest the head) and
    /// the one with its lowest (queued last).
    pub(super) top: u32,
    pub(super) low: u32,
    pub(super) ids: Vec<BlockId>,
    /// Its holders' prefix lengths shorter than the longest (`free_from`), ascending.
    pub(super) below: Vec<u32>,
}

// Two lines a segment, the lookup's fields in the first.
const _: () = assert!(std::mem::size_of::<Seg>() == 128);
const _: () = assert!(std::mem::offset_of!(Seg, free_from) + 4 <= 64);

impl Seg {
    /// An unused slot.
    pub(super) fn empty() -> Seg {
        Seg {
            start: 0,
            len: 0,
            chain: ChainHashes::default(),
            ids: Vec::new(),
            below: Vec::new(),
            at_max: 0,
            free_from: 0,
            top: NONE,
            low: NONE,
            parted: Cell::new(0),
        }
    }

    pub(super) fn len(&self) -> u32 {
        self.len
    }

    /// The hash of position `p` (below its length).
    #[inline]
    pub(super) fn hash(&self, p: u32) -> u64 {
        debug_assert!(p < self.len);
        self.chain.get((self.start + p) as usize)
    }

    /// The hash of position `p`, if it has one.
    #[inline]
    pub(super) fn get(&self, p: u32) -> Option<u64> {
        (p < self.len).then(|| self.hash(p))
    }
}

/// A run of the free queue: positions `lo..hi` of segment `seg` (queued from `hi - 1` down),
/// or, with `seg` `NONE`, unregistered blocks: the `lo`-th to the `hi`-th queued to it, whose
/// ids are `anon[lo..hi]` (in queue order) if the pool keeps ids.
///
/// One 64-byte line, aligned: unaligned in a `Vec`, a run's 56 bytes would straddle two
/// lines more often than not.
#[derive(Clone, Debug, Default)]
#[repr(align(64))]
pub(super) struct Run {
    pub(super) prev: u32,
    pub(super) next: u32,
    pub(super) seg: u32,
    pub(super) lo: u32,
    pub(super) hi: u32,
    /// Within its segment: the run of the next lower positions (queued after this one), and
    /// of the next higher.
    pub(super) down: u32,
    pub(super) up: u32,
    pub(super) anon: Vec<BlockId>,
}

const _: () = assert!(std::mem::size_of::<Run>() == 64);

impl Run {
    pub(super) fn blocks(&self) -> u32 {
        self.hi - self.lo
    }
}
