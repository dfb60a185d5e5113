//! An overlay directory's files are one overlay: two files may each add a limit under the same
//! pushed route, as one file may (two limits for one descriptor still clash).

use std::path::Path;

use crate::common::binary::{self, BIN};
use crate::common::tempdir::TempDir;

const ROUTE: &str = "httproute/default/llm/rule/0/match/0/*";

/// A file of the overlay adding `reserve` to `rule` under the route.
fn under_the_route(rule: &str, reserve: u32) -> String {
    format!(
        "domain: default/eg/http\ndescriptors:\n  - key: {ROUTE}\n    value: {ROUTE}\n    \
         descriptors:\n      - key: {rule}\n        rate_limit: {{reserve: {reserve}}}\n"
    )
}

fn check(overlay: &Path) -> (bool, String, String) {
    let at = overlay.display().to_string();
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("TURNSTILE_XDS_OVERLAY", at.as_str()),
    ];
    let out = (binary::command(Path::new(BIN), &["check"], &env).output()).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    (
        out.status.success(),
        stdout,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn two_files_add_limits_under_one_pushed_route() {
    let dir = TempDir::new("xds-overlay-two-files");
    dir.write("tokens.yaml", &under_the_route("rule-0-match-0", 300));
    dir.write("requests.yaml", &under_the_route("rule-1-match-0", 5));
    let (ok, stdout, stderr) = check(dir.path());
    assert!(ok, "{stdout}\n{stderr}");
    for (rule, reserve) in [("rule-0-match-0", 300), ("rule-1-match-0", 5)] {
        let line = format!("> key \"{rule}\": reserve={reserve}");
        assert!(stdout.contains(&line), "{line}: {stdout}");
    }
    // The same limit in two files: which would win is not for the order of files to say.
    dir.write("again.yaml", &under_the_route("rule-0-match-0", 100));
    let (ok, _, stderr) = check(dir.path());
    assert!(!ok);
    assert!(
        stderr.contains("this descriptor's rate_limit is in the overlay already"),
        "{stderr}"
    );
}
