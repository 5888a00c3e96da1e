//! Each node's remote reads of each stored tensor (PTStore's replication rule, see
//! [`super::directory`]): a row of small counters per tensor, one counter per node.
//!
//! **What is counted.** A lookup that plans to load a tensor from another node bumps the
//! reader's count of that tensor; when a count reaches `replicate_after_reads` the remote part
//! of the prefix is replicated to the reader, whose count of each replicated tensor is reset.
//! Dropping a tensor forgets every node's count of it; a node that loses its store forgets its
//! own counts. Only whether a count has reached the threshold decides anything, so a counter
//! saturates there ([`ReadCounts::bump`] returns at most the threshold): its state is one of
//! `0..=threshold`, and it takes the fewest bits of 1, 2, 4, 8, 16 or 32 that hold those.
//!
//! **Why rows.** A hash table per node (the tensor's id and its count in a 16-byte slot, at most
//! three quarters full) would hold a slot for every pair of a node and a tensor it read. At full
//! scale most tensors are read once by tens of nodes, so the tables would hold millions of counts
//! and a large part of a run's memory, and each bump would miss the cache on a probe of one of
//! hundreds of tables. A row of 2-bit counters (the threshold of 2 holds in 2 bits) is 144 bytes
//! for 560 nodes, in lines that the hot tensors share. A row lives as long as its tensor: allocated
//! when it is stored, zeroed and reused when it is dropped, so that forgetting a dropped tensor's
//! counts costs a row's words, not a probe of every node's table.
//!
//! **Bounds.** Rows in use are the tensors stored with replication on (at most the store's capacity
//! in tensors); freed rows are reused before the array grows. A row takes `nodes x bits / 8` bytes
//! whatever the reads: 144 bytes at 560 nodes and the default threshold, 16 KiB at the scenario's
//! limit of 65,536 nodes. Where few nodes read each tensor of a very large cluster, per-node tables
//! of the pairs actually read (about 26 bytes a pair) would take less; at the tens of readers a
//! tensor of a full-scale run the rows take about a tenth of that.

/// No row: a tensor stored while replication is off.
pub const NO_ROW: u32 = u32::MAX;

/// Counters of remote reads, a row per tensor and a counter per node (see the module doc).
#[derive(Clone, Debug)]
pub struct ReadCounts {
    nodes: u32,
    /// Where a counter saturates: the replication threshold (at least 1).
    cap: u32,
    /// Bits a counter takes: 1, 2, 4, 8, 16 or 32 (so none straddles two words).
    bits: u32,
    /// Words a row.
    stride: usize,
    words: Vec<u64>,
    /// Freed rows (all zero), the last freed on top.
    free: Vec<u32>,
}

