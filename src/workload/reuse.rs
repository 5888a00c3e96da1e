//! Reuse: how many distinct contexts a workload draws on, how popular each is, how soon a
//! context comes back, and multi-turn conversations.
//!
//! Without a `[workload.reuse]` table a QA workload asks every question of its corpus once
//! (shuffled or grouped). With one, requests are drawn from a **pool** of `contexts` distinct
//! contexts (the first ones the generator or the dataset yields), each with its questions:
//!
//! * **Conversations.** Requests come in conversations of `turns` turns about one context.
//!   Conversations start as a Poisson process at `arrival_rate_per_s / turns`, so requests
//!   arrive at `arrival_rate_per_s` on average; each later turn arrives an exponential think
//!   time of mean `turn_gap_s` after the previous turn *arrived* (open loop: a turn does not
//!   wait for the previous answer, as in a trace replay). Turn `k`'s prompt is turn `k - 1`'s
//!   prompt, its answer and a new question, so it extends the previous prompt exactly. The
//!   answer's tokens are seeded ids of the length the trace gives that turn's output. No
//!   policy keeps the KV of generated tokens (caches and stores hold prompt blocks), so the
//!   answer is prefilled in the next turn under every policy; the prompt before it is reused.
//! * **Pool.** The first `contexts` contexts of at least `min_context_tokens` tokens (default
//!   0) in corpus order: with 8k-token windows, leaving out the short last window of each
//!   article keeps prompts near 8k.
//! * **Questions.** Each turn asks its context's next question, round robin over the
//!   context's questions: with `questions_per_context = Q` the `Q + 1`-th visit repeats the
//!   first question (a repeated prompt, as in a FAQ service). The generator makes exactly `Q`
//!   questions per context; a dataset gives at most `Q` of its own (without `Q`: all of them).
//! * **Popularity** (which context a conversation is about): `uniform`, or `zipf` with
//!   exponent `alpha` (rank `k` has weight `1 / k^alpha`; the ranks are a seeded permutation of
//!   the pool, so popular contexts are not neighbours in the corpus). Each conversation draws
//!   independently (the independent reference model).
//! * **Reuse distance** (optional): the LRU stack model instead of independent draws. Each
//!   conversation draws a stack distance `d` from a geometric distribution of mean
//!   `reuse_distance` and takes the context used `d + 1` distinct contexts ago (`d = 0`: the
//!   context of the previous conversation). When fewer than `d + 1` contexts have been used,
//!   it draws from the popularity distribution. A reuse distance is counted in distinct
//!   contexts between two conversations about one context, which is what decides whether an
//!   LRU cache of `C` contexts still holds it (it does when the distance is below `C`).
//!   `meshsim trace stats` measures it on any trace.
//!
//! Every random choice has its own ChaCha8 stream, so the knobs do not shift each other's
//! numbers.

use std::collections::VecDeque;

use super::output::OutputDist;
use super::{Request, SegId, TokenArena};
use crate::rng::{Stream, streams};
use crate::units::Nanos;

/// Most contexts a pool may hold.
pub const MAX_CONTEXTS: u32 = 1_000_000;
/// Most turns a conversation may have.
pub const MAX_TURNS: u32 = 256;
/// Most questions a generated context may have.
pub const MAX_QUESTIONS_PER_CONTEXT: u32 = 100_000;
/// Longest mean think time between turns, in seconds (one day).
pub const MAX_TURN_GAP_S: f64 = 86_400.0;
/// Largest mean reuse distance.
pub const MAX_REUSE_DISTANCE: f64 = 1e9;
/// Largest `min_context_tokens` as a fraction of the window: greedy windows longer than this
/// are common, so the generator finds enough of them quickly.
pub const MAX_MIN_CONTEXT_FRACTION: f64 = 0.75;
/// Articles the generator makes per context asked for, at most, before it gives up looking for
/// contexts of `min_context_tokens` (the pool is then smaller, and `Trace::contexts` says so).
pub const MAX_GROUPS_PER_CONTEXT: usize = 8;
/// Most tokens a pool's contexts, or a run's generated answers, may hold (those of a replayed
/// trace's distinct blocks: 8 GiB of token ids).
pub const MAX_POOL_TOKENS: u64 = super::MAX_ARENA_TOKENS;
/// Mean think time between turns when the scenario gives none, in seconds.
pub const DEFAULT_TURN_GAP_S: f64 = 10.0;

