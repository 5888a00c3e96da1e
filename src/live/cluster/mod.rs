//! Live runs across processes and machines, on `ractor_cluster`.
//!
//! **Processes.** A run has one *coordinator* (the `meshsim run --live` process, index 0)
//! and the `meshsim node` processes it names (indices 1, 2, ... in the order given). Every
//! process runs a `ractor_cluster` [`NodeServer`] and one *agent*: a ractor actor that joins
//! the process groups `meshsim/agents` and `meshsim/agent/<incarnation>` (a random 64-bit id
//! drawn when the process starts) and whose only message is a frame's bytes
//! ([`super::wire`]). `ractor_cluster` authenticates every connection with the cookie (a
//! challenge over SHA-256, as Erlang's distribution: the cookie itself never crosses the
//! wire), bounds each inbound frame, and makes the agents of connected processes visible to
//! each other through the process groups; everything else is meshsim's frames.
//!
//! **A run.** The coordinator connects to every node, asks who it is (`Hello`), and sends
//! each a `Setup`: the run's processes (incarnation and address), the node of every actor,
//! the seed, the run's frame limit and what the system's actors of every process share
//! ([`System::shared`]: nothing for pipelines; the trace, model and K/V geometry for
//! serving). Nodes connect to each other (node `k` dials nodes `1 .. k`), then the
//! coordinator `Place`s each actor on its node as a spec in the system's encoding (a
//! pipeline shard: model, layer range, cache limits, neighbours; a serving instance or store
//! server), which the node builds with the same code as a one-process run
//! (`crate::pipeline::cluster`, `crate::serving::cluster`). Besides actor messages, a
//! process may read another's memory one-sided (`Read`, answered by the holder's loop from
//! its shared state without its actors: a serving store load; see [`Reads`]). Nodes named
//! beyond those that host actors are *spares*. `Go` starts every actor; from then on the
//! actors' messages travel as `Deliver` frames between agents, and each process hosts its
//! actors in the shells of [`super::host`], so the actor code is the same as in one process.
//!
//! **The end of a run** is the four-counter method (Mattern): the coordinator polls every
//! live process in waves for its counts (messages in flight inside it; per peer, messages
//! sent there and messages from there handled here; messages handled in all). When two
//! waves in a row see the same counts, every process is idle inside and every message sent
//! between processes has been handled, the run is over. Then it gathers each process's
//! report and ends the run (`End`).
//!
//! **A lost process.** A node whose connection to the coordinator closes (a killed process:
//! the kernel resets its sockets at once; a machine that vanishes: when TCP gives up) is
//! lost with its actors, their state, and every message sent to them or on its way from
//! them. The coordinator places each of its actors again, built anew from its spec, on a
//! spare node (or, if none is left, on the live node hosting the fewest actors), tells every
//! process the actor's new home (`Relocate`), and delivers the system's lost notice to every
//! actor (`WireMessage::lost`; the pipeline head then starts every running session over
//! under the same session id). Messages to an actor whose process is gone and that has not
//! been placed again are dropped, as the network would. The counts of the lost process, and
//! every count between it and others, leave the sums. If the coordinator is lost, each node
//! drops the run's actors and waits for the next run. Detection is by the connection only: a
//! process that hangs without closing its sockets is caught by the run's wall-clock limit.
//!
//! **Security.** Nodes listen on loopback unless told otherwise; a peer without the cookie
//! never gets past `ractor_cluster`'s authentication. A node only decodes the frames of this
//! file and builds only the actor specs of the systems it knows, within its memory limit; a
//! malformed frame is logged with its reason and dropped, and the connection of the process
//! it claims to come from is closed; a frame over the limit is refused by `ractor_cluster`
//! before it is read (the connection closes) or by the frame decoder.

// Processes are indices into several tables at once (alive, counts, agents).
#![allow(clippy::needless_range_loop)]

mod coordinator;
mod net;
mod node;
mod reads;

pub use coordinator::Coordinator;
pub use net::{AgentMsg, Net, read_cookie, send_raw_frames};
pub use node::{NodeRunFn, node_run, serve};
pub use reads::{MAX_PENDING, READ_TIMEOUT, Reads};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::wire::WireMessage;
use crate::actor::Actor;

/// The process group every agent joins.
const AGENTS: &str = "meshsim/agents";
/// Frames waiting for a process's loop (the agent waits when it is full).
const FRAME_QUEUE: usize = 4096;
/// How long to wait for a peer to connect, authenticate and show its agent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a coordinator keeps asking a node that says it is busy with another coordinator's
/// run: a node drops the run of a coordinator that is gone as soon as it sees its connection
/// close, which can take a moment after a kill.
const BUSY_GRACE: Duration = Duration::from_secs(10);
/// How long to wait for a node to build its actors (model weights among them).
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long to wait for nodes to drop a run that ended.
const END_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the coordinator polls while messages are in flight.
const WAVE_EVERY: Duration = Duration::from_millis(10);
/// Bytes a `ractor_cluster` frame adds around a meshsim frame (its protobuf fields: the
/// target actor, the variant name, lengths), generously.
pub const TRANSPORT_OVERHEAD: u64 = 1024;

fn group_of(incarnation: u64) -> String {
    format!("meshsim/agent/{incarnation:016x}")
}

/// A system whose actors can be placed on nodes: how a node builds one from its spec.
pub trait System: 'static {
    type Msg: WireMessage;
    /// What the actors of one run share inside one process (the serving system's trace,
    /// model weights and store memory), made when the process joins the run.
    type Shared: Send + Sync + 'static;
    /// The shared state of process `setup.node` of a run, from `setup.shared` (the system's
    /// encoding), refusing what needs more than `max_memory` bytes; `reads` reads other
    /// processes' memory.
    fn shared(
        setup: &crate::live::wire::Setup,
        max_memory: u64,
        reads: std::sync::Arc<Reads>,
    ) -> Result<Self::Shared, String>;
    /// Builds the actor of `spec` (the system's encoding), refusing one that needs more than
    /// `max_memory` bytes.
    fn build(
        spec: &[u8],
        max_memory: u64,
        shared: &Self::Shared,
    ) -> Result<Box<dyn Actor<Self::Msg>>, String>;
    /// Answers a one-sided read of this process's memory ([`crate::live::wire::Frame::Read`];
    /// `key` in the system's encoding): the bytes, or `None` when they are not here.
    fn read(shared: &Self::Shared, key: &[u8]) -> Option<Vec<u8>> {
        let _ = (shared, key);
        None
    }
}

/// What a node process is allowed to do.
#[derive(Clone, Copy, Debug)]
pub struct NodeLimits {
    /// Bytes of model weights and state the actors placed on it may hold.
    pub max_memory: u64,
}

/// Where a run's actors go: the process of every actor (0 is the coordinator) and, for
/// those elsewhere, their specs.
pub struct Placement<M> {
    pub local: BTreeMap<u32, Box<dyn Actor<M>>>,
    pub remote: BTreeMap<u32, (u16, Vec<u8>)>,
    /// What every node needs besides its actors' specs ([`System::shared`]).
    pub shared: Vec<u8>,
}

/// Parses a listen address, `HOST:PORT`.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| {
            // A name, as `localhost:7001`.
            use std::net::ToSocketAddrs;
            s.to_socket_addrs()
                .map_err(|e| e.to_string())?
                .next()
                .ok_or_else(|| "no address".to_string())
        })
        .map_err(|e| format!("--listen {s}: {e} (expected HOST:PORT, e.g. 127.0.0.1:7001)"))
}
