//! An instance's KV events (`router = "kv-aware"` only; see [`crate::serving::kv_events`]):
//! what its GPU prefix cache registers and evicts, taken from its pool at every step.

use super::*;
use crate::serving::msg::KvEvent;

impl Instance {
    /// Publishes what its GPU prefix cache registers and evicts to the router, gathered over
    /// `interval` (zero: every step).
    pub fn with_kv_events(mut self, interval: Nanos) -> Instance {
        self.pool.publish_events();
        self.kv_events = Some(KvPublisher::new(self.router, Some(self.index), interval));
        self
    }

    /// Sends the pool's KV events to the router, or keeps them until the interval ends. The
    /// step's events (the last iteration's registrations, this plan's evictions) leave with
    /// it, as vLLM's scheduler publishes those it took from its pool.
    pub(super) fn publish_kv(&mut self, ctx: &mut dyn Context<Msg>) {
        if let Some(p) = &mut self.kv_events {
            self.pool.take_events(p.pending());
            p.publish(ctx);
        }
    }

    /// The interval ended ([`Msg::PublishKv`]): the events kept leave.
    pub(super) fn kv_timer(&mut self, ctx: &mut dyn Context<Msg>) {
        if let Some(p) = &mut self.kv_events {
            p.flush(ctx);
        }
    }

    /// Its GPU cache starts empty: the router hears so at once, whatever the interval (an
    /// instance placed again after its process was lost starts anew, and what it held before
    /// is gone).
    pub(super) fn kv_cleared(&mut self, ctx: &mut dyn Context<Msg>) {
        if let Some(p) = &mut self.kv_events {
            p.pending().push(KvEvent::Cleared);
            p.flush(ctx);
        }
    }
}
