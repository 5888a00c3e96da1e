//! Built-in question-answering workloads, SQuAD-style and WikiQA-style.
//!
//! The generator builds a synthetic corpus with the published shape of the dataset, then asks
//! its questions:
//!
//! * **SQuAD-style** (defaults from SQuAD v1.1 dev, tokenised with the Mistral tokenizer; see
//!   `shared/datasets/README.md`): articles of 21 to 98 paragraphs (log-normal, median 40, so
//!   about 43 on average), paragraphs of median 167 tokens (log-normal, sigma 0.445: mean about
//!   184, p99 about 470), 1 + Poisson(4.1) questions per paragraph (5.1 on average), questions
//!   of median 13 tokens (about 14 on average). A whole article is then about 7,900 tokens.
//! * **WikiQA-style**: documents of median 270 tokens (log-normal, sigma 0.45: mean about 300,
//!   capped at 1,200), one question each (1 + Poisson(0.05)). WikiQA has no articles; meshsim
//!   groups 32 consecutive documents into a *collection* so that a window context can be built
//!   from several documents, which is the only way WikiQA prompts share a long prefix.
//!
//! A prompt is `system prompt + context + question`. The context is the question's own unit
//! (paragraph or document, `context = "unit"`) or the *window* of consecutive units of its
//! article that contains it (`context = "window"`): an article is cut greedily into windows of
//! at most `context_tokens` tokens, so every question about a window shares the window as a
//! prefix. Questions are asked once each, shuffled with the seed or grouped by article;
//! with a [`Reuse`] (`[workload.reuse]`), requests are instead drawn from a pool of the
//! corpus's first contexts, with a popularity, a reuse distance and multi-turn conversations
//! (see [`super::reuse`]). Arrivals are a Poisson process; output lengths follow the
//! configured distribution.
//! Token ids are uniform over the model's vocabulary (ids 0-2 are reserved for special tokens).

use super::output::OutputDist;
use super::reuse::{self, Arrivals, PoolContext, Reuse};
use super::{ReqId, Request, SegId, TokenArena, Trace};
use crate::rng::{Stream, streams};
use crate::units::Nanos;

/// Which dataset's shape to imitate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dataset {
    Squad,
    Wikiqa,
}

/// In what order questions are asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Shuffled,
    Grouped,
}

/// What a prompt's context is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextMode {
    /// The question's own paragraph or document.
    Unit,
    /// The window of consecutive units, of at most this many tokens, that contains it.
    Window { tokens: u32 },
}

impl ContextMode {
    /// Whether a unit of `len` tokens joins the open context, which holds `open` tokens
    /// (`None`: no context is open): windows are cut greedily.
    pub fn joins(self, open: Option<u32>, len: u32) -> bool {
        matches!((self, open), (ContextMode::Window { tokens }, Some(t)) if t + len <= tokens)
    }
}

/// A built-in QA workload, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct QaWorkload {
    pub dataset: Dataset,
    pub requests: u32,
    pub arrival_rate_per_s: f64,
    pub order: Order,
    pub context: ContextMode,
    pub system_prompt_tokens: u32,
    pub output: OutputDist,
    /// Draws requests from a pool of contexts instead of asking each question once.
    pub reuse: Option<Reuse>,
}

impl QaWorkload {
    /// The longest prompt the generator can build: the system prompt, the longest context
    /// (a window, or one unit longer than a window, which is a context of its own) and the
    /// longest question.
    pub fn max_prompt_tokens(&self) -> u32 {
        let shape = match self.dataset {
            Dataset::Squad => &SQUAD,
            Dataset::Wikiqa => &WIKIQA,
        };
        let unit = shape.unit_tokens.3;
        let context = match self.context {
            ContextMode::Unit => unit,
            ContextMode::Window { tokens } => tokens.max(unit),
        };
        match &self.reuse {
            None => self
                .system_prompt_tokens
                .saturating_add(context)
                .saturating_add(shape.question_tokens.3),
            Some(r) => reuse::max_prompt_tokens(
                r,
                self.system_prompt_tokens,
                context,
                shape.question_tokens.3,
                self.output.max(),
            ),
        }
    }
}

/// Shape of a dataset (see the module doc for the sources).
struct Shape {
    units_per_group: (f64, f64, u32, u32),
    unit_tokens: (f64, f64, u32, u32),
    extra_questions_per_unit: f64,
    question_tokens: (f64, f64, u32, u32),
}

