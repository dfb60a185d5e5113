//! Config layer: YAML → validated `Config` (errors name file + path) and directory loading.

mod beside;
mod files;
mod gocc;
mod limits;
mod queue;
mod reserve;
mod tree;
mod windows;
mod yaml;

use std::time::Duration;

use crate::descriptor::entries;

pub(super) use super::*;

fn sources(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect()
}

fn load_with(files: &[(&str, &str)], opts: LoadOptions) -> Result<Config, ConfigError> {
    Config::from_sources(&sources(files), opts)
}

fn load(yaml: &str) -> Config {
    match load_with(&[("conf/a.yaml", yaml)], LoadOptions::default()) {
        Ok(c) => c,
        Err(e) => panic!("expected the config to load, got: {e}\n--- yaml:\n{yaml}"),
    }
}

fn load_err(yaml: &str) -> ConfigError {
    match load_with(&[("conf/a.yaml", yaml)], LoadOptions::default()) {
        Ok(c) => panic!(
            "expected an error, config loaded: {:?}\n--- yaml:\n{yaml}",
            c.describe()
        ),
        Err(e) => e,
    }
}

/// The error names the file and the path inside it, and says what is wrong.
fn assert_err(e: &ConfigError, file: &str, path: &str, needle: &str) {
    let shown = e.to_string();
    assert_eq!(e.file, file, "file of error: {shown}");
    assert_eq!(e.path, path, "path of error: {shown}");
    assert!(
        e.message.contains(needle),
        "message should contain {needle:?}: {shown}"
    );
    assert!(
        shown.starts_with(&format!("{file}: {path}: ")),
        "Display should start with file and path: {shown}"
    );
    assert!(
        shown.contains(needle),
        "Display should contain {needle:?}: {shown}"
    );
}

/// Errors raised while parsing (serde): whole-file errors whose message carries the path.
fn assert_parse_err(e: &ConfigError, file: &str, needles: &[&str]) {
    let shown = e.to_string();
    assert_eq!(e.file, file, "file of error: {shown}");
    assert!(
        shown.starts_with(&format!("{file}: ")),
        "Display should start with the file: {shown}"
    );
    for n in needles {
        assert!(shown.contains(n), "error should contain {n:?}: {shown}");
    }
}

/// The limits of the node a request descriptor matches; panics if nothing matches.
fn limits_for<'c>(c: &'c Config, domain: &str, pairs: &[(&str, &str)]) -> &'c [RateLimit] {
    let d = c
        .domain(domain)
        .unwrap_or_else(|| panic!("domain {domain} not loaded"));
    let m = crate::descriptor::find(d, &entries(pairs))
        .unwrap_or_else(|| panic!("no node matches {pairs:?} in {domain}"));
    &m.node().limits
}

fn only_limit<'c>(c: &'c Config, domain: &str, pairs: &[(&str, &str)]) -> &'c RateLimit {
    let l = limits_for(c, domain, pairs);
    assert_eq!(l.len(), 1, "expected one limit for {pairs:?}: {l:?}");
    &l[0]
}

fn matches(c: &Config, domain: &str, pairs: &[(&str, &str)]) -> bool {
    c.domain(domain)
        .and_then(|d| crate::descriptor::find(d, &entries(pairs)))
        .is_some()
}

/// A config with one descriptor `k: v` carrying `rate_limit` with the given body lines.
fn one_limit(body: &str) -> String {
    let mut y =
        String::from("domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n");
    for line in body.lines() {
        y.push_str("      ");
        y.push_str(line);
        y.push('\n');
    }
    y
}

const RL: &str = "descriptors[0].rate_limit";
