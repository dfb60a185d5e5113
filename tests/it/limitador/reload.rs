//! The command line, the limits file at start and on reload.

use super::*;
use crate::common::binary::{block_on, command, http_get, wait_for};

#[test]
fn a_reload_raising_max_value_keeps_the_counters() {
    let l = Limitador::start(&[], LIMITS);
    let call = |user: &str| block_on(unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore(user))).unwrap();
    for _ in 0..3 {
        call("alice");
    }
    // Limitador keeps them too when the file changes in one event (a write in place, a
    // ConfigMap's swap): 3 of 3 used, raised to 5, exactly 2 more admitted.
    let raised = LIMITS.replacen("max_value: 3", "max_value: 5", 1);
    std::fs::write(&l.limits, raised).unwrap();
    let status = || http_get(l.server.ports.http, "/status");
    let until = |what: &'static str| {
        move || {
            let s = status();
            (!s.contains(what)).then_some(s)
        }
    };
    wait_for("the reload", until(r#""config_version":1"#));
    let codes: Vec<&str> = (0..3).map(|_| code(&call("alice"))).collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"]);
    // A bad file is kept out and counted; the limits served stay.
    std::fs::write(&l.limits, "- namespace: [").unwrap();
    wait_for("the refusal", until(r#""config_err_since":1"#));
    assert!(status().contains(r#""config_version":1"#));
    assert_eq!(code(&call("bob")), "OK");
}

#[test]
fn validate_names_the_line_of_a_bad_limit() {
    let dir = TempDir::new("limitador-validate");
    let exe = limitador_server(dir.path());
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, LIMITS).unwrap();
    let out = command(&exe, &["--validate", good.to_str().unwrap()], &[])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = dir.path().join("bad.yaml");
    let text = "- namespace: n\n  max_value: 1\n  seconds: 60\n  conditions: ['descriptors[0][\"a\"] ==']\n  variables: []\n";
    std::fs::write(&bad, text).unwrap();
    let out = command(&exe, &["--validate", bad.to_str().unwrap()], &[])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("line 1: limits[0].conditions[0]: couldn't parse descriptors[0][\"a\"] =="),
        "{err}"
    );
}

#[test]
fn what_turnstile_cannot_honour_is_refused_naming_it() {
    let dir = TempDir::new("limitador-refused");
    let exe = limitador_server(dir.path());
    let file = dir.path().join("limits.yaml");
    std::fs::write(&file, LIMITS).unwrap();
    let f = file.to_str().unwrap();
    for (args, named) in [
        (vec![f, "distributed", "--name", "a"], "`distributed`"),
        (vec!["-L", f, f, "memory"], "-L/--custom-metric-labels"),
    ] {
        let out = command(&exe, &args, &[]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(named), "{args:?}: {err}");
    }
}
