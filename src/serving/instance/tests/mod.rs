//! Host-less tests of the instance: a scripted context, time set by each test.

use super::*;
use crate::actor::Then;
use crate::backend::BackendError;
use crate::rng::Stream;
use crate::serving::policy::{local_prefix, vanilla};
use crate::serving::store::directory::LoadGroup;
use crate::workload::{Request, SegId, TokenArena};
use std::sync::Mutex;

/// A context that records what the instance does; time is set by the test, or by [`run`]
/// from the ends of the work the instance started.
struct Script {
    now: Nanos,
    batches: Vec<BatchShape>,
    sent: Vec<String>,
    rng: Stream,
    log: Arc<Mutex<Vec<BatchShape>>>,
    /// What every iteration's compute takes.
    iteration: Nanos,
    /// When the instance sent each first token, and what it reported of finished requests.
    first_at: Vec<Nanos>,
    done: Vec<Completion>,
    /// When each fetch started; store writes sent.
    fetch_at: Vec<Nanos>,
    writes: u32,
    /// Work ends to deliver: (time, order, message). A fetch of `b` bytes takes `b` ns.
    events: Vec<(Nanos, u64, Msg)>,
    order: u64,
    /// Fetches end with their `failed` message (their source lost its memory).
    fail_fetches: bool,
}

/// A batch backend that logs the shapes it is asked for; the script collects them when
/// the instance starts the iteration.
struct Recorder(Arc<Mutex<Vec<BatchShape>>>, Nanos);

