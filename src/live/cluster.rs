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
//! the seed and the run's frame limit. Nodes connect to each other (node `k` dials nodes `1
//! .. k`), then the coordinator `Place`s each actor on its node as a spec in the system's
//! encoding (a pipeline shard: model, layer range, cache limits, neighbours), which the node
//! builds with the same code as a one-process run (`crate::pipeline::cluster`). Nodes named
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ractor::{ActorProcessingErr, ActorRef};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{NodeEventSubscription, NodeServer, NodeServerMessage};
use tokio::sync::mpsc;

use super::LiveError;
use super::host::{LiveOutcome, LocalHost, Outbound, Route};
use super::wire::{
    Counts, FRAME_OVERHEAD, Frame, Placed, Setup, WireError, WireMessage, decode_frame,
    encode_frame,
};
use crate::actor::{Actor, ActorId};
use crate::metrics::Report;

/// The process group every agent joins.
const AGENTS: &str = "meshsim/agents";
/// Frames waiting for a process's loop (the agent waits when it is full).
const FRAME_QUEUE: usize = 4096;
/// How long to wait for a peer to connect, authenticate and show its agent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
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

/// The agent's message: a frame's bytes (all that crosses processes), or a ractor message
/// that is not one (logged and dropped).
#[derive(Debug)]
pub enum AgentMsg {
    Frame(Vec<u8>),
    Bad(String),
}

impl ractor::Message for AgentMsg {
    fn serializable() -> bool {
        true
    }
    fn serialize(
        self,
    ) -> Result<ractor::message::SerializedMessage, ractor::message::BoxedDowncastErr> {
        match self {
            AgentMsg::Frame(args) => Ok(ractor::message::SerializedMessage::Cast {
                variant: "Frame".into(),
                args,
                metadata: None,
            }),
            AgentMsg::Bad(_) => Err(ractor::message::BoxedDowncastErr),
        }
    }
    fn deserialize(
        m: ractor::message::SerializedMessage,
    ) -> Result<Self, ractor::message::BoxedDowncastErr> {
        // Never an error: whatever a peer sends reaches the agent, which logs what it cannot
        // use instead of failing inside ractor.
        Ok(match m {
            ractor::message::SerializedMessage::Cast { variant, args, .. }
                if variant == "Frame" =>
            {
                AgentMsg::Frame(args)
            }
            ractor::message::SerializedMessage::Cast { variant, .. } => {
                AgentMsg::Bad(format!("a cast of unknown variant {variant:?}"))
            }
            _ => AgentMsg::Bad("a call or reply, which meshsim never sends".into()),
        })
    }
}

struct Agent;

impl ractor::Actor for Agent {
    type Msg = AgentMsg;
    type State = mpsc::Sender<AgentMsg>;
    type Arguments = mpsc::Sender<AgentMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<AgentMsg>,
        tx: mpsc::Sender<AgentMsg>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(tx)
    }

    async fn handle(
        &self,
        _myself: ActorRef<AgentMsg>,
        msg: AgentMsg,
        tx: &mut mpsc::Sender<AgentMsg>,
    ) -> Result<(), ActorProcessingErr> {
        // The process's loop is gone only when the process is ending.
        let _ = tx.send(msg).await;
        Ok(())
    }
}

/// A change of a connection to another process.
#[derive(Debug, Clone)]
enum SessionEvent {
    Down {
        node_id: u64,
        peer_addr: String,
        authenticated: bool,
    },
}

struct Subscription {
    tx: mpsc::UnboundedSender<SessionEvent>,
    authenticated: Mutex<HashSet<u64>>,
}

impl NodeEventSubscription for Subscription {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        tracing::debug!("connection from or to {} opened", ses.peer_addr);
    }
    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        if let Ok(mut a) = self.authenticated.lock() {
            a.insert(ses.node_id);
        }
    }
    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        let authenticated = self
            .authenticated
            .lock()
            .map(|mut a| a.remove(&ses.node_id))
            .unwrap_or(false);
        if !authenticated {
            tracing::warn!(
                "refused {}: it closed or failed authentication (a wrong cookie?)",
                ses.peer_addr
            );
        }
        let _ = self.tx.send(SessionEvent::Down {
            node_id: ses.node_id,
            peer_addr: ses.peer_addr,
            authenticated,
        });
    }
}

/// This process's place in a cluster: its node server, agent and incarnation.
pub struct Net {
    pub incarnation: u64,
    server: ActorRef<NodeServerMessage>,
    agent: ActorRef<AgentMsg>,
    frames: mpsc::Receiver<AgentMsg>,
    sessions: mpsc::UnboundedReceiver<SessionEvent>,
    /// The address it listens at.
    pub listen: SocketAddr,
    /// Largest inbound frame its node server accepts.
    pub max_frame: u64,
}

/// Reads a cookie file: its first line, which must not be empty. On Unix the file must not
/// be readable by others than its owner's group (as ssh demands of keys).
pub fn read_cookie(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cookie file {}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path)
            && m.permissions().mode() & 0o004 != 0
        {
            return Err(format!(
                "cookie file {}: readable by every user (chmod 600 it)",
                path.display()
            ));
        }
    }
    let cookie = text.lines().next().unwrap_or("").trim().to_string();
    if cookie.is_empty() {
        return Err(format!("cookie file {}: empty", path.display()));
    }
    Ok(cookie)
}

