//! A sequence's KV blocks ([`Blocks`]): how many, their ids, and the segment pieces they
//! hold.

use super::BlockId;

/// A sequence's KV blocks: how many, their ids in prompt order (if the pool keeps ids), and
/// which of them are registered in segments (the rest are its own, unregistered). Only the
/// pool changes it.
///
/// `repr(C)` with the count first: an iteration reads a sequence's block count, and the
/// instance keeps that in the sequence's first cache line. The pieces are in place while
/// they are at most [`INLINE_PIECES`] (nearly every SQuAD sequence holds two: the segment of
/// its system prompt and one of its own), so that a release, which reads them, finds them in
/// the sequence's record: kept in an array of their own, they would be a cache miss at every
/// release at cluster scale, where the pools do not fit in the caches.
#[derive(Debug, Default)]
#[repr(C)]
pub struct Blocks {
    pub(super) n: u32,
    /// How many pieces it holds: in `inline` up to [`INLINE_PIECES`], else all in `more`.
    pub(super) pieces_len: u32,
    pub(super) ids: Vec<BlockId>,
    /// In prompt order: `ids[at..at + n]` are positions `0..n` of segment `seg`.
    pub(super) inline: [Piece; INLINE_PIECES],
    pub(super) more: Vec<Piece>,
}

/// Most segment pieces a sequence's [`Blocks`] keeps in place.
const INLINE_PIECES: usize = 2;

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Piece {
    pub(super) seg: u32,
    pub(super) at: u32,
    pub(super) n: u32,
}

impl Blocks {
    pub fn len(&self) -> usize {
        self.n as usize
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Its segment pieces, in prompt order.
    pub(super) fn pieces(&self) -> &[Piece] {
        let n = self.pieces_len as usize;
        if n <= INLINE_PIECES {
            &self.inline[..n]
        } else {
            &self.more
        }
    }

    /// Its last segment piece, if any.
    pub(super) fn last_piece_mut(&mut self) -> Option<&mut Piece> {
        let n = self.pieces_len as usize;
        if n <= INLINE_PIECES {
            self.inline[..n].last_mut()
        } else {
            self.more.last_mut()
        }
    }

    /// Appends a segment piece (past the last).
    pub(super) fn push_piece(&mut self, p: Piece) {
        let n = self.pieces_len as usize;
        if n < INLINE_PIECES {
            self.inline[n] = p;
        } else {
            if n == INLINE_PIECES {
                // Empty while the pieces are in place (`clear_pieces` empties it).
                debug_assert!(self.more.is_empty());
                self.more.extend_from_slice(&self.inline);
            }
            self.more.push(p);
        }
        self.pieces_len += 1;
    }

    pub(super) fn clear_pieces(&mut self) {
        self.pieces_len = 0;
        self.more.clear();
    }

    /// Their ids, in prompt order: empty unless the pool keeps ids.
    pub fn ids(&self) -> &[BlockId] {
        &self.ids
    }

    /// Blocks of its own, not in segments (unregistered).
    pub fn own(&self) -> u32 {
        self.n - self.pieces().iter().map(|p| p.n).sum::<u32>()
    }

    pub fn capacity(&self) -> usize {
        self.ids.capacity()
    }

    /// Room for `n` more block ids, once.
    pub fn reserve_exact(&mut self, n: usize) {
        self.ids.reserve_exact(n);
    }

    /// Where its segment pieces end: blocks from here on are its own and unregistered.
    pub(super) fn registered_end(&self) -> usize {
        self.pieces().last().map_or(0, |p| (p.at + p.n) as usize)
    }
}
