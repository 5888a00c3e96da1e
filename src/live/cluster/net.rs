//! A process's place in a cluster: its `ractor_cluster` node server, its agent, the
//! cookie, and sending frames to other processes' agents.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use ractor::{ActorProcessingErr, ActorRef};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{NodeEventSubscription, NodeServer, NodeServerMessage};
use tokio::sync::mpsc;

use super::*;
use crate::actor::ActorId;
use crate::live::host::Outbound;
use crate::live::wire::{FRAME_OVERHEAD, Frame, WireError, WireMessage, encode_frame};

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
pub(super) enum SessionEvent {
    Down {
        node_id: u64,
        peer_addr: String,
        authenticated: bool,
    },
}

struct Subscription {
    pub(super) tx: mpsc::UnboundedSender<SessionEvent>,
    pub(super) authenticated: Mutex<HashSet<u64>>,
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
    pub(super) server: ActorRef<NodeServerMessage>,
    pub(super) agent: ActorRef<AgentMsg>,
    pub(super) frames: mpsc::Receiver<AgentMsg>,
    pub(super) sessions: mpsc::UnboundedReceiver<SessionEvent>,
    /// The address it listens at.
    pub listen: SocketAddr,
    /// Largest inbound frame its node server accepts.
    pub max_frame: u64,
}

/// Reads a cookie file: its first line, which must not be empty. On Unix the file must not
/// be readable by others than its owner's group (as ssh demands of keys).
pub fn read_cookie(path: &std::path::Path) -> Result<String, String> {
    let text = crate::text::read_capped_string(path, crate::text::MAX_CONFIG_BYTES)
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
    pub(super) fn agent_of(inc: u64) -> Option<ActorRef<AgentMsg>> {
        ractor::pg::get_members(&group_of(inc))
            .into_iter()
            .find(|c| !c.get_id().is_local())
            .map(ActorRef::from)
    }

    pub(super) async fn sessions_info(&self) -> HashMap<u64, NodeServerSessionInformation> {
        ractor::call_t!(self.server, NodeServerMessage::GetSessions, 2000).unwrap_or_default()
    }

    /// Opens a connection to the node at `addr` (authentication follows); its address.
    pub(super) async fn connect(&self, addr: &str) -> Result<SocketAddr, String> {
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
        Ok(sa)
    }

    /// Connects to the node at `addr` and waits for its agent: `(node id, agent)`.
    pub(super) async fn dial(&mut self, addr: &str) -> Result<(u64, ActorRef<AgentMsg>), String> {
        let sa = self.connect(addr).await?;
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
                        "node {addr} closed the connection during authentication: either it \
                         is not a `meshsim node`, or its cookie differs from ours"
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
                    "node {addr} did not authenticate within {} s: either it is not a \
                     `meshsim node` (another program listens there), or its cookie differs \
                     from ours",
                    CONNECT_TIMEOUT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Connects to `addr` (if `dial`) and waits for the agent of incarnation `inc`.
    pub(super) async fn reach(
        &mut self,
        addr: &str,
        inc: u64,
        dial: bool,
    ) -> Result<ActorRef<AgentMsg>, String> {
        if let Some(a) = Net::agent_of(inc) {
            return Ok(a);
        }
        if dial {
            self.connect(addr).await?;
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
    pub(super) async fn disconnect(&self, node_id: u64, why: &str) {
        if let Some(s) = self.sessions_info().await.get(&node_id) {
            tracing::warn!("closing the connection to {}: {why}", s.peer_addr);
            s.actor.stop(Some(why.to_string()));
        }
    }
}

/// A connection error in words (ractor_cluster's own Display is its Debug).
pub(super) fn connect_error(e: ractor_cluster::ClientConnectErr) -> String {
    match e {
        ractor_cluster::ClientConnectErr::Socket(io)
        | ractor_cluster::ClientConnectErr::Encryption(io) => io.to_string(),
        other => other.to_string(),
    }
}

pub(super) fn send_frame(
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
pub(super) struct ClusterOut {
    pub(super) incarnation: u64,
    pub(super) run: u64,
    pub(super) me: u16,
    pub(super) max_frame: u64,
    pub(super) agents: RwLock<Vec<Option<ActorRef<AgentMsg>>>>,
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
        if f.len() >= 14 && f[..4] == crate::live::wire::MAGIC {
            f[6..14].copy_from_slice(&net.incarnation.to_le_bytes());
        }
        let _ = agent.cast(AgentMsg::Frame(f));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    net.shutdown().await;
    Ok(())
}
