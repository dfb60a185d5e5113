//! The examples as the docs present them: every example config passes `turnstile check` and
//! lists its limits (configuration.md: "prints every loaded limit"), the `rate_api` block of
//! docs/direct-apis.md included; Envoy's example configs pass `envoy --mode validate`; the ready
//! line the docs quote is the one the binary prints.

use std::path::PathBuf;
use std::process::Command;

use crate::common::run::*;
use crate::common::tempdir::TempDir;

/// The limits files of the repository's examples (the Kubernetes ConfigMaps are checked by
/// scripts/check-kubernetes-examples.sh).
fn example_configs() -> Vec<PathBuf> {
    let mut out = vec![repo().join("config/example.yaml")];
    let envoy = repo().join("examples/envoy");
    for e in std::fs::read_dir(&envoy).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("turnstile") && name.ends_with(".yaml") {
            out.push(p);
        }
    }
    out.sort();
    assert!(out.len() >= 4, "too few example configs: {out:?}");
    out
}

#[test]
fn check_passes_on_every_example_config_and_lists_its_limits() {
    for p in example_configs() {
        let out = run(&["check", "--config", p.to_str().unwrap()], &[]);
        assert_eq!(out.code, Some(0), "{}: {}", p.display(), out.stderr);
        assert!(
            !out.stdout.trim().is_empty(),
            "{}: no limit listed",
            p.display()
        );
    }
}

/// The first ```yaml block of `doc` that starts with `starts`.
fn yaml_block(doc: &str, starts: &str) -> String {
    let text = std::fs::read_to_string(repo().join(doc)).unwrap();
    text.split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.starts_with(starts))
        .unwrap_or_else(|| panic!("{doc} has no yaml block starting with {starts}"))
        .to_owned()
}

#[test]
fn check_lists_the_rate_api_keys_of_direct_apis_md() {
    let dir = TempDir::new("rateapi");
    let config = config_dir(dir.path(), &yaml_block("docs/direct-apis.md", "rate_api:"));
    let out = run(&["check", "--config", config.to_str().unwrap()], &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout
            .contains("rate_api key \"report-*\": window=1000ms max_requests=10")
            && out.stdout.contains("max_in_queue=100 max_wait=5000ms"),
        "the rate_api key is not listed: stdout {:?}, stderr {:?}",
        out.stdout,
        out.stderr
    );
}

#[test]
fn envoy_validates_every_example_envoy_config() {
    let envoy = tool("envoy");
    let dir = repo().join("examples/envoy");
    let mut checked = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("envoy") && name.ends_with(".yaml")) {
            continue;
        }
        let out = Command::new(&envoy)
            .args(["--mode", "validate", "-c"])
            .arg(&p)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "envoy --mode validate {name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 3, "too few Envoy configs in {}", dir.display());
}

/// The names of a ready line's fields, in order: `grpc=.. http=..` gives `[grpc, http]`.
fn fields(line: &str) -> Vec<String> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('=').map(|(k, _)| k.to_owned()))
        .collect()
}

#[test]
fn the_ready_line_the_docs_quote_is_the_one_printed() {
    let dir = TempDir::new("readyline");
    let config = config_dir(dir.path(), SIMPLE);
    let live = serve(&["serve", "--config", config.to_str().unwrap()], &[])
        .ready
        .clone();
    let mut quoted = 0;
    for doc in [
        "README.md",
        "examples/envoy/README.md",
        "docs/operations.md",
    ] {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        for line in text
            .lines()
            .filter(|l| l.starts_with("turnstile: listening "))
        {
            assert_eq!(
                fields(line),
                fields(&live),
                "{doc} quotes {line:?}; printed {live:?}"
            );
            quoted += 1;
        }
    }
    assert!(quoted > 0, "no doc quotes the ready line");
}

/// examples/envoy/docker-compose.yaml says turnstile counts in memory as shipped: its
/// environment, read as turnstile reads it, selects no Redis.
#[test]
fn the_compose_example_counts_in_memory_as_it_says() {
    let text = std::fs::read_to_string(repo().join("examples/envoy/docker-compose.yaml")).unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let env = doc["services"]["turnstile"]["environment"]
        .as_mapping()
        .expect("the turnstile service's environment");
    let vars: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| {
            let v = match v {
                serde_yaml::Value::String(s) => s.clone(),
                other => serde_yaml::to_string(other).unwrap().trim().to_owned(),
            };
            (k.as_str().unwrap().to_owned(), v)
        })
        .collect();
    let settings = turnstile::settings::Settings::from_env(|k| {
        vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    })
    .unwrap_or_else(|e| panic!("the compose environment {vars:?}: {e}"));
    assert!(
        settings.storage.redis().is_none(),
        "the compose example selects Redis with {vars:?}"
    );
    assert!(text.contains("turnstile counts in memory here"), "{text}");
    // Nothing started that turnstile does not use.
    assert!(
        doc["services"].get("redis").is_none() || settings.storage.redis().is_some(),
        "a Redis service turnstile does not use"
    );
    // No `build:`: the image comes from scripts/image.sh, which the file and the README run
    // first.
    if doc["services"]["turnstile"].get("build").is_none() {
        let readme = std::fs::read_to_string(repo().join("examples/envoy/README.md")).unwrap();
        for (name, text) in [("docker-compose.yaml", &text), ("README.md", &readme)] {
            let image = text.find("bash scripts/image.sh");
            let up = text.find("docker compose up");
            assert!(
                image.is_some() && image < up,
                "{name} does not build the image before `docker compose up`"
            );
        }
        assert!(
            !readme.contains("up --build"),
            "--build with nothing to build"
        );
    }
}

/// docs/xds.md's worked AI Gateway budget is an overlay `turnstile check` takes, and lists.
#[test]
fn check_takes_the_overlay_of_xds_md() {
    let dir = TempDir::new("xds-md-overlay");
    let overlay = dir.write(
        "overlay.yaml",
        &yaml_block("docs/xds.md", "domain: default/eg/http"),
    );
    let at = overlay.to_str().unwrap();
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("TURNSTILE_XDS_OVERLAY", at),
    ];
    let out = run(&["check"], &env);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("reserve=300 reserve_for=10m"),
        "{}",
        out.stdout
    );
}