const SQUAD: Shape = Shape {
    units_per_group: (40.0, 0.35, 21, 98),
    unit_tokens: (167.0, 0.445, 16, 1_500),
    extra_questions_per_unit: 4.1,
    question_tokens: (13.0, 0.35, 3, 64),
};

const WIKIQA: Shape = Shape {
    units_per_group: (32.0, 0.0, 32, 32),
    unit_tokens: (270.0, 0.45, 20, 1_200),
    extra_questions_per_unit: 0.05,
    question_tokens: (9.0, 0.3, 3, 40),
};

fn clamped_lognormal(rng: &mut Stream, (median, sigma, lo, hi): (f64, f64, u32, u32)) -> u32 {
    (libm::round(rng.lognormal(median, sigma)) as u32).clamp(lo, hi)
}

fn random_tokens(rng: &mut Stream, n: u32, vocab: u32) -> impl Iterator<Item = u32> + '_ {
    (0..n).map(move |_| 3 + rng.below(vocab as u64 - 3) as u32)
}

/// A generated corpus: the system prompt, the contexts and the questions about them.
struct Corpus {
    arena: TokenArena,
    system: SegId,
    /// Segments and tokens of each context.
    contexts: Vec<(Vec<SegId>, u32)>,
    /// `(context, question segment, question tokens)`, in corpus order.
    questions: Vec<(u32, SegId, u32)>,
}

/// Generates articles (groups of units) until `enough` says the corpus is large enough.
fn corpus(
    w: &QaWorkload,
    shape: &Shape,
    vocab: u32,
    rng: &mut Stream,
    enough: impl Fn(&Corpus) -> bool,
    max_groups: usize,
) -> Corpus {
    let mut arena = TokenArena::default();
    let system = arena.push(random_tokens(rng, w.system_prompt_tokens, vocab));
    let mut c = Corpus {
        arena,
        system,
        contexts: Vec::new(),
        questions: Vec::new(),
    };
    // Bounded by `max_groups`; every group adds at least one context and one question.
    let mut groups = 0;
    while !enough(&c) && groups < max_groups {
        groups += 1;
        let units = clamped_lognormal(rng, shape.units_per_group);
        let mut open: Option<u32> = None;
        for _ in 0..units {
            let len = clamped_lognormal(rng, shape.unit_tokens);
            let seg = c.arena.push(random_tokens(rng, len, vocab));
            let open_tokens = open.map(|ctx| c.contexts[ctx as usize].1);
            let ctx = match open {
                Some(ctx) if w.context.joins(open_tokens, len) => ctx,
                _ => {
                    c.contexts.push((Vec::new(), 0));
                    c.contexts.len() as u32 - 1
                }
            };
            open = Some(ctx);
            c.contexts[ctx as usize].0.push(seg);
            c.contexts[ctx as usize].1 += len;
            let asked = 1 + rng.poisson(shape.extra_questions_per_unit);
            for _ in 0..asked {
                let qlen = clamped_lognormal(rng, shape.question_tokens);
                let q = c.arena.push(random_tokens(rng, qlen, vocab));
                c.questions.push((ctx, q, qlen));
            }
        }
    }
    c
}

/// Generates the trace of `w` for a model with `vocab` tokens, from `seed`.
pub fn generate(w: &QaWorkload, vocab: u32, seed: u64) -> Trace {
    let shape = match w.dataset {
        Dataset::Squad => &SQUAD,
        Dataset::Wikiqa => &WIKIQA,
    };
    let mut rng = Stream::new(seed, streams::WORKLOAD_DATASET);
    if let Some(reuse) = &w.reuse {
        return generate_reused(w, reuse, shape, vocab, seed, &mut rng);
    }
    let Corpus {
        arena,
        system,
        contexts,
        mut questions,
    } = corpus(
        w,
        shape,
        vocab,
        &mut rng,
        |c| c.questions.len() >= w.requests as usize,
        usize::MAX,
    );
    if w.order == Order::Shuffled {
        Stream::new(seed, streams::WORKLOAD_ORDER).shuffle(&mut questions);
    }
    questions.truncate(w.requests as usize);

    let mut arrivals = Stream::new(seed, streams::WORKLOAD_ARRIVALS);
    let mut outputs = Stream::new(seed, streams::WORKLOAD_OUTPUTS);
    let mut t = 0.0f64;
    let requests = questions
        .iter()
        .map(|&(ctx, q, qlen)| {
            t += arrivals.exponential(w.arrival_rate_per_s);
            let (ctx_segs, ctx_tokens) = &contexts[ctx as usize];
            let mut segments = Vec::with_capacity(ctx_segs.len() + 2);
            segments.push(system);
            segments.extend_from_slice(ctx_segs);
            segments.push(q);
            Request {
                arrival: Nanos::from_secs_f64(t),
                segments,
                prompt_tokens: w.system_prompt_tokens + ctx_tokens + qlen,
                output_tokens: w.output.sample(&mut outputs),
                context: ctx,
            }
        })
        .collect();
    Trace {
        arena,
        requests,
        contexts: contexts.len() as u32,
    }
}

