//! The pool's invariants, checked against its records (see [`BlockPool::check`]).

use super::*;

/// Marks a block as seen, naming what holds it; an error if it was seen before.
type Mark<'a> = dyn FnMut(BlockId, &str) -> Result<(), String> + 'a;

impl BlockPool {
    /// Checks the pool's invariants (for tests and debug runs): the free queue (the untouched
    /// blocks, then the runs, or the stack) holds exactly the free blocks; every segment's
    /// runs are its free positions, highest first in queue order; no block is in two places
    /// and no hash is held twice; the index finds every segment by its first hash.
    pub fn check(&self) -> Result<(), String> {
        if !self.caching {
            return self.check_stack();
        }
        let mut seen = vec![false; self.touched as usize];
        let mut mark = |b: BlockId, what: &str| -> Result<(), String> {
            match seen.get_mut(b as usize) {
                Some(s) if !*s => {
                    *s = true;
                    Ok(())
                }
                _ => Err(format!("block {b} ({what}) is untouched or in two places")),
            }
        };
        let place = self.check_queue(&mut mark)?;
        self.check_segments(&place, &mut mark)?;
        Ok(())
    }

    /// The free queue: linked both ways without a cycle, its runs non-empty and naming free
    /// positions of live segments (or free blocks of their own), their blocks and the
    /// untouched ones as many as the free counter says. Returns where each run stands in it.
    fn check_queue(&self, mark: &mut Mark<'_>) -> Result<Vec<u32>, String> {
        let mut place = vec![NONE; self.runs.len()];
        let (mut free, mut k, mut prev, mut r) = (0u64, 0, NONE, self.head);
        while r != NONE {
            let Some(run) = self.runs.get(r as usize) else {
                return Err(format!("the free queue names run {r}, never made"));
            };
            if run.prev != prev {
                return Err(format!("run {r} has a broken back link"));
            }
            if std::mem::replace(&mut place[r as usize], k) != NONE {
                return Err("the free queue has a cycle".into());
            }
            if run.blocks() == 0 {
                return Err(format!("run {r} is empty"));
            }
            if run.seg == NONE {
                if self.keep_ids {
                    if run.anon.len() != run.hi as usize {
                        return Err(format!("run {r} has ids for other blocks"));
                    }
                    for &b in &run.anon[run.lo as usize..] {
                        mark(b, "free")?;
                    }
                }
            } else {
                let seg = self.segs.get(run.seg as usize).filter(|s| s.len() > 0);
                match seg {
                    Some(s) if run.lo >= s.free_from && run.hi <= s.len() && run.lo < run.hi => {}
                    _ => return Err(format!("run {r} names no free positions of a segment")),
                }
            }
            free += run.blocks() as u64;
            (k, prev, r) = (k + 1, r, run.next);
        }
        if self.tail != prev {
            return Err("the free queue's tail is not its last run".into());
        }
        if free + self.untouched() as u64 != self.free as u64 {
            return Err(format!(
                "the queue holds {free} blocks and {} untouched, the counter says {}",
                self.untouched(),
                self.free
            ));
        }
        if k as usize + self.unused_runs.len() != self.runs.len() {
            return Err("a run is neither queued nor unused".into());
        }
        Ok(place)
    }

    /// Every live segment: consistent holders and arrays, runs that cover its free positions
    /// in queue order (`place`), its blocks in no other place, its hashes held by no other
    /// segment, found by the index and counted where it starts.
    fn check_segments(&self, place: &[u32], mark: &mut Mark<'_>) -> Result<(), String> {
        let mut held = std::collections::HashMap::new();
        for (s, seg) in self.live_segs() {
            if (self.keep_ids && seg.ids.len() != seg.len as usize)
                || seg.chain.len() < (seg.start + seg.len) as usize
                || !seg.below.is_sorted()
                || seg.below.last().is_some_and(|&b| b >= seg.free_from)
                || (seg.at_max == 0) != (seg.free_from == 0)
                || seg.free_from > seg.len()
            {
                return Err(format!("segment {s} has inconsistent holders or arrays"));
            }
            // Its runs, from its highest positions down: consecutive, later in the queue.
            let (mut r, mut above, mut at) = (seg.top, NONE, seg.len());
            while r != NONE {
                let run = &self.runs[r as usize];
                if run.seg != s || run.hi != at || run.up != above {
                    return Err(format!("segment {s}'s runs do not cover its free blocks"));
                }
                if above != NONE && place[r as usize] <= place[above as usize] {
                    return Err(format!("segment {s}'s runs are out of queue order"));
                }
                (above, at, r) = (r, run.lo, run.down);
            }
            if at != seg.free_from || seg.low != above {
                return Err(format!("segment {s}'s runs do not reach its held blocks"));
            }
            for &b in &seg.ids {
                mark(b, "registered")?;
            }
            for h in (0..seg.len).map(|p| seg.hash(p)) {
                if let Some(other) = held.insert(h, s) {
                    return Err(format!("segments {other} and {s} both hold {h:#x}"));
                }
            }
            if self.starting(seg.hash(0)) != Some(s) {
                return Err(format!("the index does not find segment {s}"));
            }
        }
        self.starts.check()?;
        let mut starts = vec![0; self.starts.counts.len()];
        for (_, seg) in self.live_segs() {
            match starts.get_mut(seg.start as usize) {
                Some(n) => *n += 1,
                None => return Err("a segment starts where no start is counted".into()),
            }
        }
        if starts != self.starts.counts {
            return Err("segment starts are miscounted".into());
        }
        if let Some(s) = self
            .unused_segs
            .iter()
            .find(|&&s| self.segs[s as usize].len() > 0)
        {
            return Err(format!("segment {s} is unused and holds blocks"));
        }
        Ok(())
    }

    /// Without caching: the stack holds distinct touched blocks, and with the untouched ones
    /// as many as the free counter says. (The instance checks that held blocks are distinct.)
    pub(super) fn check_stack(&self) -> Result<(), String> {
        if !self.segs.is_empty() || !self.runs.is_empty() || self.index.full_slots() != 0 {
            return Err("a pool without caching keeps segments".into());
        }
        if !self.keep_ids {
            return if self.free <= self.num_blocks && self.stack.is_empty() {
                Ok(())
            } else {
                Err(format!("{} blocks free of {}", self.free, self.num_blocks))
            };
        }
        let mut seen = vec![false; self.touched as usize];
        for &b in &self.stack {
            match seen.get_mut(b as usize) {
                Some(s) if !*s => *s = true,
                _ => return Err(format!("block {b} is free twice or was never allocated")),
            }
        }
        if self.stack.len() + self.untouched() as usize != self.free as usize {
            return Err(format!(
                "{} free blocks on the stack and {} untouched, counter says {}",
                self.stack.len(),
                self.untouched(),
                self.free
            ));
        }
        Ok(())
    }
}
