//! The ordered pool's invariants, checked against its records (see [`OrderedPool::check`]).

use super::*;

impl OrderedPool {
    /// Checks the pool's invariants (for tests and debug runs): the free counts add up; the
    /// free blocks without a hash are exactly those on the stack, each once; the index and the
    /// blocks' hashes name each other; the order holds exactly the registered blocks (LFU:
    /// the free ones, under their current keys; S3-FIFO: all, those in use hidden).
    pub fn check(&self) -> Result<(), String> {
        let mut on_stack = vec![false; self.blocks.len()];
        for &b in &self.plain {
            let blk = self.blocks.get(b as usize);
            if blk.is_none_or(|k| k.refs > 0 || k.hash.is_some()) {
                return Err(format!(
                    "block {b} is on the free stack, untouched, held or cached"
                ));
            }
            if std::mem::replace(&mut on_stack[b as usize], true) {
                return Err(format!("block {b} is on the free stack twice"));
            }
        }
        let (mut registered, mut free_cached) = (0u32, 0u32);
        for (b, blk) in self.blocks.iter().enumerate() {
            let Some(h) = blk.hash else {
                if blk.refs == 0 && !on_stack[b] {
                    return Err(format!("block {b} is free, hashless and not on the stack"));
                }
                continue;
            };
            registered += 1;
            if self.index.get(&h) != Some(&(b as BlockId)) {
                return Err(format!(
                    "block {b} holds {h:#x}, which the index does not find"
                ));
            }
            let free = blk.refs == 0;
            free_cached += u32::from(free);
            let listed = match &self.order {
                Order::Lfu(set) => set.contains(&blk.lfu_key(h)) == free,
                Order::S3Fifo(q) => q.is_hidden(h) == Some(!free),
            };
            if !listed {
                return Err(format!(
                    "block {b} ({h:#x}, {} holders) is misplaced in the eviction order",
                    blk.refs
                ));
            }
        }
        if registered as usize != self.index.len() {
            return Err(format!(
                "the index holds {} hashes, the blocks {registered}",
                self.index.len()
            ));
        }
        if free_cached != self.free_cached {
            return Err(format!(
                "{free_cached} registered blocks are free, the counter says {}",
                self.free_cached
            ));
        }
        let ordered = match &self.order {
            Order::Lfu(set) => set.len() == free_cached as usize,
            Order::S3Fifo(q) => q.len() == self.index.len(),
        };
        if !ordered {
            return Err("the eviction order holds blocks that are not candidates".into());
        }
        if self.free_blocks() > self.num_blocks {
            return Err(format!(
                "{} blocks free of {}",
                self.free_blocks(),
                self.num_blocks
            ));
        }
        Ok(())
    }
}
