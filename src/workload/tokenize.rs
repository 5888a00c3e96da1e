//! Turning dataset text into token ids.
//!
//! * **Exact**: given a Hugging Face `tokenizer.json` (for example the Mistral tokenizer in
//!   `shared/datasets/tokenizers/mistral-v1.json`), ids and counts are the tokenizer's own
//!   (the `tokenizers` crate, pure Rust, no special tokens added: the prompt template decides
//!   what surrounds each piece of text).
//! * **Estimate** (no tokenizer given): each whitespace-separated word is cut into pieces of
//!   at most 4 characters and each piece is one token, so a word of `n` characters counts
//!   `ceil(n / 4)` tokens (about 1.3 to 1.5 tokens per English word, close to what BPE
//!   tokenizers give). A piece's id is [`bytes_hash`] of its UTF-8 bytes reduced to
//!   `3..PSEUDO_VOCAB`, so the same text always gives the same ids and shared text is a shared
//!   prefix, exactly as with a real tokenizer.

use std::path::Path;

use super::TraceError;
use crate::hash::bytes_hash;

/// Vocabulary of pseudo token ids (estimated tokens and blocks of traces without text).
pub const PSEUDO_VOCAB: u32 = 32_000;

/// Characters per token of the estimate.
pub const ESTIMATE_CHARS_PER_TOKEN: usize = 4;

/// A tokenizer: exact from a `tokenizer.json`, or the documented estimate.
pub enum Tokenizer {
    Exact(Box<tokenizers::Tokenizer>),
    Estimate,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizer::Exact(_) => write!(f, "Tokenizer::Exact"),
            Tokenizer::Estimate => write!(f, "Tokenizer::Estimate"),
        }
    }
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`, or gives the estimate when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Tokenizer, TraceError> {
        let Some(path) = path else {
            return Ok(Tokenizer::Estimate);
        };
        let bytes = crate::text::read_capped(path, crate::text::MAX_CONFIG_BYTES)
            .map_err(|e| TraceError::whole(path, "tokenizer", format!("cannot read: {e}")))?;
        let t = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            TraceError::whole(
                path,
                "tokenizer",
                format!("not a Hugging Face tokenizer.json: {e}"),
            )
        })?;
        Ok(Tokenizer::Exact(Box::new(t)))
    }

    pub fn is_exact(&self) -> bool {
        matches!(self, Tokenizer::Exact(_))
    }

    /// Size of the vocabulary the ids are drawn from.
    pub fn vocab(&self) -> u32 {
        match self {
            Tokenizer::Exact(t) => t.get_vocab_size(true) as u32,
            Tokenizer::Estimate => PSEUDO_VOCAB,
        }
    }

    /// The token ids of `text`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::Exact(t) => match t.encode_fast(text, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                // The tokenizers crate fails only on internal errors (for example a regex
                // that cannot run); fall back to the estimate rather than abort a run.
                Err(_) => estimate(text),
            },
            Tokenizer::Estimate => estimate(text),
        }
    }
}

/// The estimate: pieces of at most [`ESTIMATE_CHARS_PER_TOKEN`] characters of each word.
pub fn estimate(text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() / ESTIMATE_CHARS_PER_TOKEN + 1);
    for word in text.split_whitespace() {
        let mut start = 0;
        let mut chars = 0;
        for (i, _) in word.char_indices() {
            if chars == ESTIMATE_CHARS_PER_TOKEN {
                out.push(piece_id(&word[start..i]));
                start = i;
                chars = 0;
            }
            chars += 1;
        }
        out.push(piece_id(&word[start..]));
    }
    out
}

fn piece_id(piece: &str) -> u32 {
    3 + (bytes_hash(piece.as_bytes()) % (PSEUDO_VOCAB as u64 - 3)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_counts_started_four_character_pieces_of_words() {
        // "The"=1, "tokenizer"=3, "counts"=2, "é"=1 (characters, not bytes).
        assert_eq!(estimate("The  tokenizer\ncounts é").len(), 7);
        assert!(estimate("").is_empty());
        let a = estimate("shared context here. Question one");
        let b = estimate("shared context here. Question two");
        assert_eq!(a[..a.len() - 1], b[..b.len() - 1]);
        assert_ne!(a.last(), b.last());
    }
}
