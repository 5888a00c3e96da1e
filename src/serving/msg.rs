//! The messages of the serving system: router, serving instances, store servers and the
//! metadata service. Large payloads are boxed to keep events small.

use crate::actor::ActorId;
use crate::hardware::network::Purpose;
use crate::metrics::Tier;
use crate::serving::store::directory::{Change, LoadPlan, TensorId};
use crate::serving::store::memory::KvData;
use crate::units::Nanos;
use crate::workload::ReqId;

/// What a message's bytes are for, in the link counters: K/V written into the store, a
/// replica of K/V read from another node, or a message.
pub fn purpose(msg: &Msg) -> Purpose {
    match msg {
        Msg::StoreWrite { replica: true, .. } => Purpose::Replication,
        Msg::StoreWrite { .. } => Purpose::Store,
        _ => Purpose::Message,
    }
}

/// Every message between the serving system's actors.
#[derive(Debug)]
pub enum Msg {
    /// The router's own timer: request `ReqId` of the trace arrives now.
    Arrival(ReqId),
    /// Router -> instance: serve this request (payload: the prompt's token ids).
    Submit(ReqId),
    /// The work an actor started has finished.
    WorkDone,
    /// Instance (by index) -> router: the first output token of a request.
    FirstToken(ReqId, u32),
    /// Instance -> router: a request generated its last token.
    Finished(Box<Completion>),
    /// Instance (by index) -> router: the request cannot be served (queue full, or longer
    /// than the instance's whole KV memory).
    Rejected(ReqId, u32),
    /// Instance -> metadata: the longest stored prefix of this chain of tensor ids, skipping
    /// the first `skip` tensors (the instance already holds them).
    Lookup(Box<Lookup>),
    /// Metadata -> instance: where the stored prefix is, and how many store losses the
    /// metadata service had learned of when it planned (see [`Msg::StoreLost`]).
    LookupReply(ReqId, Box<LoadPlan>, u32),
    /// To an instance: one group of a request's load has arrived (its fetch ended).
    Loaded(ReqId),
    /// To an instance: one group of a request's load failed: its source's memory was lost
    /// (node crash, store restart) before the last byte landed.
    LoadFailed(ReqId),
    /// Instance -> its node's store server: the KV of these tensors (payload), to store.
    /// `data` carries the real K/V of the tensors it brings when the store holds bytes (the
    /// live host; see [`crate::serving::store::memory`]), `None` in a simulation.
    StoreWrite {
        chain: Box<Vec<TensorId>>,
        replica: bool,
        data: Option<Box<KvData>>,
    },
    /// Metadata -> a store server whose holdings changed, when the store holds bytes: apply
    /// these changes to its memory (see [`crate::serving::store::memory`]).
    Apply(Box<Applied>),
    /// Store server -> metadata: tensors written on `node` (owned, or replicas).
    Insert {
        chain: Box<Vec<TensorId>>,
        node: u32,
        replica: bool,
    },
    /// Metadata -> store server: write this many demoted bytes to SSD (in the background).
    Demote { bytes: u64 },
    /// Fault injection (`node-crash`) -> an instance or store server of the crashed node: it
    /// is gone and drops every message from now on.
    Crash,
    /// Fault injection -> router, metadata, instances: node `n` is down for good, as a
    /// membership service would tell them.
    NodeDown(u32),
    /// Fault injection (`store-restart`) -> metadata, instances: the store server of node `n`
    /// lost every tensor it held.
    StoreLost(u32),
    /// The fault injector's own timer: inject fault `i` of its list now.
    Inject(u32),
    /// Instance -> router, on real backends only: the tokens a request generated and its
    /// first token's logits, sent just before its [`Msg::Finished`]. The client receives the
    /// tokens; the router keeps them for the output check, so they outlive the instance's
    /// process.
    Output(Box<Output>),
    /// To every actor of a run across processes: this actor was lost with its process and has
    /// been placed again, built anew with nothing of its state ([`crate::live::cluster`]).
    ActorLost(ActorId),
    /// Instance or metadata service -> router (`router = "kv-aware"` only): blocks stored
    /// and removed since the last batch, in the order they happened (see
    /// [`crate::serving::router::kv_index`]).
    KvEvents(Box<KvEvents>),
    /// An actor's own timer: publish the KV events gathered since the last batch
    /// (`serving.kv_event_interval_ms`).
    PublishKv,
}

/// A batch of KV events (see [`Msg::KvEvents`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KvEvents {
    /// The instance whose GPU blocks they are about; `None` from the metadata service, about
    /// the store's tiers.
    pub instance: Option<u32>,
    pub events: Vec<KvEvent>,
}

/// Bytes of a batch's header on the wire (sender, count, timestamp).
pub const KV_EVENTS_HEADER_BYTES: u64 = 16;

impl KvEvents {
    /// Its size on the wire: the header and each event's.
    pub fn bytes(&self) -> u64 {
        KV_EVENTS_HEADER_BYTES + self.events.iter().map(KvEvent::bytes).sum::<u64>()
    }
}

/// One KV event: vLLM's `BlockStored`, `BlockRemoved` and `AllBlocksCleared` for a GPU's
/// blocks (one block hash each), and the store directory's changes for its tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KvEvent {
    /// The block of this chained hash is registered in the instance's GPU prefix cache.
    Stored(u64),
    /// The block of this hash was evicted from it.
    Removed(u64),
    /// The instance's GPU cache holds nothing any more.
    Cleared,
    /// A change to a store server's tiers (host memory, SSD, replicas).
    Store(Change),
    /// The store server of this node lost everything it held.
    StoreCleared(u32),
}

impl KvEvent {
    /// Bytes on the wire: a tag, and a block hash or tensor id (8 bytes), with its node (4).
    pub fn bytes(&self) -> u64 {
        match self {
            KvEvent::Stored(_) | KvEvent::Removed(_) => 9,
            KvEvent::Cleared => 1,
            KvEvent::Store(_) => 13,
            KvEvent::StoreCleared(_) => 5,
        }
    }
}

/// What a request generated on a real backend (see [`Msg::Output`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Output {
    pub req: ReqId,
    pub instance: u32,
    pub tokens: Vec<u32>,
    /// The logits of the first output token; empty when not kept.
    pub first_logits: Vec<f32>,
}

/// What a store server applies to its memory after a placement decision.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Applied {
    /// The directory's changes for this server's node, in order.
    pub changes: Vec<Change>,
    /// The tensors of the write that caused them, if it was this server's (what of them is
    /// still staged afterwards is freed).
    pub written: Vec<TensorId>,
}

/// A prefix lookup.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Lookup {
    pub req: ReqId,
    pub from: ActorId,
    pub node: u32,
    pub chain: Vec<TensorId>,
    pub skip: u32,
}

/// What an instance reports to the router when a request ends.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Completion {
    pub req: ReqId,
    pub instance: u32,
    pub admitted_at: Nanos,
    pub reused: [u32; Tier::ALL.len()],
    pub loaded_bytes: [u64; Tier::ALL.len()],
    pub preemptions: u32,
}
