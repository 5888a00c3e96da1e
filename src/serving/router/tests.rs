//! The router's tests: stories of arrivals, tokens, ends and faults, message by message.

use super::*;
use crate::actor::{Context, Then, Work};
use crate::metrics::Tier;
use crate::rng::Stream;
use crate::workload::{Request, TokenArena};

/// A context that keeps what the router sends and the timers it sets.
struct Script {
    now: Nanos,
    sent: Vec<(ActorId, Msg)>,
    timers: Vec<Msg>,
    rng: Stream,
}

impl Context<Msg> for Script {
    fn now(&self) -> Nanos {
        self.now
    }
    fn me(&self) -> ActorId {
        ActorId(0)
    }
    fn send(&mut self, to: ActorId, msg: Msg, _: u64) {
        self.sent.push((to, msg));
    }
    fn timer(&mut self, _: Nanos, msg: Msg) {
        self.timers.push(msg);
    }
    fn start_then(&mut self, work: Work, _: Then<Msg>) {
        panic!("the router starts no work: {work:?}");
    }
    fn rng(&mut self) -> &mut Stream {
        &mut self.rng
    }
}

/// `n` requests of 10 + i prompt tokens and 3 + i % 4 output tokens.
fn trace(n: u32) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let requests = (0..n)
        .map(|i| Request {
            arrival: Nanos(u64::from(i) * 10),
            segments: vec![arena.push(0..10 + i)],
            prompt_tokens: 10 + i,
            output_tokens: 3 + i % 4,
            context: 0,
        })
        .collect();
    Arc::new(Trace {
        arena,
        requests,
        contexts: 1,
    })
}

/// Runs a fixed story of 12 requests on 4 instances (two per node) with a router that
/// keeps at most `limit` first tokens and ends before writing them into its records:
/// arrivals, first tokens and ends in a scrambled order, a node going down in the middle
/// (a request that streamed fails, the others fail over), and a stale message from the
/// node that went down.
fn story(limit: usize) -> Report {
    let mut router = story_router(limit);
    let mut report = Report::default();
    router.report(&mut report);
    report
}

/// The router at the end of [`story`], before its report.
fn story_router(limit: usize) -> Router {
    let n = 12;
    let instances: Vec<ActorId> = (1..=4).map(ActorId).collect();
    let mut router = Router::new(
        trace(n),
        instances,
        vec![0, 0, 1, 1],
        RouterStrategy::RoundRobin,
    );
    router.pending_limit = limit;
    let mut ctx = Script {
        now: Nanos::ZERO,
        sent: Vec::new(),
        timers: Vec::new(),
        rng: Stream::new(1, 1),
    };
    let at = |router: &Router, r: u32| router.assigned[r as usize];
    for r in 0..n {
        ctx.now = Nanos(u64::from(r) * 10);
        router.handle(Msg::Arrival(ReqId(r)), &mut ctx);
    }
    let finish = |router: &mut Router, ctx: &mut Script, r: u32, t: u64| {
        ctx.now = Nanos(t);
        let c = Completion {
            req: ReqId(r),
            instance: at(router, r),
            admitted_at: Nanos(t / 2),
            reused: [r; Tier::ALL.len()],
            loaded_bytes: [u64::from(r) * 7; Tier::ALL.len()],
            preemptions: r % 3,
        };
        router.handle(Msg::Finished(Box::new(c)), ctx);
    };
    let first = |router: &mut Router, ctx: &mut Script, r: u32, t: u64| {
        ctx.now = Nanos(t);
        let i = at(router, r);
        router.handle(Msg::FirstToken(ReqId(r), i), ctx);
    };
    for (k, r) in [5u32, 0, 7, 2, 9, 4, 1].into_iter().enumerate() {
        first(&mut router, &mut ctx, r, 200 + k as u64);
    }
    for (k, r) in [7u32, 0, 4].into_iter().enumerate() {
        finish(&mut router, &mut ctx, r, 300 + k as u64);
    }
    // Node 0 (instances 0 and 1) goes down: requests 1, 5 and 9 streamed and fail (on
    // instance 1); 8 failed over; 0 and 4 had ended.
    let stale = at(&router, 5);
    ctx.now = Nanos(400);
    router.handle(Msg::NodeDown(0), &mut ctx);
    router.handle(Msg::FirstToken(ReqId(5), stale), &mut ctx);
    for (k, r) in [3u32, 8, 6, 10, 11].into_iter().enumerate() {
        first(&mut router, &mut ctx, r, 500 + k as u64);
    }
    for (k, r) in [2u32, 11, 3, 8, 6, 10].into_iter().enumerate() {
        finish(&mut router, &mut ctx, r, 600 + k as u64);
    }
    router
}

#[test]
fn a_second_report_says_the_records_went_with_the_first() {
    let mut router = story_router(3);
    let mut first = Report::default();
    router.report(&mut first);
    assert_eq!(first.records.len(), 12);
    assert!(first.violations.is_empty(), "{:?}", first.violations);
    let mut second = Report::default();
    router.report(&mut second);
    assert!(second.records.is_empty());
    assert_eq!(
        second.violations,
        ["router: asked for its report twice (its records went with the first)"]
    );
}

