//! What an actor's effects cost on the simulator: its [`Context`] ([`SimCtx`]) and the
//! network with the host's records of its flows ([`Net`]).

use super::*;

pub(super) struct SimCtx<'a, M> {
    pub(super) fetch_overhead: FetchOverhead,
    pub(super) kernel: &'a mut Kernel<Event<M>>,
    pub(super) net: Net<'a, M>,
    /// This actor's device.
    pub(super) device: &'a mut Device,
    pub(super) violations: &'a mut Vec<String>,
    pub(super) me: ActorId,
    /// This actor's place.
    pub(super) here: Place,
    pub(super) rng: &'a mut Stream,
}

/// The network and what the host keeps about its flows.
pub(super) struct Net<'a, M> {
    pub(super) network: &'a mut Network,
    pub(super) arrivals: &'a mut Vec<Option<OnArrival<M>>>,
    /// The place of every actor, by id.
    pub(super) places: &'a [Place],
    /// Memory losses of the run (node crashes, store restarts).
    pub(super) losses: &'a [MemoryLoss],
    /// What each message is for.
    pub(super) purpose: fn(&M) -> Purpose,
}

impl<M> Net<'_, M> {
    /// Applies `after` at `at` (now or later).
    pub(super) fn after(&mut self, kernel: &mut Kernel<Event<M>>, at: Nanos, after: After<M>) {
        match after {
            After::Deliver(to, msg) => kernel.schedule(at, to, Event::Msg(msg)),
            After::Fetched {
                to,
                done,
                failed,
                node,
                epoch,
                started,
            } => {
                let lost = read_fails(self.losses, node, epoch, started, at);
                let msg = if lost { failed } else { done };
                kernel.schedule(at, to, Event::Msg(msg));
            }
            After::Send(p) => self.send_at(kernel, at, p),
            After::Onward {
                from,
                to,
                bytes,
                extra,
                then,
            } => {
                // The first leg's flow ended now; its latency (`at - now`) is added to the
                // second leg's arrival rather than delaying its start.
                let now = kernel.now();
                let t = self.network.onward(now, from, to, bytes);
                self.on(kernel, t, *then, extra + (at - now));
            }
            After::Nothing => {}
        }
    }

    /// Sends `p`, its first byte leaving at `at`. A small message sent later is priced now
    /// (its share of the links at the time it is sent hardly depends on what happens in
    /// between); a bulk one starts its flow then.
    pub(super) fn send_at(&mut self, kernel: &mut Kernel<Event<M>>, at: Nanos, p: Pending<M>) {
        if at > kernel.now() && p.payload_bytes > MICE_BYTES {
            kernel.schedule(at, p.from, Event::Send(p));
            return;
        }
        let from = self.places[p.from.0 as usize];
        let dest = self.places[p.to.0 as usize];
        let purpose = (self.purpose)(&p.msg);
        let t = self
            .network
            .transfer(at, from, dest, p.payload_bytes, purpose);
        self.on(kernel, t, After::Deliver(p.to, p.msg), Nanos::ZERO);
    }

    /// Does `after` when transfer `t` arrives, `extra` later.
    pub(super) fn on(
        &mut self,
        kernel: &mut Kernel<Event<M>>,
        t: Transfer,
        after: After<M>,
        extra: Nanos,
    ) {
        match t {
            Transfer::At(arrival) => self.after(kernel, arrival + extra, after),
            Transfer::Flow(flow) => {
                let i = flow as usize;
                if self.arrivals.len() <= i {
                    self.arrivals.resize_with(i + 1, || None);
                }
                self.arrivals[i] = Some(OnArrival { after, extra });
                self.schedule_flows(kernel);
            }
        }
    }

    /// Schedules the finish events of the flows whose finish time changed.
    pub(super) fn schedule_flows(&mut self, kernel: &mut Kernel<Event<M>>) {
        for r in self.network.reschedules() {
            kernel.schedule(
                r.at,
                ActorId(0),
                Event::Flow {
                    flow: r.flow,
                    version: r.version,
                },
            );
        }
    }

    /// A flow's finish event: if current, the flow arrives and what waits on it happens.
    pub(super) fn finish(&mut self, kernel: &mut Kernel<Event<M>>, flow: FlowId, version: u32) {
        let now = kernel.now();
        if let Some(arrival) = self.network.finish(now, flow, version) {
            let on = self.arrivals[flow as usize].take();
            if let Some(OnArrival { after, extra }) = on {
                self.after(kernel, arrival + extra, after);
            }
        }
        self.schedule_flows(kernel);
    }
}