/// The trace of `w` under `reuse`: a pool of the corpus's first `reuse.contexts` contexts,
/// with their own questions or `questions_per_context` new ones each (see [`super::reuse`]).
fn generate_reused(
    w: &QaWorkload,
    reuse: &Reuse,
    shape: &Shape,
    vocab: u32,
    seed: u64,
    rng: &mut Stream,
) -> Trace {
    let n = reuse.contexts as usize;
    let min = reuse.min_context_tokens;
    // Long enough contexts only grow, so counting one as soon as it is long enough is right.
    let Corpus {
        mut arena,
        system,
        contexts,
        questions,
    } = corpus(
        w,
        shape,
        vocab,
        rng,
        |c| c.contexts.iter().filter(|(_, t)| *t >= min).count() >= n,
        n.saturating_mul(reuse::MAX_GROUPS_PER_CONTEXT),
    );
    // Corpus context -> pool index, for the first n long enough contexts.
    let mut in_pool: Vec<Option<usize>> = vec![None; contexts.len()];
    let mut pool: Vec<PoolContext> = Vec::with_capacity(n);
    for (i, (segments, tokens)) in contexts.into_iter().enumerate() {
        if tokens >= min && pool.len() < n {
            in_pool[i] = Some(pool.len());
            pool.push(PoolContext {
                segments,
                tokens,
                questions: Vec::new(),
            });
        }
    }
    match reuse.questions_per_context {
        None => {
            for (ctx, q, qlen) in questions {
                if let Some(i) = in_pool[ctx as usize] {
                    pool[i].questions.push((q, qlen));
                }
            }
        }
        Some(k) => {
            for c in &mut pool {
                for _ in 0..k {
                    let qlen = clamped_lognormal(rng, shape.question_tokens);
                    c.questions
                        .push((arena.push(random_tokens(rng, qlen, vocab)), qlen));
                }
            }
        }
    }
    let requests = reuse::requests(
        reuse,
        &pool,
        &mut arena,
        Some((system, w.system_prompt_tokens)),
        &Arrivals {
            requests: w.requests,
            rate_per_s: w.arrival_rate_per_s,
            output: &w.output,
            vocab,
            seed,
        },
    );
    Trace {
        arena,
        requests,
        contexts: pool.len() as u32,
    }
}

impl Trace {
    /// Mean prompt length in tokens.
    pub fn mean_prompt_tokens(&self) -> f64 {
        let n = self.requests.len().max(1) as f64;
        self.requests
            .iter()
            .map(|r| r.prompt_tokens as f64)
            .sum::<f64>()
            / n
    }