impl Net {
    /// Starts a node server at `listen` (port 0: any free port) with `cookie`, accepting
    /// inbound frames of at most `max_frame` bytes, and this process's agent.
    pub async fn start(listen: SocketAddr, cookie: String, max_frame: u64) -> Result<Net, String> {
        // The incarnation only tells processes apart: the clock and the pid suffice.
        let incarnation: u64 = {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            crate::hash::mix64(t ^ ((std::process::id() as u64) << 40)) | 1
        };
        // Bind once to learn the port (ractor_cluster reports port 0 only to its listener).
        let port = if listen.port() == 0 {
            let l = std::net::TcpListener::bind(listen)
                .map_err(|e| format!("listen at {listen}: {e}"))?;
            l.local_addr().map_err(|e| e.to_string())?.port()
        } else {
            // Fail now, with the reason, if the address is taken or not ours.
            drop(
                std::net::TcpListener::bind(listen)
                    .map_err(|e| format!("listen at {listen}: {e}"))?,
            );
            listen.port()
        };
        let listen = SocketAddr::new(listen.ip(), port);
        let server = NodeServer::new(
            port,
            cookie,
            format!("meshsim-{incarnation:016x}"),
            listen.ip().to_string(),
            None,
            None,
        )
        .with_listen_addr(listen.ip())
        .with_max_inbound_frame_size(max_frame + TRANSPORT_OVERHEAD);
        let (server, _) = ractor::Actor::spawn(None, server, ())
            .await
            .map_err(|e| format!("node server: {e}"))?;
        let (stx, srx) = mpsc::unbounded_channel();
        server
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "meshsim".into(),
                subscription: Box::new(Subscription {
                    tx: stx,
                    authenticated: Mutex::new(HashSet::new()),
                }),
            })
            .map_err(|e| format!("node server: {e}"))?;
        let (ftx, frx) = mpsc::channel(FRAME_QUEUE);
        let (agent, _) = ractor::Actor::spawn(None, Agent, ftx)
            .await
            .map_err(|e| format!("agent: {e}"))?;
        ractor::pg::join(AGENTS.into(), vec![agent.get_cell()]);
        ractor::pg::join(group_of(incarnation), vec![agent.get_cell()]);
        Ok(Net {
            incarnation,
            server,
            agent,
            frames: frx,
            sessions: srx,
            listen,
            max_frame,
        })
    }

    /// Stops the agent and the node server, and waits for them (a node server stopped only
    /// by the runtime's end would try to restart its listener meanwhile).
    pub async fn shutdown(&self) {
        let wait = Some(Duration::from_secs(5));
        let _ = self.agent.stop_and_wait(None, wait).await;
        let _ = self.server.stop_and_wait(None, wait).await;
    }

    /// The agent of the process whose incarnation is `inc`, once its group is visible.
    fn agent_of(inc: u64) -> Option<ActorRef<AgentMsg>> {
        ractor::pg::get_members(&group_of(inc))
            .into_iter()
            .find(|c| !c.get_id().is_local())
            .map(ActorRef::from)
    }

    async fn sessions_info(&self) -> HashMap<u64, NodeServerSessionInformation> {
        ractor::call_t!(self.server, NodeServerMessage::GetSessions, 2000).unwrap_or_default()
    }

    /// Connects to the node at `addr` and waits for its agent: `(node id, agent)`.
    async fn dial(&mut self, addr: &str) -> Result<(u64, ActorRef<AgentMsg>), String> {
        let sa = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| format!("node {addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("node {addr}: no address"))?;
        ractor_cluster::client_connect(&self.server, sa)
            .await
            .map_err(|e| {
                let e = connect_error(e);
                format!("cannot connect to node {addr}: {e} (is `meshsim node` running there?)")
            })?;
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            while let Ok(ev) = self.sessions.try_recv() {
                let SessionEvent::Down {
                    peer_addr,
                    authenticated,
                    ..
                } = ev;
                if peer_addr == sa.to_string() && !authenticated {
                    return Err(format!(
                        "node {addr} closed the connection during authentication: is its \
                         cookie the same as ours?"
                    ));
                }
            }
            let info = self.sessions_info().await;
            if let Some((&id, _)) = info.iter().find(|(_, s)| s.peer_addr == sa.to_string()) {
                let agent = ractor::pg::get_members(&AGENTS.to_string())
                    .into_iter()
                    .find(|c| c.get_id().node() == id && !c.get_id().is_local());
                if let Some(a) = agent {
                    return Ok((id, ActorRef::from(a)));
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "node {addr} did not authenticate within {} s: is its cookie the same as ours?",
                    CONNECT_TIMEOUT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Connects to `addr` (if `dial`) and waits for the agent of incarnation `inc`.
    async fn reach(
        &mut self,
        addr: &str,
        inc: u64,
        dial: bool,
    ) -> Result<ActorRef<AgentMsg>, String> {
        if let Some(a) = Net::agent_of(inc) {
            return Ok(a);
        }
        if dial {
            let sa = tokio::net::lookup_host(addr)
                .await
                .map_err(|e| format!("node {addr}: {e}"))?
                .next()
                .ok_or_else(|| format!("node {addr}: no address"))?;
            ractor_cluster::client_connect(&self.server, sa)
                .await
                .map_err(|e| {
                    let e = connect_error(e);
                    format!("cannot connect to node {addr}: {e}")
                })?;
        }
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            if let Some(a) = Net::agent_of(inc) {
                return Ok(a);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "node {addr} did not show its agent within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Closes the connection to the process whose agent is `agent` (after a malformed frame).
    async fn disconnect(&self, node_id: u64, why: &str) {
        if let Some(s) = self.sessions_info().await.get(&node_id) {
            tracing::warn!("closing the connection to {}: {why}", s.peer_addr);
            s.actor.stop(Some(why.to_string()));
        }
    }
}

/// A connection error in words (ractor_cluster's own Display is its Debug).
fn connect_error(e: ractor_cluster::ClientConnectErr) -> String {
    match e {
        ractor_cluster::ClientConnectErr::Socket(io)
        | ractor_cluster::ClientConnectErr::Encryption(io) => io.to_string(),
        other => other.to_string(),
    }
}

fn send_frame(
    to: &ActorRef<AgentMsg>,
    sender: u64,
    f: &Frame,
    limit: u64,
) -> Result<u64, WireError> {
    let b = encode_frame(sender, f, limit)?;
    let n = b.len() as u64;
    // A peer whose connection is gone: the frame is lost, as on the wire.
    if to.cast(AgentMsg::Frame(b)).is_err() {
        tracing::debug!("a frame to a process that is gone is lost");
    }
    Ok(n)
}

/// Sends the actor messages of one process to the others.
struct ClusterOut {
    incarnation: u64,
    run: u64,
    me: u16,
    max_frame: u64,
    agents: RwLock<Vec<Option<ActorRef<AgentMsg>>>>,
}

impl<M: WireMessage> Outbound<M> for ClusterOut {
    fn send(&self, node: u16, to: ActorId, msg: M) -> Result<u64, String> {
        let mut bytes = Vec::new();
        msg.encode(&mut bytes)
            .map_err(|e| format!("{} to actor {}: {e}", msg.describe(), to.0))?;
        if bytes.len() as u64 + FRAME_OVERHEAD > self.max_frame {
            return Err(WireError::TooLarge {
                what: format!("{} to actor {}", msg.describe(), to.0),
                bytes: bytes.len() as u64 + FRAME_OVERHEAD,
                limit: self.max_frame,
            }
            .to_string());
        }
        let agent = self
            .agents
            .read()
            .ok()
            .and_then(|a| a.get(node as usize).cloned().flatten());
        let Some(agent) = agent else {
            // Its process is gone: lost.
            return Ok(0);
        };
        let f = Frame::Deliver {
            run: self.run,
            from_node: self.me,
            to: to.0,
            msg: bytes,
        };
        send_frame(&agent, self.incarnation, &f, self.max_frame).map_err(|e| e.to_string())
    }
}

/// A system whose actors can be placed on nodes: how a node builds one from its spec.
pub trait System: 'static {
    type Msg: WireMessage;
    /// Builds the actor of `spec` (the system's encoding), refusing one that needs more than
    /// `max_memory` bytes.
    fn build(spec: &[u8], max_memory: u64) -> Result<Box<dyn Actor<Self::Msg>>, String>;
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
}

/// A coordinator's connections to its nodes, kept for every run of one command.
pub struct Coordinator {
    net: Net,
    /// `(incarnation, address, agent)` of node 1, 2, ...
    nodes: Vec<(u64, String, ActorRef<AgentMsg>, u64)>,
    runs: u64,
    /// What happened during the last run, with times since its start (for the console).
    pub timeline: Vec<(Duration, String)>,
}

impl Coordinator {
    /// Connects to every node of `addrs` with `cookie`; the run's frames are at most
    /// `max_frame` bytes, which every node must accept.
    pub async fn connect(
        addrs: &[String],
        cookie: String,
        max_frame: u64,
    ) -> Result<Coordinator, LiveError> {
        let cfg = |e: String| LiveError::Config(e);
        let here: SocketAddr = "127.0.0.1:0".parse().map_err(|e| cfg(format!("{e}")))?;
        let mut net = Net::start(here, cookie, max_frame).await.map_err(cfg)?;
        match Coordinator::greet(&mut net, addrs, max_frame).await {
            Ok(nodes) => Ok(Coordinator {
                net,
                nodes,
                runs: 0,
                timeline: Vec::new(),
            }),
            Err(e) => {
                net.shutdown().await;
                Err(e)
            }
        }
    }

    /// Dials and greets every node of `addrs`: `(incarnation, address, agent, frame limit)`.
    async fn greet(
        net: &mut Net,
        addrs: &[String],
        max_frame: u64,
    ) -> Result<Vec<(u64, String, ActorRef<AgentMsg>, u64)>, LiveError> {
        let cfg = |e: String| LiveError::Config(e);
        let mut nodes = Vec::new();
        for addr in addrs {
            let (_, agent) = net.dial(addr).await.map_err(cfg)?;
            let nonce = net.incarnation ^ nodes.len() as u64;
            send_frame(&agent, net.incarnation, &Frame::Hello { nonce }, max_frame)
                .map_err(|e| cfg(e.to_string()))?;
            let deadline = Instant::now() + CONNECT_TIMEOUT;
            let ack = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let Ok(Some(m)) = tokio::time::timeout(left, net.frames.recv()).await else {
                    return Err(cfg(format!("node {addr} did not answer")));
                };
                let AgentMsg::Frame(b) = m else { continue };
                match decode_frame(&b, max_frame) {
                    Ok((
                        inc,
                        Frame::HelloAck {
                            nonce: n,
                            max_frame: theirs,
                            busy_with,
                            ..
                        },
                    )) if n == nonce => {
                        break (inc, theirs, busy_with);
                    }
                    Ok(_) => continue,
                    Err(e) => tracing::warn!("a malformed frame from node {addr}: {e}"),
                }
            };
            let (inc, theirs, busy) = ack;
            if let Some(run) = busy {
                return Err(cfg(format!(
                    "node {addr} is busy with run {run:016x} of another coordinator"
                )));
            }
            if theirs < max_frame {
                return Err(cfg(format!(
                    "the scenario's largest message needs frames of {max_frame} bytes; node \
                     {addr} accepts at most {theirs} (start it with --max-frame-mib {})",
                    max_frame.div_ceil(1 << 20)
                )));
            }
            nodes.push((inc, addr.clone(), agent, theirs));
        }
        Ok(nodes)
    }

    /// Node addresses, in order (node 1 first).
    pub fn addresses(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.1.clone()).collect()
    }

    pub async fn shutdown(&self) {
        self.net.shutdown().await;
    }

    fn frame_to(&self, node: u16, f: &Frame, limit: u64) -> Result<(), LiveError> {
        let agent = &self.nodes[node as usize - 1].2;
        send_frame(agent, self.net.incarnation, f, limit)
            .map(|_| ())
            .map_err(|e| LiveError::Actor(e.to_string()))
    }

    /// Runs the actors of `placement` across this coordinator's processes until no message
    /// is left in flight anywhere, for at most `max_wall` (see the module doc).
    pub async fn run<S: System>(
        &mut self,
        placement: Placement<S::Msg>,
        seed: u64,
        max_frame: u64,
        max_wall: Duration,
    ) -> Result<LiveOutcome, LiveError> {
        self.runs += 1;
        self.timeline.clear();
        let run = self.net.incarnation.rotate_left(16) ^ self.runs;
        let n_actors = placement.local.len() + placement.remote.len();
        let procs = self.nodes.len() + 1;
        let mut home = vec![0u16; n_actors];
        for (&id, (node, _)) in &placement.remote {
            home[id as usize] = *node;
        }
        let mut nodes_list = vec![(self.net.incarnation, self.net.listen.to_string())];
        nodes_list.extend(self.nodes.iter().map(|n| (n.0, n.1.clone())));
        let start = Instant::now();
        let mut alive = vec![true; procs];
        let result = self
            .drive::<S>(
                run, placement, seed, max_frame, max_wall, home, nodes_list, &mut alive, start,
            )
            .await;
        // End the run everywhere and wait for the nodes to drop it, so that the next run (or
        // the end of this process) does not overtake the End.
        let live: Vec<u16> = (1..procs).filter(|&k| alive[k]).map(|k| k as u16).collect();
        for &k in &live {
            let _ = self.frame_to(k, &Frame::End { run }, max_frame);
        }
        if let Err(e) = self.await_ready(run, live, max_frame, END_TIMEOUT).await {
            tracing::warn!("ending the run: {e}");
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn drive<S: System>(
        &mut self,
        run: u64,
        mut placement: Placement<S::Msg>,
        seed: u64,
        max_frame: u64,
        max_wall: Duration,
        mut home: Vec<u16>,
        nodes_list: Vec<(u64, String)>,
        alive: &mut [bool],
        start: Instant,
    ) -> Result<LiveOutcome, LiveError> {
        let procs = alive.len();
        let actor_err = LiveError::Actor;
        // Setup everywhere, then the placements.
        for k in 1..procs {
            let setup = Setup {
                run,
                system: S::Msg::SYSTEM.into(),
                node: k as u16,
                nodes: nodes_list.clone(),
                home: home.clone(),
                seed,
                max_frame,
            };
            self.frame_to(k as u16, &Frame::Setup(setup), max_frame)?;
        }
        self.await_ready(
            run,
            (1..procs).map(|k| k as u16).collect(),
            max_frame,
            SETUP_TIMEOUT,
        )
        .await?;
        let specs: BTreeMap<u32, (u16, Vec<u8>)> = std::mem::take(&mut placement.remote);
        let mut by_node: BTreeMap<u16, Vec<Placed>> = BTreeMap::new();
        for (id, (node, spec)) in &specs {
            by_node.entry(*node).or_default().push(Placed {
                id: *id,
                spec: spec.clone(),
            });
        }
        for (node, actors) in &by_node {
            self.frame_to(
                *node,
                &Frame::Place {
                    run,
                    actors: actors.clone(),
                },
                max_frame,
            )?;
        }
        self.await_ready(
            run,
            by_node.keys().copied().collect(),
            max_frame,
            SETUP_TIMEOUT,
        )
        .await?;
        self.timeline
            .push((start.elapsed(), format!("{} node(s) set up", procs - 1)));

        // The coordinator's own actors.
        let out = Arc::new(ClusterOut {
            incarnation: self.net.incarnation,
            run,
            me: 0,
            max_frame,
            agents: RwLock::new(
                std::iter::once(None)
                    .chain(self.nodes.iter().map(|n| Some(n.2.clone())))
                    .collect(),
            ),
        });
        let routes: Vec<Route<S::Msg>> = home.iter().map(|&h| Route::Remote(h)).collect();
        let outbound: Arc<dyn Outbound<S::Msg>> = out.clone();
        let mut host = LocalHost::new(procs, routes, seed, Some(outbound));
        for (id, a) in std::mem::take(&mut placement.local) {
            host.add(ActorId(id), a).await?;
        }
        // Go, counted as a message to each node so that the waves cannot end before it lands.
        let began = Instant::now();
        self.timeline
            .push((start.elapsed(), "actors started everywhere".into()));
        for k in 1..procs {
            self.frame_to(k as u16, &Frame::Go { run }, max_frame)?;
            host.shared_count_sent(k as u16);
        }
        host.start();
        let deadline = began + max_wall;
        let mut wave = 0u64;
        let mut pending: Option<Vec<Option<Counts>>> = None;
        let mut last: Option<Vec<Counts>> = None;
        let mut next_wave = Instant::now();
        let outcome: Result<Duration, LiveError> = 'run: loop {
            if let Some(e) = host.failure() {
                break 'run Err(actor_err(e));
            }
            let now = Instant::now();
            if now > deadline {
                break 'run Err(actor_err(format!(
                    "the live run did not end within its wall-clock limit of {:.0} s",
                    max_wall.as_secs_f64()
                )));
            }
            if pending.is_none() && now >= next_wave {
                wave += 1;
                let mut counts: Vec<Option<Counts>> = vec![None; procs];
                counts[0] = Some(host.counts());
                for k in 1..procs {
                    if alive[k] {
                        self.frame_to(k as u16, &Frame::Poll { run, wave }, max_frame)?;
                    }
                }
                pending = Some(counts);
            }
            if let Some(counts) = &pending
                && (1..procs).all(|k| !alive[k] || counts[k].is_some())
            {
                let now_counts: Vec<Counts> = counts
                    .iter()
                    .map(|c| c.clone().unwrap_or_default())
                    .collect();
                let q = quiet(&now_counts, alive);
                if q && last.as_ref() == Some(&now_counts) {
                    break 'run Ok(began.elapsed());
                }
                last = Some(now_counts);
                pending = None;
                next_wave = Instant::now() + if q { Duration::ZERO } else { WAVE_EVERY };
                continue;
            }
            let sleep = next_wave
                .saturating_duration_since(Instant::now())
                .max(Duration::from_micros(200))
                .min(Duration::from_millis(50));
            tokio::select! {
                m = self.net.frames.recv() => {
                    let Some(AgentMsg::Frame(b)) = m else { continue };
                    match decode_frame(&b, max_frame) {
                        Ok((_, Frame::Counts { run: r, wave: w, node, counts: c })) if r == run && w == wave => {
                            if let Some(p) = pending.as_mut()
                                && let Some(slot) = p.get_mut(node as usize)
                            {
                                *slot = Some(c);
                            }
                        }
                        Ok((_, Frame::Failed { run: r, node, error })) if r == run => {
                            let addr = nodes_list.get(node as usize).map(|n| n.1.as_str()).unwrap_or("?");
                            break 'run Err(actor_err(format!("node {node} ({addr}): {error}")));
                        }
                        Ok((_, Frame::Deliver { run: r, from_node, to, msg })) if r == run => {
                            match S::Msg::decode(&msg) {
                                Ok(m) => {
                                    if let Err(e) = host.deliver_remote(ActorId(to), m, from_node) {
                                        break 'run Err(actor_err(e));
                                    }
                                }
                                Err(e) => {
                                    break 'run Err(actor_err(format!("a message from node {from_node}: {e}")));
                                }
                            }
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!("dropping a malformed frame: {e}"),
                    }
                }
                ev = self.net.sessions.recv() => {
                    let Some(SessionEvent::Down { node_id, .. }) = ev else { continue };
                    let Some(k) = (1..procs)
                        .find(|&k| alive[k] && self.nodes[k - 1].2.get_id().node() == node_id)
                    else {
                        continue;
                    };
                    alive[k] = false;
                    self.timeline.push((
                        start.elapsed(),
                        format!("node {k} ({}) lost: its connection closed", nodes_list[k].1),
                    ));
                    if let Err(e) = self
                        .replace::<S>(run, k as u16, &specs, &mut home, alive, &out, &host, max_frame, start)
                        .await
                    {
                        break 'run Err(e);
                    }
                    pending = None;
                    last = None;
                }
                _ = tokio::time::sleep(sleep) => {}
            }
        };
        let wall = match outcome {
            Ok(w) => w,
            Err(e) => {
                host.stop().await;
                return Err(e);
            }
        };
        self.timeline.push((
            start.elapsed(),
            "every process idle, no message in flight".into(),
        ));
        // Reports.
        let mut report = host.report().await?;
        let [
            mut messages,
            mut bytes,
            mut fetched,
            mut wire_bytes,
            mut wire_frames,
        ] = host.totals();
        host.stop().await;
        let mut waiting: HashSet<u16> =
            (1..procs).filter(|&k| alive[k]).map(|k| k as u16).collect();
        for &k in &waiting {
            self.frame_to(k, &Frame::ReportAsk { run }, max_frame)?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut parts: BTreeMap<u16, Report> = BTreeMap::new();
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(Some(m)) = tokio::time::timeout(left, self.net.frames.recv()).await else {
                return Err(actor_err("a node did not send its report".into()));
            };
            let AgentMsg::Frame(b) = m else { continue };
            if let Ok((
                _,
                Frame::ReportReply {
                    run: r,
                    node,
                    report: part,
                    totals,
                },
            )) = decode_frame(&b, max_frame)
                && r == run
                && waiting.remove(&node)
            {
                messages += totals[0];
                bytes += totals[1];
                fetched += totals[2];
                wire_bytes += totals[3];
                wire_frames += totals[4];
                parts.insert(node, part);
            }
        }
        for (_, p) in parts {
            report.merge(p);
        }
        if let Some(first) = report.violations.first() {
            return Err(LiveError::Actor(format!(
                "{first} ({} violation(s) in all)",
                report.violations.len()
            )));
        }
        Ok(LiveOutcome {
            report,
            wall,
            messages,
            bytes,
            fetched,
            wire_bytes,
            wire_frames,
        })
    }

    async fn await_ready(
        &mut self,
        run: u64,
        from: Vec<u16>,
        max_frame: u64,
        timeout: Duration,
    ) -> Result<(), LiveError> {
        let mut waiting: HashSet<u16> = from.into_iter().collect();
        let deadline = Instant::now() + timeout;
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = tokio::select! {
                m = self.net.frames.recv() => m,
                ev = self.net.sessions.recv() => {
                    if let Some(SessionEvent::Down { peer_addr, .. }) = ev {
                        return Err(LiveError::Actor(format!("the connection to {peer_addr} closed while the run was set up")));
                    }
                    continue;
                }
                _ = tokio::time::sleep(left) => None,
            };
            let Some(AgentMsg::Frame(b)) = m else {
                return Err(LiveError::Actor("nodes did not get ready in time".into()));
            };
            match decode_frame(&b, max_frame) {
                Ok((
                    _,
                    Frame::Ready {
                        run: r,
                        node,
                        error,
                    },
                )) if r == run => {
                    if let Some(e) = error {
                        let addr = self
                            .nodes
                            .get(node as usize - 1)
                            .map(|n| n.1.clone())
                            .unwrap_or_default();
                        return Err(LiveError::Actor(format!("node {node} ({addr}): {e}")));
                    }
                    waiting.remove(&node);
                }
                Ok((
                    _,
                    Frame::Failed {
                        run: r,
                        node,
                        error,
                    },
                )) if r == run => {
                    return Err(LiveError::Actor(format!("node {node}: {error}")));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("dropping a malformed frame: {e}"),
            }
        }
        Ok(())
    }

    /// Places the actors of lost node `dead` again and tells everyone.
    #[allow(clippy::too_many_arguments)]
    async fn replace<S: System>(
        &mut self,
        run: u64,
        dead: u16,
        specs: &BTreeMap<u32, (u16, Vec<u8>)>,
        home: &mut [u16],
        alive: &[bool],
        out: &ClusterOut,
        host: &LocalHost<S::Msg>,
        max_frame: u64,
        start: Instant,
    ) -> Result<(), LiveError> {
        if let Ok(mut a) = out.agents.write() {
            a[dead as usize] = None;
        }
        let lost: Vec<u32> = (0..home.len() as u32)
            .filter(|&a| home[a as usize] == dead)
            .collect();
        for &a in &lost {
            host.set_route(ActorId(a), Route::Gone);
        }
        for &a in &lost {
            let mut load = vec![0usize; alive.len()];
            for &h in home.iter() {
                load[h as usize] += 1;
            }
            let Some(target) = (1..alive.len())
                .filter(|&k| alive[k])
                .min_by_key(|&k| (load[k], k))
            else {
                return Err(LiveError::Actor(format!(
                    "actor {a} was lost with node {dead} and no node is left to take it"
                )));
            };
            let target = target as u16;
            let spec = specs
                .get(&a)
                .map(|s| s.1.clone())
                .ok_or_else(|| LiveError::Actor(format!("no spec for actor {a}")))?;
            self.frame_to(
                target,
                &Frame::Place {
                    run,
                    actors: vec![Placed { id: a, spec }],
                },
                max_frame,
            )?;
            self.await_ready(run, vec![target], max_frame, SETUP_TIMEOUT)
                .await?;
            home[a as usize] = target;
            host.set_route(ActorId(a), Route::Remote(target));
            for k in 1..alive.len() {
                if alive[k] {
                    self.frame_to(
                        k as u16,
                        &Frame::Relocate {
                            run,
                            actor: a,
                            node: target,
                            dead,
                        },
                        max_frame,
                    )?;
                }
            }
            self.timeline.push((
                start.elapsed(),
                format!(
                    "actor {a} placed again on node {target} ({})",
                    self.nodes[target as usize - 1].1
                ),
            ));
        }
        // The lost notice, to every actor of the run (all of them live now).
        for &a in &lost {
            for to in 0..home.len() as u32 {
                if let Some(n) = <S::Msg as WireMessage>::lost(ActorId(a)) {
                    host.send(ActorId(to), n);
                }
            }
        }
        Ok(())
    }
}

/// Every process idle inside and every message between live processes handled.
fn quiet(c: &[Counts], alive: &[bool]) -> bool {
    let n = c.len();
    for i in 0..n {
        if !alive[i] {
            continue;
        }
        if c[i].local_in_flight != 0 {
            return false;
        }
        for j in 0..n {
            if i == j || !alive[j] {
                continue;
            }
            let sent = c[i].sent_to.get(j).copied().unwrap_or(0);
            let handled = c[j].handled_from.get(i).copied().unwrap_or(0);
            if sent != handled {
                return false;
            }
        }
    }
    true
}

/// Serves runs as a `meshsim node` until the process is killed: `listen` (loopback unless
/// told otherwise), `cookie`, frames of at most `max_frame` bytes, and actors built by
/// `build` for the systems it knows.
pub async fn serve(
    listen: SocketAddr,
    cookie: String,
    max_frame: u64,
    limits: NodeLimits,
    build: fn(&str) -> Option<NodeRunFn>,
) -> Result<(), String> {
    let mut net = Net::start(listen, cookie, max_frame).await?;
    tracing::info!(
        "meshsim node {:016x} listening at {} (frames up to {} bytes)",
        net.incarnation,
        net.listen,
        max_frame
    );
    eprintln!("meshsim node listening at {}", net.listen);
    loop {
        tokio::select! {
            m = net.frames.recv() => {
                let Some(m) = m else { return Ok(()) };
                let b = match m {
                    AgentMsg::Frame(b) => b,
                    AgentMsg::Bad(why) => {
                        tracing::warn!("dropping a message that is not a frame: {why}");
                        continue;
                    }
                };
                match decode_frame(&b, max_frame) {
                    Ok((sender, Frame::Hello { nonce })) => {
                        if let Some(to) = Net::agent_of(sender) {
                            let ack = Frame::HelloAck { nonce, listen: net.listen.to_string(), max_frame, busy_with: None };
                            let _ = send_frame(&to, net.incarnation, &ack, max_frame);
                        }
                    }
                    Ok((sender, Frame::Setup(setup))) => {
                        let Some(run_fn) = build(&setup.system) else {
                            if let Some(to) = Net::agent_of(sender) {
                                let r = Frame::Ready { run: setup.run, node: setup.node, error: Some(format!("this node does not know the system {:?}", setup.system)) };
                                let _ = send_frame(&to, net.incarnation, &r, max_frame);
                            }
                            continue;
                        };
                        tracing::info!("run {:016x}: node {} of {}", setup.run, setup.node, setup.nodes.len() - 1);
                        let r = run_fn(&mut net, sender, setup, limits).await;
                        if let Err(e) = r {
                            tracing::warn!("the run ended with an error: {e}");
                        }
                    }
                    Ok((_, f)) => tracing::debug!("ignoring {f:?} outside a run"),
                    Err(e) => reject(&net, sender_of(&b), &e).await,
                }
            }
            ev = net.sessions.recv() => {
                if ev.is_none() { return Ok(()); }
            }
        }
    }
}

/// The sender's incarnation in a frame's header, if the header is there.
fn sender_of(b: &[u8]) -> Option<u64> {
    let s: [u8; 8] = b.get(6..14)?.try_into().ok()?;
    Some(u64::from_le_bytes(s))
}

/// Logs a malformed frame and closes the connection of the process it names.
async fn reject(net: &Net, sender: Option<u64>, e: &WireError) {
    tracing::warn!("dropping a malformed frame: {e}");
    if let Some(node_id) = sender.and_then(Net::agent_of).map(|a| a.get_id().node()) {
        net.disconnect(node_id, &format!("malformed frame: {e}"))
            .await;
    }
}

/// A node's run of one system, from its `Setup` to its `End`.
pub type NodeRunFn = for<'a> fn(
    &'a mut Net,
    u64,
    Setup,
    NodeLimits,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(), String>> + 'a>,
>;

/// Runs system `S`'s part of a run on this node (see the module doc).
pub async fn node_run<S: System>(
    net: &mut Net,
    coordinator: u64,
    setup: Setup,
    limits: NodeLimits,
) -> Result<(), String> {
    let run = setup.run;
    let me = setup.node;
    let limit = setup.max_frame.min(net.max_frame);
    let Some(coord) = Net::agent_of(coordinator) else {
        return Err("the coordinator's agent is not visible".into());
    };
    let inc = net.incarnation;
    let tell = |f: &Frame| {
        let _ = send_frame(&coord, inc, f, limit);
    };
    // Reach every other node of the run: dial those before us, wait for those after.
    let procs = setup.nodes.len();
    let mut agents: Vec<Option<ActorRef<AgentMsg>>> = vec![None; procs];
    agents[0] = Some(coord.clone());
    for k in 1..procs {
        if k == me as usize {
            continue;
        }
        let (their, addr) = &setup.nodes[k];
        match net.reach(addr, *their, k < me as usize).await {
            Ok(a) => agents[k] = Some(a),
            Err(e) => {
                tell(&Frame::Ready {
                    run,
                    node: me,
                    error: Some(e.clone()),
                });
                return Err(e);
            }
        }
    }
    let coord_node = coord.get_id().node();
    let node_ids: Vec<Option<u64>> = agents
        .iter()
        .map(|a| a.as_ref().map(|a| a.get_id().node()))
        .collect();
    let out = Arc::new(ClusterOut {
        incarnation: net.incarnation,
        run,
        me,
        max_frame: limit,
        agents: RwLock::new(agents),
    });
    let routes: Vec<Route<S::Msg>> = setup.home.iter().map(|&h| Route::Remote(h)).collect();
    let outbound: Arc<dyn Outbound<S::Msg>> = out.clone();
    let mut host = LocalHost::new(procs, routes, setup.seed, Some(outbound));
    tell(&Frame::Ready {
        run,
        node: me,
        error: None,
    });
    let mut reported_failure = false;
    let result = loop {
        if !reported_failure && let Some(e) = host.failure() {
            tell(&Frame::Failed {
                run,
                node: me,
                error: e,
            });
            reported_failure = true;
        }
        let m = tokio::select! {
            m = net.frames.recv() => m,
            ev = net.sessions.recv() => {
                match ev {
                    Some(SessionEvent::Down { node_id, .. }) if node_id == coord_node => {
                        break Err("the coordinator is gone; dropping the run".to_string());
                    }
                    Some(SessionEvent::Down { node_id, .. }) => {
                        if let Some(k) = node_ids.iter().position(|n| *n == Some(node_id))
                            && let Ok(mut a) = out.agents.write()
                        {
                            a[k] = None;
                        }
                        continue;
                    }
                    None => break Ok(()),
                }
            }
            _ = host.changed(Duration::from_millis(50)) => continue,
        };
        let Some(m) = m else { break Ok(()) };
        let b = match m {
            AgentMsg::Frame(b) => b,
            AgentMsg::Bad(why) => {
                tracing::warn!("dropping a message that is not a frame: {why}");
                continue;
            }
        };
        let (sender, f) = match decode_frame(&b, limit) {
            Ok(x) => x,
            Err(e) => {
                reject(net, sender_of(&b), &e).await;
                continue;
            }
        };
        match f {
            Frame::Deliver {
                run: r,
                from_node,
                to,
                msg,
            } if r == run => match S::Msg::decode(&msg) {
                Ok(m) => {
                    if let Err(e) = host.deliver_remote(ActorId(to), m, from_node) {
                        tell(&Frame::Failed {
                            run,
                            node: me,
                            error: e,
                        });
                    }
                }
                Err(e) => {
                    let e = WireError::Malformed(format!("a message for actor {to}: {e}"));
                    reject(net, Some(sender), &e).await;
                }
            },
            Frame::Place { run: r, actors } if r == run => {
                let mut error = None;
                for Placed { id, spec } in actors {
                    if id as usize >= setup.home.len() {
                        error = Some(format!("actor {id} is not of this run"));
                        break;
                    }
                    match S::build(&spec, limits.max_memory) {
                        Ok(a) => {
                            if let Err(e) = host.add(ActorId(id), a).await {
                                error = Some(e.to_string());
                                break;
                            }
                        }
                        Err(e) => {
                            error = Some(format!("actor {id}: {e}"));
                            break;
                        }
                    }
                }
                tell(&Frame::Ready {
                    run,
                    node: me,
                    error,
                });
            }
            Frame::Go { run: r } if r == run => {
                tracing::info!("run {run:016x}: actors started");
                host.start();
                // The Go is counted as a message from the coordinator, handled now.
                host.shared_count_handled(0);
            }
            Frame::Relocate {
                run: r,
                actor,
                node,
                dead,
            } if r == run => {
                if let Ok(mut a) = out.agents.write()
                    && let Some(slot) = a.get_mut(dead as usize)
                {
                    *slot = None;
                }
                if node == me {
                    // Placed here: its route became local when it was added.
                } else {
                    host.set_route(ActorId(actor), Route::Remote(node));
                }
            }
            Frame::Poll { run: r, wave } if r == run => {
                tell(&Frame::Counts {
                    run,
                    wave,
                    node: me,
                    counts: host.counts(),
                });
            }
            Frame::ReportAsk { run: r } if r == run => {
                let report = host.report().await.unwrap_or_else(|e| Report {
                    violations: vec![e.to_string()],
                    ..Report::default()
                });
                let totals = host.totals();
                tell(&Frame::ReportReply {
                    run,
                    node: me,
                    report,
                    totals,
                });
            }
            Frame::End { run: r } if r == run => {
                host.stop().await;
                tell(&Frame::Ready {
                    run,
                    node: me,
                    error: None,
                });
                return Ok(());
            }
            Frame::Hello { nonce } => {
                if let Some(to) = Net::agent_of(sender) {
                    let ack = Frame::HelloAck {
                        nonce,
                        listen: net.listen.to_string(),
                        max_frame: net.max_frame,
                        busy_with: Some(run),
                    };
                    let _ = send_frame(&to, net.incarnation, &ack, limit);
                }
            }
            other => tracing::debug!("ignoring {other:?} during run {run:016x}"),
        }
    };
    host.stop().await;
    result
}

/// Connects to the node at `addr` with `cookie` as a peer would and sends it `frames` as
/// they are (for tests of a node's defences against malformed frames).
#[doc(hidden)]
pub async fn send_raw_frames(
    addr: &str,
    cookie: String,
    frames: Vec<Vec<u8>>,
) -> Result<(), String> {
    let here: SocketAddr = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
    let mut net = Net::start(here, cookie, 1 << 20).await?;
    let (_, agent) = net.dial(addr).await?;
    for mut f in frames {
        // Frames with a header name this peer as their sender, as a real peer's would.
        if f.len() >= 14 && f[..4] == super::wire::MAGIC {
            f[6..14].copy_from_slice(&net.incarnation.to_le_bytes());
        }
        let _ = agent.cast(AgentMsg::Frame(f));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    net.shutdown().await;
    Ok(())
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

/// Whether `ip` is a loopback address (a node listens on one unless told otherwise).
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}
