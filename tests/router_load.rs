//! The load term of the approximate KV router ([`KvRouting`]): an instance's load is the KV blocks
//! of the requests the router sent it that have not ended, prompt *and* output tokens, and it
//! falls again when a request finishes or is rejected. The router is driven message by
//! message, and where it sends each request shows what it counted: the requests share one
//! prompt, so the instance that holds it wins exactly when its load is below the prefill it
//! saves elsewhere.

use std::sync::Arc;

use meshsim::actor::{Actor, ActorId, Context, Then, Work};
use meshsim::metrics::Tier;
use meshsim::rng::Stream;
use meshsim::serving::Msg;
use meshsim::serving::kv_routing::KvRouting;
use meshsim::serving::msg::Completion;
use meshsim::serving::router::{Router, RouterStrategy};
use meshsim::units::Nanos;
use meshsim::workload::{ReqId, Request, TokenArena, Trace};

const BLOCK: u32 = 16;

/// A context that keeps where the router sends each request.
struct Script {
    now: Nanos,
    submitted: Vec<(ActorId, ReqId)>,
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
        if let Msg::Submit(req) = msg {
            self.submitted.push((to, req));
        }
    }
    fn timer(&mut self, _: Nanos, _: Msg) {}
    fn start_then(&mut self, work: Work, _: Then<Msg>) {
        panic!("the router starts no work: {work:?}");
    }
    fn rng(&mut self) -> &mut Stream {
        &mut self.rng
    }
}

/// Requests with the same 32-token prompt (2 blocks) and these output tokens.
fn trace(outputs: &[u32]) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let requests = outputs
        .iter()
        .enumerate()
        .map(|(i, &output_tokens)| Request {
            arrival: Nanos(i as u64),
            segments: vec![arena.push(100..132)],
            prompt_tokens: 32,
            output_tokens,
            context: 0,
        })
        .collect();
    Arc::new(Trace {
        arena,
        requests,
        contexts: 1,
    })
}

/// A kv-approx router over two instances (actors 1 and 2) for `outputs`.
fn router(outputs: &[u32]) -> (Router, Script) {
    let r = Router::new(
        trace(outputs),
        vec![ActorId(1), ActorId(2)],
        vec![0, 1],
        RouterStrategy::KvApprox,
    )
    .with_kv(KvRouting::new(2, 1_000, BLOCK, 1.0));
    let ctx = Script {
        now: Nanos::ZERO,
        submitted: Vec::new(),
        rng: Stream::new(3, 0),
    };
    (r, ctx)
}

/// Request `r` arrives; returns the instance (0 or 1) it was sent to.
fn arrive(router: &mut Router, ctx: &mut Script, r: u32) -> u32 {
    ctx.now = Nanos(u64::from(r) * 10);
    router.handle(Msg::Arrival(ReqId(r)), ctx);
    let &(to, req) = ctx.submitted.last().expect("sent somewhere");
    assert_eq!(req, ReqId(r));
    to.0 - 1
}

fn finish(router: &mut Router, ctx: &mut Script, r: u32, instance: u32) {
    let c = Completion {
        req: ReqId(r),
        instance,
        admitted_at: ctx.now,
        reused: [0; Tier::ALL.len()],
        loaded_bytes: [0; Tier::ALL.len()],
        preemptions: 0,
    };
    router.handle(Msg::Finished(Box::new(c)), ctx);
}

#[test]
fn a_requests_blocks_count_its_output_tokens() {
    let kv = KvRouting::new(1, 1_000, BLOCK, 1.0);
    assert_eq!(kv.blocks(32, 0), 2);
    assert_eq!(kv.blocks(32, 1), 3);
    assert_eq!(kv.blocks(32, 48), 5);
    assert_eq!(kv.blocks(1, 15), 1);
}

#[test]
fn output_tokens_weigh_in_the_load_of_the_instance_they_were_sent_to() {
    // Request 0: 2 prompt blocks and 48 output tokens, 5 KV blocks in all; request 1 has
    // the same prompt and 1 output token.
    let (mut router, mut ctx) = router(&[48, 1]);
    assert_eq!(
        arrive(&mut router, &mut ctx, 0),
        0,
        "a tie: the lowest index"
    );
    // Instance 0 holds the prompt but carries 5 blocks: 0 + 5 against 2 + 0. Counting the
    // prompt alone (2 blocks) would tie, and the tie would keep it on instance 0.
    assert_eq!(arrive(&mut router, &mut ctx, 1), 1);
}

#[test]
fn the_load_falls_when_a_request_finishes_or_is_rejected() {
    let (mut router, mut ctx) = router(&[48, 1, 48, 1, 1]);
    assert_eq!(arrive(&mut router, &mut ctx, 0), 0);
    assert_eq!(arrive(&mut router, &mut ctx, 1), 1);
    // Both hold the prompt now; instance 0 carries 5 blocks, instance 1 carries 3.
    finish(&mut router, &mut ctx, 0, 0);
    // Instance 0's load is back to 0: 0 + 0 against 0 + 3. Had it kept request 0's 5
    // blocks, instance 1 would win.
    assert_eq!(arrive(&mut router, &mut ctx, 2), 0);
    // Request 2 (5 blocks) is rejected by instance 0, whose load falls back to 0 again: 0
    // against 3 (keeping its 5 blocks would send request 3 to instance 1).
    router.handle(Msg::Rejected(ReqId(2), 0), &mut ctx);
    assert_eq!(arrive(&mut router, &mut ctx, 3), 0);
    // Instance 0 now carries request 3's 3 blocks, instance 1 request 1's 3; once request
    // 1 finishes, instance 1 is the lighter one.
    finish(&mut router, &mut ctx, 1, 1);
    assert_eq!(arrive(&mut router, &mut ctx, 4), 1);
}
