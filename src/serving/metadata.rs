//! The metadata service: one actor at node 0's host that owns the [`Directory`].
//!
//! Requests are served one at a time, FIFO, each taking `service` time (a lookup walks the
//! query's ids in a hash map; an insert updates the records and queues): each request is
//! work on the service's device ([`Work::Compute`]), charged by the host, so a request arriving
//! while the service is busy waits. A lookup therefore costs the network round trip between
//! the instance and node 0, the queueing, and `service`. State changes when a request is
//! taken; the reply leaves when its service time ends ([`Then::Send`]). A demotion notice to a
//! store server leaves at once.
//!
//! When the servers hold real bytes (the live host, [`Metadata::with_bytes`]), the service
//! also tells every server whose holdings a request changed what changed ([`Msg::Apply`],
//! leaving at once, in the order the directory made the changes; see
//! [`super::store::memory`]). Under the simulator no such message exists, so simulated results do
//! not depend on it.

use super::store::directory::{Directory, TensorId};
use crate::actor::{Actor, ActorId, Context, Then, Work, unexpected};
use crate::metrics::{Report, StoreReport};
use crate::serving::Msg;
use crate::serving::kv_events::KvPublisher;
use crate::serving::msg::{Applied, KvEvent};
use crate::units::Nanos;

pub struct Metadata {
    dir: Directory,
    service: Nanos,
    servers: Vec<ActorId>,
    report: StoreReport,
    /// Unexpected messages (errors are values).
    violations: Vec<String>,
    /// Store losses learned of ([`Msg::StoreLost`], [`Msg::NodeDown`]), and the nodes down.
    losses: u32,
    down: Vec<u32>,
    /// The servers hold real bytes: tell them every change.
    bytes: bool,
    /// Losses learned of, by node: the epoch of each node's store in the plans it makes.
    node_losses: Vec<u32>,
    /// Publishes the directory's changes to the router (`router = "kv-aware"` only).
    kv_events: Option<KvPublisher>,
}

impl Metadata {
    pub fn new(dir: Directory, service: Nanos, servers: Vec<ActorId>) -> Metadata {
        let nodes = servers.len();
        Metadata {
            dir,
            service,
            servers,
            report: StoreReport::default(),
            violations: Vec::new(),
            losses: 0,
            down: Vec::new(),
            bytes: false,
            node_losses: vec![0; nodes],
            kv_events: None,
        }
    }

    /// Publishes every change of the store's tiers to `router` as KV events, gathered over
    /// `interval` (zero: after every request); see [`crate::serving::kv_events`].
    pub fn with_kv_events(mut self, router: ActorId, interval: Nanos) -> Metadata {
        self.dir.track_changes();
        self.kv_events = Some(KvPublisher::new(router, None, interval));
        self
    }

    /// The servers hold real bytes (the live host): every change of their holdings is sent
    /// to them.
    pub fn with_bytes(mut self) -> Metadata {
        self.dir.track_changes();
        self.bytes = true;
        self
    }

    /// Counts a loss of `node`'s store (the epoch of its later plans).
    fn lost(&mut self, node: u32) {
        if let Some(n) = self.node_losses.get_mut(node as usize) {
            *n += 1;
        }
    }

    /// The store of `node` lost every tensor: forgotten, and its later plans carry a new
    /// epoch.
    fn store_lost(&mut self, node: u32, ctx: &mut dyn Context<Msg>) {
        self.losses += 1;
        self.lost(node);
        self.dir.lose_node(node);
        if let Some(p) = &mut self.kv_events {
            p.pending().push(KvEvent::StoreCleared(node));
        }
        self.dispatch(None, ctx);
    }

    /// Sends each server its share of the directory's changes since the last call; the
    /// writer `written` (a node and the tensors its write brought) hears even of none.
    /// The changes go to the router too, as KV events, when it asked for them.
    fn dispatch(&mut self, written: Option<(u32, &[TensorId])>, ctx: &mut dyn Context<Msg>) {
        let changes = self.dir.changes();
        if let Some(p) = &mut self.kv_events {
            p.pending()
                .extend(changes.iter().map(|&c| KvEvent::Store(c)));
            p.publish(ctx);
        }
        if !self.bytes {
            return;
        }
        for (node, &server) in self.servers.iter().enumerate() {
            let node = node as u32;
            let mine: Vec<_> = changes
                .iter()
                .copied()
                .filter(|c| c.node() == node)
                .collect();
            let written = match written {
                Some((n, ids)) if n == node => ids.to_vec(),
                _ => Vec::new(),
            };
            if mine.is_empty() && written.is_empty() {
                continue;
            }
            let bytes = 16 + 12 * (mine.len() + written.len()) as u64;
            let applied = Applied {
                changes: mine,
                written,
            };
            ctx.send(server, Msg::Apply(Box::new(applied)), bytes);
        }
    }
}