/// Which context a conversation is about.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Popularity {
    Uniform,
    Zipf { alpha: f64 },
}

/// The `[workload.reuse]` table, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Reuse {
    /// Distinct contexts requests draw on.
    pub contexts: u32,
    /// Contexts shorter than this many tokens are left out of the pool (0: none), so that a
    /// pool of 8k-token windows does not include the short remainder of an article.
    pub min_context_tokens: u32,
    /// Questions per context (generator: exactly; dataset: at most); `None`: the corpus's own.
    pub questions_per_context: Option<u32>,
    pub popularity: Popularity,
    /// Mean LRU stack distance between two conversations about one context (in contexts).
    pub reuse_distance: Option<f64>,
    /// Turns per conversation (1: single questions).
    pub turns: u32,
    /// Mean think time between the arrivals of two turns of a conversation, in seconds.
    pub turn_gap_s: f64,
}

impl Reuse {
    /// Independent draws of `contexts` contexts, uniform, one turn each.
    pub fn uniform(contexts: u32) -> Reuse {
        Reuse {
            contexts,
            min_context_tokens: 0,
            questions_per_context: None,
            popularity: Popularity::Uniform,
            reuse_distance: None,
            turns: 1,
            turn_gap_s: DEFAULT_TURN_GAP_S,
        }
    }
}

/// One context of the pool: its segments and token count, and the questions about it.
#[derive(Clone, Debug, Default)]
pub struct PoolContext {
    pub segments: Vec<SegId>,
    pub tokens: u32,
    /// `(segment, tokens)` of each question; never empty.
    pub questions: Vec<(SegId, u32)>,
}

/// How the requests of a pool arrive and how long their answers are.
pub struct Arrivals<'a> {
    pub requests: u32,
    pub rate_per_s: f64,
    pub output: &'a OutputDist,
    /// Answer token ids are drawn from `3..vocab`.
    pub vocab: u32,
    pub seed: u64,
}

/// The requests of `reuse` over `pool` (see the module doc), sorted by arrival: the first
/// `a.requests` of the conversations' turns. Answer segments are appended to `arena`;
/// `system` (segment and tokens) opens every prompt.
pub fn requests(
    reuse: &Reuse,
    pool: &[PoolContext],
    arena: &mut TokenArena,
    system: Option<(SegId, u32)>,
    a: &Arrivals,
) -> Vec<Request> {
    assert!(!pool.is_empty() && pool.iter().all(|c| !c.questions.is_empty()));
    let turns = reuse.turns.max(1);
    let mut picker = Picker::new(reuse, pool.len() as u32, a.seed);
    let mut starts = Stream::new(a.seed, streams::WORKLOAD_ARRIVALS);
    let mut gaps = Stream::new(a.seed, streams::WORKLOAD_TURNS);
    let mut outputs = Stream::new(a.seed, streams::WORKLOAD_OUTPUTS);
    let mut answers = Stream::new(a.seed, streams::WORKLOAD_ANSWERS);
    let mut next_question = vec![0u32; pool.len()];
    let conversations = a.requests.div_ceil(turns);
    let mut out = Vec::with_capacity((conversations * turns) as usize);
    let mut t = 0.0f64;
    // Bounded: `conversations * turns` requests, each with at most `turns` questions and
    // answers beyond its context.
    for _ in 0..conversations {
        t += starts.exponential(a.rate_per_s / turns as f64);
        let ctx = picker.next();
        let c = &pool[ctx as usize];
        let mut history: Vec<SegId> = Vec::with_capacity(c.segments.len() + 2 * turns as usize);
        let mut tokens = 0u32;
        if let Some((seg, len)) = system {
            history.push(seg);
            tokens += len;
        }
        history.extend_from_slice(&c.segments);
        tokens += c.tokens;
        let mut at = t;
        for turn in 0..turns {
            if turn > 0 && reuse.turn_gap_s > 0.0 {
                at += gaps.exponential(1.0 / reuse.turn_gap_s);
            }
            let n = &mut next_question[ctx as usize];
            let (q, q_len) = c.questions[*n as usize % c.questions.len()];
            *n = n.wrapping_add(1);
            let output_tokens = a.output.sample(&mut outputs);
            let mut segments = Vec::with_capacity(history.len() + 1);
            segments.extend_from_slice(&history);
            segments.push(q);
            out.push(Request {
                arrival: Nanos::from_secs_f64(at),
                segments,
                prompt_tokens: tokens.saturating_add(q_len),
                output_tokens,
                context: ctx,
            });
            if turn + 1 < turns {
                let answer = (0..output_tokens)
                    .map(|_| 3 + answers.below(u64::from(a.vocab.max(4) - 3)) as u32);
                history.push(q);
                history.push(arena.push(answer));
                tokens = tokens.saturating_add(q_len).saturating_add(output_tokens);
            }
        }
    }
    // Stable: equal arrivals keep conversation order.
    out.sort_by_key(|r| r.arrival);
    out.truncate(a.requests as usize);
    out
}

