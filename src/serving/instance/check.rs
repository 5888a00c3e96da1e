//! The invariants of a serving instance, checked while a run goes on ([`crate::actor::Actor::check`]).

use super::*;

impl Instance {
    /// Checks the instance's invariants: a consistent block pool, sequence counts within
    /// their limits, no waiting sequence holding blocks, and every block in use held by a
    /// running sequence.
    pub(super) fn invariants(&self) -> Result<(), String> {
        let me = |e: String| format!("instance {}: {e}", self.index);
        self.pool.check().map_err(me)?;
        if self.running.len() > self.cfg.max_num_seqs as usize {
            return Err(me(format!(
                "{} sequences running, at most {}",
                self.running.len(),
                self.cfg.max_num_seqs
            )));
        }
        // Preempted sequences go back to the queue beyond `max_waiting`, at most one per
        // running slot.
        let queued = self.waiting.len() + self.loading.len();
        if queued > (self.cfg.max_waiting + self.cfg.max_num_seqs) as usize {
            return Err(me(format!("{queued} requests queued or loading")));
        }
        if let Some(s) = self.waiting.iter().find(|s| !s.blocks.is_empty()) {
            return Err(me(format!(
                "request {} waits while holding {} blocks",
                s.req.0,
                s.blocks.len()
            )));
        }
        let held: std::collections::BTreeSet<BlockId> = self
            .running
            .iter()
            .flat_map(|s| s.blocks.iter().copied())
            .collect();
        let in_use = self.pool.num_blocks() - self.pool.free_blocks();
        if held.len() != in_use as usize {
            return Err(me(format!(
                "running sequences hold {} distinct blocks, the pool has {in_use} in use",
                held.len()
            )));
        }
        Ok(())
    }
}
