//! Pipeline shards with a per-node generation cache (DESIGN, "Pipeline routes").
//!
//! A model's layers are split into contiguous ranges, one per [`Shard`]. A chat request is a
//! route session with a stable [`SessionId`]. A shard is a pure state machine: it handles one
//! [`ShardRequest`] at a time, at a time `now` given by its caller, through its
//! [`ModelBackend`], and answers with a [`ShardReply`]; it reads no clock and does no IO.
//!
//! Modes of a request:
//! - **prefill**: the input covers the whole sequence so far (positions `0..seq_len`); the shard
//!   runs it from an empty cache and stores the resulting cache state under
//!   `(session, start, end)`, replacing any earlier one.
//! - **decode**: the input is the newest token alone (its ids for the head, a `[1, 1, hidden]`
//!   activation after it) at position `seq_len - 1`. The shard needs its stored state of exactly
//!   `seq_len - 1` tokens; if it has none (restart, eviction, TTL expiry, route change) or a
//!   state of another length, it answers [`ShardReply::CacheMiss`] and computes nothing. Outputs
//!   are never silently wrong.
//! - **stateless**: like prefill, but nothing is stored: the baseline that recomputes the
//!   whole prompt-so-far for every token.
//!
//! A [`Route`] chains shards that cover the model's layers in order and drives greedy
//! generation. On a cache miss it re-prefills the sequence so far under the same session id
//! (which replaces every shard's state) and carries on, so an undisturbed run and a disturbed
//! one produce the same tokens. It counts the bytes that flow between shards at every step.

pub mod cache;

use crate::backend::{Activation, BackendError, CacheState, ModelBackend, StepOutput};
use crate::units::Nanos;
pub use cache::{CacheKey, CacheLimits, Eviction, SessionCache, SessionId};

/// How a request is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Prefill,
    Decode,
    Stateless,
}

/// One step of a session arriving at a shard.
#[derive(Clone, Debug)]
pub struct ShardRequest {
    pub session: SessionId,
    pub mode: Mode,
    /// Token ids (head) or the previous shard's activation.
    pub input: Activation,
    /// Tokens in the sequence once this step's input is included.
    pub seq_len: usize,
    /// Which pass of the session the head is on: it starts at 0 and grows each time the
    /// head starts the session over after losing a shard (`crate::pipeline::Msg::Lost`), so
    /// that a reply to a step sent before the loss is told apart and dropped. Shards copy it
    /// from a step to the step they forward.
    pub attempt: u32,
}

impl ShardRequest {
    /// The position of the newest token.
    pub fn newest(&self) -> usize {
        self.seq_len - 1
    }
}

/// A shard's answer.
#[derive(Clone, Debug)]
pub enum ShardReply {
    /// Send this on to the next shard.
    Forward(ShardRequest),
    /// The tail sampled the token that follows the sequence.
    Token {
        session: SessionId,
        token: u32,
        logits: Option<Vec<f32>>,
    },
    /// A decode step found no usable cache state here.
    CacheMiss { session: SessionId, key: CacheKey },
    /// The step could not be run (a bad request or a backend error); the session ends.
    Failed { session: SessionId, error: String },
}

/// What a shard did with a request.
#[derive(Clone, Debug)]
pub struct Handled {
    pub reply: ShardReply,
    /// The modelled duration (sim backend), if any.
    pub duration: Option<Nanos>,
}

/// What can go wrong at a shard or on a route.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("bad route: {0}")]
    BadRoute(String),
    #[error("session {0:?} kept missing the cache after a re-prefill")]
    RepeatedMiss(SessionId),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Counters of one shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    pub prefills: u64,
    pub decodes: u64,
    pub stateless: u64,
    pub cache_misses: u64,
}

/// One pipeline shard: a layer range, its backend and its session cache.
pub struct Shard {
    backend: Box<dyn ModelBackend>,
    cache: SessionCache<CacheState>,
    stats: ShardStats,
}

