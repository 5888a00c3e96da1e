//! The KV-cache block pool of a serving instance, with vLLM's automatic prefix caching.
//!
//! The instance's KV memory is cut into fixed blocks of `block_size` tokens. A block is either
//! *in use* (running sequences hold it) or *free*. Free blocks sit in one queue, least recently
//! used at the head. With caching on, a full prompt block is *registered* under its chained
//! hash once its KV is computed; when it becomes free it keeps its hash and stays findable
//! until it is reused for something else. Allocation pops the head of the free queue and, if
//! that block was registered, *evicts* it (drops its hash). A sequence releases its blocks in
//! reverse order, so its last blocks sit nearer the head and go first: the early blocks of a
//! prompt are the ones other prompts are most likely to share. That is the whole behaviour;
//! the test module holds it written the obvious way (a queue of blocks and a map of hashes),
//! and a differential test checks every answer of this pool against it.
//!
//! **Segments, not blocks.** A SQuAD prompt is 258 blocks, and a pool that keeps a record per
//! block touches each of them at every step of a request (lookup, hit, allocation,
//! registration, release): at cluster scale, where the pools of 2,240 GPUs do not fit in the
//! caches, that would be a cache miss per block and step, and most of a run. This pool keeps
//! registered blocks in *segments* instead, and does its work per segment:
//!
//! - A segment is a run of registered blocks at consecutive chain positions, registered by
//!   sequences that each held the whole run before them: its block ids in position order,
//!   and its hashes, which are those of the chain of the sequence that registered its last
//!   block at the same positions. So a segment keeps that chain (a [`ChainHashes`], whose
//!   arrays it shares with the request and the other pools that hold them) and its length,
//!   and copies no hash: registering a block is a count. A prompt registers its blocks in
//!   order, so its new blocks extend the segment it holds the end of, or start a new one
//!   (after a block whose hash another block held, or where a held segment goes on with
//!   other hashes). Only a segment's first hash is in the hash index ([`BlockIndex`], a few
//!   entries per prompt).
//! - **Every holder of a segment holds a prefix of it.** A lookup walks a prompt's chain
//!   segment by segment: it enters a segment at its start (the index), and leaves it where
//!   the hashes part (a hash names its whole prefix, so one comparison at the far end, or a
//!   binary search, finds that place) or the segment ends. So a segment's reference counts
//!   never grow with position, and the segment only needs its holders' prefix lengths;
//!   its free blocks are the positions from the longest of them on. The longest and how
//!   many hold it live in the segment's record, the others in a list beside it (`below`),
//!   which most segments never use: the questions about one window hold its whole segment,
//!   so a release or a hit touches only the record (the list would be a cache miss of its
//!   own in every release at cluster scale).
//! - **Where prompts part.** Prompts that share only a system prompt all part from the
//!   segment that holds it (registered by the first of them) at the same place, so a
//!   segment keeps where the last lookup found its hashes parting, and the next one checks
//!   there first: two comparisons instead of a binary search, which at cluster scale reads
//!   a dozen cold lines of two chains at every admission. The place is only taken once
//!   checked, so the hint changes no answer.
//! - **The free queue holds runs.** Blocks reaching no reference in one release are appended
//!   as runs: the newly free positions of each segment the sequence held (highest first, as
//!   the release order has it) and its own unregistered blocks (ids in queue order). Within a
//!   segment, queued runs hold decreasing positions: the highest free positions are nearest
//!   the head. So an eviction takes a segment's last positions (the arrays shrink), and a hit
//!   takes the lowest free ones (the runs queued last shrink from their low end): both touch
//!   one run or a few, not a block each.
//!
//! **Ids only where KV is real.** With a backend that keeps KV by block (a live run), blocks
//! have ids: a sequence's [`Blocks`] list them in prompt order, segments and runs keep theirs,
//! and they are the ones the obvious pool hands out. A simulated backend never reads them,
//! and which free block an allocation gets is then unobservable (only which hashes stay
//! registered is), so a simulation's pool keeps no ids at all: blocks are counted. The
//! differential test runs a counting pool in lockstep with the one with ids and the obvious
//! one.
//!
//! **Memory.** A pool starts with every block free and untouched, in id order at the head of
//! the queue; nothing is ever queued ahead of an untouched block, so they are kept implicitly
//! (ids from `touched` to `num_blocks`), and a pool costs memory for its segments and runs (4
//! bytes a registered block with ids; the hash arrays its segments share are those of at
//! most one chain each), not for the KV memory of its GPU (a cluster of 2,240 GPUs has 26 M
//! blocks). Without caching, no block carries a hash or is shared, so
//! which free block an allocation gets changes nothing that can be observed: free blocks with
//! ids then sit on a stack (the most recently released taken first), and a counting pool
//! keeps only its count of free blocks.
//!
//! **Other eviction orders.** A policy may have the GPU prefix cache evict in another order
//! (`gpu_eviction`, [`GpuEviction`]): `lfu` (fewest accesses first, then least recently
//! used: SGLang's radix cache's `lfu`) or `s3-fifo` (Yang et al., SOSP 2023). Those are kept
//! block by block in an [`OrderedPool`], a pool with the same calls whose module doc says what it
//! charges and what it changes in the published algorithms; the instance holds a
//! [`GpuPool`], which is this pool under LRU (unchanged, and the default) and that one
//! otherwise. Beside the order, the ordered pool differs from this one in one respect: an
//! allocation takes free blocks that hold no hash before it evicts any registered block,
//! where this pool's queue mixes both in release order (as vLLM's does).

mod blocks;
mod check;
mod gpu_pool;
pub(crate) mod index;
mod ordered;
mod pool;
pub mod prompt_hashes;
#[cfg(test)]
mod reference;
mod register;
mod segments;
#[cfg(test)]
mod tests;

pub use blocks::Blocks;
pub use gpu_pool::{GpuEviction, GpuPool};
pub use ordered::OrderedPool;
pub use pool::BlockPool;

pub type BlockId = u32;
/// No run, segment or block.
const NONE: u32 = u32::MAX;
/// Most block ids an unused segment slot keeps room for (a SQuAD prompt is 258 blocks).
const KEEP_BLOCKS: usize = 4096;
/// Segments and runs a caching pool makes room for when it is built (8 and 8 KiB). They are
/// records aligned to cache lines, whose arrays grow by aligned allocations (each a new one,
/// a copy and a free, where glibc first merges the small free chunks it holds): at cluster
/// scale a pool ends a run with up to 64 segments and 128 runs, and growing its arrays from
/// empty to those would take about eleven such allocations a pool. A pool that needs more
/// grows.
const RESERVE_SEGS: usize = 64;
const RESERVE_RUNS: usize = 128;
/// Most block ids an unused run keeps room for (a run of a sequence's own blocks is mostly
/// its last prompt block and its decode blocks).
const KEEP_IDS: usize = 256;
