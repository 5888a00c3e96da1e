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
    let run = setup.run;
    let me = setup.node;
    let limit = setup.max_frame.min(net.max_frame);
    let Some(coord) = Net::agent_of(coordinator) else {
        return Err("the coordinator's agent is not visible".into());
    };
    let inc = net.incarnation;
    let tell = |f: &Frame| {
        if let Err(e) = send_frame(&coord, inc, f, limit) {
            tracing::warn!("a frame to the coordinator: {e}");
        }
    };
    // The run cannot be set up here: say why, and leave it.
    let refuse = |e: String| {
        tell(&Frame::Ready {
            run,
            node: me,
            error: Some(e.clone()),
        });
        Err(e)
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
            Err(e) => return refuse(e),
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
    let reads = Reads::new(out.clone());
    let shared = match S::shared(&setup, limits.max_memory, reads.clone()) {
        Ok(s) => s,
        Err(e) => return refuse(e),
    };
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
                        if let Some(k) = node_ids.iter().position(|n| *n == Some(node_id)) {
                            if let Ok(mut a) = out.agents.write() {
                                a[k] = None;
                            }
                            reads.lost(k as u16);
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
                    match S::build(&spec, limits.max_memory, &shared) {
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
            Frame::Read { run: r, seq, key } if r == run => {
                let data = S::read(&shared, &key);
                if let Some(to) = Net::agent_of(sender) {
                    let f = Frame::ReadReply { run, seq, data };
                    if let Err(e) = send_frame(&to, net.incarnation, &f, limit) {
                        tracing::warn!("answering read {seq}: {e}");
                    }
                }
            }
            Frame::ReadReply { run: r, seq, data } if r == run => reads.answer(seq, data),
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
                let mut totals = host.totals();
                totals[5] = reads.payload_bytes();
                // In parts that fit the frame limit (per-request outputs and logits add up).
                let parts = report_parts(report, limit / 2);
                let n = parts.len();
                for (i, report) in parts.into_iter().enumerate() {
                    tell(&Frame::ReportReply {
                        run,
                        node: me,
                        report,
                        totals: if i + 1 == n { totals } else { [0; 6] },
                        more: i + 1 < n,
                    });
                }
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
