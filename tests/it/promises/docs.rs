//! The files and links the docs name exist: every relative Markdown link (and its `#anchor`,
//! as GitHub makes anchors from headings), and every repository path in backquotes.

use std::path::{Path, PathBuf};

use super::*;

/// Top-level folders of this repository: a backquoted path starting with one names a file here.
const OURS: [&str; 10] = [
    "src/",
    "tests/",
    "scripts/",
    "examples/",
    "docs/",
    "config/",
    "benches/",
    "fuzz/",
    "vendor/",
    "proto/",
];

/// Paths the docs quote from other projects' trees (the page says whose).
const FOREIGN: [&str; 1] = [
    // redis-cell's, in docs/direct-apis.md
    "src/cell/mod.rs",
];

/// Paths written by a run, not kept in the repository (.gitignore).
const GENERATED: [&str; 1] = ["benches/load/last-run.md"];

fn markdown_files() -> Vec<PathBuf> {
    let root = repo();
    let mut out: Vec<PathBuf> = ["README.md", "SECURITY.md", "BENCHMARKS.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    for dir in ["docs", "examples/envoy", "examples/kubernetes", "vendor/h2"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(md: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(md).unwrap();
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `[text](target)` targets, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for part in line.split("](").skip(1) {
            if let Some(end) = part.find(')') {
                out.push(part[..end].to_owned());
            }
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for md in markdown_files() {
        let text = std::fs::read_to_string(&md).unwrap();
        let dir = md.parent().unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                md.clone()
            } else {
                dir.join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: {target}: no such file", md.display()));
            } else if let Some(a) = anchor.filter(|_| path.extension().is_some_and(|x| x == "md")) {
                if !anchors(&path).iter().any(|h| h == a) {
                    broken.push(format!("{}: {target}: no such heading", md.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let root = repo();
    let mut missing = Vec::new();
    for md in markdown_files() {
        let text = std::fs::read_to_string(&md).unwrap();
        for quoted in text.split('`').skip(1).step_by(2) {
            // `src/x.rs:12-30` names lines of a file; `tests/it/x.rs::name` a test in it.
            let path = quoted.split(':').next().unwrap_or_default();
            let ours = OURS.iter().any(|d| path.starts_with(d));
            let plain = path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c));
            // A quoted message (`config/a.yaml: descriptors[1]...: invalid unit`) is not a name.
            if !ours || !plain || path.ends_with(".go") || quoted.contains(' ') {
                continue;
            }
            if FOREIGN.contains(&path) || GENERATED.contains(&path) {
                continue;
            }
            // A page inside a vendored crate names the crate's own files.
            let near = md.parent().unwrap().join(path);
            if !root.join(path).exists() && !near.exists() {
                missing.push(format!("{}: `{quoted}`", md.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named but absent:\n{}",
        missing.join("\n")
    );
}
