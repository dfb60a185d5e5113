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
    replace(&l.limits, &raised);
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
    replace(&l.limits, "- namespace: [");
    wait_for("the refusal", until(r#""config_err_since":1"#));
    assert!(status().contains(r#""config_version":1"#));
    assert_eq!(code(&call("bob")), "OK");
}

/// `path`'s text replaced in one step, as an editor's save or a ConfigMap's swap does: a write
/// that truncates first may be read empty, a valid file of no limits (with Limitador too).
fn replace(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
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
        (
            vec!["--tracing-endpoint", "https://jaeger:4317", f],
            "--tracing-endpoint",
        ),
    ] {
        let out = command(&exe, &args, &[]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(named), "{args:?}: {err}");
    }
}

#[test]
fn custom_metric_labels_label_each_call_and_reload() {
    let dir = TempDir::new("limitador-labels");
    let labels = dir.path().join("labels.yaml");
    let first = "user_id: descriptors[0][\"auth.identity.userid\"]\nkind: descriptors[0].kind\n\
                 num: 1 + 1\npast: descriptors[5][\"x\"]\n";
    std::fs::write(&labels, first).unwrap();
    let l = Limitador::start(&["-L", labels.to_str().unwrap()], LIMITS);
    let call = |req| block_on(unary(&l.grpc(), SHOULD_RATE_LIMIT, req)).unwrap();
    let second: &[(&str, &str)] = &[("route", "r1")];
    let shape: &[(&str, &str)] = &[
        ("limit.toystore_get__1a2b3c4d", "1"),
        ("auth.identity.userid", "alice"),
    ];
    call(request("ns/route", &[shape, second], 0));
    let metrics = || http_get(l.server.ports.http, "/metrics");
    // As the real server labels it: `user_id` and `num` from the file, `kind` only when sent,
    // `past` never (its index is past the descriptors), descriptors[1]'s entries by default.
    let want =
        r#"authorized_calls{limitador_namespace="ns/route",num="2",route="r1",user_id="alice"} 1"#;
    assert!(metrics().contains(want), "{}", metrics());
    replace(&labels, "route_l: descriptors[1].route\n");
    let mut n = 0;
    wait_for("the labels' reload", || {
        n += 1;
        call(request(
            "ns/route",
            &[&[("limit.per_route__deadbeef", "1")], second],
            0,
        ));
        let m = metrics();
        (!m.contains(r#"authorized_calls{limitador_namespace="ns/route",route="r1",route_l="r1"}"#))
            .then(|| format!("{n} calls: {m}"))
    });
}

/// `disk PATH`: turnstile's durable counters in PATH, so a restart keeps what was counted (a
/// window from the first hit included).
#[test]
fn disk_storage_keeps_the_counters_across_a_restart() {
    let state = TempDir::new("limitador-disk");
    let path = state.path().to_str().unwrap().to_owned();
    let storage = ["disk", path.as_str()];
    let call = |l: &Limitador| {
        code(&block_on(unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore("alice"))).unwrap())
    };
    let first = Limitador::start_on(&[], LIMITS, &storage, &[]);
    assert_eq!([call(&first), call(&first)], ["OK", "OK"]);
    first.server.stop();
    let again = Limitador::start_on(&[], LIMITS, &storage, &[]);
    assert_eq!(
        [call(&again), call(&again)],
        ["OK", "OVER_LIMIT"],
        "2 of 3 were kept"
    );
}
