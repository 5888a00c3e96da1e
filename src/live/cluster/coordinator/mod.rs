//! The coordinator of a run across processes: it sets the run up on its nodes, hosts its
//! own actors, detects the end of the run in waves, and places a lost node's actors again.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ractor::ActorRef;

use super::net::*;
use super::*;
use crate::actor::ActorId;
use crate::live::LiveError;
use crate::live::host::{LiveOutcome, LocalHost, Outbound, Route};
use crate::live::wire::{Counts, Frame, Placed, Setup, WireMessage, decode_frame};
use crate::metrics::Report;

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
    pub(super) async fn greet(
        net: &mut Net,
        addrs: &[String],
        max_frame: u64,
    ) -> Result<Vec<(u64, String, ActorRef<AgentMsg>, u64)>, LiveError> {
        let cfg = |e: String| LiveError::Config(e);
        let mut nodes = Vec::new();
        for addr in addrs {
            let (_, agent) = net.dial(addr).await.map_err(cfg)?;
            // A node still busy with the run of a coordinator that is gone drops it once it
            // sees that coordinator's connection close: ask again for a while before refusing.
            let busy_until = Instant::now() + BUSY_GRACE;
            let mut asked = 0u64;
            let (inc, theirs) = loop {
                let nonce = net.incarnation ^ ((nodes.len() as u64) << 32) ^ asked;
                asked += 1;
                let (inc, theirs, busy) =
                    Coordinator::hello(net, addr, &agent, nonce, max_frame).await?;
                match busy {
                    None => break (inc, theirs),
                    Some(_) if Instant::now() < busy_until => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Some(run) => {
                        return Err(cfg(format!(
                            "node {addr} is busy with run {run:016x} of another coordinator \
                             (still after {} s)",
                            BUSY_GRACE.as_secs()
                        )));
                    }
                }
            };
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

    /// Says `Hello` to the node at `addr` and waits for its answer: `(incarnation, frame
    /// limit, the run it is busy with)`.
    async fn hello(
        net: &mut Net,
        addr: &str,
        agent: &ActorRef<AgentMsg>,
        nonce: u64,
        max_frame: u64,
    ) -> Result<(u64, u64, Option<u64>), LiveError> {
        let cfg = |e: String| LiveError::Config(e);
        send_frame(agent, net.incarnation, &Frame::Hello { nonce }, max_frame)
            .map_err(|e| cfg(e.to_string()))?;
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
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
                )) if n == nonce => return Ok((inc, theirs, busy_with)),
                Ok(_) => continue,
                Err(e) => tracing::warn!("a malformed frame from node {addr}: {e}"),
            }
        }
    }

    /// Node addresses, in order (node 1 first).
    pub fn addresses(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.1.clone()).collect()
    }

    pub async fn shutdown(&self) {
        self.net.shutdown().await;
    }

    pub(super) fn frame_to(&self, node: u16, f: &Frame, limit: u64) -> Result<(), LiveError> {
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
        if let Err(e) = self
            .await_ready(
                run,
                live,
                max_frame,
                END_TIMEOUT,
                None::<&LocalHost<S::Msg>>,
            )
            .await
        {
            tracing::warn!("ending the run: {e}");
        }
        result
    }

    /// Waits for a `Ready` from every node of `from`. Actor messages that come meanwhile
    /// (while an actor is placed again, the others go on) are delivered to `host`.
    pub(super) async fn await_ready<M: WireMessage>(
        &mut self,
        run: u64,
        from: Vec<u16>,
        max_frame: u64,
        timeout: Duration,
        host: Option<&LocalHost<M>>,
    ) -> Result<(), LiveError> {
        let mut waiting: HashSet<u16> = from.into_iter().collect();
        let deadline = Instant::now() + timeout;
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = tokio::select! {
                m = self.net.frames.recv() => m,
                ev = self.net.sessions.recv() => {
                    if let Some(SessionEvent::Down { peer_addr, .. }) = ev {
                        return Err(LiveError::Actor(format!(
                            "the connection to {peer_addr} closed while the run was set up"
                        )));
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
                Ok((
                    _,
                    Frame::Deliver {
                        run: r,
                        from_node,
                        to,
                        msg,
                    },
                )) if r == run => {
                    let Some(host) = host else {
                        tracing::warn!("an actor message before the actors started, dropped");
                        continue;
                    };
                    let m = M::decode(&msg).map_err(|e| {
                        LiveError::Actor(format!("a message from node {from_node}: {e}"))
                    })?;
                    host.deliver_remote(ActorId(to), m, from_node)
                        .map_err(LiveError::Actor)?;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("dropping a malformed frame: {e}"),
            }
        }
        Ok(())
    }

    /// Places the actors of lost node `dead` again and tells everyone.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn replace<S: System>(
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
            self.await_ready(run, vec![target], max_frame, SETUP_TIMEOUT, Some(host))
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
pub(super) fn quiet(c: &[Counts], alive: &[bool]) -> bool {
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

mod waves;
