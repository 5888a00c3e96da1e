//! Replaying real datasets and production traces.
//!
//! Two kinds of files become a [`Trace`]:
//!
//! * **Datasets** (SQuAD JSON, WikiQA TSV) give text: a [`Corpus`] of documents, their units
//!   (paragraphs or WikiQA documents) and the questions asked about each unit. They become
//!   requests the way a QA service would serve them: `system prompt + context + question`,
//!   where the context is the question's unit or the window of consecutive units of its
//!   document that contains it (at most `context_tokens` tokens, cut greedily), so every
//!   question about a window shares it as a prefix. Text is tokenised exactly with a
//!   `tokenizer.json` or estimated ([`super::tokenize`]). Questions are asked in document order
//!   or shuffled with the seed; arrivals are Poisson at the configured rate; output lengths
//!   come from the configured distribution.
//! * **Traces** (Mooncake JSONL, Vidur/Splitwise CSV, meshsim's canonical JSONL) give
//!   arrival times, prompt lengths, output lengths and, for Mooncake and canonical traces,
//!   which prompt blocks are shared. A Mooncake block id becomes a segment of pseudo token
//!   ids derived from the id ([`crate::hash::pseudo_tokens`]), so equal ids are equal token
//!   prefixes; a Vidur prompt shares nothing.
//!
//! Every error names the file, the line (where there is one) and the field.

pub mod canonical;
pub mod mooncake;
pub mod squad;
pub mod vidur;
pub mod wikiqa;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::output::OutputDist;
use super::qa::{ContextMode, Order};
use super::reuse::{self, Arrivals, PoolContext, Reuse};
use super::tokenize::{PSEUDO_VOCAB, Tokenizer};
use super::{Request, SegId, TokenArena, Trace, TraceError};
use crate::rng::{Stream, streams};
use crate::units::Nanos;

/// The formats meshsim reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    SquadJson,
    WikiqaTsv,
    MooncakeJsonl,
    VidurCsv,
    Canonical,
}

impl Source {
    pub const ALL: [Source; 5] = [
        Source::SquadJson,
        Source::WikiqaTsv,
        Source::MooncakeJsonl,
        Source::VidurCsv,
        Source::Canonical,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Source::SquadJson => "squad-json",
            Source::WikiqaTsv => "wikiqa-tsv",
            Source::MooncakeJsonl => "mooncake-jsonl",
            Source::VidurCsv => "vidur-csv",
            Source::Canonical => "canonical",
        }
    }

    pub fn from_name(name: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether the file holds text that becomes QA prompts (rather than a request trace).
    pub fn is_dataset(self) -> bool {
        matches!(self, Source::SquadJson | Source::WikiqaTsv)
    }

    /// Guesses the format of `path` from its extension (and, for `.jsonl`, its first line).
    pub fn guess(path: &Path) -> Option<Source> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "json" => Some(Source::SquadJson),
            "tsv" => Some(Source::WikiqaTsv),
            "csv" => Some(Source::VidurCsv),
            "jsonl" => {
                // Its first line only (in its first 64 KiB: a canonical header is short).
                use std::io::Read;
                let mut bytes = Vec::new();
                std::fs::File::open(path)
                    .and_then(|f| f.take(64 << 10).read_to_end(&mut bytes))
                    .ok()?;
                let first = bytes.split(|&b| b == b'\n').next()?;
                let first = String::from_utf8_lossy(first);
                Some(if first.contains(canonical::FORMAT_TAG) {
                    Source::Canonical
                } else {
                    Source::MooncakeJsonl
                })
            }
            _ => None,
        }
    }

    /// The block size that the format's sharing is expressed in (for statistics).
    pub fn default_block_size(self) -> u32 {
        match self {
            Source::MooncakeJsonl => mooncake::BLOCK_TOKENS,
            _ => 16,
        }
    }
}

/// How dataset questions become requests (unused by trace formats).
#[derive(Clone, Debug, PartialEq)]
pub struct QaOptions {
    pub arrival_rate_per_s: f64,
    pub order: Order,
    pub context: ContextMode,
    /// Text of the system prompt that opens every prompt (empty: none).
    pub system_prompt: String,
    pub output: OutputDist,
    /// Draws requests from a pool of the dataset's first contexts instead of asking each
    /// question once (see [`crate::workload::reuse`]).
    pub reuse: Option<Reuse>,
}

impl Default for QaOptions {
    fn default() -> Self {
        QaOptions {
            arrival_rate_per_s: 1.0,
            order: Order::Grouped,
            context: ContextMode::Unit,
            system_prompt: DEFAULT_SYSTEM_PROMPT.to_string(),
            output: OutputDist::Fixed { tokens: 64 },
            reuse: None,
        }
    }
}

