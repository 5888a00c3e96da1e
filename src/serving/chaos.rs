//! The fault injector of the serving system: one actor at the frontend that injects the
//! scenario's `node-crash` and `store-restart` faults (see `crate::fault`) at their
//! times, as messages: [`Msg::Crash`] to the crashed node's instances and store server, and a
//! notice to everyone who must know, as a membership service would give it ([`Msg::NodeDown`]
//! to the router, the metadata service and every instance; [`Msg::StoreLost`] to the metadata
//! service, every instance and the restarted server). Hardware faults (`link-slow`,
//! `gpu-slow`) are the host's: they change what the links and devices cost.

use super::Msg;
use crate::actor::{Actor, ActorId, Context, unexpected};
use crate::fault::Fault;
use crate::metrics::Report;

/// Who the injector tells.
#[derive(Clone, Debug)]
pub struct Targets {
    pub router: ActorId,
    /// Every instance with its node.
    pub instances: Vec<(ActorId, u32)>,
    /// The metadata service and the store server of each node, under store policies.
    pub metadata: Option<ActorId>,
    pub servers: Vec<ActorId>,
}

pub struct Chaos {
    faults: Vec<Fault>,
    targets: Targets,
    violations: Vec<String>,
}

/// Bytes of a fault notice on the wire.
const NOTICE_BYTES: u64 = 16;

impl Chaos {
    /// An injector of the `node-crash` and `store-restart` faults among `faults`.
    pub fn new(faults: &[Fault], targets: Targets) -> Chaos {
        let faults = faults
            .iter()
            .filter(|f| matches!(f, Fault::NodeCrash { .. } | Fault::StoreRestart { .. }))
            .cloned()
            .collect();
        Chaos {
            faults,
            targets,
            violations: Vec::new(),
        }
    }

    fn inject(&mut self, i: usize, ctx: &mut dyn Context<Msg>) {
        let t = &self.targets;
        let mut send = |to: ActorId, msg: Msg| ctx.send(to, msg, NOTICE_BYTES);
        match self.faults.get(i) {
            Some(&Fault::NodeCrash { node, .. }) => {
                for &(id, n) in &t.instances {
                    if n == node {
                        send(id, Msg::Crash);
                    }
                }
                if let Some(&server) = t.servers.get(node as usize) {
                    send(server, Msg::Crash);
                }
                send(t.router, Msg::NodeDown(node));
                if let Some(m) = t.metadata {
                    send(m, Msg::NodeDown(node));
                }
                for &(id, _) in &t.instances {
                    send(id, Msg::NodeDown(node));
                }
            }
            Some(&Fault::StoreRestart { node, .. }) => {
                let Some(m) = t.metadata else {
                    return; // no store under this policy: nothing to lose
                };
                send(m, Msg::StoreLost(node));
                for &(id, _) in &t.instances {
                    send(id, Msg::StoreLost(node));
                }
                if let Some(&server) = t.servers.get(node as usize) {
                    send(server, Msg::StoreLost(node));
                }
            }
            _ => {}
        }
    }
}

impl Actor<Msg> for Chaos {
    fn start(&mut self, ctx: &mut dyn Context<Msg>) {
        for (i, f) in self.faults.iter().enumerate() {
            let at = match *f {
                Fault::NodeCrash { at, .. } | Fault::StoreRestart { at, .. } => at,
                _ => continue,
            };
            ctx.timer(at, Msg::Inject(i as u32));
        }
    }

    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context<Msg>) {
        match msg {
            Msg::Inject(i) => self.inject(i as usize, ctx),
            Msg::ActorLost(_) => {}
            other => unexpected(&mut self.violations, "fault injector", &other),
        }
    }

    fn report(&mut self, report: &mut Report) {
        report.violations.extend(self.violations.iter().cloned());
    }
}
