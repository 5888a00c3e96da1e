//! The store path of an instance (see the module doc of [`super`]): lookup replies, the
//! loads started at admission, the end of an iteration that waits for layer-wise loads, and
//! loads abandoned when a store loses its tensors.

use super::*;

impl Instance {
    /// The metadata service answered: the request joins the queue with its plan, which
    /// starts when the request is admitted.
    pub(super) fn lookup_reply(
        &mut self,
        req: ReqId,
        plan: LoadPlan,
        losses: u32,
        ctx: &mut dyn Context<Msg>,
    ) {
        let (Some(st), Some(mut seq)) = (self.store.as_ref(), take_loading(&mut self.loading, req))
        else {
            let me = format!("instance {}", self.index);
            let what = format!("a lookup reply for request {} that is not loading", req.0);
            unexpected(&mut self.violations, &me, &what);
            return;
        };
        seq.cold.stored_chunks = plan.stored_chunks;
        // Planned before a store loss this instance knows of: the plan may name lost tensors.
        if losses < self.losses {
            Self::without_load(&mut seq);
            self.enqueue(seq, ctx);
            return;
        }
        let mut plan = plan;
        let mut load_end = plan.stored_chunks * st.tensor_tokens;
        if st.load == LoadChoice::WhenFaster && !plan.groups.is_empty() {
            let skip = seq.cold.load_start / st.tensor_tokens;
            let keep = self.tensors_worth_loading(&seq, &plan, skip, &*ctx);
            trim_plan(&mut plan, &seq.cold.chain, skip, keep, st.tensor_bytes);
            load_end = (skip + keep) * st.tensor_tokens;
        }
        if !plan.groups.is_empty() {
            seq.cold.load_end = load_end;
            seq.cold.replicate = plan.replicate;
            for g in &plan.groups {
                seq.cold.planned[g.tier as usize] += g.tensors * st.tensor_tokens;
                seq.cold.loaded_bytes[g.tier as usize] += g.bytes;
            }
            seq.load = Some(Box::new(Load {
                groups: plan.groups,
                pending: 0,
                started: None,
                arrived: None,
            }));
        }
        self.enqueue(seq, ctx);
    }

