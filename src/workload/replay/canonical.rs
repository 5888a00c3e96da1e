//! meshsim's canonical trace format, which `meshsim trace convert` writes from every other
//! format and which replays exactly the trace that was converted.
//!
//! JSON Lines, UTF-8. The first line is a header:
//!
//! ```json
//! {"format": "meshsim-trace", "version": 1, "block_size": 16, "documents": 48, "units": 2067, "questions": 10570}
//! ```
//!
//! (`block_size` is the granularity of the source's sharing, used by `trace stats`; the counts
//! are optional and describe the source dataset). Then *segment* lines and *request* lines:
//!
//! ```json
//! {"segment": 0, "tokens": [1, 415, 2936]}
//! {"segment": 1, "pseudo_key": 17, "len": 512}
//! {"arrival_ns": 0, "prompt": [0, 1], "output_tokens": 40, "context": 0}
//! ```
//!
//! A segment is a run of token ids shared by every prompt that lists it: either explicit
//! `tokens`, or `len` pseudo tokens derived from `pseudo_key` (token `i` is
//! `pseudo_tokens(pseudo_key, len, 32000)`, see `src/hash.rs`), which is how blocks of traces
//! without text (Mooncake, Vidur) are stored. Segments are numbered 0, 1, 2, ... in the order
//! they are defined, and must be defined before a request uses them. A request gives its
//! arrival time in integer nanoseconds (non-decreasing from line to line), its prompt as a list
//! of segment numbers, its output length in tokens and, optionally, the number of the context
//! (document window) it is about. Unknown keys are errors.

use std::io::Write;
use std::path::Path;

use serde::Deserialize;

use super::mooncake::{MAX_LENGTH, json_error};
use super::{Loaded, Source, TraceError, lines, read_bytes};
use crate::units::Nanos;
use crate::workload::tokenize::PSEUDO_VOCAB;
use crate::workload::{Request, SegId, TokenArena, Trace};

/// The value of the header's `format` key.
pub const FORMAT_TAG: &str = "meshsim-trace";

pub use crate::workload::MAX_ARENA_TOKENS;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: String,
    version: u32,
    block_size: u32,
    documents: Option<u32>,
    units: Option<u32>,
    questions: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    segment: Option<u32>,
    tokens: Option<Vec<u32>>,
    pseudo_key: Option<u64>,
    len: Option<u32>,
    arrival_ns: Option<u64>,
    prompt: Option<Vec<u32>>,
    output_tokens: Option<u32>,
    context: Option<u32>,
}

fn parse<'de, T: Deserialize<'de>>(path: &Path, n: usize, text: &'de str) -> Result<T, TraceError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v: T = serde_path_to_error::deserialize(&mut de).map_err(|e| json_error(path, n, e))?;
    de.end()
        .map_err(|e| TraceError::at(path, n, "line", e.to_string()))?;
    Ok(v)
}

/// Reads a canonical trace, keeping at most `max_requests` requests.
pub fn read(path: &Path, max_requests: Option<u32>) -> Result<Loaded, TraceError> {
    let bytes = read_bytes(path)?;
    let mut it = lines(path, &bytes);
    let (hn, htext) = it
        .next()
        .expect("read_bytes rejects files without a non-blank line")?;
    let h: Header = parse(path, hn, htext)?;
    check_header(path, hn, &h)?;
    let mut arena = TokenArena::default();
    let mut requests: Vec<Request> = Vec::new();
    let mut request_lines = Vec::new();
    let mut contexts = 0u32;
    let max = max_requests.map_or(usize::MAX, |m| m as usize);
    for l in it {
        if requests.len() >= max {
            break;
        }
        let (n, text) = l?;
        let line: Line = parse(path, n, text)?;
        let err = |field: &str, msg: String| TraceError::at(path, n, field, msg);
        if let Some(id) = line.segment {
            segment(&line, id, &mut arena).map_err(|(f, m)| err(f, m))?;
            continue;
        }
        let previous = requests.last().map(|r: &Request| r.arrival);
        let (arrival, prompt, output, tokens) =
            request(&line, previous, &arena).map_err(|(f, m)| err(f, m))?;
        let context = line.context.unwrap_or(0);
        contexts = contexts.max(context.saturating_add(1));
        request_lines.push(n);
        requests.push(Request {
            arrival,
            segments: prompt.into_iter().map(SegId).collect(),
            prompt_tokens: tokens as u32,
            output_tokens: output,
            context,
        });
    }
    Ok(Loaded {
        trace: Trace {
            arena,
            requests,
            contexts,
        },
        source: Source::Canonical,
        block_size: h.block_size,
        documents: h.documents,
        units: h.units,
        questions: h.questions,
        skipped_lines: 0,
        lines: request_lines,
    })
}

