//! The files and links the docs name exist: every relative Markdown link (and its `#anchor`,
//! as GitHub makes anchors from headings), and every repository path in backquotes.

use std::path::{Path, PathBuf};

use crate::common::run::*;

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

/// `curl -s '<url>' | jq '<filter>'` lines of `page`: (url, filter).
fn curl_jq_lines(page: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join(page)).unwrap();
    let quoted = |s: &str, after: &str| -> Option<String> {
        let rest = &s[s.find(after)? + after.len()..];
        Some(rest[..rest.find('\'')?].to_owned())
    };
    text.lines()
        .filter_map(|l| Some((quoted(l, "curl -s '")?, quoted(l, "| jq '")?)))
        .collect()
}

/// A jq path filter (`.a[0].b`) applied to `v`; anything else is not a path this test reads.
fn jq_path<'v>(v: &'v serde_json::Value, filter: &str) -> &'v serde_json::Value {
    let mut at = v;
    for part in filter.split('.').skip(1) {
        let (name, indexes) = part.split_once('[').unwrap_or((part, ""));
        if !name.is_empty() {
            at = &at[name];
        }
        for i in indexes.split('[').filter(|i| !i.is_empty()) {
            let i: usize = (i.trim_end_matches(']').parse())
                .unwrap_or_else(|_| panic!("{filter}: not a jq path"));
            at = &at[i];
        }
    }
    at
}

/// Every `curl … | jq '<path>'` operations.md shows against the heavy hitters finds what it
/// looks for in the real server's answer (a renamed field prints `null`).
#[tokio::test]
async fn the_heavy_hitter_jq_lines_of_operations_md_find_their_field() {
    use crate::common::{one, TestServer};
    let config = "domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 5}
";
    let env = [
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("TURNSTILE_ADMIN_ADDR", "127.0.0.1:0"),
        ("TURNSTILE_TOP_SAMPLE", "1"),
    ];
    let s = TestServer::start_with(config, &env).await;
    for _ in 0..8 {
        s.call(one("web", &[("remote_address", "203.0.113.9")]))
            .await;
    }
    let lines = curl_jq_lines("docs/operations.md");
    let top: Vec<_> = lines
        .iter()
        .filter(|(url, _)| url.contains("/top"))
        .collect();
    assert!(top.len() >= 2, "the heavy hitters' examples: {lines:?}");
    for (url, filter) in top {
        let (port, path) = url
            .strip_prefix("localhost:")
            .and_then(|u| u.split_once('/'))
            .unwrap_or_else(|| panic!("{url}: not localhost:PORT/..."));
        let addr = match port {
            "6070" => s.running().debug_addr,
            "6071" => s.running().admin_addr,
            p => panic!("{url}: port {p} is neither the debug port nor the admin listener"),
        };
        let answer: serde_json::Value = reqwest::get(format!("http://{}/{path}", addr.unwrap()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let found = jq_path(&answer, filter);
        assert!(
            found.is_object() && found["value"] == "remote_address=203.0.113.9",
            "{url} | jq '{filter}' prints {found} of {answer}"
        );
    }
}

/// The admin look-up's example in operations.md names every field the real answer has.
#[tokio::test]
async fn the_look_up_example_of_operations_md_has_every_field() {
    use crate::common::{one, TestServer};
    let text = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let mut lines = text
        .lines()
        .skip_while(|l| !l.contains("/admin/look-up -d"));
    let body = lines.next().expect("the look-up's curl line");
    let body = &body[body.find("-d '").unwrap() + 4..body.rfind('\'').unwrap()];
    let example: String = lines
        .map_while(|l| l.strip_prefix("# "))
        .collect::<Vec<_>>()
        .join("");
    let example: serde_json::Value =
        serde_json::from_str(&example).unwrap_or_else(|e| panic!("{example}: {e}"));
    let config = "domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_key}
";
    let s = TestServer::start_with(config, &[("TURNSTILE_ADMIN_ADDR", "127.0.0.1:0")]).await;
    for _ in 0..3 {
        s.call(one("edge", &[("api_key", "alice")])).await;
    }
    let url = format!("http://{}/admin/look-up", s.running().admin_addr.unwrap());
    let answer: serde_json::Value = (reqwest::Client::new().post(url).body(body.to_owned()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer, example,
        "the example is the real answer at the docs' time"
    );
}

/// The README and redis-and-fleets.md give the same Redis-to-memory figures, with one and four
/// descriptors, and BENCHMARKS.md has them.
#[test]
fn the_redis_speed_figures_agree_between_pages() {
    let read = |p: &str| {
        std::fs::read_to_string(repo().join(p))
            .unwrap()
            .replace("\n  ", " ")
    };
    let decimals = |text: &str| -> Vec<String> {
        (text.split(|c: char| !(c.is_ascii_digit() || c == '.')))
            .filter(|w| w.starts_with("0.") && w.len() > 2)
            .map(str::to_owned)
            .collect()
    };
    let readme = read("README.md");
    let row = (readme.lines())
        .find(|l| l.starts_with("| exact through Redis"))
        .expect("the README's Redis row");
    let fleets = read("docs/redis-and-fleets.md");
    let at = fleets
        .find("the exact path serves")
        .expect("redis-and-fleets' figure");
    let sentence = &fleets[at..at + fleets[at..].find("four").unwrap()];
    let (a, b) = (decimals(row), decimals(sentence));
    assert_eq!(a, b, "README: {row}\nredis-and-fleets.md: {sentence}");
    let benchmarks = read("BENCHMARKS.md");
    for figure in &a {
        assert!(
            benchmarks.contains(figure.as_str()),
            "{figure} is not in BENCHMARKS.md"
        );
    }
}
