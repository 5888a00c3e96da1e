//! The metadata service: one actor at node 0's host that owns the [`Directory`].
//!
//! Requests are served one at a time, FIFO, each taking `service` time (a lookup walks the
//! query's ids in a hash map; an insert updates the records and queues): a request arriving
//! while the service is busy waits. A lookup therefore costs the network round trip between
//! the instance and node 0, the queueing, and `service`. State changes when a request is
//! taken; the reply leaves when its service time ends.

use super::directory::{Directory, StoreStats};
use crate::actor::{Actor, Context, Msg};
use crate::metrics::Report;
use crate::sim::kernel::ActorId;
use crate::units::Nanos;

/// What the store did over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreReport {
    pub lookups: u64,
    pub stats: StoreStats,
    /// Bytes copied into replica caches.
    pub replication_bytes: u64,
    /// Bytes demoted from host memory to SSD.
    pub demoted_bytes: u64,
}

pub struct Metadata {
    dir: Directory,
    service: Nanos,
    busy_until: Nanos,
    servers: Vec<ActorId>,
    report: StoreReport,
}

impl Metadata {
    pub fn new(dir: Directory, service: Nanos, servers: Vec<ActorId>) -> Metadata {
        Metadata {
            dir,
            service,
            busy_until: Nanos::ZERO,
            servers,
            report: StoreReport::default(),
        }
    }

    /// Takes one request: returns the delay until its service ends.
    fn serve(&mut self, now: Nanos) -> Nanos {
        self.busy_until = now.max(self.busy_until) + self.service;
        self.busy_until - now
    }
}

impl Actor for Metadata {
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context) {
        match msg {
            Msg::Start => {}
            Msg::Lookup(l) => {
                let delay = self.serve(ctx.now());
                self.report.lookups += 1;
                let plan = self.dir.lookup(&l.chain, l.skip as usize, l.node);
                let bytes = 16 + 32 * plan.groups.len() as u64 + 8 * plan.replicate.len() as u64;
                ctx.send_after(
                    delay,
                    l.from,
                    Msg::LookupReply(l.req, Box::new(plan)),
                    bytes,
                );
            }
            Msg::Insert {
                chain,
                node,
                replica,
            } => {
                self.serve(ctx.now());
                let tensor_bytes = self.dir.params().tensor_bytes;
                if replica {
                    self.report.replication_bytes += chain.len() as u64 * tensor_bytes;
                    self.dir.add_replicas(node, &chain);
                } else {
                    let out = self.dir.insert(&chain, node);
                    if out.demoted > 0 {
                        let bytes = out.demoted as u64 * tensor_bytes;
                        self.report.demoted_bytes += bytes;
                        ctx.send(self.servers[node as usize], Msg::Demote { bytes }, 16);
                    }
                }
            }
            other => panic!("metadata cannot handle {other:?}"),
        }
    }

    fn report(&self, report: &mut Report) {
        if let Err(e) = self.dir.check() {
            report.violations.push(format!("store: {e}"));
        }
        report.store = Some(StoreReport {
            stats: self.dir.stats,
            ..self.report
        });
    }
}
