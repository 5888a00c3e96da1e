//! The store server of one node: it does the I/O that needs the node's CPU. Reads from host
//! memory are one-sided (the reader's bulk fetch, no server work); SSD reads are posted by
//! the reader too and streamed by the node through a bounce buffer in its host memory
//! (`Work::Fetch` from `Medium::Ssd`: the SSD read and the network transfer overlap, as
//! NVMe-oF targets and Mooncake's transfer engine do); writes from local GPUs
//! land in host memory and are registered with the metadata service; demotions decided by the
//! metadata service are written to SSD in the background (they occupy the SSD write channel).
//!
//! Under the live host the server also holds the real bytes of what the directory places on
//! its node ([`super::store::memory`]): a write's K/V lands in its staging area, and the metadata
//! service's [`Msg::Apply`] says what to keep, move and free. The protocol is the same; a
//! simulated server has no memory and ignores the bytes (there are none).

use std::sync::Arc;

use super::store::memory::ClusterMemory;
use crate::actor::{Actor, ActorId, Context, Work, unexpected};
use crate::metrics::Report;
use crate::serving::Msg;

pub struct StoreServer {
    node: u32,
    metadata: ActorId,
    /// The node's live store memory (live host only).
    memory: Option<Arc<ClusterMemory>>,
    /// Unexpected messages (errors are values).
    violations: Vec<String>,
    /// Crashed with its node: it drops every message.
    crashed: bool,
}

impl StoreServer {
    pub fn new(node: u32, metadata: ActorId) -> StoreServer {
        StoreServer {
            node,
            metadata,
            memory: None,
            violations: Vec::new(),
            crashed: false,
        }
    }

    /// Holds real bytes in `memory` (the live host).
    pub fn with_memory(mut self, memory: Arc<ClusterMemory>) -> StoreServer {
        self.memory = Some(memory);
        self
    }
}

impl Actor<Msg> for StoreServer {
    fn handle(&mut self, msg: Msg, ctx: &mut dyn Context<Msg>) {
        if self.crashed {
            return;
        }
        match msg {
            Msg::Crash => self.crashed = true,
            // Another actor's process was lost: the metadata service accounts for stores.
            Msg::ActorLost(_) => {}
            // A restart loses the tensors, which the metadata service keeps track of; the
            // server itself holds no state but their bytes.
            Msg::StoreLost(_) => {
                if let Some(m) = &self.memory {
                    m.lose(self.node);
                }
            }
            Msg::WorkDone => {}
            Msg::Apply(a) => match &self.memory {
                Some(m) => m.apply(self.node, &a.changes, &a.written),
                None => {
                    let me = format!("store server {}", self.node);
                    unexpected(
                        &mut self.violations,
                        &me,
                        &"changes to apply without memory",
                    )
                }
            },
            Msg::StoreWrite {
                chain,
                replica,
                data,
            } => {
                if let (Some(m), Some(data)) = (&self.memory, data) {
                    m.land(self.node, *data);
                }
                let bytes = 8 * chain.len() as u64;
                let node = self.node;
                ctx.send(
                    self.metadata,
                    Msg::Insert {
                        chain,
                        node,
                        replica,
                    },
                    bytes,
                );
            }
            Msg::Demote { bytes } => ctx.start(Work::Ssd { write: true, bytes }, Msg::WorkDone),
            other => {
                let me = format!("store server {}", self.node);
                unexpected(&mut self.violations, &me, &other)
            }
        }
    }

    fn report(&mut self, report: &mut Report) {
        report.violations.extend(self.violations.iter().cloned());
    }
}