/// The system prompt used when a scenario gives none.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are a helpful assistant. Answer the question \
    using only the context below.";

/// A replayed workload, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplaySpec {
    pub source: Source,
    pub path: PathBuf,
    pub tokenizer: Option<PathBuf>,
    /// Replay at most this many requests (the first ones, after ordering).
    pub max_requests: Option<u32>,
    /// Skip malformed lines (counting them) instead of failing on the first.
    pub skip_bad_lines: bool,
    /// Leave out requests whose prompt is longer than the model's context (counting them)
    /// instead of refusing the trace.
    pub skip_too_long: bool,
    pub qa: QaOptions,
}

impl ReplaySpec {
    pub fn new(source: Source, path: impl Into<PathBuf>) -> ReplaySpec {
        ReplaySpec {
            source,
            path: path.into(),
            tokenizer: None,
            max_requests: None,
            skip_bad_lines: false,
            skip_too_long: false,
            qa: QaOptions::default(),
        }
    }
}

/// A loaded file as a trace, with what the format tells about it.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub trace: Trace,
    pub source: Source,
    /// Block size of the format's sharing (Mooncake: 512; others: 16, vLLM's default).
    pub block_size: u32,
    /// Documents (articles, WikiQA collections) in the file, for datasets.
    pub documents: Option<u32>,
    /// Units (paragraphs, WikiQA documents) in the file, for datasets.
    pub units: Option<u32>,
    /// Questions in the file, for datasets.
    pub questions: Option<u32>,
    /// Lines skipped as malformed (only with `skip_bad_lines`).
    pub skipped_lines: u64,
    /// For each request of the trace, the 1-based line of the file it comes from; empty for
    /// datasets, whose requests have no line of their own.
    pub lines: Vec<usize>,
}

/// Loads the file of `spec` and builds its trace; `seed` orders and times dataset questions.
pub fn load(spec: &ReplaySpec, seed: u64) -> Result<Loaded, TraceError> {
    let mut loaded = match spec.source {
        Source::SquadJson | Source::WikiqaTsv => {
            let corpus = if spec.source == Source::SquadJson {
                squad::read(&spec.path)?
            } else {
                wikiqa::read(&spec.path, spec.skip_bad_lines)?
            };
            let tok = Tokenizer::load(spec.tokenizer.as_deref())?;
            let mut l = corpus.build(&spec.path, &tok, &spec.qa, spec.max_requests, seed)?;
            l.source = spec.source;
            l
        }
        Source::MooncakeJsonl => {
            mooncake::read(&spec.path, spec.skip_bad_lines)?.build(spec.max_requests)
        }
        Source::VidurCsv => vidur::read(&spec.path, spec.skip_bad_lines)?.build(spec.max_requests),
        Source::Canonical => canonical::read(&spec.path, spec.max_requests)?,
    };
    loaded.source = spec.source;
    if loaded.trace.requests.is_empty() {
        let skipped = match loaded.skipped_lines {
            0 => String::new(),
            n => format!(" ({n} malformed lines skipped)"),
        };
        return Err(TraceError::whole(
            &spec.path,
            "file",
            format!("no requests to replay{skipped}: a trace needs at least one"),
        ));
    }
    Ok(loaded)
}

