//! A run on the coordinator while its actors run: setting it up, starting its actors, and
//! detecting its end in waves (each live process's counts of messages sent and handled),
//! with one handler for each event of the loop (a frame, a change of a connection, a tick).

use super::*;

impl Coordinator {
    /// Sets the run up, starts its actors, waits for the end of the run in waves and
    /// gathers the reports, one step after another.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn drive<S: System>(
        &mut self,
        run: u64,
        mut placement: Placement<S::Msg>,
        seed: u64,
        max_frame: u64,
        max_wall: Duration,
        home: Vec<u16>,
        nodes_list: Vec<(u64, String)>,
        alive: &mut [bool],
        start: Instant,
    ) -> Result<LiveOutcome, LiveError> {
        let procs = alive.len();
        let specs = self
            .set_up::<S>(run, &mut placement, seed, max_frame, &home, &nodes_list)
            .await?;
        self.timeline
            .push((start.elapsed(), format!("{} node(s) set up", procs - 1)));
        let local = std::mem::take(&mut placement.local);
        let (out, host) = self
            .host_actors::<S>(run, local, seed, max_frame, &home, procs)
            .await?;
        // Go, counted as a message to each node so that the waves cannot end before it lands.
        let began = Instant::now();
        self.timeline
            .push((start.elapsed(), "actors started everywhere".into()));
        for k in 1..procs {
            self.frame_to(k as u16, &Frame::Go { run }, max_frame)?;
            host.shared_count_sent(k as u16);
        }
        host.start();
        let mut w = Waves::<S> {
            run,
            max_frame,
            max_wall,
            start,
            began,
            deadline: began + max_wall,
            nodes_list,
            specs,
            home,
            alive,
            out,
            host,
            wave: 0,
            state: Wave::Resting {
                due: Instant::now(),
            },
            last: None,
        };
        let wall = match self.until_quiet(&mut w).await? {
            Ok(wall) => wall,
            Err(e) => {
                w.host.stop().await;
                return Err(e);
            }
        };
        self.timeline.push((
            start.elapsed(),
            "every process idle, no message in flight".into(),
        ));
        self.reports(run, max_frame, w.host, w.alive, wall).await
    }

    /// Sends every node its `Setup`, then the nodes that host actors their `Place`, waiting
    /// for each round's `Ready`s so that every actor is built before any starts; the specs
    /// of the placed actors (to place a lost one again).
    async fn set_up<S: System>(
        &mut self,
        run: u64,
        placement: &mut Placement<S::Msg>,
        seed: u64,
        max_frame: u64,
        home: &[u16],
        nodes_list: &[(u64, String)],
    ) -> Result<BTreeMap<u32, (u16, Vec<u8>)>, LiveError> {
        let procs = self.nodes.len() + 1;
        for k in 1..procs {
            let setup = Setup {
                run,
                system: S::Msg::SYSTEM.into(),
                node: k as u16,
                nodes: nodes_list.to_vec(),
                home: home.to_vec(),
                seed,
                max_frame,
                shared: placement.shared.clone(),
            };
            self.frame_to(k as u16, &Frame::Setup(setup), max_frame)?;
        }
        self.await_ready(
            run,
            (1..procs).map(|k| k as u16).collect(),
            max_frame,
            SETUP_TIMEOUT,
            None::<&LocalHost<S::Msg>>,
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
            None::<&LocalHost<S::Msg>>,
        )
        .await?;
        Ok(specs)
    }

    /// Builds the host of the coordinator's own actors, `local`, with the outbound that
    /// reaches every node's agent, so that they run as the nodes' do (not started yet).
    async fn host_actors<S: System>(
        &self,
        run: u64,
        local: BTreeMap<u32, Box<dyn crate::actor::Actor<S::Msg>>>,
        seed: u64,
        max_frame: u64,
        home: &[u16],
        procs: usize,
    ) -> Result<(Arc<ClusterOut>, LocalHost<S::Msg>), LiveError> {
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
        for (id, a) in local {
            host.add(ActorId(id), a).await?;
        }
        Ok((out, host))
    }

    /// Runs the loop of the run's actors until the run is quiet or fails, dispatching each
    /// event to its handler: `Ok(Ok(wall))` when quiet, `Ok(Err(_))` when the run failed
    /// (its host still to stop), `Err(_)` when a poll could not be sent at all.
    async fn until_quiet<S: System>(
        &mut self,
        w: &mut Waves<'_, S>,
    ) -> Result<Result<Duration, LiveError>, LiveError> {
        loop {
            if let Some(e) = w.host.failure() {
                return Ok(Err(LiveError::Actor(e)));
            }
            let now = Instant::now();
            if now > w.deadline {
                return Ok(Err(LiveError::Actor(format!(
                    "the live run did not end within its wall-clock limit of {:.0} s",
                    w.max_wall.as_secs_f64()
                ))));
            }
            if matches!(w.state, Wave::Resting { due } if now >= due) {
                self.poll(w)?;
            }
            if w.all_counted() {
                match w.settle() {
                    Some(wall) => return Ok(Ok(wall)),
                    None => continue,
                }
            }
            let step = match self.next_event(w.sleep()).await {
                Event::Frame(m) => self.on_frame(w, m),
                Event::Session(ev) => self.on_session(w, ev).await,
                Event::Tick => Step::Next,
            };
            if let Step::Over(r) = step {
                return Ok(r);
            }
        }
    }

    /// Waits at most `sleep` for a frame or a change of a connection, so that the loop also
    /// wakes for its next wave.
    async fn next_event(&mut self, sleep: Duration) -> Event {
        tokio::select! {
            m = self.net.frames.recv() => Event::Frame(m),
            ev = self.net.sessions.recv() => Event::Session(ev),
            _ = tokio::time::sleep(sleep) => Event::Tick,
        }
    }

    /// Starts the next wave: this process's counts at once, a `Poll` to every live node for
    /// theirs.
    fn poll<S: System>(&self, w: &mut Waves<'_, S>) -> Result<(), LiveError> {
        w.wave += 1;
        let mut counts: Vec<Option<Counts>> = vec![None; w.alive.len()];
        counts[0] = Some(w.host.counts());
        for k in 1..w.alive.len() {
            if w.alive[k] {
                let f = Frame::Poll {
                    run: w.run,
                    wave: w.wave,
                };
                self.frame_to(k as u16, &f, w.max_frame)?;
            }
        }
        w.state = Wave::Polling(counts);
        Ok(())
    }

    /// Handles a frame while the actors run: a node's counts for this wave, its failure, a
    /// message for an actor here, or a read of this process's memory (which holds none).
    fn on_frame<S: System>(&self, w: &mut Waves<'_, S>, m: Option<AgentMsg>) -> Step {
        let Some(AgentMsg::Frame(b)) = m else {
            return Step::Next;
        };
        let run = w.run;
        match decode_frame(&b, w.max_frame) {
            Ok((
                _,
                Frame::Counts {
                    run: r,
                    wave,
                    node,
                    counts,
                },
            )) if r == run && wave == w.wave => {
                if let Wave::Polling(p) = &mut w.state
                    && let Some(slot) = p.get_mut(node as usize)
                {
                    *slot = Some(counts);
                }
            }
            Ok((
                _,
                Frame::Failed {
                    run: r,
                    node,
                    error,
                },
            )) if r == run => {
                let addr = w
                    .nodes_list
                    .get(node as usize)
                    .map(|n| n.1.as_str())
                    .unwrap_or("?");
                let e = format!("node {node} ({addr}): {error}");
                return Step::Over(Err(LiveError::Actor(e)));
            }
            Ok((
                _,
                Frame::Deliver {
                    run: r,
                    from_node,
                    to,
                    msg,
                },
            )) if r == run => return w.deliver(from_node, to, &msg),
            Ok((sender, Frame::Read { run: r, seq, .. })) if r == run => {
                // The coordinator's actors hold no memory that others read.
                if let Some(to) = Net::agent_of(sender) {
                    let f = Frame::ReadReply {
                        run,
                        seq,
                        data: None,
                    };
                    let _ = send_frame(&to, self.net.incarnation, &f, w.max_frame);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("dropping a malformed frame: {e}"),
        }
        Step::Next
    }

    /// Handles a closed connection: a live node's means it is lost, so its actors are placed
    /// again and the wave under way (whose counts are no longer comparable) starts over.
    async fn on_session<S: System>(
        &mut self,
        w: &mut Waves<'_, S>,
        ev: Option<SessionEvent>,
    ) -> Step {
        let Some(SessionEvent::Down { node_id, .. }) = ev else {
            return Step::Next;
        };
        let Some(k) = (1..w.alive.len())
            .find(|&k| w.alive[k] && self.nodes[k - 1].2.get_id().node() == node_id)
        else {
            return Step::Next;
        };
        w.alive[k] = false;
        self.timeline.push((
            w.start.elapsed(),
            format!(
                "node {k} ({}) lost: its connection closed",
                w.nodes_list[k].1
            ),
        ));
        if let Err(e) = self
            .replace::<S>(
                w.run,
                k as u16,
                &w.specs,
                &mut w.home,
                w.alive,
                &w.out,
                &w.host,
                w.max_frame,
                w.start,
            )
            .await
        {
            return Step::Over(Err(e));
        }
        if let Wave::Polling(_) = w.state {
            w.state = Wave::Resting {
                due: Instant::now(),
            };
        }
        w.last = None;
        Step::Next
    }

    /// Gathers the report of `host` (which it stops) and of every live node, in parts, into
    /// the run's outcome with its wall time `wall`.
    async fn reports<M: WireMessage>(
        &mut self,
        run: u64,
        max_frame: u64,
        host: LocalHost<M>,
        alive: &[bool],
        wall: Duration,
    ) -> Result<LiveOutcome, LiveError> {
        let mut report = host.report().await?;
        // Summed over processes, place by place (see `LocalHost::totals`).
        let mut totals = host.totals();
        host.stop().await;
        let procs = alive.len();
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
                return Err(LiveError::Actor("a node did not send its report".into()));
            };
            let AgentMsg::Frame(b) = m else { continue };
            if let Ok((
                _,
                Frame::ReportReply {
                    run: r,
                    node,
                    report: part,
                    totals: theirs,
                    more,
                },
            )) = decode_frame(&b, max_frame)
                && r == run
                && waiting.contains(&node)
            {
                for (t, x) in totals.iter_mut().zip(theirs) {
                    *t += x;
                }
                parts.entry(node).or_default().merge(part);
                if !more {
                    waiting.remove(&node);
                }
            }
        }
        for (_, p) in parts {
            report.merge(p);
        }
        LiveOutcome::new(report, wall, totals)
    }
}

