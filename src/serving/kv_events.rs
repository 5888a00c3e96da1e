//! Publishing KV events to the router (`router = "kv-aware"`): what an instance's GPU prefix
//! cache and the store's tiers stored and removed, as batches of [`KvEvent`]s.
//!
//! A publisher gathers the events its actor made and sends them to the router as one
//! [`Msg::KvEvents`] message: at once (`serving.kv_event_interval_ms = 0`, the default, one
//! batch per engine iteration as vLLM's `ZmqEventPublisher` sends the events its scheduler
//! took from the block pool at each step), or, with an interval, once the interval has passed
//! since the first event of the batch (a timer, [`Msg::PublishKv`]), so that the router learns
//! late. A batch costs network time like any message ([`KvEvents::bytes`]: 16 bytes of header
//! and 9 a block); a batch sent by an actor that crashes before it leaves is lost with it, and
//! one on a slow or cut link is late, as the fault model has every message. Nothing is
//! published for any other router: their runs have no event traffic at all.
//!
//! **Order.** Events keep the order their actor made them. The LRU pool evicts a chain from its
//! last block, and publishes its removals so (last to first): a router never sees a prefix cut
//! at its head while its tail is still held. The LFU and S3-FIFO pools (`gpu_eviction`) remove
//! in their own order, block by block, as they evict; the directory's drops come as its
//! eviction makes them.

use crate::actor::{ActorId, Context};
use crate::serving::Msg;
use crate::serving::msg::{KvEvent, KvEvents};
use crate::units::Nanos;

/// Most events a batch holds before it leaves whatever the interval (a bound on the memory
/// an actor keeps for the router: 1 M events, 16 MiB).
pub const MAX_PENDING_EVENTS: usize = 1 << 20;

/// One actor's KV event publisher.
#[derive(Debug)]
pub struct KvPublisher {
    router: ActorId,
    /// The instance the events are about; `None` for the store's (the metadata service).
    instance: Option<u32>,
    interval: Nanos,
    pending: Vec<KvEvent>,
    /// A [`Msg::PublishKv`] timer is set.
    armed: bool,
}

impl KvPublisher {
    pub fn new(router: ActorId, instance: Option<u32>, interval: Nanos) -> KvPublisher {
        KvPublisher {
            router,
            instance,
            interval,
            pending: Vec::new(),
            armed: false,
        }
    }

    /// The buffer new events go to; call [`Self::publish`] after adding them.
    pub fn pending(&mut self) -> &mut Vec<KvEvent> {
        &mut self.pending
    }

    /// Sends the pending events now (no interval, or a full batch), or sets the timer that
    /// sends them once the interval has passed.
    pub fn publish(&mut self, ctx: &mut dyn Context<Msg>) {
        if self.pending.is_empty() {
            return;
        }
        if self.interval == Nanos::ZERO || self.pending.len() >= MAX_PENDING_EVENTS {
            self.flush(ctx);
        } else if !self.armed {
            self.armed = true;
            ctx.timer(self.interval, Msg::PublishKv);
        }
    }

    /// The interval passed ([`Msg::PublishKv`]): sends the pending events.
    pub fn flush(&mut self, ctx: &mut dyn Context<Msg>) {
        self.armed = false;
        if self.pending.is_empty() {
            return;
        }
        let batch = KvEvents {
            instance: self.instance,
            events: std::mem::take(&mut self.pending),
        };
        let bytes = batch.bytes();
        ctx.send(self.router, Msg::KvEvents(Box::new(batch)), bytes);
    }
}
