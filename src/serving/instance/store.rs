//! The store path of an instance (see the module doc of [`super`]): lookup replies, loads,
//! and loads abandoned when a store loses its tensors.

use super::*;

impl Instance {
    /// The metadata service answered: start every load group at once.
    pub(super) fn lookup_reply(
        &mut self,
        req: ReqId,
        plan: LoadPlan,
        losses: u32,
        ctx: &mut dyn Context<Msg>,
    ) {
        let (Some(st), Some(l)) = (self.store.as_ref(), self.loading.get_mut(&req)) else {
            let me = format!("instance {}", self.index);
            let what = format!("a lookup reply for request {} that is not loading", req.0);
            unexpected(&mut self.violations, &me, &what);
            return;
        };
        l.seq.stored_chunks = plan.stored_chunks;
        // Planned before a store loss this instance knows of: the plan may name lost tensors.
        if losses < self.losses {
            if let Some(Loading { seq, .. }) = self.loading.remove(&req) {
                self.enqueue(Self::without_load(seq), ctx);
            }
            return;
        }
        if plan.groups.is_empty() {
            if let Some(l) = self.loading.remove(&req) {
                self.enqueue(l.seq, ctx);
            }
            return;
        }
        l.pending = Some(plan.groups.len() as u32);
        l.sources = plan.groups.iter().map(|g| g.node).collect();
        l.seq.load_end = plan.stored_chunks * st.tensor_tokens;
        l.seq.replicate = plan.replicate;
        for g in &plan.groups {
            l.seq.planned[g.tier as usize] += g.tensors * st.tensor_tokens;
            l.seq.loaded_bytes[g.tier as usize] += g.bytes;
            let medium = match g.location {
                Location::Host => Medium::Memory,
                Location::Ssd => Medium::Ssd,
            };
            ctx.start(
                Work::Fetch {
                    from: Place::Host { node: g.node },
                    medium,
                    bytes: g.bytes,
                    segments: g.segments,
                },
                Msg::Loaded(req),
            );
        }
    }

    /// One load group arrived; when all have, the request joins the queue.
    pub(super) fn loaded(&mut self, req: ReqId, ctx: &mut dyn Context<Msg>) {
        if !self.loading.contains_key(&req)
            && let Some(n) = self.stale_loads.get_mut(&req)
        {
            // A group of a load abandoned after a store loss.
            *n -= 1;
            if *n == 0 {
                self.stale_loads.remove(&req);
            }
            return;
        }
        let pending = self.loading.get_mut(&req).and_then(|l| l.pending.as_mut());
        let (Some(pending), Some(st)) = (pending, self.store.as_ref()) else {
            let me = format!("instance {}", self.index);
            let what = format!("a load for request {} that is not loading", req.0);
            unexpected(&mut self.violations, &me, &what);
            return;
        };
        *pending = pending.saturating_sub(1);
        if *pending > 0 {
            return;
        }
        let Some(Loading { mut seq, .. }) = self.loading.remove(&req) else {
            return;
        };
        if !seq.replicate.is_empty() {
            let ids = std::mem::take(&mut seq.replicate);
            let bytes = ids.len() as u64 * st.tensor_bytes;
            ctx.send(
                st.servers[st.node as usize],
                Msg::StoreWrite {
                    chain: Box::new(ids),
                    replica: true,
                },
                bytes,
            );
        }
        self.enqueue(seq, ctx);
    }

    /// `seq` as if the store had held nothing beyond what the GPU cache holds: its prompt is
    /// computed (and stored again after its prefill).
    pub(super) fn without_load(mut seq: Seq) -> Seq {
        seq.load_end = seq.load_start;
        seq.planned = [0; Tier::ALL.len()];
        seq.loaded_bytes = [0; Tier::ALL.len()];
        seq.replicate.clear();
        seq.stored_chunks = 0;
        seq
    }

    /// The store of `node` lost its tensors: loads from it are abandoned (their requests
    /// recompute those tokens), and their groups still in flight are ignored when they come.
    pub(super) fn store_lost(&mut self, node: u32, ctx: &mut dyn Context<Msg>) {
        self.losses += 1;
        let hit: Vec<ReqId> = self
            .loading
            .iter()
            .filter(|(_, l)| l.pending.is_some() && l.sources.contains(&node))
            .map(|(&r, _)| r)
            .collect();
        for req in hit {
            let Some(l) = self.loading.remove(&req) else {
                continue;
            };
            let pending = l.pending.unwrap_or(0);
            if pending > 0 {
                *self.stale_loads.entry(req).or_insert(0) += pending;
            }
            self.enqueue(Self::without_load(l.seq), ctx);
        }
    }
}
