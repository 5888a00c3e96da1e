//! The invariants of a serving instance, checked while a run goes on
//! ([`crate::actor::Actor::check`]).

use super::*;

impl Instance {
    /// Checks the instance's invariants: a consistent block pool, sequence counts within
    /// their limits, no waiting sequence holding blocks or loading, every parked sequence
    /// loading, loads in flight only in parked sequences or in members of the iteration in
    /// flight, and every block in use held by a running or parked sequence.
    pub(super) fn invariants(&self) -> Result<(), String> {
        let me = |e: String| format!("instance {}: {e}", self.index);
        self.pool.check().map_err(me)?;
        let admitted = self.running.len() + self.parked.len();
        if admitted > self.cfg.max_num_seqs as usize {
            return Err(me(format!(
                "{} sequences running and {} parked, at most {} in all",
                self.running.len(),
                self.parked.len(),
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
        let started = |s: &Seq| s.load.as_deref().is_some_and(|l| l.started.is_some());
        let in_flight = |s: &Seq| s.load.as_deref().is_some_and(Load::in_flight);
        if let Some(s) = self
            .waiting
            .iter()
            .chain(&self.loading)
            .find(|s| started(s))
        {
            return Err(me(format!("request {} loads while queued", s.req.0)));
        }
        if let Some(s) = self.parked.iter().find(|s| !in_flight(s)) {
            return Err(me(format!("request {} is parked but not loading", s.req.0)));
        }
        let busy = self.busy_since.is_some();
        if let Some(s) = self
            .running
            .iter()
            .find(|s| in_flight(s) && !(busy && s.scheduled > 0))
        {
            return Err(me(format!(
                "request {} runs with a load in flight outside the iteration in flight",
                s.req.0
            )));
        }
        if busy
            && matches!(self.phase, Phase::Loads(_))
            && !self.running.iter().any(|s| in_flight(s) && s.scheduled > 0)
        {
            return Err(me(
                "the iteration waits for loads that are not in flight".into()
            ));
        }
        let admitted = || self.running.iter().chain(&self.parked);
        let in_use = self.pool.num_blocks() - self.pool.free_blocks();
        let held = if self.real {
            // Blocks with ids: the distinct ones.
            let ids: std::collections::BTreeSet<crate::serving::kv::BlockId> = admitted()
                .flat_map(|s| s.blocks.ids().iter().copied())
                .collect();
            ids.len() as u64
        } else {
            // Counted blocks: each sequence's own, and the registered ones in use.
            let own: u64 = admitted().map(|s| u64::from(s.blocks.own())).sum();
            own + u64::from(self.pool.held_registered())
        };
        if held != u64::from(in_use) {
            return Err(me(format!(
                "running and parked sequences hold {held} blocks, the pool has {in_use} in use"
            )));
        }
        Ok(())
    }
}