/// Where the coordinator's detection of the end of a run stands.
enum Wave {
    /// No wave is out; the next goes at `due`.
    Resting { due: Instant },
    /// A wave is out: the counts of every process so far (this process's at once).
    Polling(Vec<Option<Counts>>),
}

/// What woke the coordinator's loop while a run's actors run.
enum Event {
    /// A message for the agent (`None` once its channel is closed).
    Frame(Option<AgentMsg>),
    /// A change of a connection (`None` once its channel is closed).
    Session(Option<SessionEvent>),
    /// Time for the next wave, or for another look at the host.
    Tick,
}

/// What the coordinator's loop does after a handler.
enum Step {
    /// Go on.
    Next,
    /// The run is over: quiet after this wall time since `Go`, or failed.
    Over(Result<Duration, LiveError>),
}

/// The state of a run on the coordinator while its actors run, which the handlers of its
/// loop share.
struct Waves<'a, S: System> {
    run: u64,
    max_frame: u64,
    max_wall: Duration,
    /// When the run began (for the timeline).
    start: Instant,
    /// When the actors were started.
    began: Instant,
    deadline: Instant,
    nodes_list: Vec<(u64, String)>,
    /// The spec and first node of every actor placed on a node.
    specs: BTreeMap<u32, (u16, Vec<u8>)>,
    /// The process of every actor now.
    home: Vec<u16>,
    /// Which processes are live (0, the coordinator, always).
    alive: &'a mut [bool],
    out: Arc<ClusterOut>,
    host: LocalHost<S::Msg>,
    /// The number of the last wave sent.
    wave: u64,
    state: Wave,
    /// The counts of the last complete wave, unless a node was lost since.
    last: Option<Vec<Counts>>,
}

