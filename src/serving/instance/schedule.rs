//! An instance's iterations: planning the next one (running sequences first, then
//! admission, with preemption when blocks run out; see the module doc of [`super`]),
//! starting it on the backend, and applying its results when it ends.

use super::*;

impl Instance {
    /// Plans and starts the next iteration, if there is anything to compute.
    pub(super) fn step(&mut self, ctx: &mut dyn Context<Msg>) {
        debug_assert!(self.busy_since.is_none());
        let mut budget = self.cfg.max_batched_tokens;
        let mut shape = BatchShape::default();
        let preempted = if self.lockstep_step(&mut budget, &mut shape) {
            false
        } else {
            self.running.materialize_all();
            self.schedule_each(&mut budget, &mut shape)
        };
        if !preempted {
            self.admit(&mut budget, &mut shape, ctx);
        }
        // The step's KV events (the last iteration's registrations, this plan's evictions)
        // leave with it, as vLLM's scheduler publishes those it took from its pool.
        self.publish_kv(ctx);
        if shape.is_empty() {
            return;
        }
        self.stats.iterations += 1;
        self.busy_since = Some(ctx.now());
        self.phase = Phase::Compute;
        let ran = if self.real {
            self.run_members(&shape)
        } else {
            self.backend.iteration(&shape, &mut [])
        };
        let duration = match ran {
            Ok(d) => d,
            Err(e) => {
                // The iteration still ends (at once), so the instance never stalls; the run
                // ends with this violation.
                self.violations
                    .push(format!("instance {}: iteration failed: {e}", self.index));
                Nanos::ZERO
            }
        };
        ctx.start(Work::Compute(duration), Msg::WorkDone);
    }

