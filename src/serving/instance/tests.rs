//! Host-less tests of the instance: a scripted context, time set by each test.

use super::*;
use crate::actor::Then;
use crate::backend::BackendError;
use crate::rng::Stream;
use crate::serving::policy::{LocalPrefix, Vanilla};
use crate::workload::{Request, TokenArena};
use std::sync::Mutex;

/// A context that records what the instance does; time is set by the test.
struct Script {
    now: Nanos,
    batches: Vec<BatchShape>,
    sent: Vec<String>,
    rng: Stream,
    log: Arc<Mutex<Vec<BatchShape>>>,
}

/// A batch backend that logs the shapes it is asked for; the script collects them when
/// the instance starts the iteration.
struct Recorder(Arc<Mutex<Vec<BatchShape>>>);

impl BatchBackend for Recorder {
    fn iteration(&mut self, batch: &BatchShape) -> Result<Nanos, BackendError> {
        self.0.lock().unwrap().push(*batch);
        Ok(Nanos(1_000))
    }
}

impl Context<Msg> for Script {
    fn now(&self) -> Nanos {
        self.now
    }
    fn me(&self) -> ActorId {
        ActorId(1)
    }
    fn send(&mut self, _: ActorId, msg: Msg, _: u64) {
        self.sent.push(match msg {
            Msg::FirstToken(r, _) => format!("first {}", r.0),
            Msg::Finished(c) => format!("finished {} preempted {}", c.req.0, c.preemptions),
            Msg::Rejected(r, _) => format!("rejected {}", r.0),
            other => format!("{other:?}"),
        });
    }
    fn timer(&mut self, _: Nanos, _: Msg) {}
    fn start_then(&mut self, work: Work, _: Then<Msg>) {
        assert!(matches!(work, Work::Compute(_)), "unexpected work {work:?}");
        let logged = std::mem::take(&mut *self.log.lock().unwrap());
        assert_eq!(logged.len(), 1, "one priced iteration per started one");
        self.batches.extend(logged);
    }
    fn rng(&mut self) -> &mut Stream {
        &mut self.rng
    }
}

/// Requests with prompts of `lens` distinct tokens each and `out` output tokens.
fn trace(lens: &[u32], out: u32) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let mut next = 0u32;
    let requests = lens
        .iter()
        .map(|&n| {
            let seg = arena.push(next..next + n);
            next += n;
            Request {
                arrival: Nanos::ZERO,
                segments: vec![seg],
                prompt_tokens: n,
                output_tokens: out,
                context: 0,
            }
        })
        .collect();
    Arc::new(Trace {
        arena,
        requests,
        contexts: 1,
    })
}

fn instance(
    trace: Arc<Trace>,
    policy: Arc<dyn Policy>,
    blocks: u32,
    budget: u32,
    s: &Script,
) -> Instance {
    let cfg = InstanceConfig {
        block_size: 16,
        num_blocks: blocks,
        max_num_seqs: 8,
        max_batched_tokens: budget,
        max_waiting: 100,
    };
    let backend = Box::new(Recorder(s.log.clone()));
    Instance::new(0, ActorId(0), trace, policy, cfg, None, backend)
}

fn script() -> Script {
    Script {
        now: Nanos::ZERO,
        batches: Vec::new(),
        sent: Vec::new(),
        rng: Stream::new(1, 1),
        log: Arc::default(),
    }
}

/// Completes iterations until the instance goes idle (bounded).
fn drain(i: &mut Instance, s: &mut Script) {
    for _ in 0..10_000 {
        if i.busy_since.is_none() {
            return;
        }
        s.now += Nanos(1_000);
        i.handle(Msg::WorkDone, s);
    }
    panic!("instance never went idle");
}