#[test]
fn records_are_the_same_whenever_pending_first_tokens_and_ends_are_written() {
    let all_at_the_end = story(usize::MAX);
    assert!(
        all_at_the_end.violations.is_empty(),
        "{:?}",
        all_at_the_end.violations
    );
    for limit in [1, 2, 3, 5] {
        let r = story(limit);
        assert_eq!(r.records, all_at_the_end.records, "limit {limit}");
        assert_eq!(r.failovers, all_at_the_end.failovers, "limit {limit}");
    }
    let records = &all_at_the_end.records;
    assert_eq!(records.len(), 12);
    for r in records {
        let prompt = TOKEN_ID_BYTES * u64::from(r.prompt_tokens);
        match r.id {
            // Ended: the prompt, then every output token.
            0 | 2 | 3 | 4 | 6 | 7 | 8 | 10 | 11 => {
                let failed_over = u64::from(r.id == 8);
                let want = prompt * (1 + failed_over) + TOKEN_ID_BYTES * u64::from(r.output_tokens);
                assert_eq!(r.network_bytes, want, "{r:?}");
                assert_eq!(
                    r.end,
                    Some(Nanos(match r.id {
                        7 => 300,
                        0 => 301,
                        4 => 302,
                        2 => 600,
                        11 => 601,
                        3 => 602,
                        8 => 603,
                        6 => 604,
                        _ => 605,
                    })),
                    "{r:?}"
                );
                assert_eq!(r.preemptions, r.id % 3);
                assert_eq!(r.reused, [r.id; Tier::ALL.len()]);
                assert_eq!(r.admitted, r.end.map(|t| Nanos(t.0 / 2)));
                assert!(r.failed.is_none());
            }
            // Streamed on node 0, then failed with it: the prompt and the first token;
            // the stale first token of 5 changed nothing.
            1 | 5 | 9 => {
                assert_eq!(r.network_bytes, prompt + TOKEN_ID_BYTES, "{r:?}");
                assert!(r.failed.is_some() && r.end.is_none(), "{r:?}");
                assert!(r.first_token.is_some_and(|t| t.0 < 300), "{r:?}");
            }
            _ => unreachable!(),
        }
    }
    assert_eq!(all_at_the_end.failovers, 1);
}

#[test]
fn a_lost_instances_requests_run_again_and_keep_their_first_token() {
    let instances: Vec<ActorId> = (1..=2).map(ActorId).collect();
    let mut router = Router::new(trace(4), instances, vec![0, 1], RouterStrategy::RoundRobin);
    let mut ctx = Script {
        now: Nanos::ZERO,
        sent: Vec::new(),
        timers: Vec::new(),
        rng: Stream::new(1, 1),
    };
    for r in 0..4 {
        router.handle(Msg::Arrival(ReqId(r)), &mut ctx);
    }
    // Round robin: 0 and 2 on instance 0, 1 and 3 on instance 1. Request 0 streams its
    // first token; request 1 ends with its output.
    ctx.now = Nanos(100);
    router.handle(Msg::FirstToken(ReqId(0), 0), &mut ctx);
    let output = |r: u32, i: u32| Output {
        req: ReqId(r),
        instance: i,
        tokens: vec![r, r + 1],
        first_logits: vec![r as f32],
    };
    let end = |r: u32, i: u32| Completion {
        req: ReqId(r),
        instance: i,
        admitted_at: Nanos(50),
        reused: [0; Tier::ALL.len()],
        loaded_bytes: [0; Tier::ALL.len()],
        preemptions: 0,
    };
    router.handle(Msg::FirstToken(ReqId(1), 1), &mut ctx);
    router.handle(Msg::Output(Box::new(output(1, 1))), &mut ctx);
    router.handle(Msg::Finished(Box::new(end(1, 1))), &mut ctx);
    // Instance 0 is lost: 0 and 2 run again (round robin goes on: 0 to instance 0, now
    // empty, and 2 to instance 1); an unknown actor's loss changes nothing.
    ctx.sent.clear();
    router.handle(Msg::ActorLost(ActorId(9)), &mut ctx);
    assert!(ctx.sent.is_empty());
    router.handle(Msg::ActorLost(ActorId(1)), &mut ctx);
    let again: Vec<(u32, u32)> = ctx
        .sent
        .iter()
        .map(|(to, m)| match m {
            Msg::Submit(r) => (r.0, to.0),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(again, [(0, 1), (2, 2)]);
    assert_eq!(router.failovers, 2);
    // The new run's first token is not request 0's first; its output replaces nothing.
    ctx.now = Nanos(900);
    for (r, i) in [(0, 0), (2, 1), (3, 1)] {
        router.handle(Msg::FirstToken(ReqId(r), i), &mut ctx);
        router.handle(Msg::Output(Box::new(output(r, i))), &mut ctx);
        router.handle(Msg::Finished(Box::new(end(r, i))), &mut ctx);
    }
    let mut report = Report::default();
    router.report(&mut report);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.failovers, 2);
    let first: Vec<Option<Nanos>> = report.records.iter().map(|r| r.first_token).collect();
    assert_eq!(
        first,
        [
            Some(Nanos(100)),
            Some(Nanos(100)),
            Some(Nanos(900)),
            Some(Nanos(900))
        ]
    );
    assert!(report.records.iter().all(|r| r.end.is_some()));
    let outputs: Vec<(u32, Vec<u32>)> = (0..4).map(|r| (r, vec![r, r + 1])).collect();
    assert_eq!(report.outputs, outputs, "by request, each once");
    assert_eq!(report.first_logits.len(), 4);
}
