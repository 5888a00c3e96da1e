//! The module layers of the library: every `crate::` import of a top-level module goes to a
//! strictly lower layer, so there is no dependency circle and shared code stays at the bottom;
//! and inside every folder, the modules import each other without a circle. Test modules are
//! not counted. No `.rs` file under `src/`, `tests/` or `benches/` is longer than
//! [`MAX_FILE_LINES`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules by layer, bottom first.
const LAYERS: &[&[&str]] = &[
    &["units", "hash", "rng", "text", "cpu"],
    &["hardware", "fault"],
    &["metrics"],
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

/// A module's path from the crate root: `src/serving/run.rs` is `serving::run`, and
/// `src/serving/store/mod.rs` is `serving::store`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The identifiers of a `{...}` group's top level: `{a, b::c, d::{e}}` gives `a`, `b`, `d`.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut at_start = true;
    let mut current = String::new();
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                at_start = true;
                continue;
            }
            _ => {}
        }
        if depth == 0 && at_start {
            if c.is_ascii_alphanumeric() || c == '_' {
                current.push(c);
            } else if !current.is_empty() {
                heads.push(std::mem::take(&mut current));
                at_start = false;
            }
        }
    }
    if !current.is_empty() {
        heads.push(current);
    }
    heads
}

/// Every path that `text` (module `me`) names through `crate::`, `super::` or `self::`,
/// made absolute (before its test module, outside comments). A `{...}` group gives one path
/// per member.
fn paths(me: &[String], text: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let (mut base, skip): (Vec<String>, usize) = if rest.starts_with("crate::") {
            (Vec::new(), "crate::".len())
        } else if rest.starts_with("super::") {
            (me[..me.len().saturating_sub(1)].to_vec(), "super::".len())
        } else if rest.starts_with("self::") {
            (me.to_vec(), "self::".len())
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        // A match inside a longer identifier (`my_crate::`) is not a path.
        if i > 0 && ident(bytes[i - 1] as char) {
            i += skip;
            continue;
        }
        let mut j = i + skip;
        loop {
            let seg: String = code[j..].chars().take_while(|&c| ident(c)).collect();
            if seg == "super" {
                base.pop();
            } else if !seg.is_empty() {
                base.push(seg.clone());
            }
            j += seg.len();
            if code[j..].starts_with("::{") {
                let open = j + 3;
                let mut depth = 1;
                let mut end = open;
                for (k, c) in code[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 {
                        end = open + k;
                        break;
                    }
                }
                for h in group_heads(&code[open..end]) {
                    let mut p = base.clone();
                    if h != "self" {
                        p.push(h);
                    }
                    out.push(p);
                }
                break;
            } else if code[j..].starts_with("::") && !seg.is_empty() {
                j += 2;
            } else {
                out.push(base.clone());
                break;
            }
        }
        i = j.max(i + 1);
    }
    out
}