    pub fn ids(&self) -> impl Iterator<Item = ReqId> {
        (0..self.requests.len() as u32).map(ReqId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn squad(requests: u32, context: ContextMode) -> QaWorkload {
        QaWorkload {
            dataset: Dataset::Squad,
            requests,
            arrival_rate_per_s: 10.0,
            order: Order::Shuffled,
            context,
            system_prompt_tokens: 32,
            output: OutputDist::Fixed { tokens: 8 },
            reuse: None,
        }
    }

    #[test]
    fn squad_paragraph_prompts_have_the_published_shape() {
        let t = generate(&squad(20_000, ContextMode::Unit), 32_000, 1);
        assert_eq!(t.requests.len(), 20_000);
        // Paragraph (~184) + question (~14) + system prompt (32).
        let mean = t.mean_prompt_tokens();
        assert!((200.0..260.0).contains(&mean), "mean prompt {mean}");
        // About 5.1 questions per paragraph context.
        let per_ctx = 20_000.0 / t.contexts as f64;
        assert!(
            (4.0..6.5).contains(&per_ctx),
            "{per_ctx} questions per context"
        );
        for id in t.ids().take(100) {
            assert_eq!(t.prompt(id).count() as u32, t.request(id).prompt_tokens);
        }
    }

    #[test]
    fn window_contexts_stay_within_the_window_and_are_shared() {
        let t = generate(
            &squad(5_000, ContextMode::Window { tokens: 4096 }),
            32_000,
            2,
        );
        for r in &t.requests {
            assert!(r.prompt_tokens <= 32 + 4096 + 64 || r.segments.len() == 3);
        }
        let per_ctx = 5_000.0 / t.contexts as f64;
        assert!(per_ctx > 50.0, "{per_ctx} questions per window");
        // Arrivals are sorted and roughly at the configured rate.
        assert!(t.requests.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        let span = t.requests.last().unwrap().arrival.as_secs_f64();
        assert!((450.0..550.0).contains(&span), "{span}");
    }

    #[test]
    fn no_prompt_is_longer_than_the_bound_the_scenario_checks() {
        for context in [
            ContextMode::Unit,
            ContextMode::Window { tokens: 64 },
            ContextMode::Window { tokens: 4096 },
        ] {
            let w = squad(5_000, context);
            let t = generate(&w, 32_000, 5);
            let longest = t.requests.iter().map(|r| r.prompt_tokens).max().unwrap();
            assert!(longest <= w.max_prompt_tokens(), "{context:?}: {longest}");
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_trace() {
        let w = squad(1_000, ContextMode::Window { tokens: 2048 });
        let (a, b, c) = (
            generate(&w, 32_000, 3),
            generate(&w, 32_000, 3),
            generate(&w, 32_000, 4),
        );
        let key = |t: &Trace| -> Vec<(Nanos, u32)> {
            t.requests
                .iter()
                .map(|r| (r.arrival, r.prompt_tokens))
                .collect()
        };
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a), key(&c));
    }

    #[test]
    fn a_reuse_pool_has_the_contexts_and_questions_asked_for() {
        let reuse = Reuse {
            questions_per_context: Some(3),
            popularity: reuse::Popularity::Zipf { alpha: 1.2 },
            turns: 2,
            ..Reuse::uniform(40)
        };
        let w = QaWorkload {
            reuse: Some(reuse),
            ..squad(2_000, ContextMode::Window { tokens: 2048 })
        };
        let t = generate(&w, 32_000, 7);
        assert_eq!((t.requests.len(), t.contexts), (2_000, 40));
        assert!(t.requests.iter().all(|r| r.context < 40));
        // Three distinct questions per context (in either turn).
        let mut asked = std::collections::BTreeMap::<u32, std::collections::BTreeSet<SegId>>::new();
        for r in &t.requests {
            asked
                .entry(r.context)
                .or_default()
                .insert(*r.segments.last().unwrap());
        }
        let popular = asked.values().map(|q| q.len()).max().unwrap();
        assert_eq!(popular, 3);
        let longest = t.requests.iter().map(|r| r.prompt_tokens).max().unwrap();
        assert!(longest <= w.max_prompt_tokens());
        for id in t.ids().take(200) {
            assert_eq!(t.prompt(id).count() as u32, t.request(id).prompt_tokens);
        }
    }

    #[test]
    fn a_minimum_context_length_keeps_short_windows_out_of_the_pool() {
        let window = ContextMode::Window { tokens: 8192 };
        let pool = |min: u32| {
            let w = QaWorkload {
                reuse: Some(Reuse {
                    min_context_tokens: min,
                    ..Reuse::uniform(100)
                }),
                ..squad(1_000, window)
            };
            generate(&w, 32_000, 11)
        };
        let (all, long) = (pool(0), pool(6144));
        assert_eq!((all.contexts, long.contexts), (100, 100));
        assert!(long.requests.iter().all(|r| r.prompt_tokens >= 32 + 6144));
        let (a, l) = (all.mean_prompt_tokens(), long.mean_prompt_tokens());
        assert!(
            a < 6_500.0 && l > 7_000.0,
            "mean prompt {a} without, {l} with"
        );
    }
}
