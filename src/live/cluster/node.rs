//! `meshsim node`: serving runs, one after another, as one of their processes.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ractor::ActorRef;

use super::net::*;
use super::*;
use crate::actor::ActorId;
use crate::live::host::{LocalHost, Outbound, Route};
use crate::live::wire::{Frame, Placed, Setup, WireError, WireMessage, decode_frame};
use crate::metrics::Report;

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
                            let ack = Frame::HelloAck {
                                nonce,
                                listen: net.listen.to_string(),
                                max_frame,
                                busy_with: None,
                            };
                            let _ = send_frame(&to, net.incarnation, &ack, max_frame);
                        }
                    }
                    Ok((sender, Frame::Setup(setup))) => {
                        let Some(run_fn) = build(&setup.system) else {
                            if let Some(to) = Net::agent_of(sender) {
                                let error = format!(
                                    "this node does not know the system {:?}",
                                    setup.system
                                );
                                let r = Frame::Ready {
                                    run: setup.run,
                                    node: setup.node,
                                    error: Some(error),
                                };
                                let _ = send_frame(&to, net.incarnation, &r, max_frame);
                            }
                            continue;
                        };
                        tracing::info!(
                            "run {:016x}: node {} of {}",
                            setup.run,
                            setup.node,
                            setup.nodes.len() - 1
                        );
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
pub(super) fn sender_of(b: &[u8]) -> Option<u64> {
    let s: [u8; 8] = b.get(6..14)?.try_into().ok()?;
    Some(u64::from_le_bytes(s))
}

/// Logs a malformed frame and closes the connection of the process it names.
pub(super) async fn reject(net: &Net, sender: Option<u64>, e: &WireError) {
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
    let limit = setup.max_frame.min(net.max_frame);
    let Some(agent) = Net::agent_of(coordinator) else {
        return Err("the coordinator's agent is not visible".into());
    };
    let coord = ToCoordinator {
        agent,
        incarnation: net.incarnation,
        limit,
    };
    let r = NodeRun::<S>::join(net, coord, setup, limits).await?;
    r.serve_run(net).await
}

/// The way from a node's run to its coordinator, and the run's frame limit.
struct ToCoordinator {
    agent: ActorRef<AgentMsg>,
    incarnation: u64,
    limit: u64,
}

impl ToCoordinator {
    /// Sends `f` to the coordinator, logging (not failing on) a frame that cannot be sent,
    /// since the coordinator's loss shows on its connection anyway.
    fn tell(&self, f: &Frame) {
        if let Err(e) = send_frame(&self.agent, self.incarnation, f, self.limit) {
            tracing::warn!("a frame to the coordinator: {e}");
        }
    }
}

/// What woke a node's loop during a run.
enum Event {
    /// A message for the agent (`None` once its channel is closed).
    Frame(Option<AgentMsg>),
    /// A change of a connection (`None` once its channel is closed).
    Session(Option<SessionEvent>),
    /// Something changed in the host (or time passed): a failure to report, maybe.
    Changed,
}

/// What a node's loop does after a handler.
enum Step {
    /// Go on serving the run.
    Next,
    /// Leave the run with this result (its actors still to stop).
    Leave(Result<(), String>),
    /// The coordinator ended the run.
    End,
}

/// System `S`'s part of one run on this node, from its `Setup` to its `End`, which the
/// handlers of its loop share.
struct NodeRun<S: System> {
    run: u64,
    me: u16,
    coord: ToCoordinator,
    /// The coordinator's node id: its loss ends the run here.
    coord_node: u64,
    /// The node id of every process of the run, by index (`None` for this one).
    node_ids: Vec<Option<u64>>,
    /// How many actors the run has.
    actors: usize,
    limits: NodeLimits,
    out: Arc<ClusterOut>,
    reads: Arc<Reads>,
    shared: S::Shared,
    host: LocalHost<S::Msg>,
    /// Whether the coordinator was told of the host's failure.
    reported_failure: bool,
}

impl<S: System> NodeRun<S> {
    /// Joins the run of `setup`: reaches every other node, makes the process's shared state
    /// and host, and says `Ready` to the coordinator, or says why it cannot and leaves.
    async fn join(
        net: &mut Net,
        coord: ToCoordinator,
        setup: Setup,
        limits: NodeLimits,
    ) -> Result<NodeRun<S>, String> {
        let run = setup.run;
        let me = setup.node;
        // The run cannot be set up here: say why, and leave it.
        let refuse = |e: String| {
            coord.tell(&Frame::Ready {
                run,
                node: me,
                error: Some(e.clone()),
            });
            e
        };
        // Reach every other node of the run: dial those before us, wait for those after.
        let procs = setup.nodes.len();
        let mut agents: Vec<Option<ActorRef<AgentMsg>>> = vec![None; procs];
        agents[0] = Some(coord.agent.clone());
        for k in 1..procs {
            if k == me as usize {
                continue;
            }
            let (their, addr) = &setup.nodes[k];
            match net.reach(addr, *their, k < me as usize).await {
                Ok(a) => agents[k] = Some(a),
                Err(e) => return Err(refuse(e)),
            }
        }
        let coord_node = coord.agent.get_id().node();
        let node_ids: Vec<Option<u64>> = agents
            .iter()
            .map(|a| a.as_ref().map(|a| a.get_id().node()))
            .collect();
        let out = Arc::new(ClusterOut {
            incarnation: net.incarnation,
            run,
            me,
            max_frame: coord.limit,
            agents: RwLock::new(agents),
        });
        let reads = Reads::new(out.clone());
        let shared = match S::shared(&setup, limits.max_memory, reads.clone()) {
            Ok(s) => s,
            Err(e) => return Err(refuse(e)),
        };
        let routes: Vec<Route<S::Msg>> = setup.home.iter().map(|&h| Route::Remote(h)).collect();
        let outbound: Arc<dyn Outbound<S::Msg>> = out.clone();
        let host = LocalHost::new(procs, routes, setup.seed, Some(outbound));
        coord.tell(&Frame::Ready {
            run,
            node: me,
            error: None,
        });
        Ok(NodeRun {
            run,
            me,
            coord,
            coord_node,
            node_ids,
            actors: setup.home.len(),
            limits,
            out,
            reads,
            shared,
            host,
            reported_failure: false,
        })
    }

    /// Serves the run until its `End`, the coordinator's loss or the end of the process,
    /// handing each event to its handler; the actors are stopped whichever way it ends.
    async fn serve_run(mut self, net: &mut Net) -> Result<(), String> {
        let result = loop {
            self.report_failure();
            let step = match self.next_event(net).await {
                Event::Frame(m) => self.on_message(net, m).await,
                Event::Session(ev) => self.on_session(ev),
                Event::Changed => Step::Next,
            };
            match step {
                Step::Next => {}
                Step::Leave(r) => break r,
                Step::End => return self.end().await,
            }
        };
        self.host.stop().await;
        result
    }

    /// Tells the coordinator of the host's first failure, once, so that it ends the run.
    fn report_failure(&mut self) {
        if !self.reported_failure
            && let Some(e) = self.host.failure()
        {
            self.coord.tell(&Frame::Failed {
                run: self.run,
                node: self.me,
                error: e,
            });
            self.reported_failure = true;
        }
    }

    /// Waits for a frame, a change of a connection or of the host (at most 50 ms, so that
    /// a failure is reported soon).
    async fn next_event(&self, net: &mut Net) -> Event {
        tokio::select! {
            m = net.frames.recv() => Event::Frame(m),
            ev = net.sessions.recv() => Event::Session(ev),
            _ = self.host.changed(Duration::from_millis(50)) => Event::Changed,
        }
    }

    /// Handles a closed connection: the coordinator's ends the run here; another node's
    /// means its messages and reads are lost from now on.
    fn on_session(&self, ev: Option<SessionEvent>) -> Step {
        match ev {
            Some(SessionEvent::Down { node_id, .. }) if node_id == self.coord_node => {
                Step::Leave(Err("the coordinator is gone; dropping the run".to_string()))
            }
            Some(SessionEvent::Down { node_id, .. }) => {
                if let Some(k) = self.node_ids.iter().position(|n| *n == Some(node_id)) {
                    if let Ok(mut a) = self.out.agents.write() {
                        a[k] = None;
                    }
                    self.reads.lost(k as u16);
                }
                Step::Next
            }
            None => Step::Leave(Ok(())),
        }
    }

    /// Decodes a message for the agent and hands its frame on; a message that is not a
    /// frame is dropped, and a malformed frame closes the connection of its sender.
    async fn on_message(&mut self, net: &Net, m: Option<AgentMsg>) -> Step {
        let Some(m) = m else {
            return Step::Leave(Ok(()));
        };
        let b = match m {
            AgentMsg::Frame(b) => b,
            AgentMsg::Bad(why) => {
                tracing::warn!("dropping a message that is not a frame: {why}");
                return Step::Next;
            }
        };
        match decode_frame(&b, self.coord.limit) {
            Ok((sender, f)) => self.on_frame(net, sender, f).await,
            Err(e) => {
                reject(net, sender_of(&b), &e).await;
                Step::Next
            }
        }
    }

    /// Handles one frame of the run from process `sender`, each kind by its own handler;
    /// frames of other runs are ignored.
    async fn on_frame(&mut self, net: &Net, sender: u64, f: Frame) -> Step {
        let run = self.run;
        match f {
            Frame::Deliver {
                run: r,
                from_node,
                to,
                msg,
            } if r == run => self.on_deliver(net, sender, from_node, to, &msg).await,
            Frame::Place { run: r, actors } if r == run => self.on_place(actors).await,
            Frame::Go { run: r } if r == run => {
                tracing::info!("run {run:016x}: actors started");
                self.host.start();
                // The Go is counted as a message from the coordinator, handled now.
                self.host.shared_count_handled(0);
            }
            Frame::Relocate {
                run: r,
                actor,
                node,
                dead,
            } if r == run => self.on_relocate(actor, node, dead),
            Frame::Read { run: r, seq, key } if r == run => self.on_read(net, sender, seq, &key),
            Frame::ReadReply { run: r, seq, data } if r == run => self.reads.answer(seq, data),
            Frame::Poll { run: r, wave } if r == run => {
                self.coord.tell(&Frame::Counts {
                    run,
                    wave,
                    node: self.me,
                    counts: self.host.counts(),
                });
            }
            Frame::ReportAsk { run: r } if r == run => self.on_report_ask().await,
            Frame::End { run: r } if r == run => return Step::End,
            Frame::Hello { nonce } => self.on_hello(net, sender, nonce),
            other => tracing::debug!("ignoring {other:?} during run {run:016x}"),
        }
        Step::Next
    }

    /// Delivers an actor message from node `from_node` to local actor `to`: one that cannot
    /// be decoded closes the connection of `sender`, one that cannot be delivered fails the
    /// run.
    async fn on_deliver(&self, net: &Net, sender: u64, from_node: u16, to: u32, msg: &[u8]) {
        match S::Msg::decode(msg) {
            Ok(m) => {
                if let Err(e) = self.host.deliver_remote(ActorId(to), m, from_node) {
                    self.coord.tell(&Frame::Failed {
                        run: self.run,
                        node: self.me,
                        error: e,
                    });
                }
            }
            Err(e) => {
                let e = WireError::Malformed(format!("a message for actor {to}: {e}"));
                reject(net, Some(sender), &e).await;
            }
        }
    }

    /// Builds and adds the actors the coordinator places here, then says `Ready` (with the
    /// first error, if one could not be placed).
    async fn on_place(&mut self, actors: Vec<Placed>) {
        let mut error = None;
        for Placed { id, spec } in actors {
            if id as usize >= self.actors {
                error = Some(format!("actor {id} is not of this run"));
                break;
            }
            match S::build(&spec, self.limits.max_memory, &self.shared) {
                Ok(a) => {
                    if let Err(e) = self.host.add(ActorId(id), a).await {
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
        self.coord.tell(&Frame::Ready {
            run: self.run,
            node: self.me,
            error,
        });
    }

    /// Routes actor `actor` to its new home, node `node`, after node `dead` was lost.
    fn on_relocate(&self, actor: u32, node: u16, dead: u16) {
        if let Ok(mut a) = self.out.agents.write()
            && let Some(slot) = a.get_mut(dead as usize)
        {
            *slot = None;
        }
        if node == self.me {
            // Placed here: its route became local when it was added.
        } else {
            self.host.set_route(ActorId(actor), Route::Remote(node));
        }
    }

    /// Answers a one-sided read of this process's memory from process `sender`.
    fn on_read(&self, net: &Net, sender: u64, seq: u64, key: &[u8]) {
        let data = S::read(&self.shared, key);
        if let Some(to) = Net::agent_of(sender) {
            let f = Frame::ReadReply {
                run: self.run,
                seq,
                data,
            };
            if let Err(e) = send_frame(&to, net.incarnation, &f, self.coord.limit) {
                tracing::warn!("answering read {seq}: {e}");
            }
        }
    }

    /// Sends the coordinator the report of this node's actors, in parts that fit the frame
    /// limit, with the totals in the last.
    async fn on_report_ask(&self) {
        let report = self.host.report().await.unwrap_or_else(|e| Report {
            violations: vec![e.to_string()],
            ..Report::default()
        });
        let mut totals = self.host.totals();
        totals[5] = self.reads.payload_bytes();
        // In parts that fit the frame limit (per-request outputs and logits add up).
        let parts = report_parts(report, self.coord.limit / 2);
        let n = parts.len();
        for (i, report) in parts.into_iter().enumerate() {
            self.coord.tell(&Frame::ReportReply {
                run: self.run,
                node: self.me,
                report,
                totals: if i + 1 == n { totals } else { [0; 6] },
                more: i + 1 < n,
            });
        }
    }

    /// Answers a coordinator's `Hello` during the run: this node is busy with it.
    fn on_hello(&self, net: &Net, sender: u64, nonce: u64) {
        if let Some(to) = Net::agent_of(sender) {
            let ack = Frame::HelloAck {
                nonce,
                listen: net.listen.to_string(),
                max_frame: net.max_frame,
                busy_with: Some(self.run),
            };
            let _ = send_frame(&to, net.incarnation, &ack, self.coord.limit);
        }
    }

    /// Ends the run on the coordinator's `End`: stops the actors, then says `Ready`, so
    /// that the coordinator knows the run is dropped here.
    async fn end(self) -> Result<(), String> {
        self.host.stop().await;
        self.coord.tell(&Frame::Ready {
            run: self.run,
            node: self.me,
            error: None,
        });
        Ok(())
    }
}

/// `report` in parts of about `budget` bytes each: the first holds everything but the
/// per-request outputs and first-token logits, which follow in as many parts as they need
/// (merging the parts gives `report` back).
pub(super) fn report_parts(mut report: Report, budget: u64) -> Vec<Report> {
    let budget = budget.max(1 << 16);
    let outputs = std::mem::take(&mut report.outputs);
    let logits = std::mem::take(&mut report.first_logits);
    let mut parts = vec![report];
    let mut part = Report::default();
    let mut size = 0u64;
    // Starts a new part before `add` bytes that would take this one over the budget.
    let mut room = |part: &mut Report, add: u64, parts: &mut Vec<Report>| {
        if size > 0 && size + add > budget {
            parts.push(std::mem::take(part));
            size = 0;
        }
        size += add;
    };
    for o in outputs {
        room(&mut part, 16 + 4 * o.1.len() as u64, &mut parts);
        part.outputs.push(o);
    }
    for l in logits {
        room(&mut part, 16 + 4 * l.1.len() as u64, &mut parts);
        part.first_logits.push(l);
    }
    let size = part.outputs.len() + part.first_logits.len();
    if size > 0 {
        parts.push(part);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_in_parts_merges_back_into_itself_and_each_part_fits() {
        let r = Report {
            violations: vec!["v".into()],
            failovers: 3,
            outputs: (0..50).map(|q| (q, vec![q; 100])).collect(),
            first_logits: (0..50).map(|q| (q, vec![q as f32; 20_000])).collect(),
            ..Report::default()
        };
        let parts = report_parts(r.clone(), 1 << 18);
        assert!(parts.len() > 5, "{} parts", parts.len());
        for p in &parts {
            let b = postcard::to_allocvec(p).unwrap();
            assert!(b.len() < (1 << 18) + 100_000, "{}", b.len());
        }
        let mut back = Report::default();
        for p in parts {
            back.merge(p);
        }
        assert_eq!(back, r);
    }
}