impl Shard {
    pub fn new(backend: Box<dyn ModelBackend>, limits: CacheLimits) -> Shard {
        Shard {
            backend,
            cache: SessionCache::new(limits),
            stats: ShardStats::default(),
        }
    }

    /// The cache key of `session` at this shard.
    pub fn key(&self, session: SessionId) -> CacheKey {
        let layers = self.backend.layers();
        CacheKey {
            session,
            start: layers.start,
            end: layers.end,
        }
    }

    pub fn backend(&self) -> &dyn ModelBackend {
        self.backend.as_ref()
    }

    pub fn cache(&self) -> &SessionCache<CacheState> {
        &self.cache
    }

    pub fn cache_mut(&mut self) -> &mut SessionCache<CacheState> {
        &mut self.cache
    }

    pub fn stats(&self) -> ShardStats {
        self.stats
    }

    /// Drops all session state, as a restarted process would (the weights stay loaded).
    pub fn restart(&mut self) {
        self.cache.clear();
    }

    /// Handles one request at time `now`.
    pub fn handle(&mut self, now: Nanos, req: ShardRequest) -> Result<Handled, ShardError> {
        let n = req.input.positions();
        let expected = match req.mode {
            Mode::Prefill | Mode::Stateless => req.seq_len,
            Mode::Decode => 1,
        };
        if n != expected || req.seq_len == 0 {
            return Err(ShardError::BadRequest(format!(
                "{:?} step of a {}-token sequence carries {n} positions",
                req.mode, req.seq_len
            )));
        }
        let key = self.key(req.session);
        let layers = self.backend.layers();
        let (offset, cache) = match req.mode {
            Mode::Prefill => {
                self.stats.prefills += 1;
                (0, None)
            }
            Mode::Stateless => {
                self.stats.stateless += 1;
                (0, None)
            }
            Mode::Decode => match self.cache.take(now, &key) {
                Some(state) if state.tokens() == req.newest() => {
                    self.stats.decodes += 1;
                    (req.newest(), Some(state))
                }
                // Absent, expired, or of another length (a stale state is dropped: it cannot
                // serve this sequence any more).
                _ => {
                    self.stats.cache_misses += 1;
                    return Ok(Handled {
                        reply: ShardReply::CacheMiss {
                            session: req.session,
                            key,
                        },
                        duration: None,
                    });
                }
            },
        };
        let step = self.backend.run(layers, req.input, offset, cache)?;
        if req.mode != Mode::Stateless {
            self.cache.insert(now, key, step.cache);
        }
        let reply = match step.output {
            StepOutput::Activation(input) => ShardReply::Forward(ShardRequest { input, ..req }),
            StepOutput::Token { token, logits } => ShardReply::Token {
                session: req.session,
                token,
                logits,
            },
        };
        Ok(Handled {
            reply,
            duration: step.duration,
        })
    }
}

/// How a route generates tokens after the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeMode {
    /// Decode steps that carry the newest token only, against the shards' caches.
    Cached,
    /// Recompute the whole sequence for every token.
    Stateless,
}

/// One greedy generation on a route.
#[derive(Clone, Debug)]
pub struct Generation {
    pub session: SessionId,
    pub mode: DecodeMode,
    pub prompt_len: usize,
    /// The prompt followed by every generated token.
    pub tokens: Vec<u32>,
    /// The logits that chose the newest token (real backends only).
    pub last_logits: Option<Vec<f32>>,
    /// Per step (the first is the prefill), bytes sent from one shard to the next.
    pub bytes_between_shards: Vec<u64>,
    /// Cache misses answered, and the re-prefills they caused.
    pub cache_misses: u64,
    /// Sum of the modelled durations of every shard's work (sim backends).
    pub model_time: Nanos,
}