impl BatchBackend for Recorder {
    fn iteration(
        &mut self,
        batch: &BatchShape,
        _members: &mut [crate::backend::Member<'_>],
    ) -> Result<Nanos, BackendError> {
        self.0.lock().unwrap().push(*batch);
        Ok(self.1)
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
        match &msg {
            // Tests answer lookups themselves, and count store writes.
            Msg::Lookup(_) => return,
            Msg::StoreWrite { .. } => {
                self.writes += 1;
                return;
            }
            Msg::FirstToken(..) => self.first_at.push(self.now),
            Msg::Finished(c) => self.done.push((**c).clone()),
            _ => {}
        }
        self.sent.push(match msg {
            Msg::FirstToken(r, _) => format!("first {}", r.0),
            Msg::Finished(c) => format!("finished {} preempted {}", c.req.0, c.preemptions),
            Msg::Rejected(r, _) => format!("rejected {}", r.0),
            other => format!("{other:?}"),
        });
    }
    fn timer(&mut self, _: Nanos, _: Msg) {}
    fn start_then(&mut self, work: Work, then: Then<Msg>) {
        let took = match work {
            Work::Compute(d) => {
                // An iteration's compute, or (none priced) the layers that waited for loads.
                let logged = std::mem::take(&mut *self.log.lock().unwrap());
                assert!(logged.len() <= 1, "one priced iteration per started one");
                self.batches.extend(logged);
                d
            }
            Work::Fetch { bytes, .. } => {
                self.fetch_at.push(self.now);
                Nanos(bytes)
            }
            other => panic!("unexpected work {other:?}"),
        };
        let Then::Notify(msg) = then else {
            panic!("the instance is notified of its work");
        };
        self.order += 1;
        self.events.push((self.now + took, self.order, msg));
    }
    fn start_fetch(&mut self, work: Work, done: Msg, failed: Msg) {
        let msg = if self.fail_fetches { failed } else { done };
        self.start(work, msg);
    }
    fn rng(&mut self) -> &mut Stream {
        &mut self.rng
    }
}

/// A trace over `arena` of requests given as their prompt's segments and output tokens, all
/// arriving at 0.
fn trace_of(arena: TokenArena, requests: Vec<(Vec<SegId>, u32)>) -> Arc<Trace> {
    let requests = (requests.into_iter())
        .map(|(segments, output_tokens)| Request {
            arrival: Nanos::ZERO,
            prompt_tokens: segments.iter().map(|&s| arena.len(s) as u32).sum(),
            segments,
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

/// Requests with prompts of `lens` distinct tokens each and `out` output tokens.
fn trace(lens: &[u32], out: u32) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let mut next = 0u32;
    let requests = lens
        .iter()
        .map(|&n| {
            let seg = arena.push(next..next + n);
            next += n;
            (vec![seg], out)
        })
        .collect();
    trace_of(arena, requests)
}

/// Two requests with the same `tokens`-token prompt, both arriving at 0, 2 output tokens.
fn prompt_twice(tokens: u32) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let seg = arena.push(0..tokens);
    trace_of(arena, vec![(vec![seg], 2), (vec![seg], 2)])
}

fn instance(
    trace: Arc<Trace>,
    policy: Arc<Policy>,
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
    let backend = Box::new(Recorder(s.log.clone(), s.iteration));
    Instance::new(0, ActorId(0), trace, policy, cfg, None, backend)
}

fn script() -> Script {
    Script {
        now: Nanos::ZERO,
        batches: Vec::new(),
        sent: Vec::new(),
        rng: Stream::new(1, 1),
        log: Arc::default(),
        iteration: Nanos(1_000),
        first_at: Vec::new(),
        done: Vec::new(),
        fetch_at: Vec::new(),
        writes: 0,
        events: Vec::new(),
        order: 0,
        fail_fetches: false,
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
    let mut i = instance(trace(&[150], 3), Arc::new(vanilla()), 100, 64, &s);
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
    let mut i = instance(trace(&[32, 32], 40), Arc::new(vanilla()), 8, 1024, &s);
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
    let t = prompt_twice(64);
    let mut s = script();
    let mut i = instance(t, Arc::new(local_prefix()), 100, 1024, &s);
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
    let mut i = instance(trace(&[32], 2), Arc::new(vanilla()), 100, 1024, &s);
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

#[test]
fn what_an_iteration_reads_of_a_sequence_fits_its_first_cache_line() {
    use std::mem::{align_of, offset_of, size_of};
    assert_eq!(align_of::<Seq>(), 64);
    // The block count (the blocks' first word) and the cold part's pointer too.
    assert!(offset_of!(Seq, blocks) + size_of::<u32>() <= 64);
    assert!(offset_of!(Seq, load) < 64 && offset_of!(Seq, done) < 64);
    assert!(offset_of!(Seq, cold) < 64);
    // What only admission, loads and the end read is boxed: a sequence moves as two lines.
    assert_eq!(size_of::<Seq>(), 128);
    // The batch's slots hold `Option<Seq>`: the box gives `None` a place, no room.
    assert_eq!(size_of::<Option<Seq>>(), 128);
}

#[test]
fn its_cache_hint_names_the_running_batch_and_the_backend_as_the_batch_changes() {
    // Three 32-token prompts: the first runs alone, the others join it at the next iteration
    // and all leave as they finish. The hint follows the running batch (whose array moves
    // when it grows) and always names the backend.
    let mut s = script();
    let mut i = instance(trace(&[32, 32, 32], 4), Arc::new(vanilla()), 100, 1024, &s);
    let backend = (&*i.backend as *const dyn BatchBackend).cast::<u8>().addr();
    let expect = |i: &Instance| {
        let h = i.hot();
        let (due, bytes) = i.running.due_bytes();
        assert_eq!(bytes, 8 * i.running.len());
        assert_eq!(h.count as usize, bytes.div_ceil(64));
        assert_eq!(h.base, due);
        assert_eq!(h.stride, 64);
        assert_eq!(h.values[0], backend);
        assert!(h.value_bytes[0] > 0);
    };
    expect(&i);
    for r in 0..3 {
        i.handle(Msg::Submit(ReqId(r)), &mut s);
        expect(&i);
    }
    assert_eq!(i.running.len(), 1, "the others wait for the next iteration");
    let mut most = 0;
    for _ in 0..100 {
        if i.busy_since.is_none() {
            break;
        }
        s.now += Nanos(1_000);
        i.handle(Msg::WorkDone, &mut s);
        most = most.max(i.running.len());
        expect(&i);
    }
    assert_eq!(most, 3, "all three ran together");
    assert!(i.running.is_empty() && i.violations.is_empty());
}

#[test]
fn finished_requests_leave_at_most_max_spare_buffers_and_the_next_request_reuses_one() {
    // Six 64-token prompts finish together; a seventh comes after them.
    let t = trace(&[64; 7], 2);
    let mut s = script();
    let mut i = instance(t.clone(), Arc::new(local_prefix()), 100, 1024, &s);
    for r in 0..6 {
        i.handle(Msg::Submit(ReqId(r)), &mut s);
    }
    drain(&mut i, &mut s);
    assert_eq!(s.done.len(), 6);
    assert_eq!(i.spare.blocks.len(), MAX_SPARE);
    assert!(i.spare.blocks.iter().all(|b| b.is_empty()));
    assert_eq!(i.spare.n_colds, MAX_SPARE);
    assert!(
        (i.spare.colds.iter()).all(|c| c.as_ref().is_some_and(|c| c.hashes.is_empty())),
        "a kept record lets go of its request's hashes"
    );
    i.handle(Msg::Submit(ReqId(6)), &mut s);
    assert_eq!(
        i.spare.blocks.len(),
        MAX_SPARE - 1,
        "a spare block list is reused, not a new one"
    );
    assert_eq!(i.spare.n_colds, MAX_SPARE - 1, "and a spare record");
    assert!(i.spare.colds[MAX_SPARE - 1].is_none(), "the one taken");
    let seq = &i.running[0];
    let mut want = Vec::new();
    t.block_hashes(ReqId(6), 16, &mut want);
    assert_eq!(
        seq.cold.hashes.to_vec(),
        want,
        "and the request holds exactly its prompt's hashes"
    );
    drain(&mut i, &mut s);
    assert_eq!(s.done.len(), 7);
    assert_eq!(i.spare.blocks.len(), MAX_SPARE);
    assert_eq!(i.spare.n_colds, MAX_SPARE);
    assert!(i.spare.colds.iter().all(Option::is_some));
    i.pool.check().unwrap();
}

/// `n` requests whose prompts share one of three prefixes (0, 30 or 60 tokens) before a tail of
/// their own (1 to 70 tokens), with 1 to 40 output tokens.
fn shared_prefix_trace(n: usize, rng: &mut Stream) -> Arc<Trace> {
    let mut arena = TokenArena::default();
    let prefixes: Vec<_> = (1..=3u32)
        .map(|p| {
            (
                arena.push(100_000 * p..100_000 * p + 30 * (p - 1)),
                30 * (p - 1),
            )
        })
        .collect();
    let mut next = 0u32;
    let requests = (0..n)
        .map(|_| {
            let p = rng.below(3) as usize;
            let tail = 1 + rng.below(70) as u32;
            let seg = arena.push(next..next + tail);
            next += tail;
            let (prefix, len) = prefixes[p];
            let segments = if len > 0 {
                vec![prefix, seg]
            } else {
                vec![seg]
            };
            (segments, 1 + rng.below(40) as u32)
        })
        .collect();
    trace_of(arena, requests)
}

#[test]
fn steady_decoders_schedule_and_finish_as_visiting_every_sequence_does() {
    // Two instances in lockstep on the same messages: one keeps decoding sequences steady,
    // the other visits every sequence at every iteration (the scheduler as the module doc
    // writes it). Every batch shape, message and pool count must agree, under budgets that
    // cut batches short and pools small enough to preempt.
    let mut checked = 0;
    for seed in 0..40u64 {
        let mut rng = Stream::new(seed, 7);
        let t = shared_prefix_trace(60, &mut rng);
        let policy: Arc<Policy> = if seed % 2 == 0 {
            Arc::new(vanilla())
        } else {
            Arc::new(local_prefix())
        };
        let blocks = 12 + rng.below(40) as u32;
        let budget = [24, 64, 200, 4096][rng.below(4) as usize];
        let (mut sa, mut sb) = (script(), script());
        let mut a = instance(t.clone(), policy.clone(), blocks, budget, &sa);
        let mut b = instance(t.clone(), policy, blocks, budget, &sb);
        b.lockstep = false;
        let mut next = 0u32;
        for _ in 0..5_000 {
            let submit = next < 60 && (a.busy_since.is_none() || rng.below(3) == 0);
            if submit {
                a.handle(Msg::Submit(ReqId(next)), &mut sa);
                b.handle(Msg::Submit(ReqId(next)), &mut sb);
                next += 1;
            } else if a.busy_since.is_some() {
                sa.now += Nanos(1_000);
                sb.now += Nanos(1_000);
                a.handle(Msg::WorkDone, &mut sa);
                b.handle(Msg::WorkDone, &mut sb);
            } else {
                break;
            }
            a.invariants().unwrap();
            assert_eq!(sa.batches, sb.batches, "seed {seed}");
            assert_eq!(sa.sent, sb.sent, "seed {seed}");
            assert_eq!(a.pool.free_blocks(), b.pool.free_blocks(), "seed {seed}");
            assert_eq!(a.running.len(), b.running.len(), "seed {seed}");
            checked += 1;
        }
        assert_eq!(
            sa.done.len() + a.stats.rejected as usize,
            60,
            "seed {seed}: all ended"
        );
        assert!(a.violations.is_empty() && b.violations.is_empty());
    }
    assert!(checked > 10_000, "{checked} steps checked");
}

mod store;