impl<S: System> Waves<'_, S> {
    /// Whether a wave is out and every live process has answered it.
    fn all_counted(&self) -> bool {
        match &self.state {
            Wave::Polling(counts) => {
                (1..self.alive.len()).all(|k| !self.alive[k] || counts[k].is_some())
            }
            Wave::Resting { .. } => false,
        }
    }

    /// Closes a wave that every live process answered: the run's wall time when it is quiet
    /// with the same counts as the wave before, else `None` with the next wave scheduled.
    fn settle(&mut self) -> Option<Duration> {
        let Wave::Polling(counts) = &self.state else {
            return None;
        };
        let now_counts: Vec<Counts> = counts
            .iter()
            .map(|c| c.clone().unwrap_or_default())
            .collect();
        let q = quiet(&now_counts, self.alive);
        if q && self.last.as_ref() == Some(&now_counts) {
            return Some(self.began.elapsed());
        }
        self.last = Some(now_counts);
        let due = Instant::now() + if q { Duration::ZERO } else { WAVE_EVERY };
        self.state = Wave::Resting { due };
        None
    }

    /// How long the loop may wait for an event before it looks again: until the next wave,
    /// within 200 µs and 50 ms.
    fn sleep(&self) -> Duration {
        let left = match &self.state {
            Wave::Resting { due } => due.saturating_duration_since(Instant::now()),
            // The wave went out when it was due: that time is past.
            Wave::Polling(_) => Duration::ZERO,
        };
        left.max(Duration::from_micros(200))
            .min(Duration::from_millis(50))
    }

    /// Delivers an actor message from node `from_node` to local actor `to`; a message that
    /// cannot be decoded or delivered fails the run.
    fn deliver(&self, from_node: u16, to: u32, msg: &[u8]) -> Step {
        match S::Msg::decode(msg) {
            Ok(m) => match self.host.deliver_remote(ActorId(to), m, from_node) {
                Ok(()) => Step::Next,
                Err(e) => Step::Over(Err(LiveError::Actor(e))),
            },
            Err(e) => Step::Over(Err(LiveError::Actor(format!(
                "a message from node {from_node}: {e}"
            )))),
        }
    }
}