impl Generation {
    /// A generation of `prompt` (not empty) before its first pass.
    pub fn new(session: SessionId, prompt: Vec<u32>, mode: DecodeMode) -> Result<Self, ShardError> {
        if prompt.is_empty() {
            return Err(ShardError::BadRequest("empty prompt".into()));
        }
        Ok(Generation {
            session,
            mode,
            prompt_len: prompt.len(),
            tokens: prompt,
            last_logits: None,
            bytes_between_shards: Vec::new(),
            cache_misses: 0,
            model_time: Nanos::ZERO,
        })
    }

    /// The generated tokens.
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// The mode of the first pass: prefill, or a stateless full pass.
    pub fn first_mode(&self) -> Mode {
        match self.mode {
            DecodeMode::Cached => Mode::Prefill,
            DecodeMode::Stateless => Mode::Stateless,
        }
    }

    /// The head's request for a pass over the whole sequence so far.
    pub fn full_request(&self, mode: Mode) -> ShardRequest {
        ShardRequest {
            session: self.session,
            mode,
            input: Activation::tokens(self.tokens.clone()),
            seq_len: self.tokens.len(),
            attempt: 0,
        }
    }

    /// The head's request for a decode step: only the newest token, sampled but not yet run
    /// through the model.
    pub fn decode_request(&self) -> Result<ShardRequest, ShardError> {
        let Some(&newest) = self.tokens.last() else {
            return Err(ShardError::BadRequest("a generation without tokens".into()));
        };
        Ok(ShardRequest {
            session: self.session,
            mode: Mode::Decode,
            input: Activation::tokens(vec![newest]),
            seq_len: self.tokens.len(),
            attempt: 0,
        })
    }

    /// Applies the outcome of a full pass in `mode`: appends the token, or reports the miss
    /// that a full pass never answers.
    pub fn finish_full(&mut self, mode: Mode, pass: Pass, bytes: u64) -> Result<(), ShardError> {
        match pass {
            Pass::Token(t, logits) => {
                self.push(t, logits, bytes);
                Ok(())
            }
            // Prefill and stateless steps never consult a shard's cache.
            Pass::Miss => Err(ShardError::BadRoute(format!(
                "a {mode:?} step of session {:?} answered a cache miss",
                self.session
            ))),
        }
    }

    /// Appends a sampled token and the bytes its pass sent between shards.
    pub fn push(&mut self, token: u32, logits: Option<Vec<f32>>, bytes: u64) {
        self.tokens.push(token);
        self.last_logits = logits;
        self.bytes_between_shards.push(bytes);
    }

    /// Counts a decode step that missed, once its re-prefill has run: the bytes the failed
    /// step sent are added to the re-prefill's.
    pub fn record_miss(&mut self, bytes: u64) {
        self.cache_misses += 1;
        if let Some(b) = self.bytes_between_shards.last_mut() {
            *b += bytes;
        }
    }

    /// The newest token.
    pub fn newest(&self) -> u32 {
        // A generation always holds its (non-empty) prompt.
        self.tokens[self.tokens.len() - 1]
    }
}

/// Shards that cover a model's layers in order, head first.
pub struct Route {
    shards: Vec<Shard>,
}

/// What a pass through a whole route gave: the tail's token, or a cache miss somewhere.
#[derive(Debug)]
pub enum Pass {
    Token(u32, Option<Vec<f32>>),
    Miss,
}