    /// Under `load = "when-faster"`: how many of `plan`'s tensors (chain positions `skip`
    /// on, in order) to load, the rest being recomputed, by the estimated time to the
    /// request's first token (see the module doc of [`super`], "Load or recompute"). All of
    /// them where the host or the backend cannot estimate.
    fn tensors_worth_loading(
        &self,
        seq: &Seq,
        plan: &LoadPlan,
        skip: u32,
        ctx: &dyn Context<Msg>,
    ) -> u32 {
        let Some(st) = &self.store else {
            return 0;
        };
        let (tt, prompt) = (st.tensor_tokens, seq.prompt_len);
        // The group that serves each planned position, in chain order.
        let mut owner = vec![usize::MAX; plan.groups.iter().map(|g| g.tensors as usize).sum()];
        for (gi, g) in plan.groups.iter().enumerate() {
            for &k in &g.indices {
                if let Some(o) = owner.get_mut((k - skip) as usize) {
                    *o = gi;
                }
            }
        }
        let n = owner.len() as u32;
        let budget = self.cfg.max_batched_tokens.max(1);
        // Prefilling from token `from` to the end of the prompt, in chunks of the budget.
        let compute = |from: u32| -> Option<Nanos> {
            let mut t = Nanos::ZERO;
            let mut c = from.min(prompt.saturating_sub(1));
            while c < prompt {
                let k = budget.min(prompt - c);
                let mut shape = crate::model::cost::BatchShape::default();
                shape.add(k as u64, c as u64, c + k == prompt);
                t += self.backend.estimate(&shape)?;
                c += k;
            }
            Some(t)
        };
        // The groups' loads, trimmed to the first `k` positions, run side by side.
        let load = |k: u32| -> Option<Nanos> {
            let mut longest = Nanos::ZERO;
            for (gi, g) in plan.groups.iter().enumerate() {
                let kept = owner[..k as usize].iter().filter(|&&o| o == gi).count() as u32;
                if kept == 0 {
                    continue;
                }
                let work = Work::Fetch {
                    from: Place::Host { node: g.node },
                    medium: match g.location {
                        Location::Host => Medium::Memory,
                        Location::Ssd => Medium::Ssd,
                    },
                    bytes: kept as u64 * st.tensor_bytes,
                    segments: trimmed_segments(g, kept),
                    epoch: g.epoch,
                    staging: st.staging,
                };
                longest = longest.max(ctx.estimate(&work)?);
            }
            Some(longest)
        };
        let layerwise = st.overlap == LoadOverlap::Layerwise;
        // The load of the first `k` tensors and the prefill of the rest.
        let parts = |k: u32| Some((load(k)?, compute((skip + k) * tt)?));
        let first_token = |k: u32| {
            let (l, c) = parts(k)?;
            Some(if layerwise { l.max(c) } else { l + c })
        };
        // Candidates: nothing, everything, and every place where the source changes. Within
        // a run of one source the load grows linearly and the prefill left shrinks concavely,
        // so their sum is least at an end of the run; their maximum (layer-wise) is least
        // where they cross, found by bisection.
        let mut candidates = vec![0, n];
        let mut start = 0;
        for i in 1..=n {
            if i == n || owner[i as usize] != owner[start as usize] {
                candidates.push(i);
                if layerwise {
                    // Bounded: halves [lo, hi] each round.
                    let (mut lo, mut hi) = (start, i);
                    while lo < hi {
                        let mid = lo + (hi - lo) / 2;
                        match parts(mid) {
                            Some((l, c)) if l >= c => hi = mid,
                            Some(_) => lo = mid + 1,
                            None => return n,
                        }
                    }
                    candidates.push(lo);
                    candidates.push(lo.saturating_sub(1).max(start));
                }
                start = i;
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        let mut best = (Nanos(u64::MAX), n);
        for k in candidates {
            let Some(t) = first_token(k) else {
                return n;
            };
            // Ties load more: the store's answer stands unless recomputing is faster.
            if t <= best.0 {
                best = (t, k);
            }
        }
        best.1
    }

    /// Starts every group of `seq`'s load at once (at its admission, its blocks allocated).
    /// A real backend reads the K/V of each group into the blocks now, for the positions in
    /// `within` (beyond the GPU cache's hits, before the last prompt token); a group whose
    /// bytes are not in the store fails (its tokens are recomputed, as after a lost source).
    pub(super) fn start_load(
        &mut self,
        seq: &mut Seq,
        within: std::ops::Range<u32>,
        ctx: &mut dyn Context<Msg>,
    ) {
        let Some(load) = seq.load.as_mut() else {
            return;
        };
        load.pending = load.groups.len() as u32;
        load.started = Some(ctx.now());
        let tt = self.store.as_ref().map_or(0, |st| st.tensor_tokens);
        for g in &load.groups {
            let medium = match g.location {
                Location::Host => Medium::Memory,
                Location::Ssd => Medium::Ssd,
            };
            let mut failed = false;
            if self.real {
                let items: Vec<LoadItem> = g
                    .indices
                    .iter()
                    .map(|&k| LoadItem {
                        node: g.node,
                        ssd: g.location == Location::Ssd,
                        id: seq.cold.chain[k as usize],
                        start: k * tt,
                    })
                    .collect();
                if let Err(e) = self
                    .backend
                    .load(seq.blocks.ids(), &items, tt, within.clone())
                {
                    tracing::debug!(instance = self.index, req = seq.req.0, "load failed: {e}");
                    failed = true;
                }
            }
            let work = Work::Fetch {
                from: Place::Host { node: g.node },
                medium,
                bytes: g.bytes,
                segments: g.segments,
                epoch: g.epoch,
                staging: self
                    .store
                    .as_ref()
                    .map_or(Default::default(), |st| st.staging),
            };
            if failed {
                ctx.start(work, Msg::LoadFailed(seq.req));
            } else {
                ctx.start_fetch(work, Msg::Loaded(seq.req), Msg::LoadFailed(seq.req));
            }
        }
    }

    /// The iteration's compute ended at `compute_end`: finish it, or wait for the layer-wise
    /// loads of its members (see the module doc).
    pub(super) fn compute_done(&mut self, compute_end: Nanos, ctx: &mut dyn Context<Msg>) {
        let Some(t0) = self.busy_since else {
            return;
        };
        let members = || self.running.iter().filter(|s| s.scheduled > 0);
        // Only layer-wise loads overlap an iteration: without them no member has a load (a
        // parked request joins the batch once loaded), and the scans below change nothing.
        let layerwise = self
            .store
            .as_ref()
            .is_some_and(|st| st.overlap == LoadOverlap::Layerwise);
        if !layerwise {
            debug_assert!(!members().any(|s| s.load.is_some()));
            self.finish_iteration(ctx);
            return;
        }
        if members().any(|s| s.load.as_deref().is_some_and(Load::in_flight)) {
            self.phase = Phase::Loads(compute_end);
            return;
        }
        // The compute as it ran (a slowed GPU stretches it), spread evenly over the layers.
        let d = (compute_end - t0).0;
        let layers = self.store.as_ref().map_or(1, |st| st.layers.max(1)) as u64;
        let mut end = compute_end;
        for seq in members() {
            if let Some(&Load {
                started: Some(s),
                arrived: Some(a),
                ..
            }) = seq.load.as_deref()
            {
                let t = (a - s).0;
                end = end
                    .max(s + Nanos(t / layers + d))
                    .max(a + Nanos(d / layers));
            }
        }
        let now = ctx.now();
        if end > now {
            self.phase = Phase::Tail;
            ctx.start(Work::Compute(end - now), Msg::WorkDone);
        } else {
            self.finish_iteration(ctx);
        }
    }

    /// A group of a load abandoned after a store loss or a preemption ended (a request has at
    /// most one load, so no live load of `req` is in flight): true if `req` had one.
    fn stale_load_ended(&mut self, req: ReqId) -> bool {
        let Some(n) = self.stale_loads.get_mut(&req) else {
            return false;
        };
        *n -= 1;
        if *n == 0 {
            self.stale_loads.remove(&req);
        }
        true
    }

    /// One load group failed: its source lost the memory it read (a crash or a store restart
    /// that this instance may not know of yet). The request's load is lost as in
    /// [`Self::store_lost`]: a parked request releases its blocks and goes back to the head of
    /// the queue, a running one is preempted; its other groups are ignored when they end.
    pub(super) fn load_failed(&mut self, req: ReqId, ctx: &mut dyn Context<Msg>) {
        if self.stale_load_ended(req) {
            return;
        }
        self.failed_loads += 1;
        let in_flight = |s: &Seq| s.req == req && s.load.as_deref().is_some_and(Load::in_flight);
        if let Some(i) = self.parked.iter().position(in_flight) {
            let mut seq = self.parked.remove(i);
            if let Some(l) = seq.load.as_mut() {
                l.pending -= 1;
            }
            self.lose_load(&mut seq);
            self.release_blocks(&mut seq);
            self.waiting.push_front(seq);
        } else if let Some(i) = self.running.position(in_flight) {
            let mut seq = self.running.remove(i);
            if let Some(l) = seq.load.as_mut() {
                l.pending -= 1;
            }
            self.lose_load(&mut seq);
            self.preempt(seq);
        } else {
            let me = format!("instance {}", self.index);
            let what = format!("a failed load for request {} that is not loading", req.0);
            unexpected(&mut self.violations, &me, &what);
            return;
        }
        match (self.busy_since, self.phase) {
            (None, _) => self.step(ctx),
            (Some(_), Phase::Loads(compute_end)) => self.compute_done(compute_end, ctx),
            _ => {}
        }
    }

    /// One load group arrived. When all have: a parked request joins the running batch; a
    /// layer-wise one lets its iteration finish if that iteration waits only for it.
    pub(super) fn loaded(&mut self, req: ReqId, ctx: &mut dyn Context<Msg>) {
        if self.stale_load_ended(req) {
            return;
        }
        let in_flight = |s: &Seq| s.req == req && s.load.as_deref().is_some_and(Load::in_flight);
        let parked = self.parked.iter().position(in_flight);
        let seq = match parked {
            Some(i) => self.parked.get_mut(i),
            None => self
                .running
                .position(in_flight)
                .map(|i| &mut self.running[i]),
        };
        let (Some(seq), Some(st)) = (seq, self.store.as_ref()) else {
            let me = format!("instance {}", self.index);
            let what = format!("a load for request {} that is not loading", req.0);
            unexpected(&mut self.violations, &me, &what);
            return;
        };
        let Some(load) = seq.load.as_mut() else {
            return;
        };
        load.pending -= 1;
        if load.pending > 0 {
            return;
        }
        load.arrived = Some(ctx.now());
        if !seq.cold.replicate.is_empty() {
            let mut ids = std::mem::take(&mut seq.cold.replicate);
            let mut data = None;
            if self.real {
                // The K/V of what it loaded, from its blocks: only tensors that lie wholly
                // within the tokens it holds (not the one with the last prompt token).
                let held = seq.computed.max(seq.cold.load_end.min(seq.prompt_len - 1));
                let held = held - held % st.tensor_tokens;
                let at = |id: &u64| seq.cold.chain.iter().position(|c| c == id);
                ids.retain(|id| at(id).is_some_and(|k| (k as u32 + 1) * st.tensor_tokens <= held));
                let tensors: Vec<(u64, u32)> = ids
                    .iter()
                    .filter_map(|id| at(id).map(|k| (*id, k as u32 * st.tensor_tokens)))
                    .collect();
                match self
                    .backend
                    .export(seq.blocks.ids(), &tensors, st.tensor_tokens)
                {
                    Ok(d) => data = Some(Box::new(d)),
                    Err(e) => {
                        self.violations.push(format!(
                            "instance {}: request {}: replica write: {e}",
                            self.index, req.0
                        ));
                        ids.clear();
                    }
                }
            }
            if !ids.is_empty() {
                let bytes = ids.len() as u64 * st.tensor_bytes;
                ctx.send(
                    st.servers[st.node as usize],
                    Msg::StoreWrite {
                        chain: Box::new(ids),
                        replica: true,
                        data,
                    },
                    bytes,
                );
            }
        }
        if let Some(i) = parked {
            // Its loaded tokens are in its blocks: it runs from the next iteration on, as
            // the most recently admitted sequence.
            let mut seq = self.parked.remove(i);
            seq.load = None;
            self.running.push(seq);
            if self.busy_since.is_none() {
                self.step(ctx);
            }
        } else if let Phase::Loads(compute_end) = self.phase {
            self.compute_done(compute_end, ctx);
        }
    }

    /// `seq` as if the store had held nothing beyond what the GPU cache holds: its prompt is
    /// computed (and stored again after its prefill). Its load must not be in flight.
    pub(super) fn without_load(seq: &mut Seq) {
        seq.cold.load_end = seq.cold.load_start;
        seq.cold.planned = [0; Tier::ALL.len()];
        seq.cold.loaded_bytes = [0; Tier::ALL.len()];
        seq.cold.replicate.clear();
        seq.cold.stored_chunks = 0;
        seq.load = None;
    }

    /// Drops `seq`'s load; groups still in flight are ignored when they arrive.
    pub(super) fn abandon_load(&mut self, seq: &mut Seq) {
        if let Some(load) = seq.load.take()
            && load.in_flight()
        {
            *self.stale_loads.entry(seq.req).or_insert(0) += load.pending;
        }
    }

    /// `seq` lost the tokens it was loading: they are recomputed and no longer count as
    /// reused from the store.
    fn lose_load(&mut self, seq: &mut Seq) {
        self.abandon_load(seq);
        Self::without_load(seq);
        for tier in &Tier::ALL[1..] {
            seq.cold.reused[*tier as usize] = 0;
        }
    }

    /// The store of `node` lost its tensors: plans from it are dropped, loads from it are
    /// abandoned (their requests recompute those tokens: parked ones release their blocks and
    /// go back to the head of the queue, running ones are preempted), and their groups still
    /// in flight are ignored when they come.
    pub(super) fn store_lost(&mut self, node: u32, ctx: &mut dyn Context<Msg>) {
        self.losses += 1;
        let hit = |s: &Seq| s.load.as_deref().is_some_and(|l| l.from(node));
        for seq in self.waiting.iter_mut().filter(|s| hit(s)) {
            Self::without_load(seq);
        }
        // Newest first, each to the head of the queue: they keep their admission order.
        for i in (0..self.parked.len()).rev() {
            if !hit(&self.parked[i]) {
                continue;
            }
            let mut seq = self.parked.remove(i);
            self.lose_load(&mut seq);
            self.release_blocks(&mut seq);
            self.waiting.push_front(seq);
        }
        for i in (0..self.running.len()).rev() {
            let seq = &self.running[i];
            if !(hit(seq) && seq.load.as_deref().is_some_and(Load::in_flight)) {
                continue;
            }
            let mut seq = self.running.remove(i);
            self.lose_load(&mut seq);
            self.preempt(seq);
        }
        match (self.busy_since, self.phase) {
            (None, _) => self.step(ctx),
            (Some(_), Phase::Loads(compute_end)) => self.compute_done(compute_end, ctx),
            _ => {}
        }
    }
}

/// The request `req` waiting for its lookup, taken out of `loading`.
fn take_loading(loading: &mut Vec<Seq>, req: ReqId) -> Option<Seq> {
    let i = loading.iter().position(|s| s.req == req)?;
    Some(loading.swap_remove(i))
}

/// A group's segments when only `kept` of its tensors are loaded: in proportion, rounded up
/// (the plan does not say where in the group its segments start).
fn trimmed_segments(g: &LoadGroup, kept: u32) -> u32 {
    if kept >= g.tensors || g.tensors == 0 {
        return g.segments;
    }
    (g.segments as u64 * kept as u64)
        .div_ceil(g.tensors as u64)
        .max(1) as u32
}

/// Keeps the first `keep` tensors of `plan` (chain positions `skip` to `skip + keep`): the
/// groups shrink or go, and only their tensors are replicated.
fn trim_plan(plan: &mut LoadPlan, chain: &[u64], skip: u32, keep: u32, tensor_bytes: u64) {
    let end = skip + keep;
    for g in &mut plan.groups {
        let kept = g.indices.iter().filter(|&&k| k < end).count() as u32;
        g.segments = trimmed_segments(g, kept);
        g.indices.retain(|&k| k < end);
        g.tensors = kept;
        g.bytes = kept as u64 * tensor_bytes;
    }
    plan.groups.retain(|g| g.tensors > 0);
    let kept = &chain[(skip as usize).min(chain.len())..(end as usize).min(chain.len())];
    plan.replicate.retain(|id| kept.contains(id));
}
