//! Buffers that finished requests leave for the next ones ([`Spare`]).

use super::*;

/// Most buffers an instance keeps for reuse. An instance admits a few requests between two
/// that finish, so a few cover them; the bound keeps what waits small.
pub(super) const MAX_SPARE: usize = 4;

/// Buffers that finished requests leave for the next ones: a new request's block list and
/// cold record reuse one instead of allocating, and the memory they land in is likely still
/// in the cache (at cluster scale, a fresh allocation is a cold one, and its free at the end
/// of the request another miss). (A request's hashes are shared arrays, see
/// [`crate::serving::kv::prompt_hashes`]: nothing to reuse.)
#[derive(Debug, Default)]
pub(super) struct Spare {
    pub(super) blocks: Vec<Blocks>,
    /// Kept records, `colds[..n_colds]`, boxed as the sequences hold them: a kept record goes back
    /// to a sequence as it is. In place, not in a list of their own: [`Spare::hint`] reads the
    /// pointer of the one it asks for, and in a list's buffer that read would be a cache miss of
    /// its own at every submission at cluster scale, where the instance's own lines are asked for
    /// before its event.
    pub(super) colds: [Option<Box<Cold>>; MAX_SPARE],
    pub(super) n_colds: usize,
}

impl Spare {
    /// Keeps the buffers of `seq`, which finished and released its blocks. A real backend's
    /// block list keeps its capacity for the request's most blocks and is not kept.
    pub(super) fn keep(&mut self, mut seq: Seq, real: bool) {
        if !real && self.blocks.len() < MAX_SPARE && seq.blocks.is_empty() {
            self.blocks.push(std::mem::take(&mut seq.blocks));
        }
        if self.n_colds < MAX_SPARE {
            // Its hashes go now, as they did with the request (the arrays are shared).
            seq.cold.hashes = ChainHashes::default();
            self.colds[self.n_colds] = Some(seq.cold);
            self.n_colds += 1;
        }
    }

    /// A cold record as new (`Cold::default()`), reusing a kept one's lists.
    pub(super) fn cold(&mut self) -> Box<Cold> {
        let Some(mut c) = self.n_colds.checked_sub(1).and_then(|i| {
            self.n_colds = i;
            self.colds[i].take()
        }) else {
            return Box::default();
        };
        let (mut chain, mut replicate, mut out) = (
            std::mem::take(&mut c.chain),
            std::mem::take(&mut c.replicate),
            std::mem::take(&mut c.out),
        );
        chain.clear();
        replicate.clear();
        out.clear();
        *c = Cold {
            chain,
            replicate,
            out,
            ..Cold::default()
        };
        c
    }
}
