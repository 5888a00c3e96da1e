//! Registration: a sequence's computed prompt blocks join segments (see the module doc of
//! [`super`]).

use super::blocks::{Blocks, Piece};
use super::prompt_hashes::ChainHashes;
use super::segments::Seg;
use super::*;
use crate::serving::msg::KvEvent;

impl BlockPool {
    /// Registers the sequence's blocks under `hashes.get(i)` (its prompt's chain from its
    /// first block) for every `i` from `from` to `upto`, once their KV is computed. A block
    /// whose hash another block holds already stays unregistered (that one holds identical
    /// KV). Each block extends the segment whose last block is the sequence's block before
    /// it, or starts a segment.
    pub fn register_all(
        &mut self,
        blocks: &mut Blocks,
        hashes: &ChainHashes,
        upto: usize,
        from: usize,
    ) {
        if !self.caching {
            return;
        }
        assert!(upto <= hashes.len(), "a hash for every block registered");
        assert!(upto <= blocks.len(), "a block for every hash");
        // Blocks before the sequence's registered end are registered already.
        let from = from.max(blocks.registered_end());
        let (mut prev, mut own) = self.owner_before(blocks, hashes, from);
        let mut i = from;
        // Bounded: every pass registers a block at least, or moves on by one.
        while i < upto {
            let h = hashes.get(i);
            if let Some(x) = self.find(prev, i, h) {
                (prev, own) = (Some(x), false);
                i += 1;
                continue;
            }
            let (s, fresh) = match prev {
                Some((s, p)) if own && p + 1 == self.segs[s as usize].len() => (s, false),
                _ => (self.new_seg(i, upto - i), true),
            };
            // The sequence holds the whole segment `s` and extends it with block `i`, and
            // with the blocks after it up to the next position a segment starts at: the hash
            // of such a block can be in no other segment (it would be at `s`'s next position,
            // past its end, or start a segment there).
            let j = self.starts.next(i + 1, upto);
            let k = (j - i) as u32;
            if let Some(events) = &mut self.events {
                events.extend((i..j).map(|x| KvEvent::Stored(hashes.get(x))));
            }
            let seg = &mut self.segs[s as usize];
            // Holding the whole segment, the sequence's chain agrees with it at its positions,
            // so its chain serves as the segment's from now on.
            if !seg.chain.same_arrays(hashes) {
                seg.chain = hashes.clone();
            }
            seg.len += k;
            if self.keep_ids {
                seg.ids.extend_from_slice(&blocks.ids[i..j]);
            }
            // The sequence held the whole segment (the longest holding) and now holds it with
            // the new blocks: the only longest holder.
            if !fresh && seg.at_max > 1 {
                let (was, n) = (seg.free_from, seg.at_max - 1);
                seg.below.extend(std::iter::repeat_n(was, n as usize));
            }
            seg.at_max = 1;
            seg.free_from = seg.len();
            (prev, own) = (Some((s, seg.len() - 1)), true);
            if fresh {
                blocks.push_piece(Piece {
                    seg: s,
                    at: i as u32,
                    n: k,
                });
                self.index_seg(s);
            } else {
                blocks.last_piece_mut().expect("held").n += k;
            }
            i = j;
        }
    }

    /// Where `h` is registered (segment, position), given `prev`, where the hash before it
    /// in its chain is (`None` at a chain's start, or if no block holds it): the next
    /// position of `prev`'s segment, or a segment's start.
    /// `at` is `h`'s chain position.
    pub(super) fn find(&self, prev: Option<(u32, u32)>, at: usize, h: u64) -> Option<(u32, u32)> {
        if let Some((s, p)) = prev
            && self.segs[s as usize].get(p + 1) == Some(h)
        {
            return Some((s, p + 1));
        }
        self.starting_at(at, h).map(|s| (s, 0))
    }

    /// Where `hashes[from - 1]` is registered, and whether the sequence's own block there is
    /// the registered one (`None` if `from` is 0 or no block holds it). Blocks between the
    /// sequence's registered end and `from` hold hashes other blocks held: the chain is
    /// followed from there.
    pub(super) fn owner_before(
        &self,
        blocks: &Blocks,
        hashes: &ChainHashes,
        from: usize,
    ) -> (Option<(u32, u32)>, bool) {
        if from == 0 {
            return (None, false);
        }
        let (start, at) = match blocks.pieces().last() {
            Some(p) => ((p.at + p.n) as usize, Some((p.seg, p.n - 1))),
            None => (0, None),
        };
        if start == from {
            return (at, true);
        }
        let found = (start..from).fold(at, |prev, i| self.find(prev, i, hashes.get(i)));
        (found, false)
    }

    /// A new segment at chain position `start`, empty, with room for `most` blocks: the
    /// caller fills it (and so it is indexed, by its first hash, when that is known).
    pub(super) fn new_seg(&mut self, start: usize, most: usize) -> u32 {
        let s = match self.unused_segs.pop() {
            Some(s) => s,
            None => {
                self.segs.push(Seg::empty());
                self.segs.len() as u32 - 1
            }
        };
        self.starts.add(start);
        // An unused slot keeps the room of its arrays (see `allocate`).
        let seg = &mut self.segs[s as usize];
        debug_assert!(seg.len == 0 && seg.at_max == 0 && seg.below.is_empty());
        if self.keep_ids {
            seg.ids.reserve(most);
        }
        (seg.start, seg.free_from, seg.top, seg.low) = (start as u32, 0, NONE, NONE);
        seg.parted.set(0);
        s
    }

    /// Indexes segment `s`, which holds its first block now.
    pub(super) fn index_seg(&mut self, s: u32) {
        let segs = &self.segs;
        let first = |x: u32| segs[x as usize].get(0);
        let h = first(s).expect("a segment with a block");
        self.index.make_room(first);
        let new = self.index.insert_new(h, s, first);
        debug_assert!(new, "hash {h:#x} held by a block find missed");
    }
}