impl<M> Context<M> for SimCtx<'_, M> {
    fn now(&self) -> Nanos {
        self.kernel.now()
    }
    fn me(&self) -> ActorId {
        self.me
    }
    fn send(&mut self, to: ActorId, msg: M, payload_bytes: u64) {
        let now = self.kernel.now();
        let p = Pending {
            from: self.me,
            to,
            msg,
            payload_bytes,
        };
        self.net.send_at(self.kernel, now, p);
    }
    fn timer(&mut self, after: Nanos, msg: M) {
        let at = self.kernel.now() + after;
        self.kernel.schedule(at, self.me, Event::Msg(msg));
    }
    fn start_fetch(&mut self, work: Work, done: M, failed: M) {
        let node = match &work {
            Work::Fetch { from, epoch, .. } => from.node().map(|n| (n, *epoch)),
            _ => None,
        };
        match node {
            Some((node, epoch)) => {
                let after = After::Fetched {
                    to: self.me,
                    done,
                    failed,
                    node,
                    epoch,
                    started: self.kernel.now(),
                };
                self.start_after(work, after);
            }
            None => self.start(work, done),
        }
    }
    fn start_then(&mut self, work: Work, then: Then<M>) {
        let after = match then {
            Then::Notify(done) => After::Deliver(self.me, done),
            Then::Send {
                to,
                msg,
                payload_bytes,
            } => After::Send(Pending {
                from: self.me,
                to,
                msg,
                payload_bytes,
            }),
            Then::Nothing => After::Nothing,
        };
        self.start_after(work, after);
    }
    fn rng(&mut self) -> &mut Stream {
        self.rng
    }
    fn estimate(&self, work: &Work) -> Option<Nanos> {
        let Work::Fetch {
            from,
            medium,
            bytes,
            segments,
            staging,
            ..
        } = *work
        else {
            return None;
        };
        let overhead =
            self.fetch_overhead.request + Nanos(self.fetch_overhead.segment.0 * segments as u64);
        let ssd = medium == Medium::Ssd;
        let t =
            self.net
                .network
                .estimate(self.kernel.now(), from, self.here, ssd, bytes, staging)?;
        Some(t + overhead)
    }
}

impl<M> SimCtx<'_, M> {
    /// Starts `work`; `after` happens when it ends.
    pub(super) fn start_after(&mut self, work: Work, after: After<M>) {
        let now = self.kernel.now();
        let here = self.here;
        let (transfer, extra) = match work {
            Work::Fetch {
                from,
                medium,
                bytes,
                segments,
                staging,
                ..
            } => {
                let overhead = self.fetch_overhead.request
                    + Nanos(self.fetch_overhead.segment.0 * segments as u64);
                let ssd = medium == Medium::Ssd;
                match self.net.network.load(now, from, ssd, here, bytes, staging) {
                    // Staged hop after hop: the second leg starts when the first arrives, and
                    // the overheads count once, at the end.
                    Some((t, Some(stage))) => {
                        let onward = After::Onward {
                            from: stage,
                            to: here,
                            bytes,
                            extra: overhead,
                            then: Box::new(after),
                        };
                        self.net.on(self.kernel, t, onward, Nanos::ZERO);
                        return;
                    }
                    Some((t, None)) => (Some(t), overhead),
                    None => (None, overhead),
                }
            }
            Work::Ssd { write, bytes } => {
                let t = here.node().and_then(|node| {
                    if write {
                        self.net.network.ssd_write(now, node, bytes)
                    } else {
                        self.net
                            .network
                            .ssd_read(now, node, Place::Host { node }, bytes)
                    }
                });
                (t, Nanos::ZERO)
            }
            Work::Compute(d) => {
                let device = &mut *self.device;
                let d = if device.speed == 1.0 {
                    d
                } else {
                    Nanos::from_secs_f64(d.as_secs_f64() / device.speed)
                };
                device.free = now.max(device.free) + d;
                (Some(Transfer::At(device.free)), Nanos::ZERO)
            }
        };
        let transfer = transfer.unwrap_or_else(|| {
            // Errors are values: the work ends at once and the run fails with this.
            self.violations.push(format!(
                "actor {} at {here:?} started {work:?}, but there are no SSDs there",
                self.me.0
            ));
            Transfer::At(now)
        });
        self.net.on(self.kernel, transfer, after, extra);
    }
}