/// The longest prompt `reuse` can build from a context of `context` tokens, a system prompt
/// of `system` tokens, questions of at most `question` tokens and answers of at most
/// `answer` tokens.
pub fn max_prompt_tokens(
    reuse: &Reuse,
    system: u32,
    context: u32,
    question: u32,
    answer: u32,
) -> u32 {
    let turns = reuse.turns.max(1);
    system
        .saturating_add(context)
        .saturating_add(question.saturating_mul(turns))
        .saturating_add(answer.saturating_mul(turns - 1))
}

/// Draws the context of each conversation.
struct Picker {
    rng: Stream,
    /// Context of each popularity rank.
    by_rank: Vec<u32>,
    /// Cumulative weights of the ranks (Zipf); empty for uniform.
    cumulative: Vec<f64>,
    /// The LRU stack (most recent first) and the success probability of the geometric
    /// stack distance; `None` for independent draws.
    stack: Option<(VecDeque<u32>, f64)>,
}

impl Picker {
    fn new(reuse: &Reuse, n: u32, seed: u64) -> Picker {
        let mut rng = Stream::new(seed, streams::WORKLOAD_POPULARITY);
        let mut by_rank: Vec<u32> = (0..n).collect();
        rng.shuffle(&mut by_rank);
        let cumulative = match reuse.popularity {
            Popularity::Uniform => Vec::new(),
            Popularity::Zipf { alpha } => {
                let mut sum = 0.0;
                (1..=n)
                    .map(|k| {
                        sum += libm::pow(k as f64, -alpha);
                        sum
                    })
                    .collect()
            }
        };
        let stack = reuse
            .reuse_distance
            .map(|mean| (VecDeque::with_capacity(n as usize), 1.0 / (mean + 1.0)));
        Picker {
            rng,
            by_rank,
            cumulative,
            stack,
        }
    }

    fn popular(&mut self) -> u32 {
        let rank = match self.cumulative.last() {
            None => self.rng.below(self.by_rank.len() as u64) as usize,
            Some(&total) => {
                let x = self.rng.uniform() * total;
                self.cumulative
                    .partition_point(|&c| c <= x)
                    .min(self.by_rank.len() - 1)
            }
        };
        self.by_rank[rank]
    }

