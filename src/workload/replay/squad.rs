//! SQuAD v1.1 and v2.0 JSON: `{"data": [{"title", "paragraphs": [{"context", "qas":
//! [{"question", ...}]}]}]}`. Answers, ids and v2's `is_impossible` / `plausible_answers` are
//! accepted and ignored: only the text that a prompt contains matters here. Each article is a
//! document and each paragraph a unit.

use std::path::Path;

use serde::Deserialize;

use super::{Corpus, Document, TraceError, read_bytes};

#[derive(Deserialize)]
struct SquadFile {
    data: Vec<Article>,
}

#[derive(Deserialize)]
struct Article {
    #[serde(default)]
    title: String,
    paragraphs: Vec<Paragraph>,
}

#[derive(Deserialize)]
struct Paragraph {
    context: String,
    qas: Vec<Qa>,
}

#[derive(Deserialize)]
struct Qa {
    question: String,
}

/// 1-based line of byte `offset` of `bytes`.
pub(crate) fn line_of(bytes: &[u8], offset: usize) -> usize {
    1 + bytes[..offset.min(bytes.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
}

/// Reads a SQuAD JSON file.
pub fn read(path: &Path) -> Result<Corpus, TraceError> {
    let bytes = read_bytes(path)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        TraceError::at(
            path,
            line_of(&bytes, e.valid_up_to()),
            "file",
            "not valid UTF-8",
        )
    })?;
    let mut de = serde_json::Deserializer::from_str(text);
    let file: SquadFile = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path_s = e.path().to_string();
        let inner = e.into_inner();
        TraceError::at(
            path,
            inner.line(),
            if path_s == "." { "data" } else { &path_s },
            inner.to_string(),
        )
    })?;
    de.end()
        .map_err(|e| TraceError::at(path, e.line(), "file", e.to_string()))?;
    let documents = file
        .data
        .into_iter()
        .map(|a| {
            let mut doc = Document {
                title: a.title,
                ..Document::default()
            };
            for (u, p) in a.paragraphs.into_iter().enumerate() {
                doc.units.push(p.context);
                doc.questions
                    .extend(p.qas.into_iter().map(|q| (u as u32, q.question)));
            }
            doc
        })
        .collect();
    Ok(Corpus {
        documents,
        skipped_lines: 0,
    })
}