#[test]
fn a_prompt_longer_than_the_budget_is_prefilled_in_chunks_before_its_first_token() {
    let mut s = script();
    let mut i = instance(trace(&[150], 3), Arc::new(Vanilla), 100, 64, &s);
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    assert_eq!(s.batches.len(), 1);
    assert_eq!(s.batches[0].new_tokens, 64);
    i.handle(Msg::WorkDone, &mut s);
    i.handle(Msg::WorkDone, &mut s);
    assert!(s.sent.is_empty(), "no token before the prompt is done");
    assert_eq!(s.batches[2].new_tokens, 22);
    assert_eq!(s.batches[2].sampling_seqs, 1);
    i.handle(Msg::WorkDone, &mut s);
    assert_eq!(s.sent, ["first 0"]);
    drain(&mut i, &mut s);
    // 3 prefill chunks, then 2 decode steps of one token each.
    assert_eq!(s.batches.len(), 5);
    assert_eq!(s.batches[3].new_tokens, 1);
    assert_eq!(s.batches[3].kv_read_tokens, 151);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 0"]);
    assert_eq!(i.pool.free_blocks(), 100, "every block is back");
}

#[test]
fn when_blocks_run_out_the_newest_sequence_is_preempted_and_still_finishes() {
    // Two 32-token prompts (2 blocks each) generating 40 tokens each need 5 blocks apiece
    // at the end; 8 blocks cannot hold both, so the second is preempted and recomputed.
    let mut s = script();
    let mut i = instance(trace(&[32, 32], 40), Arc::new(Vanilla), 8, 1024, &s);
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    i.handle(Msg::Submit(ReqId(1)), &mut s);
    drain(&mut i, &mut s);
    assert!(
        s.sent.contains(&"finished 0 preempted 0".to_string()),
        "{:?}",
        s.sent
    );
    assert!(
        s.sent.contains(&"finished 1 preempted 1".to_string()),
        "{:?}",
        s.sent
    );
    assert_eq!(i.stats().preemptions, 1);
    assert_eq!(i.pool.free_blocks(), 8);
    i.pool.check().unwrap();
}

#[test]
fn a_repeated_prompt_reuses_its_blocks_but_recomputes_its_last_token() {
    // The same 64-token prompt twice: the second reuses 3 of its 4 blocks (48 tokens);
    // the last block holds the last prompt token, which must be recomputed.
    let t = {
        let mut arena = TokenArena::default();
        let seg = arena.push(0..64);
        let r = Request {
            arrival: Nanos::ZERO,
            segments: vec![seg],
            prompt_tokens: 64,
            output_tokens: 2,
            context: 0,
        };
        Arc::new(Trace {
            arena,
            requests: vec![r.clone(), r],
            contexts: 1,
        })
    };
    let mut s = script();
    let mut i = instance(t, Arc::new(LocalPrefix), 100, 1024, &s);
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    drain(&mut i, &mut s);
    i.handle(Msg::Submit(ReqId(1)), &mut s);
    let last = s.batches.last().unwrap();
    assert_eq!((last.new_tokens, last.kv_read_tokens), (16, 64));
    drain(&mut i, &mut s);
    assert_eq!(i.stats().pool.hit_blocks, 3);
}

#[test]
fn unexpected_messages_are_violations_not_panics() {
    let mut s = script();
    let mut i = instance(trace(&[32], 2), Arc::new(Vanilla), 100, 1024, &s);
    // A work-done notice while idle, a load and a lookup reply for a request that is not
    // loading, and a message meant for the router.
    i.handle(Msg::WorkDone, &mut s);
    i.handle(Msg::Loaded(ReqId(7)), &mut s);
    i.handle(Msg::Arrival(ReqId(0)), &mut s);
    assert!(s.batches.is_empty() && s.sent.is_empty());
    let mut report = Report::default();
    i.report(&mut report);
    assert_eq!(report.violations.len(), 3, "{:?}", report.violations);
    assert!(report.violations[0].contains("instance 0 cannot handle"));
    // The instance still serves requests.
    i.handle(Msg::Submit(ReqId(0)), &mut s);
    drain(&mut i, &mut s);
    assert_eq!(s.sent, ["first 0", "finished 0 preempted 0"]);
}