    /// Schedules the running sequences one by one, in admission order, as the module doc
    /// says: each takes what it has left to compute within the budget left, and needs its
    /// blocks, for which the most recently admitted are preempted. Every sequence must be
    /// active. Returns whether one was preempted.
    pub(super) fn schedule_each(&mut self, budget: &mut u32, shape: &mut BatchShape) -> bool {
        let mut preempted = false;
        let mut i = 0;
        // Bounded by the number of running sequences, which only shrinks inside the loop.
        'running: while i < self.running.len() && *budget > 0 {
            let seq = &self.running[i];
            let n = (seq.known_tokens() - seq.computed).min(*budget);
            let need = self.blocks_past(seq.computed + n, seq.blocks.len() as u32);
            while self.pool.free_blocks() < need {
                // Preempt the most recently admitted sequence; possibly this one.
                let victim = self.running.pop().expect("running is not empty");
                preempted = true;
                let was_self = self.running.len() == i;
                self.preempt(victim);
                if was_self {
                    break 'running;
                }
            }
            let seq = &mut self.running[i];
            // A decoding sequence needs a block once every `block_size` iterations: the pool
            // is called only then (a call for none changes nothing, and would be made for
            // almost every sequence at almost every iteration).
            if need > 0 {
                let ok = self.pool.allocate(need, &mut seq.blocks);
                debug_assert!(ok);
            }
            seq.scheduled = n;
            shape.add(
                n as u64,
                seq.computed as u64,
                seq.computed + n == seq.known_tokens(),
            );
            *budget -= n;
            i += 1;
        }
        preempted
    }

    /// Schedules the running sequences as [`Self::schedule_each`] would, visiting only the
    /// active ones and the steady ones that are due, if the budget holds what every sequence
    /// has left to compute and the free blocks what they need (then each takes all it has
    /// left, in admission order, nobody is preempted, and the steady ones each take their one
    /// token and need no block). Returns false, having changed nothing but made the due
    /// sequences active, where that does not hold.
    pub(super) fn lockstep_step(&mut self, budget: &mut u32, shape: &mut BatchShape) -> bool {
        let mut visit = std::mem::take(&mut self.visit);
        self.running.due_now(&mut visit);
        for &i in &visit {
            self.running.materialize(i as usize);
        }
        let (steady, steady_computed) = self.running.steady();
        let mut demand = steady;
        let mut need_all = 0u64;
        for &i in &visit {
            let seq = &self.running[i as usize];
            let n = seq.known_tokens() - seq.computed;
            demand += u64::from(n);
            need_all += u64::from(self.blocks_past(seq.known_tokens(), seq.blocks.len() as u32));
        }
        let fits = demand <= u64::from(*budget) && need_all <= u64::from(self.pool.free_blocks());
        if fits {
            for &i in &visit {
                let seq = &self.running[i as usize];
                let n = seq.known_tokens() - seq.computed;
                let need = self.blocks_past(seq.known_tokens(), seq.blocks.len() as u32);
                let seq = &mut self.running[i as usize];
                if need > 0 {
                    let ok = self.pool.allocate(need, &mut seq.blocks);
                    debug_assert!(ok);
                }
                seq.scheduled = n;
                shape.add(n as u64, seq.computed as u64, true);
            }
            shape.add_decoding(steady, steady_computed);
            *budget -= demand as u32;
        }
        self.visit = visit;
        fits
    }

    /// Runs the iteration on a real backend: its members are the running sequences with
    /// tokens scheduled; each one's sampled token waits in it until the iteration's results
    /// are applied.
    pub(super) fn run_members(
        &mut self,
        shape: &BatchShape,
    ) -> Result<Nanos, crate::backend::BackendError> {
        let mut members: Vec<Member<'_>> = self
            .running
            .iter()
            .filter(|s| s.scheduled > 0)
            .map(|s| Member {
                req: s.req,
                blocks: s.blocks.ids(),
                computed: s.computed,
                n: s.scheduled,
                generated: &s.cold.out,
                sampled: None,
            })
            .collect();
        let r = self.backend.iteration(shape, &mut members);
        let sampled: Vec<Option<Sampled>> = members.into_iter().map(|m| m.sampled).collect();
        let mut sampled = sampled.into_iter();
        for i in 0..self.running.len() {
            let seq = &mut self.running[i];
            if seq.scheduled > 0 {
                let Some(got) = sampled.next() else {
                    break;
                };
                seq.cold.pending = got;
            }
        }
        r
    }

    /// Admits waiting requests in arrival order while `max_num_seqs` allows, budget is left
    /// and their blocks are free; starts the loads of those with a store plan.
    pub(super) fn admit(
        &mut self,
        budget: &mut u32,
        shape: &mut BatchShape,
        ctx: &mut dyn Context<Msg>,
    ) {
        let overlap = self.store.as_ref().map(|st| st.overlap);
        // Bounded: every pass admits one request or stops.
        while *budget > 0 && self.running.len() + self.parked.len() < self.cfg.max_num_seqs as usize
        {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            // Reuse at most up to the last prompt token, which must be computed.
            let reusable = ((seq.known_tokens() - 1) / self.cfg.block_size) as usize;
            let (hits, hits_free) = if self.look_in_gpu {
                self.pool.longest_cached_prefix(&seq.cold.hashes, reusable)
            } else {
                (0, 0)
            };
            let gpu_tokens = hits * self.cfg.block_size;
            let aligned_max = reusable as u32 * self.cfg.block_size;
            // The plan is usable if it extends the GPU hits: it starts within them and brings
            // tokens beyond them.
            let store_usable = seq.load.is_some()
                && seq.cold.load_end.min(aligned_max) > gpu_tokens
                && gpu_tokens >= seq.cold.load_start;
            let cached = if store_usable {
                seq.cold.load_end.min(aligned_max)
            } else {
                gpu_tokens
            };
            let park = store_usable && overlap == Some(LoadOverlap::None);
            let n = if park {
                0
            } else {
                (seq.known_tokens() - cached).min(*budget)
            };
            let need = self.blocks_for(cached + n) - hits;
            if need > self.pool.free_blocks() - hits_free {
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            if self.real && seq.blocks.capacity() == 0 {
                // Once, for the most blocks it can hold (a preemption keeps the capacity): no
                // growth of the list as decoding fills blocks.
                let most = seq.prompt_len + seq.output_len - 1;
                seq.blocks.reserve_exact(self.blocks_for(most) as usize);
            }
            self.pool
                .take_cached(&seq.cold.hashes, hits as usize, &mut seq.blocks);
            let ok = self.pool.allocate(need, &mut seq.blocks);
            debug_assert!(ok);
            if seq.cold.admitted_at.is_none() {
                seq.cold.admitted_at = Some(ctx.now());
                seq.cold.reused = seq.cold.planned;
                seq.cold.reused[Tier::Gpu as usize] = gpu_tokens;
                let from_store = if store_usable { cached - gpu_tokens } else { 0 };
                let mut excess = seq.cold.planned.iter().sum::<u32>() - from_store;
                for tier in Tier::ALL[1..].iter().rev() {
                    let take = excess.min(seq.cold.reused[*tier as usize]);
                    seq.cold.reused[*tier as usize] -= take;
                    excess -= take;
                }
            }
            if store_usable {
                self.start_load(&mut seq, gpu_tokens..cached, ctx);
            } else if seq.load.is_some() {
                // Nothing to load beyond the GPU hits: the plan is not started.
                Self::without_load(&mut seq);
            }
            seq.computed = cached;
            seq.registered = hits;
            seq.scheduled = n;
            if park {
                self.parked.push(seq);
                continue;
            }
            shape.add(n as u64, cached as u64, cached + n == seq.known_tokens());
            *budget -= n;
            self.running.push(seq);
        }
    }

    /// Handles the end of a piece of compute work: the iteration's compute, or the layers
    /// that waited for layer-wise loads.
    pub(super) fn work_done(&mut self, ctx: &mut dyn Context<Msg>) {
        match (self.busy_since, self.phase) {
            (Some(_), Phase::Compute) => self.compute_done(ctx.now(), ctx),
            (Some(_), Phase::Tail) => self.finish_iteration(ctx),
            _ => {
                let me = format!("instance {}", self.index);
                unexpected(
                    &mut self.violations,
                    &me,
                    &"a work-done notice with no work in flight",
                );
            }
        }
    }

    /// Applies the results of the iteration that just ended.
    pub(super) fn finish_iteration(&mut self, ctx: &mut dyn Context<Msg>) {
        let Some(started) = self.busy_since.take() else {
            return;
        };
        self.phase = Phase::Compute;
        self.stats.busy += ctx.now() - started;
        let keep = self.policy.keep_gpu_blocks();
        let mut finished = false;
        // The steady sequences (see [`running`]) each computed one token and sampled the
        // next; none of them finished or filled a prompt block: the tick below applies that.
        // The others are visited, in admission order; finished ones are marked and leave
        // `running` at the end (keeping the admission order of the others).
        let mut visit = std::mem::take(&mut self.visit);
        self.running.due_now(&mut visit);
        for &i in &visit {
            let i = i as usize;
            let seq = &mut self.running[i];
            if seq.scheduled == 0 {
                continue;
            }
            seq.computed += seq.scheduled;
            seq.scheduled = 0;
            // A layer-wise load has been applied with the iteration it started in.
            if seq.load.is_some() {
                seq.load = None;
            }
            if keep {
                self.register_filled(i);
            }
            self.write_to_store(i, ctx);
            finished |= self.sample(i, started, ctx);
        }
        self.running.advance();
        if self.lockstep {
            for &i in &visit {
                if let Some(due) = self.steady_until(&self.running[i as usize]) {
                    self.running.make_steady(i as usize, due);
                }
            }
        }
        if finished {
            let real = self.real;
            visit.retain(|&i| self.running[i as usize].done);
            let spare = &mut self.spare;
            self.running
                .remove_each(&visit, |seq| spare.keep(seq, real));
        }
        self.visit = visit;
        self.step(ctx);
    }

    /// Registers (under a policy that keeps GPU blocks) the blocks running sequence `i`'s
    /// prompt filled beyond those registration is done with (a block filled when its last
    /// token is computed: no division, and no read of the hashes, unless one did); those past
    /// the hashes are never registered, and done with too.
    fn register_filled(&mut self, i: usize) {
        let block_size = self.cfg.block_size;
        let seq = &mut self.running[i];
        let prompt_done = seq.computed.min(seq.prompt_len);
        if u64::from(seq.registered + 1) * u64::from(block_size) <= u64::from(prompt_done) {
            let filled = prompt_done / block_size;
            let full = filled.min(seq.cold.hashes.len() as u32);
            if seq.registered < full {
                self.pool.register_all(
                    &mut seq.blocks,
                    &seq.cold.hashes,
                    full as usize,
                    seq.registered as usize,
                );
            }
            seq.registered = filled;
        }
    }

    /// Sends running sequence `i`'s prompt tensors to its node's store server once the whole
    /// prompt is computed (store policies only; with a real backend, with their K/V).
    fn write_to_store(&mut self, i: usize, ctx: &mut dyn Context<Msg>) {
        let seq = &mut self.running[i];
        let Some(st) = &self.store else {
            return;
        };
        if seq.stored || seq.computed < seq.prompt_len {
            return;
        }
        seq.stored = true;
        let new = seq.cold.chain.len() as u64
            - (seq.cold.stored_chunks as u64).min(seq.cold.chain.len() as u64);
        if new == 0 {
            return;
        }
        let data = if self.real {
            let first = seq.cold.stored_chunks as usize;
            let tensors: Vec<(u64, u32)> = (first..seq.cold.chain.len())
                .map(|k| (seq.cold.chain[k], k as u32 * st.tensor_tokens))
                .collect();
            match self
                .backend
                .export(seq.blocks.ids(), &tensors, st.tensor_tokens)
            {
                Ok(d) => Some(Box::new(d)),
                Err(e) => {
                    self.violations.push(format!(
                        "instance {}: request {}: store write: {e}",
                        self.index, seq.req.0
                    ));
                    None
                }
            }
        } else {
            None
        };
        ctx.send(
            st.servers[st.node as usize],
            Msg::StoreWrite {
                chain: Box::new(seq.cold.chain.clone()),
                replica: false,
                data,
            },
            new * st.tensor_bytes,
        );
    }

    /// Running sequence `i` samples a token if the iteration computed its last known one,
    /// and finishes after its last: its blocks go back to the pool and the router hears of
    /// it. Whether it finished.
    fn sample(&mut self, i: usize, started: Nanos, ctx: &mut dyn Context<Msg>) -> bool {
        let seq = &mut self.running[i];
        if seq.computed < seq.known_tokens() {
            return false;
        }
        // Only a real backend samples tokens.
        if self.real
            && let Some(got) = seq.cold.pending.take()
        {
            seq.cold.out.push(got.token);
            if got.logits.is_some() {
                seq.cold.first_logits = got.logits;
            }
        }
        seq.generated += 1;
        if seq.generated == 1 {
            ctx.send(self.router, Msg::FirstToken(seq.req, self.index), 4);
        }
        if seq.generated < seq.output_len {
            return false;
        }
        seq.done = true;
        self.pool.release(&mut seq.blocks);
        if self.real {
            if seq.cold.out.len() != seq.output_len as usize {
                self.violations.push(format!(
                    "instance {}: request {} generated {} of {} tokens",
                    self.index,
                    seq.req.0,
                    seq.cold.out.len(),
                    seq.output_len
                ));
            }
            let output = Output {
                req: seq.req,
                instance: self.index,
                tokens: std::mem::take(&mut seq.cold.out),
                first_logits: seq.cold.first_logits.take().unwrap_or_default(),
            };
            ctx.send(self.router, Msg::Output(Box::new(output)), 0);
        }
        ctx.send(
            self.router,
            Msg::Finished(Box::new(Completion {
                req: seq.req,
                instance: self.index,
                admitted_at: seq.cold.admitted_at.unwrap_or(started),
                reused: seq.cold.reused,
                loaded_bytes: seq.cold.loaded_bytes,
                preemptions: seq.cold.preemptions,
            })),
            4 * (seq.output_len as u64 - 1),
        );
        true
    }

    /// If `seq` (active, just applied) only decodes from now on until a tick, that tick
    /// (later than now): the first at which it needs a new block or samples its last token.
    /// It decodes if its next iteration computes its one known token, which ends the prompt
    /// (so it has nothing to register or store) and loads nothing, as every iteration after
    /// it until then.
    pub(super) fn steady_until(&self, seq: &Seq) -> Option<u64> {
        let bs = u64::from(self.cfg.block_size);
        let decodes = !seq.done
            && seq.scheduled == 0
            && seq.load.is_none()
            && seq.computed >= seq.prompt_len
            && seq.known_tokens() - seq.computed == 1
            && (seq.stored || self.store.is_none())
            && !(self.policy.keep_gpu_blocks()
                && (u64::from(seq.registered) + 1) * bs <= u64::from(seq.prompt_len));
        if !decodes {
            return None;
        }
        let now = self.running.tick();
        let room = seq.blocks.len() as u64 * bs - u64::from(seq.computed);
        let left = u64::from(seq.output_len - 1 - seq.generated);
        let due = now + room.min(left);
        (due > now).then_some(due)
    }
}
