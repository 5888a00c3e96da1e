//! The messages of the pipeline-route system: the head and the shard actors. Their encoding
//! between processes is [`super::wire`].

use super::shard::{ShardReply, ShardRequest};
use crate::actor::ActorId;
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
    /// Tail shard (a token) or any shard (a cache miss) -> head, for the session's pass
    /// `attempt` (the [`ShardRequest::attempt`] of the step that produced it).
    Reply {
        reply: Box<ShardReply>,
        attempt: u32,
    },
    /// Head -> shard: drop every session state, as a restarted shard process would (fault
    /// injection).
    Restart,
    /// Host -> every actor: actor `ActorId` was lost with its process and has been placed
    /// again, with no state; whatever was sent to it or was being computed there is gone.
    /// The head starts every running session over (a re-prefill under the same session id,
    /// as after a cache miss). Only a host whose actors live in processes that can die sends
    /// it (`crate::live::cluster`).
    Lost(ActorId),
}
