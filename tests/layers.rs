//! The module layers of the library: every `crate::` import of a top-level module goes to a
//! strictly lower layer, so there is no dependency circle and shared code stays at the bottom
//! (issue "One actor contract for both systems"). Test modules are not counted.

use std::collections::BTreeSet;
use std::path::Path;

/// Top-level modules by layer, bottom first.
const LAYERS: &[&[&str]] = &[
    &["units", "hash", "rng", "text", "tuning"],
    &["metrics", "hardware"],
    &["actor", "model"],
    &["exec", "sim", "live", "workload"],
    &["backend", "results", "scenario"],
    &["serving", "pipeline", "profiling"],
    &["experiment", "vopr"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The `crate::x` modules named by the code of `text` (before its test module, outside
/// comments).
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            let tail = &rest[i + "crate::".len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
            rest = tail;
        }
    }
    out
}

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

#[test]
fn every_module_imports_only_modules_of_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        // The binary and its subcommands sit above the library.
        if module == "main" || module == "cli" || module == "lib" {
            continue;
        }
        let Some(mine) = layer(&module) else {
            wrong.push(format!(
                "{}: module `{module}` is in no layer",
                rel.display()
            ));
            continue;
        };
        for m in imports(&std::fs::read_to_string(f).unwrap()) {
            if m == module || m == "self" {
                continue;
            }
            match layer(&m) {
                Some(l) if l < mine => {}
                Some(l) => wrong.push(format!(
                    "{}: `{module}` (layer {mine}) imports `{m}` (layer {l})",
                    rel.display()
                )),
                None => wrong.push(format!("{}: imports unknown module `{m}`", rel.display())),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