impl Route {
    /// Checks that the shards' ranges are contiguous and cover the whole model.
    pub fn new(shards: Vec<Shard>) -> Result<Route, ShardError> {
        let Some(first) = shards.first() else {
            return Err(ShardError::BadRoute("no shards".into()));
        };
        let total = first.backend.total_layers();
        let mut next = 0;
        for s in &shards {
            let l = s.backend.layers();
            if l.start != next || s.backend.total_layers() != total {
                return Err(ShardError::BadRoute(format!(
                    "shard of layers {l:?} does not follow layer {next}"
                )));
            }
            next = l.end;
        }
        if next != total {
            return Err(ShardError::BadRoute(format!(
                "shards end at layer {next} of {total}"
            )));
        }
        Ok(Route { shards })
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn shard_mut(&mut self, i: usize) -> &mut Shard {
        &mut self.shards[i]
    }

    /// Sends `req` through every shard in order.
    fn pass(
        &mut self,
        now: Nanos,
        mut req: ShardRequest,
        bytes: &mut u64,
        time: &mut Nanos,
    ) -> Result<Pass, ShardError> {
        let last = self.shards.len() - 1;
        for (i, shard) in self.shards.iter_mut().enumerate() {
            let handled = shard.handle(now, req)?;
            *time += handled.duration.unwrap_or(Nanos::ZERO);
            match handled.reply {
                ShardReply::Forward(next) if i < last => {
                    *bytes += next.input.bytes();
                    req = next;
                }
                ShardReply::Token { token, logits, .. } if i == last => {
                    return Ok(Pass::Token(token, logits));
                }
                ShardReply::CacheMiss { .. } => return Ok(Pass::Miss),
                other => {
                    return Err(ShardError::BadRoute(format!(
                        "shard {i} of {} answered {other:?}",
                        last + 1
                    )));
                }
            }
        }
        // Route::new refuses an empty route, and the last shard's answer always returns above.
        unreachable!("the tail answers a token or a miss")
    }

    /// Runs the whole sequence of `g` in `mode` (prefill or stateless) and appends the token.
    fn full(&mut self, now: Nanos, g: &mut Generation, mode: Mode) -> Result<(), ShardError> {
        let mut bytes = 0;
        let pass = self.pass(now, g.full_request(mode), &mut bytes, &mut g.model_time)?;
        g.finish_full(mode, pass, bytes)
    }

    /// Starts a session: prefills `prompt` and samples the first token.
    pub fn start(
        &mut self,
        now: Nanos,
        session: SessionId,
        prompt: Vec<u32>,
        mode: DecodeMode,
    ) -> Result<Generation, ShardError> {
        let mut g = Generation::new(session, prompt, mode)?;
        let first = g.first_mode();
        self.full(now, &mut g, first)?;
        Ok(g)
    }

    /// Generates one more token of `g` at time `now`.
    pub fn step(&mut self, now: Nanos, g: &mut Generation) -> Result<u32, ShardError> {
        match g.mode {
            DecodeMode::Stateless => self.full(now, g, Mode::Stateless)?,
            DecodeMode::Cached => {
                let mut bytes = 0;
                match self.pass(now, g.decode_request()?, &mut bytes, &mut g.model_time)? {
                    Pass::Token(t, logits) => g.push(t, logits, bytes),
                    Pass::Miss => {
                        // Re-prefill the sequence so far under the same session id; this
                        // replaces the state of the shards that did run the decode step.
                        self.full(now, g, Mode::Prefill)?;
                        g.record_miss(bytes);
                    }
                }
            }
        }
        Ok(g.newest())
    }

    /// Greedy generation of `max_new` tokens (at least one), all at time `now`.
    pub fn generate(
        &mut self,
        now: Nanos,
        session: SessionId,
        prompt: Vec<u32>,
        max_new: usize,
        mode: DecodeMode,
    ) -> Result<Generation, ShardError> {
        let mut g = self.start(now, session, prompt, mode)?;
        for _ in 1..max_new {
            self.step(now, &mut g)?;
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SimBackend;
    use crate::hardware::GpuSpec;

    fn a100() -> GpuSpec {
        GpuSpec::a100_40gb(0.5, 0.8)
    }

    fn sim_route(cuts: &[usize]) -> Route {
        let m = crate::model::catalogue::MISTRAL_7B_V0_2.model;
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(m.layers as usize);
        let shards = bounds
            .windows(2)
            .map(|w| {
                let b = SimBackend::new(m.clone(), w[0]..w[1], a100(), Nanos::ZERO);
                Shard::new(Box::new(b), CacheLimits::default())
            })
            .collect();
        Route::new(shards).unwrap()
    }

    #[test]
    fn routes_must_cover_the_layers_in_order() {
        let m = crate::model::catalogue::TINY.model;
        let shard = |r: std::ops::Range<usize>| {
            let b = SimBackend::new(m.clone(), r, a100(), Nanos::ZERO);
            Shard::new(Box::new(b), CacheLimits::default())
        };
        assert!(Route::new(vec![shard(0..2), shard(3..4)]).is_err());
        assert!(Route::new(vec![shard(0..2)]).is_err());
        assert!(Route::new(vec![shard(2..4), shard(0..2)]).is_err());
        assert!(Route::new(vec![shard(0..2), shard(2..4)]).is_ok());
    }

    #[test]
    fn sim_decode_sends_one_hidden_vector_and_costs_less_than_stateless() {
        let mut r = sim_route(&[16]);
        let s = SessionId(1);
        let cached = r.generate(Nanos::ZERO, s, vec![1; 512], 8, DecodeMode::Cached);
        let cached = cached.unwrap();
        // Prefill: 512 x 4096 x 2 B; each decode step: 4096 x 2 B.
        assert_eq!(cached.bytes_between_shards[0], 512 * 8192);
        assert!(cached.bytes_between_shards[1..].iter().all(|&b| b == 8192));
        assert_eq!(cached.cache_misses, 0);
        let mut r = sim_route(&[16]);
        let stateless = r
            .generate(Nanos::ZERO, s, vec![1; 512], 8, DecodeMode::Stateless)
            .unwrap();
        assert_eq!(stateless.bytes_between_shards[7], 519 * 8192);
        assert!(stateless.model_time > cached.model_time);
        assert_eq!(stateless.tokens.len(), cached.tokens.len());
    }

    #[test]
    fn a_restarted_middle_shard_answers_a_miss_and_the_route_re_prefills() {
        let mut r = sim_route(&[10, 20]);
        let s = SessionId(7);
        let mut g = r
            .start(Nanos::ZERO, s, vec![3; 100], DecodeMode::Cached)
            .unwrap();
        r.step(Nanos::ZERO, &mut g).unwrap();
        r.shard_mut(1).restart();
        r.step(Nanos::ZERO, &mut g).unwrap();
        assert_eq!(g.cache_misses, 1);
        assert_eq!(r.shards()[1].stats().cache_misses, 1);
        // Prefill, decode, then the re-prefill of 102 tokens.
        assert_eq!(r.shards()[0].stats().prefills, 2);
        assert_eq!(r.shards()[2].stats().prefills, 2);
        r.step(Nanos::ZERO, &mut g).unwrap();
        assert_eq!(g.cache_misses, 1);
        assert_eq!(g.tokens.len(), 104);
    }

    #[test]
    fn a_decode_after_the_ttl_misses() {
        let mut r = sim_route(&[16]);
        let s = SessionId(2);
        let mut g = r
            .start(Nanos::ZERO, s, vec![5; 10], DecodeMode::Cached)
            .unwrap();
        r.step(Nanos::from_secs(599), &mut g).unwrap();
        assert_eq!(g.cache_misses, 0);
        r.step(Nanos::from_secs(1199), &mut g).unwrap();
        assert_eq!(g.cache_misses, 1);
    }

    #[test]
    fn a_decode_step_must_carry_one_position() {
        let mut r = sim_route(&[16]);
        let req = ShardRequest {
            session: SessionId(1),
            mode: Mode::Decode,
            input: Activation::tokens(vec![1, 2]),
            seq_len: 2,
            attempt: 0,
        };
        assert!(matches!(
            r.shard_mut(0).handle(Nanos::ZERO, req),
            Err(ShardError::BadRequest(_))
        ));
    }
}
