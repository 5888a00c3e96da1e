//! The messages of the pipeline-route system: the head and the shard actors.

use super::shard::{ShardReply, ShardRequest};
use crate::workload::ReqId;

/// Every message between a route's actors. Large payloads are boxed to keep events small.
#[derive(Debug)]
pub enum Msg {
    /// The head's own timer: request `ReqId` of the trace arrives now.
    Arrival(ReqId),
    /// The work an actor started has finished.
    WorkDone,
    /// Head or shard -> shard: one step of a route session (DESIGN, "Pipeline routes"); the
    /// payload is the step's input activation.
    Step(Box<ShardRequest>),
    /// Tail shard (a token) or any shard (a cache miss) -> head.
    Reply(Box<ShardReply>),
    /// Head -> shard: drop every session state, as a restarted shard process would (fault
    /// injection).
    Restart,
}