impl ReadCounts {
    /// Counters for `nodes` nodes that saturate at `cap` (a threshold of 0 counts as 1: a
    /// first read reaches it).
    pub fn new(nodes: u32, cap: u32) -> ReadCounts {
        let cap = cap.max(1);
        // The fewest bits of a power of two that hold 0..=cap.
        let need = 32 - cap.leading_zeros();
        let bits = need.next_power_of_two();
        let stride = (nodes as usize * bits as usize).div_ceil(64).max(1);
        ReadCounts {
            nodes,
            cap,
            bits,
            stride,
            words: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Rows in use.
    pub fn rows(&self) -> usize {
        self.words.len() / self.stride - self.free.len()
    }

    /// A row of zero counts.
    ///
    /// # Panics
    /// If more than `u32::MAX - 1` rows are in use.
    pub fn alloc(&mut self) -> u32 {
        if let Some(row) = self.free.pop() {
            return row;
        }
        let row = self.words.len() / self.stride;
        assert!(
            row < NO_ROW as usize,
            "fewer than 2^32 - 1 rows of read counts"
        );
        self.words.resize(self.words.len() + self.stride, 0);
        row as u32
    }

    /// Forgets every count of `row` and frees it.
    pub fn release(&mut self, row: u32) {
        let at = row as usize * self.stride;
        self.words[at..at + self.stride].fill(0);
        self.free.push(row);
    }

    /// The word and shift of `node`'s counter in `row`.
    fn place(&self, row: u32, node: u32) -> (usize, u32) {
        debug_assert!(node < self.nodes, "node {node} of {}", self.nodes);
        let bit = node as usize * self.bits as usize;
        (row as usize * self.stride + bit / 64, (bit % 64) as u32)
    }

    fn mask(&self) -> u64 {
        (1 << self.bits) - 1
    }

    /// `node`'s count in `row`.
    pub fn get(&self, row: u32, node: u32) -> u32 {
        let (w, s) = self.place(row, node);
        ((self.words[w] >> s) & self.mask()) as u32
    }

    /// Adds one to `node`'s count in `row`, up to the threshold; returns the new count.
    pub fn bump(&mut self, row: u32, node: u32) -> u32 {
        let (w, s) = self.place(row, node);
        let mask = self.mask();
        let c = ((self.words[w] >> s) & mask) as u32;
        let new = c.saturating_add(1).min(self.cap);
        self.words[w] = (self.words[w] & !(mask << s)) | (u64::from(new) << s);
        new
    }

    /// Forgets `node`'s count in `row`.
    pub fn reset(&mut self, row: u32, node: u32) {
        let (w, s) = self.place(row, node);
        self.words[w] &= !(self.mask() << s);
    }

    /// Forgets `node`'s count in every row (free rows are zero already).
    pub fn clear_node(&mut self, node: u32) {
        let (w, s) = self.place(0, node);
        let keep = !(self.mask() << s);
        for row in self.words.chunks_exact_mut(self.stride) {
            row[w] &= keep;
        }
    }

    /// Whether every free row is zero and `in_use` lists the rows in use, each once (for
    /// checks; a counter above the threshold cannot be made: [`ReadCounts::bump`] saturates).
    pub fn check(&self, in_use: impl Iterator<Item = u32>) -> Result<(), String> {
        let rows = self.words.len() / self.stride;
        let mut seen = vec![false; rows];
        for &row in &self.free {
            let at = row as usize * self.stride;
            if seen[row as usize] || self.words[at..at + self.stride].iter().any(|&w| w != 0) {
                return Err(format!(
                    "free row {row} of read counts holds counts or is freed twice"
                ));
            }
            seen[row as usize] = true;
        }
        for row in in_use {
            if row as usize >= rows || seen[row as usize] {
                return Err(format!("read-count row {row} is free, shared or missing"));
            }
            seen[row as usize] = true;
        }
        if let Some(row) = seen.iter().position(|s| !s) {
            return Err(format!(
                "read-count row {row} is neither free nor a tensor's"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;
    use std::collections::HashMap;

    #[test]
    fn counters_take_the_fewest_bits_that_hold_the_threshold() {
        for (cap, bits) in [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 4),
            (15, 4),
            (16, 8),
            (255, 8),
            (256, 16),
            (65_535, 16),
            (65_536, 32),
            (u32::MAX, 32),
        ] {
            assert_eq!(ReadCounts::new(3, cap).bits, bits, "threshold {cap}");
        }
        // 560 nodes of 2 bits: 18 words a row.
        assert_eq!(ReadCounts::new(560, 2).stride, 18);
        assert_eq!(ReadCounts::new(1, 2).stride, 1);
    }

    /// Against a map of exact counts: every bump returns the exact count held to the
    /// threshold, whatever the threshold, the number of nodes (counters across word
    /// boundaries) and the order of bumps, resets, node clears, frees and reuses.
    #[test]
    fn saturating_counts_agree_with_exact_ones_held_to_the_threshold() {
        for (nodes, cap) in [
            (1, 1),
            (7, 2),
            (33, 2),
            (70, 3),
            (5, 9),
            (3, 300),
            (2, 70_000),
        ] {
            let mut rng = Stream::new(u64::from(nodes) * 31 + u64::from(cap), 0);
            let mut c = ReadCounts::new(nodes, cap);
            let mut exact: HashMap<(u32, u32), u32> = HashMap::new();
            let mut live: Vec<u32> = Vec::new();
            for _ in 0..20_000 {
                match rng.below(10) {
                    0 if live.len() < 40 => live.push(c.alloc()),
                    1 if !live.is_empty() => {
                        let row = live.swap_remove(rng.below(live.len() as u64) as usize);
                        c.release(row);
                        exact.retain(|&(r, _), _| r != row);
                    }
                    2 if !live.is_empty() => {
                        let row = live[rng.below(live.len() as u64) as usize];
                        let node = rng.below(u64::from(nodes)) as u32;
                        c.reset(row, node);
                        exact.remove(&(row, node));
                    }
                    3 => {
                        let node = rng.below(u64::from(nodes)) as u32;
                        c.clear_node(node);
                        exact.retain(|&(_, n), _| n != node);
                    }
                    _ if !live.is_empty() => {
                        let row = live[rng.below(live.len() as u64) as usize];
                        let node = rng.below(u64::from(nodes)) as u32;
                        let e = exact.entry((row, node)).or_insert(0);
                        *e += 1;
                        assert_eq!(c.bump(row, node), (*e).min(cap.max(1)));
                    }
                    _ => {}
                }
            }
            assert_eq!(c.rows(), live.len());
            c.check(live.iter().copied()).expect("consistent");
            assert!(c.check(live.iter().copied().skip(1)).is_err() || live.is_empty());
            for &row in &live {
                for node in 0..nodes {
                    let e = exact.get(&(row, node)).copied().unwrap_or(0);
                    assert_eq!(c.get(row, node), e.min(cap.max(1)), "row {row} node {node}");
                }
            }
        }
    }

    #[test]
    fn a_freed_row_comes_back_zero_and_is_reused_first() {
        let mut c = ReadCounts::new(100, 2);
        let a = c.alloc();
        let b = c.alloc();
        for node in 0..100 {
            c.bump(a, node);
            c.bump(b, node);
        }
        c.release(a);
        c.check(std::iter::once(b)).expect("a freed row is zero");
        assert_eq!(c.alloc(), a);
        assert!((0..100).all(|n| c.get(a, n) == 0 && c.get(b, n) == 1));
        assert_eq!(c.rows(), 2);
    }
}