    fn next(&mut self) -> u32 {
        let Some((_, p)) = self.stack else {
            return self.popular();
        };
        // Geometric on {0, 1, ...} with mean (1 - p) / p, by inversion.
        let d = if p >= 1.0 {
            0
        } else {
            let u = self.rng.uniform();
            (libm::log(1.0 - u) / libm::log(1.0 - p)).min(u32::MAX as f64) as usize
        };
        let depth = self.stack.as_ref().map_or(0, |s| s.0.len());
        let c = if d < depth {
            self.stack.as_mut().unwrap().0.remove(d).unwrap()
        } else {
            let c = self.popular();
            let stack = &mut self.stack.as_mut().unwrap().0;
            if let Some(i) = stack.iter().position(|&x| x == c) {
                stack.remove(i);
            }
            c
        };
        self.stack.as_mut().unwrap().0.push_front(c);
        c
    }
}

/// Context reuse distances of a sequence of context ids: for each request whose context was
/// seen before, the number of distinct other contexts since its last request (Mattson's LRU
/// stack distance). O(n log n) with a Fenwick tree over request positions.
pub fn reuse_distances(contexts: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let contexts: Vec<u32> = contexts.into_iter().collect();
    let n = contexts.len();
    // tree over positions: 1 at the latest position of each context seen so far.
    let mut tree = vec![0i32; n + 1];
    let add = |tree: &mut Vec<i32>, i: usize, v: i32| {
        let mut i = i + 1;
        while i <= n {
            tree[i] += v;
            i += i & i.wrapping_neg();
        }
    };
    let prefix = |tree: &Vec<i32>, i: usize| {
        // Sum over positions 0..i.
        let (mut i, mut s) = (i, 0i32);
        while i > 0 {
            s += tree[i];
            i -= i & i.wrapping_neg();
        }
        s
    };
    let mut last: std::collections::HashMap<u32, usize> = Default::default();
    let mut out = Vec::new();
    for (i, &c) in contexts.iter().enumerate() {
        if let Some(prev) = last.insert(c, i) {
            // Distinct contexts whose latest request lies strictly between prev and i.
            out.push((prefix(&tree, i) - prefix(&tree, prev + 1)) as u32);
            add(&mut tree, prev, -1);
        }
        add(&mut tree, i, 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(arena: &mut TokenArena, n: u32, questions: u32) -> Vec<PoolContext> {
        (0..n)
            .map(|c| PoolContext {
                segments: vec![arena.push(c * 1000..c * 1000 + 40)],
                tokens: 40,
                questions: (0..questions).map(|q| (arena.push([c, q, 7]), 3)).collect(),
            })
            .collect()
    }

    fn run(reuse: &Reuse, n: u32, requests: u32) -> (TokenArena, Vec<Request>) {
        let mut arena = TokenArena::default();
        let p = pool(&mut arena, n, 4);
        let output = OutputDist::Fixed { tokens: 5 };
        let a = Arrivals {
            requests,
            rate_per_s: 10.0,
            output: &output,
            vocab: 100,
            seed: 9,
        };
        let r = super::requests(reuse, &p, &mut arena, None, &a);
        (arena, r)
    }

    fn counts(r: &[Request], n: u32) -> Vec<u32> {
        let mut c = vec![0u32; n as usize];
        for q in r {
            c[q.context as usize] += 1;
        }
        c
    }

    #[test]
    fn zipf_popularity_follows_its_exponent() {
        let n = 100;
        let reuse = Reuse {
            popularity: Popularity::Zipf { alpha: 1.0 },
            ..Reuse::uniform(n)
        };
        let (_, r) = run(&reuse, n, 100_000);
        let mut c = counts(&r, n);
        c.sort_unstable_by(|a, b| b.cmp(a));
        // Harmonic number H(100) = 5.187: rank 1 has 1/H of the requests, rank 10 a tenth
        // of that.
        let top = c[0] as f64 / 100_000.0;
        assert!((top - 1.0 / 5.187).abs() < 0.01, "{top}");
        let ratio = c[0] as f64 / c[9] as f64;
        assert!((8.0..12.5).contains(&ratio), "{ratio}");
        // Uniform: every context gets about 1 %.
        let (_, r) = run(&Reuse::uniform(n), n, 100_000);
        let c = counts(&r, n);
        assert!(c.iter().all(|&k| (800..1200).contains(&k)), "{c:?}");
    }

    #[test]
    fn the_stack_model_gives_the_mean_reuse_distance_asked_for() {
        for mean in [0.0, 3.0, 20.0] {
            let reuse = Reuse {
                reuse_distance: Some(mean),
                ..Reuse::uniform(1000)
            };
            let (_, r) = run(&reuse, 1000, 50_000);
            let d = reuse_distances(r.iter().map(|q| q.context));
            let measured = d.iter().map(|&x| x as f64).sum::<f64>() / d.len() as f64;
            assert!(
                (measured - mean).abs() <= 0.05 * mean + 0.05,
                "mean {mean}: measured {measured}"
            );
        }
    }

    #[test]
    fn reuse_distances_count_distinct_contexts_in_between() {
        // a b c b a: b at distance 1 (c), a at distance 2 (b, c).
        assert_eq!(reuse_distances([0, 1, 2, 1, 0]), vec![1, 2]);
        assert_eq!(reuse_distances([5, 5, 5]), vec![0, 0]);
        assert!(reuse_distances([1, 2, 3]).is_empty());
    }

    #[test]
    fn each_turn_extends_the_previous_prompt_with_its_answer_and_a_new_question() {
        let reuse = Reuse {
            turns: 3,
            turn_gap_s: 5.0,
            ..Reuse::uniform(5)
        };
        let (arena, r) = run(&reuse, 5, 300);
        assert_eq!(r.len(), 300);
        assert!(r.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        // Group the turns of each conversation: a turn's prompt starts with every segment of
        // an earlier turn's prompt of the same context, plus that turn's answer.
        let (mut extended, mut gaps) = (0, 0.0);
        for (i, a) in r.iter().enumerate() {
            for b in &r[i + 1..] {
                if b.segments.len() == a.segments.len() + 2
                    && b.segments[..a.segments.len()] == a.segments[..]
                {
                    let answer = b.segments[a.segments.len()];
                    assert_eq!(arena.segment(answer).len() as u32, a.output_tokens);
                    assert_eq!(b.prompt_tokens, a.prompt_tokens + a.output_tokens + 3);
                    assert!(b.arrival >= a.arrival);
                    gaps += (b.arrival.as_secs_f64() - a.arrival.as_secs_f64()) / 200.0;
                    extended += 1;
                    break;
                }
            }
        }
        // 100 conversations of 3 turns: 200 later turns, each extending one earlier turn.
        assert_eq!(extended, 200);
        // Think times have the configured mean (200 samples: standard error 0.35 s).
        assert!((4.0..6.0).contains(&gaps), "{gaps}");
        // Conversations start at 10 / 3 per second: 100 starts over about 30 s.
        let last_start = r
            .iter()
            .filter(|q| q.segments.len() == 2)
            .map(|q| q.arrival.as_secs_f64())
            .fold(0.0, f64::max);
        assert!((24.0..36.0).contains(&last_start), "{last_start}");
    }

    #[test]
    fn questions_go_round_robin_so_a_context_repeats_its_prompts() {
        let reuse = Reuse::uniform(1);
        let (_, r) = run(&reuse, 1, 8);
        let q: Vec<SegId> = r.iter().map(|x| *x.segments.last().unwrap()).collect();
        assert_eq!(q[0..4], q[4..8]);
        assert_ne!(q[0], q[1]);
    }

    #[test]
    fn the_same_seed_gives_the_same_requests() {
        let reuse = Reuse {
            popularity: Popularity::Zipf { alpha: 0.8 },
            reuse_distance: Some(4.0),
            turns: 2,
            ..Reuse::uniform(50)
        };
        let key = |r: &[Request]| -> Vec<(Nanos, u32, u32)> {
            r.iter()
                .map(|q| (q.arrival, q.context, q.prompt_tokens))
                .collect()
        };
        let (_, a) = run(&reuse, 50, 1000);
        let (_, b) = run(&reuse, 50, 1000);
        assert_eq!(key(&a), key(&b));
    }
}