impl Actor<Msg> for Metadata {
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context<Msg>) {
        self.dir.set_now(ctx.now().0);
        match msg {
            Msg::Lookup(l) => {
                self.report.lookups += 1;
                let mut plan = self.dir.lookup(&l.chain, l.skip as usize, l.node);
                for g in &mut plan.groups {
                    g.epoch = self.node_losses.get(g.node as usize).copied().unwrap_or(0);
                }
                let bytes = 16 + 32 * plan.groups.len() as u64 + 8 * plan.replicate.len() as u64;
                ctx.start_then(
                    Work::Compute(self.service),
                    Then::Send {
                        to: l.from,
                        msg: Msg::LookupReply(l.req, Box::new(plan), self.losses),
                        payload_bytes: bytes,
                    },
                );
            }
            // Written by a node that is down now: nothing of it remains.
            Msg::Insert { node, .. } if self.down.contains(&node) => {}
            Msg::NodeDown(node) => {
                if !self.down.contains(&node) {
                    self.down.push(node);
                }
                self.store_lost(node, ctx);
            }
            // A store server lost with its process and placed again, empty: as a store
            // restart. Any other lost actor holds nothing of the directory's.
            Msg::ActorLost(a) => {
                if let Some(node) = self.servers.iter().position(|&s| s == a) {
                    self.store_lost(node as u32, ctx);
                }
            }
            Msg::StoreLost(node) => self.store_lost(node, ctx),
            Msg::PublishKv => {
                if let Some(p) = &mut self.kv_events {
                    p.flush(ctx);
                }
            }
            Msg::Insert {
                chain,
                node,
                replica,
            } => {
                ctx.start_then(Work::Compute(self.service), Then::Nothing);
                let tensor_bytes = self.dir.params().tensor_bytes;
                if replica {
                    self.report.replication_bytes += chain.len() as u64 * tensor_bytes;
                    self.dir.add_replicas(node, &chain);
                    self.dispatch(Some((node, &chain)), ctx);
                } else {
                    let out = self.dir.insert(&chain, node);
                    // The changes first: the demoted bytes must have moved before the SSD
                    // write that the demotion notice starts.
                    self.dispatch(Some((node, &chain)), ctx);
                    if out.demoted > 0 {
                        let bytes = out.demoted as u64 * tensor_bytes;
                        self.report.demoted_bytes += bytes;
                        ctx.send(self.servers[node as usize], Msg::Demote { bytes }, 16);
                    }
                }
            }
            other => unexpected(&mut self.violations, "metadata", &other),
        }
    }

    fn check(&self) -> Result<(), String> {
        self.dir.check().map_err(|e| format!("store: {e}"))
    }

    fn report(&mut self, report: &mut Report) {
        // The directory's full check reads every tensor record: the host runs it (`check`)
        // after the last event where checks are on, as it does every instance's pool check.
        report.violations.extend(self.violations.iter().cloned());
        report.store = Some(StoreReport {
            stats: self.dir.stats,
            ..self.report
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::ActorId;
    use crate::rng::Stream;
    use crate::serving::msg::Lookup;
    use crate::serving::store::directory::tests::{chain, params};
    use crate::workload::ReqId;

    /// Keeps the replies the service sends when its work ends.
    struct Ctx {
        replies: Vec<Msg>,
        rng: Stream,
    }

    impl Context<Msg> for Ctx {
        fn now(&self) -> Nanos {
            Nanos::ZERO
        }
        fn me(&self) -> ActorId {
            ActorId(9)
        }
        fn send(&mut self, _: ActorId, _: Msg, _: u64) {}
        fn timer(&mut self, _: Nanos, _: Msg) {}
        fn start_then(&mut self, _: Work, then: Then<Msg>) {
            if let Then::Send { msg, .. } = then {
                self.replies.push(msg);
            }
        }
        fn rng(&mut self) -> &mut Stream {
            &mut self.rng
        }
    }

    /// The epochs of the groups of a lookup of `c` from node 0.
    fn epochs(m: &mut Metadata, ctx: &mut Ctx, c: &[u64]) -> Vec<(u32, u32)> {
        let lookup = Lookup {
            req: ReqId(0),
            from: ActorId(1),
            node: 0,
            chain: c.to_vec(),
            skip: 0,
        };
        m.handle(Msg::Lookup(Box::new(lookup)), ctx);
        match ctx.replies.pop() {
            Some(Msg::LookupReply(_, plan, _)) => {
                plan.groups.iter().map(|g| (g.node, g.epoch)).collect()
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn plans_carry_the_losses_of_each_source_that_the_service_knew_of() {
        let dir = Directory::new(params(2, 100, 0, 100));
        let mut m = Metadata::new(dir, Nanos(10), vec![ActorId(5), ActorId(6)]);
        let mut ctx = Ctx {
            replies: Vec::new(),
            rng: Stream::new(1, 1),
        };
        let c = chain(&[1, 2, 3]);
        let insert = |m: &mut Metadata, ctx: &mut Ctx| {
            let chain = Box::new(c.clone());
            m.handle(
                Msg::Insert {
                    chain,
                    node: 1,
                    replica: false,
                },
                ctx,
            );
        };
        insert(&mut m, &mut ctx);
        assert_eq!(epochs(&mut m, &mut ctx, &c), vec![(1, 0)]);
        // Node 1's store restarts: what it held is forgotten; stored again, its plans now
        // say that they know of one loss, and a host fails any read planned with fewer.
        m.handle(Msg::StoreLost(1), &mut ctx);
        assert!(epochs(&mut m, &mut ctx, &c).is_empty());
        insert(&mut m, &mut ctx);
        assert_eq!(epochs(&mut m, &mut ctx, &c), vec![(1, 1)]);
    }
}