/// A line's error: the field at fault and the message.
type LineError = (&'static str, String);

/// Checks the header line `n`.
fn check_header(path: &Path, n: usize, h: &Header) -> Result<(), TraceError> {
    if h.format != FORMAT_TAG {
        return Err(TraceError::at(
            path,
            n,
            "format",
            format!("expected {FORMAT_TAG:?}, found {:?}", h.format),
        ));
    }
    if h.version != 1 {
        return Err(TraceError::at(
            path,
            n,
            "version",
            format!("expected 1, found {}", h.version),
        ));
    }
    if !(1..=1 << 20).contains(&h.block_size) {
        return Err(TraceError::at(
            path,
            n,
            "block_size",
            format!(
                "expected tokens from 1 to {}, found {}",
                1 << 20,
                h.block_size
            ),
        ));
    }
    Ok(())
}

/// Adds segment line `id` to the arena (a pseudo segment as its key).
fn segment(line: &Line, id: u32, arena: &mut TokenArena) -> Result<(), LineError> {
    if line.arrival_ns.is_some()
        || line.prompt.is_some()
        || line.output_tokens.is_some()
        || line.context.is_some()
    {
        return Err(("segment", "a segment line has no request keys".into()));
    }
    if id as usize != arena.segments() {
        return Err((
            "segment",
            format!(
                "expected segment {} (numbered in order), found {id}",
                arena.segments()
            ),
        ));
    }
    let added = match (&line.tokens, line.pseudo_key, line.len) {
        (Some(t), None, None) => t.len() as u64,
        // Pseudo tokens are kept as their key: nothing stored.
        (None, Some(_), Some(len)) if (1..=MAX_LENGTH as u32).contains(&len) => 0,
        (None, Some(_), Some(len)) => {
            return Err((
                "len",
                format!("expected 1 to {MAX_LENGTH} tokens, found {len}"),
            ));
        }
        _ => {
            return Err((
                "tokens",
                "expected either `tokens` or both `pseudo_key` and `len`".into(),
            ));
        }
    };
    if arena.total_tokens() as u64 + added > MAX_ARENA_TOKENS {
        return Err((
            "tokens",
            format!("more than {MAX_ARENA_TOKENS} tokens in all `tokens` segments"),
        ));
    }
    match line.pseudo_key {
        Some(key) => {
            arena.push_pseudo(key, line.len.unwrap_or(0), PSEUDO_VOCAB);
        }
        None => {
            arena.push(line.tokens.clone().unwrap_or_default());
        }
    }
    Ok(())
}

/// A request line: its arrival (not before `previous`), prompt segments, output length and
/// prompt tokens.
fn request(
    line: &Line,
    previous: Option<Nanos>,
    arena: &TokenArena,
) -> Result<(Nanos, Vec<u32>, u32, u64), LineError> {
    if line.tokens.is_some() || line.pseudo_key.is_some() || line.len.is_some() {
        return Err(("segment", "segment keys without `segment`".into()));
    }
    let arrival = Nanos(
        line.arrival_ns
            .ok_or(("arrival_ns", "missing".to_string()))?,
    );
    let prompt = line
        .prompt
        .clone()
        .ok_or(("prompt", "missing".to_string()))?;
    let output = line
        .output_tokens
        .ok_or(("output_tokens", "missing".to_string()))?;
    if !(1..=MAX_LENGTH as u32).contains(&output) {
        return Err((
            "output_tokens",
            format!("expected 1 to {MAX_LENGTH}, found {output}"),
        ));
    }
    if let Some(prev) = previous
        && prev > arrival
    {
        return Err((
            "arrival_ns",
            format!("arrivals must not decrease: {} after {}", arrival.0, prev.0),
        ));
    }
    let mut tokens = 0u64;
    for &s in &prompt {
        if s as usize >= arena.segments() {
            return Err((
                "prompt",
                format!("segment {s} is not defined before this line"),
            ));
        }
        tokens += arena.len(SegId(s)) as u64;
    }
    if !(1..=MAX_LENGTH as u64).contains(&tokens) {
        return Err((
            "prompt",
            format!("expected 1 to {MAX_LENGTH} tokens, found {tokens}"),
        ));
    }
    Ok((arrival, prompt, output, tokens))
}

/// Writes `loaded` in the canonical format: header, every segment, every request.
pub fn write(loaded: &Loaded, mut out: impl Write) -> std::io::Result<()> {
    let t = &loaded.trace;
    write!(
        out,
        "{{\"format\": \"{FORMAT_TAG}\", \"version\": 1, \"block_size\": {}",
        loaded.block_size
    )?;
    for (k, v) in [
        ("documents", loaded.documents),
        ("units", loaded.units),
        ("questions", loaded.questions),
    ] {
        if let Some(v) = v {
            write!(out, ", \"{k}\": {v}")?;
        }
    }
    writeln!(out, "}}")?;
    let mut buf = String::new();
    for i in 0..t.arena.segments() {
        let id = SegId(i as u32);
        // A pseudo segment of the format's vocabulary is written as its key; any other
        // segment as its tokens.
        match t.arena.pseudo(id).filter(|p| p.vocab == PSEUDO_VOCAB) {
            Some(p) => writeln!(
                out,
                "{{\"segment\": {i}, \"pseudo_key\": {}, \"len\": {}}}",
                p.key, p.len
            )?,
            None => {
                buf.clear();
                join(&mut buf, t.arena.segment(id).iter());
                writeln!(out, "{{\"segment\": {i}, \"tokens\": [{buf}]}}")?;
            }
        }
    }
    for r in &t.requests {
        buf.clear();
        join(&mut buf, r.segments.iter().map(|s| &s.0));
        writeln!(
            out,
            "{{\"arrival_ns\": {}, \"prompt\": [{buf}], \"output_tokens\": {}, \"context\": {}}}",
            r.arrival.0, r.output_tokens, r.context
        )?;
    }
    out.flush()
}

fn join<'a>(buf: &mut String, items: impl Iterator<Item = &'a u32>) {
    use std::fmt::Write as _;
    for (i, x) in items.enumerate() {
        if i > 0 {
            buf.push_str(", ");
        }
        let _ = write!(buf, "{x}");
    }
}