/// The dependency circles among the modules of one folder: for each pair of files whose
/// paths first differ below folder `P`, an import makes an edge between the two children
/// of `P` it crosses (an import between a module and one inside it is a declaration or a
/// re-export, and is not counted). Returns each circle as its members, sorted.
fn circles(files: &[(Vec<String>, String)]) -> Vec<Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let is_module = |p: &[String]| {
        modules.contains(p)
            || modules
                .iter()
                .any(|m| m.len() > p.len() && m.starts_with(p))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (me, text) in files {
        for p in paths(me, text) {
            // The module the path names: its longest prefix that is a module.
            let n = (0..=p.len())
                .rev()
                .find(|&n| is_module(&p[..n]))
                .unwrap_or(0);
            let target = &p[..n];
            let common = me.iter().zip(target).take_while(|(a, b)| a == b).count();
            if common == me.len() || common == target.len() {
                continue;
            }
            let from = me[..=common].join("::");
            let to = target[..=common].join("::");
            edges.entry(from).or_default().insert(to);
        }
    }
    // Strongly connected components (Tarjan, recursive: the graph is a few hundred nodes).
    struct Tarjan<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on: BTreeSet<String>,
        out: Vec<Vec<String>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &str) {
            let i = self.index.len();
            self.index.insert(v.to_string(), i);
            self.low.insert(v.to_string(), i);
            self.stack.push(v.to_string());
            self.on.insert(v.to_string());
            let next: Vec<String> = self
                .edges
                .get(v)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            for w in next {
                if !self.index.contains_key(&w) {
                    self.visit(&w);
                    let l = self.low[v].min(self.low[&w]);
                    self.low.insert(v.to_string(), l);
                } else if self.on.contains(&w) {
                    let l = self.low[v].min(self.index[&w]);
                    self.low.insert(v.to_string(), l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut c = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(&w);
                    let done = w == v;
                    c.push(w);
                    if done {
                        break;
                    }
                }
                if c.len() > 1 {
                    c.sort();
                    self.out.push(c);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: Vec<String> = edges.keys().cloned().collect();
    for v in nodes {
        if !t.index.contains_key(&v) {
            t.visit(&v);
        }
    }
    t.out.sort();
    t.out
}

/// The library's files as (module path, text), outside the binary (`main`, `cli`).
fn library() -> Vec<(Vec<String>, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    files.sort();
    files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(&src).unwrap();
            let m = module_path(rel);
            let top = m.first().map(String::as_str).unwrap_or("lib");
            (top != "main" && top != "cli").then(|| (m, std::fs::read_to_string(f).unwrap()))
        })
        .collect()
}

#[test]
fn no_folder_has_a_dependency_circle_among_its_modules() {
    let found = circles(&library());
    let text: Vec<String> = found.iter().map(|c| c.join(" <-> ")).collect();
    assert!(found.is_empty(), "dependency circles:\n{}", text.join("\n"));
}

#[test]
fn a_planted_circle_is_found_at_every_depth() {
    let m = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    let mut files = vec![
        (m("sys::build"), "use crate::units::Nanos;\n".to_string()),
        (
            m("sys::sim"),
            "use super::build::{actors, trace};\n".to_string(),
        ),
        (m("sys::live"), "use super::build::actors;\n".to_string()),
        (m("sys::store::a"), "use super::b::X;\n".to_string()),
        (
            m("sys::store::b"),
            "use crate::sys::build::Y;\n".to_string(),
        ),
        (m("sys"), "pub use build::Z;\n".to_string()),
        (m("units"), String::new()),
    ];
    assert!(circles(&files).is_empty(), "{:?}", circles(&files));
    // A runner importing its peer, which imports it back through a group.
    files[0]
        .1
        .push_str("use crate::sys::{sim::Spool, units};\n");
    assert_eq!(circles(&files), vec![vec!["sys::build", "sys::sim"]]);
    files[0].1.clear();
    // A circle one folder down, through `super::super` and a test module that does not count.
    files[4].1 = "use super::super::store::a::W;\n#[cfg(test)]\nuse super::c::V;\n".to_string();
    assert_eq!(
        circles(&files),
        vec![vec!["sys::store::a", "sys::store::b"]]
    );
    // Across folders: `sys::store` and `sys::live` each import the other.
    files[4].1 = "use crate::sys::live::Q;\n".to_string();
    files[2]
        .1
        .push_str("// use crate::sys::store::a; (a comment)\n");
    assert!(circles(&files).is_empty());
    files[2]
        .1
        .push_str("fn f() { crate::sys::store::a::g() }\n");
    assert_eq!(circles(&files), vec![vec!["sys::live", "sys::store"]]);
}

/// Most lines of a source file, counting its tests: a file past it usually holds two concepts
/// (large test modules go to a `tests.rs` beside the file; integration tests and benchmarks are
/// split by theme, with shared helpers in `tests/common/`).
const MAX_FILE_LINES: usize = 650;

/// The `.rs` files under `dirs` (searched recursively) that are longer than `max` lines, as
/// `path: n lines`.
fn longer_than(max: usize, dirs: &[PathBuf]) -> Vec<String> {
    let mut files = Vec::new();
    for d in dirs {
        walk(d, &mut files);
    }
    files.sort();
    files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > max).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect()
}

#[test]
fn no_source_file_is_longer_than_a_person_can_hold_in_their_head() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = ["src", "tests", "benches"].map(|d| root.join(d));
    let long = longer_than(MAX_FILE_LINES, &dirs);
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn a_planted_long_file_is_found_in_a_nested_folder() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("common/deep");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(nested.join("long.rs"), "a\nb\nc\n").unwrap();
    std::fs::write(dir.path().join("short.rs"), "a\nb\n").unwrap();
    std::fs::write(dir.path().join("notes.md"), "a\nb\nc\n").unwrap();
    let long = longer_than(2, &[dir.path().to_path_buf()]);
    let want = format!("{}: 3 lines", nested.join("long.rs").display());
    assert_eq!(long, vec![want]);
}
