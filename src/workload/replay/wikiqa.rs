//! WikiQA TSV: a header line, then one row per candidate sentence with the columns
//! `QuestionID, Question, DocumentID, DocumentTitle, SentenceID, Sentence, Label`. A
//! document's text is its sentences in `SentenceID` order (`D<n>-<k>`), joined by spaces; the
//! rows of one question are contiguous. Documents are units; as in the built-in generator,
//! [`COLLECTION`] consecutive documents (in order of first appearance) form one corpus document,
//! so that window contexts can span several real documents.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::{Corpus, Document, TraceError, lines, read_bytes, skip_or_fail};

/// WikiQA documents per corpus document (window contexts span at most this many).
pub const COLLECTION: usize = 32;

const COLUMNS: [&str; 7] = [
    "QuestionID",
    "Question",
    "DocumentID",
    "DocumentTitle",
    "SentenceID",
    "Sentence",
    "Label",
];

struct Row<'a> {
    question_id: &'a str,
    question: &'a str,
    document_id: &'a str,
    title: &'a str,
    sentence: u32,
    text: &'a str,
}

fn parse_row<'a>(path: &Path, n: usize, line: &'a str) -> Result<Row<'a>, TraceError> {
    let f: Vec<&str> = line.split('\t').collect();
    if f.len() != COLUMNS.len() {
        return Err(TraceError::at(
            path,
            n,
            "line",
            format!(
                "expected {} tab-separated columns, found {}",
                COLUMNS.len(),
                f.len()
            ),
        ));
    }
    for (i, name) in [(0, "QuestionID"), (1, "Question"), (2, "DocumentID")] {
        if f[i].trim().is_empty() {
            return Err(TraceError::at(path, n, name, "empty"));
        }
    }
    let sentence = f[4]
        .strip_prefix(f[2])
        .and_then(|s| s.strip_prefix('-'))
        .and_then(|s| s.parse::<u32>().ok())
        .ok_or_else(|| {
            TraceError::at(
                path,
                n,
                "SentenceID",
                format!("expected {}-<number>, found {:?}", f[2], f[4]),
            )
        })?;
    if f[6].trim() != "0" && f[6].trim() != "1" {
        return Err(TraceError::at(
            path,
            n,
            "Label",
            format!("expected 0 or 1, found {:?}", f[6]),
        ));
    }
    Ok(Row {
        question_id: f[0],
        question: f[1],
        document_id: f[2],
        title: f[3],
        sentence,
        text: f[5],
    })
}

/// Reads a WikiQA TSV file.
pub fn read(path: &Path, skip_bad_lines: bool) -> Result<Corpus, TraceError> {
    let bytes = read_bytes(path)?;
    let mut it = lines(path, &bytes);
    let (n, header) = it
        .next()
        .expect("read_bytes rejects files without a non-blank line")?;
    let cols: Vec<&str> = header.split('\t').map(str::trim).collect();
    if cols != COLUMNS {
        return Err(TraceError::at(
            path,
            n,
            "header",
            format!("expected the columns {}", COLUMNS.join(", ")),
        ));
    }
    let mut skipped = 0;
    // Documents in order of first appearance; lookups by id only.
    let mut doc_index: HashMap<String, usize> = HashMap::new();
    let mut docs: Vec<(String, BTreeMap<u32, String>)> = Vec::new();
    let mut questions: Vec<(usize, String)> = Vec::new();
    let mut last_question: Option<String> = None;
    for l in it {
        let row = match l.and_then(|(n, line)| parse_row(path, n, line)) {
            Ok(r) => r,
            Err(e) => {
                skip_or_fail(skip_bad_lines, &mut skipped, e)?;
                continue;
            }
        };
        let d = *doc_index
            .entry(row.document_id.to_string())
            .or_insert_with(|| {
                docs.push((row.title.to_string(), BTreeMap::new()));
                docs.len() - 1
            });
        docs[d]
            .1
            .entry(row.sentence)
            .or_insert_with(|| row.text.to_string());
        if last_question.as_deref() != Some(row.question_id) {
            last_question = Some(row.question_id.to_string());
            questions.push((d, row.question.to_string()));
        }
    }
    let mut documents: Vec<Document> = docs
        .chunks(COLLECTION)
        .map(|chunk| Document {
            title: chunk[0].0.clone(),
            units: chunk
                .iter()
                .map(|(_, s)| s.values().map(String::as_str).collect::<Vec<_>>().join(" "))
                .collect(),
            questions: Vec::new(),
        })
        .collect();
    for (d, q) in questions {
        documents[d / COLLECTION]
            .questions
            .push(((d % COLLECTION) as u32, q));
    }
    Ok(Corpus {
        documents,
        skipped_lines: skipped,
    })
}