impl Loaded {
    /// Leaves out the requests whose prompt is longer than `max_prompt_tokens`; returns how
    /// many (`workload.skip_too_long`). The others keep their arrivals and their order.
    pub fn drop_too_long(&mut self, max_prompt_tokens: u64) -> usize {
        let before = self.trace.requests.len();
        let keep: Vec<bool> = (self.trace.requests.iter())
            .map(|r| u64::from(r.prompt_tokens) <= max_prompt_tokens)
            .collect();
        let mut i = 0;
        self.trace.requests.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        if !self.lines.is_empty() {
            let mut i = 0;
            self.lines.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
        before - self.trace.requests.len()
    }

    /// Checks that every request of the trace loaded from `path` can be simulated: it arrives
    /// by `max_arrival` (the simulation's time limit) and its prompt fits in the model's
    /// context of `max_prompt_tokens` tokens (`model` names it). The error names the first
    /// request that does not, by its line (or, for datasets, its number).
    pub fn check_fits(
        &self,
        path: &Path,
        max_arrival: Nanos,
        max_prompt_tokens: u64,
        model: &str,
    ) -> Result<(), TraceError> {
        let (arrival_field, prompt_field) = match self.source {
            Source::MooncakeJsonl => ("timestamp", "input_length"),
            Source::VidurCsv => ("arrived_at", "num_prefill_tokens"),
            Source::Canonical => ("arrival_ns", "prompt"),
            Source::SquadJson | Source::WikiqaTsv => ("arrival", "prompt"),
        };
        let at = |i: usize, field: &str, msg: String| match self.lines.get(i) {
            Some(&line) => TraceError::at(path, line, field, msg),
            None => TraceError::whole(path, &format!("request {i}: {field}"), msg),
        };
        for (i, r) in self.trace.requests.iter().enumerate() {
            if r.arrival > max_arrival {
                return Err(at(
                    i,
                    arrival_field,
                    format!(
                        "the request arrives at {:.3} s, after the simulation's time limit \
                         (limits.max_sim_time_s = {})",
                        r.arrival.as_secs_f64(),
                        max_arrival.as_secs_f64()
                    ),
                ));
            }
            if u64::from(r.prompt_tokens) > max_prompt_tokens {
                return Err(at(
                    i,
                    prompt_field,
                    format!(
                        "a prompt of {} tokens is longer than the context of {model} ({} tokens)",
                        r.prompt_tokens, max_prompt_tokens
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The bytes of `path` without a leading UTF-8 byte-order mark; they must not be empty.
pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>, TraceError> {
    let mut bytes = crate::text::read_capped(path, crate::text::MAX_DATA_BYTES)
        .map_err(|e| TraceError::whole(path, "file", format!("cannot read: {e}")))?;
    if bytes.starts_with(crate::text::UTF8_BOM) {
        bytes.drain(..crate::text::UTF8_BOM.len());
    }
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(TraceError::whole(path, "file", "the file is empty"));
    }
    Ok(bytes)
}

/// The non-blank lines of `bytes` as `(1-based line number, text)`, each checked as UTF-8.
pub(crate) fn lines<'a>(
    path: &'a Path,
    bytes: &'a [u8],
) -> impl Iterator<Item = Result<(usize, &'a str), TraceError>> + 'a {
    bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.iter().all(|b| b.is_ascii_whitespace()))
        .map(move |(i, l)| {
            let l = l.strip_suffix(b"\r").unwrap_or(l);
            std::str::from_utf8(l).map(|s| (i + 1, s)).map_err(|e| {
                TraceError::at(
                    path,
                    i + 1,
                    "line",
                    format!("not valid UTF-8 (byte {} of the line)", e.valid_up_to() + 1),
                )
            })
        })
}

/// `v` as text short enough for a message: `1e300` rather than its 301 digits.
pub(crate) fn short(v: f64) -> String {
    if v.is_finite() && v.abs() >= 1e15 {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// A line-level error under `skip_bad_lines`: counted and skipped, or returned.
pub(crate) fn skip_or_fail(skip: bool, skipped: &mut u64, e: TraceError) -> Result<(), TraceError> {
    if skip {
        *skipped += 1;
        Ok(())
    } else {
        Err(e)
    }
}

/// A text dataset: documents, their units and the questions asked about them.
#[derive(Clone, Debug, Default)]
pub struct Corpus {
    pub documents: Vec<Document>,
    pub skipped_lines: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Document {
    pub title: String,
    /// Paragraphs (SQuAD) or documents (WikiQA), in order.
    pub units: Vec<String>,
    /// `(unit index, question text)`, in file order.
    pub questions: Vec<(u32, String)>,
}

impl Corpus {
    pub fn units(&self) -> usize {
        self.documents.iter().map(|d| d.units.len()).sum()
    }

    pub fn questions(&self) -> usize {
        self.documents.iter().map(|d| d.questions.len()).sum()
    }

    /// Builds the QA trace: see the module doc. Only the documents that the selected
    /// questions are about are tokenised.
    pub fn build(
        &self,
        path: &Path,
        tok: &Tokenizer,
        qa: &QaOptions,
        max_requests: Option<u32>,
        seed: u64,
    ) -> Result<Loaded, TraceError> {
        if let Some(reuse) = &qa.reuse {
            return self.build_reused(path, tok, qa, reuse, max_requests, seed);
        }
        // (document, question index), in document order.
        let mut asked: Vec<(u32, u32)> = self
            .documents
            .iter()
            .enumerate()
            .flat_map(|(d, doc)| (0..doc.questions.len() as u32).map(move |q| (d as u32, q)))
            .collect();
        if qa.order == Order::Shuffled {
            Stream::new(seed, streams::WORKLOAD_ORDER).shuffle(&mut asked);
        }
        if let Some(max) = max_requests {
            asked.truncate(max as usize);
        }

        let mut arena = TokenArena::default();
        let system_tokens = tok.encode(&qa.system_prompt);
        let system_len = system_tokens.len() as u32;
        let system = (system_len > 0).then(|| arena.push(system_tokens));
        // Per document used: the context id of each unit, then each context's segments.
        let mut unit_ctx: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        let mut contexts: Vec<(Vec<SegId>, u32)> = Vec::new();
        let mut outputs = Stream::new(seed, streams::WORKLOAD_OUTPUTS);
        let mut arrivals = Stream::new(seed, streams::WORKLOAD_ARRIVALS);
        let mut t = 0.0f64;
        let mut requests = Vec::with_capacity(asked.len());
        for &(d, q) in &asked {
            let doc = &self.documents[d as usize];
            let ctx_of_unit = unit_ctx.entry(d).or_insert_with(|| {
                let mut of_unit = Vec::with_capacity(doc.units.len());
                let mut open: Option<u32> = None;
                for text in &doc.units {
                    let ids = tok.encode(text);
                    let len = ids.len() as u32;
                    let seg = arena.push(ids);
                    let open_tokens = open.map(|c| contexts[c as usize].1);
                    let c = match open {
                        Some(c) if qa.context.joins(open_tokens, len) => c,
                        _ => {
                            contexts.push((Vec::new(), 0));
                            contexts.len() as u32 - 1
                        }
                    };
                    open = Some(c);
                    contexts[c as usize].0.push(seg);
                    contexts[c as usize].1 += len;
                    of_unit.push(c);
                }
                of_unit
            });
            let (unit, text) = &doc.questions[q as usize];
            let ctx = ctx_of_unit[*unit as usize];
            let q_ids = tok.encode(text);
            let q_len = q_ids.len() as u32;
            let q_seg = arena.push(q_ids);
            let (ctx_segs, ctx_len) = &contexts[ctx as usize];
            let mut segments = Vec::with_capacity(ctx_segs.len() + 2);
            segments.extend(system);
            segments.extend_from_slice(ctx_segs);
            segments.push(q_seg);
            t += arrivals.exponential(qa.arrival_rate_per_s);
            requests.push(Request {
                arrival: Nanos::from_secs_f64(t),
                segments,
                prompt_tokens: system_len + ctx_len + q_len,
                output_tokens: qa.output.sample(&mut outputs),
                context: ctx,
            });
        }
        Ok(self.loaded(arena, requests, contexts.len() as u32))
    }

    /// The loaded trace of this corpus's `requests` over `arena`.
    fn loaded(&self, arena: TokenArena, requests: Vec<Request>, contexts: u32) -> Loaded {
        Loaded {
            trace: Trace {
                arena,
                requests,
                contexts,
            },
            source: Source::SquadJson,
            block_size: 16,
            documents: Some(self.documents.len() as u32),
            units: Some(self.units() as u32),
            questions: Some(self.questions() as u32),
            skipped_lines: self.skipped_lines,
            lines: Vec::new(),
        }
    }

    /// The trace under `reuse`: a pool of the first `reuse.contexts` contexts (in file order)
    /// that have questions, each with at most `questions_per_context` of its questions (in
    /// file order); `max_requests` requests (default: as many as the dataset has questions).
    fn build_reused(
        &self,
        path: &Path,
        tok: &Tokenizer,
        qa: &QaOptions,
        reuse: &Reuse,
        max_requests: Option<u32>,
        seed: u64,
    ) -> Result<Loaded, TraceError> {
        let mut arena = TokenArena::default();
        let system_tokens = tok.encode(&qa.system_prompt);
        let system_len = system_tokens.len() as u32;
        let system = (system_len > 0).then(|| (arena.push(system_tokens), system_len));
        let cap = reuse.questions_per_context.unwrap_or(u32::MAX) as usize;
        let mut pool: Vec<PoolContext> = Vec::new();
        // Bounded by the corpus: each document is tokenised once.
        for doc in &self.documents {
            if pool.len() >= reuse.contexts as usize {
                break;
            }
            let mut contexts: Vec<PoolContext> = Vec::new();
            let mut of_unit = Vec::with_capacity(doc.units.len());
            for text in &doc.units {
                let ids = tok.encode(text);
                let len = ids.len() as u32;
                let seg = arena.push(ids);
                if !qa.context.joins(contexts.last().map(|c| c.tokens), len) {
                    contexts.push(PoolContext::default());
                }
                let c = contexts.last_mut().expect("a context was just pushed");
                c.segments.push(seg);
                c.tokens += len;
                of_unit.push(contexts.len() - 1);
            }
            for (unit, text) in &doc.questions {
                let c = &mut contexts[of_unit[*unit as usize]];
                if c.questions.len() < cap {
                    let ids = tok.encode(text);
                    let len = ids.len() as u32;
                    c.questions.push((arena.push(ids), len));
                }
            }
            pool.extend(
                contexts
                    .into_iter()
                    .filter(|c| !c.questions.is_empty() && c.tokens >= reuse.min_context_tokens),
            );
        }
        pool.truncate(reuse.contexts as usize);
        if pool.len() < reuse.contexts as usize {
            return Err(TraceError::whole(
                path,
                "reuse.contexts",
                format!(
                    "the scenario asks for {} distinct contexts but the dataset has {} with \
                     questions and at least {} tokens (reuse.min_context_tokens)",
                    reuse.contexts,
                    pool.len(),
                    reuse.min_context_tokens
                ),
            ));
        }
        let requests = reuse::requests(
            reuse,
            &pool,
            &mut arena,
            system,
            &Arrivals {
                requests: max_requests.unwrap_or(self.questions() as u32),
                rate_per_s: qa.arrival_rate_per_s,
                output: &qa.output,
                vocab: tok.vocab(),
                seed,
            },
        );
        Ok(self.loaded(arena, requests, pool.len() as u32))
    }
}

/// One request of a trace file: arrival, prompt blocks and output length.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRecord {
    pub arrival: Nanos,
    /// `(block key, tokens)`: blocks with equal keys and positions are shared prefixes.
    pub blocks: Vec<(u64, u32)>,
    pub output_tokens: u32,
    /// The 1-based line of the file it was read from.
    pub line: usize,
}

/// A request trace read from a file.
#[derive(Clone, Debug, Default)]
pub struct TraceFile {
    pub records: Vec<TraceRecord>,
    pub block_size: u32,
    pub skipped_lines: u64,
}

impl TraceFile {
    /// Builds the trace: each distinct `(key, tokens)` block is one segment of pseudo
    /// tokens, kept as its key (see [`TokenArena`]); requests are sorted by arrival
    /// (stable), then the first `max_requests` kept.
    pub fn build(mut self, max_requests: Option<u32>) -> Loaded {
        self.records.sort_by_key(|r| r.arrival);
        if let Some(max) = max_requests {
            self.records.truncate(max as usize);
        }
        let mut arena = TokenArena::default();
        // Lookups only (never iterated), so std's hasher cannot change the result.
        let mut segs: std::collections::HashMap<(u64, u32), SegId> = Default::default();
        let mut requests = Vec::with_capacity(self.records.len());
        let mut first_blocks: BTreeMap<u64, u32> = BTreeMap::new();
        // First pass: number the distinct blocks, so the arena is allocated once.
        let mut distinct: Vec<(u64, u32)> = Vec::new();
        let mut prompts: Vec<Vec<SegId>> = Vec::with_capacity(self.records.len());
        for r in &self.records {
            let mut segments = Vec::with_capacity(r.blocks.len());
            for &(key, len) in &r.blocks {
                let seg = *segs.entry((key, len)).or_insert_with(|| {
                    distinct.push((key, len));
                    SegId(distinct.len() as u32 - 1)
                });
                segments.push(seg);
            }
            prompts.push(segments);
        }
        // Pseudo blocks are kept as their keys (16 bytes a block, whatever its length).
        arena.reserve(0, distinct.len());
        for &(key, len) in &distinct {
            arena.push_pseudo(key, len, PSEUDO_VOCAB);
        }
        for (r, segments) in self.records.iter().zip(prompts) {
            let next = first_blocks.len() as u32;
            let context = *first_blocks
                .entry(r.blocks.first().map_or(u64::MAX, |b| b.0))
                .or_insert(next);
            requests.push(Request {
                arrival: r.arrival,
                prompt_tokens: r.blocks.iter().map(|b| b.1).sum(),
                segments,
                output_tokens: r.output_tokens,
                context,
            });
        }
        Loaded {
            trace: Trace {
                arena,
                requests,
                contexts: first_blocks.len() as u32,
            },
            source: Source::MooncakeJsonl,
            block_size: self.block_size,
            documents: None,
            units: None,
            questions: None,
            skipped_lines: self.skipped_lines,
            lines: self.records.iter().map(|r| r.line).collect(),
        }
    }
}

#[cfg(test)]
mod tests;
