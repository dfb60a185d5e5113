//! The xDS overlay (`TURNSTILE_XDS_OVERLAY`): turnstile's own fields for limits Envoy Gateway
//! pushes. Envoy Gateway's shape (its translator's `ratelimit-config` test data): domain
//! `default/eg/http` (namespace/gateway/listener), the route's descriptor (key and value the
//! route's name), and below it `rule-0-match-0`, the distinct `x-user-id` header of a
//! BackendTrafficPolicy's rule (no value: one counter per user).

use std::path::Path;
use std::time::Duration;

use crate::common::ads::Ads;
use crate::common::binary::{self, call, start_fails, Server, BIN};
use crate::common::envoy::clear_of_window_edge;
use crate::common::tempdir::TempDir;
use crate::common::*;
use turnstile::config::xds::pb;

const DOMAIN: &str = "default/eg/http";
const ROUTE: &str = "httproute/default/llm/rule/0/match/0/*";
const USER: &str = "rule-0-match-0";

/// The RateLimitConfig Envoy Gateway pushes for a per-user limit of `rpu` a `unit` on the route.
fn pushed(unit: pb::RateLimitUnit, rpu: u32) -> pb::RateLimitConfig {
    pb::RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors: vec![pb::RateLimitDescriptor {
            key: ROUTE.into(),
            value: ROUTE.into(),
            descriptors: vec![pb::RateLimitDescriptor {
                key: USER.into(),
                rate_limit: Some(pb::RateLimitPolicy {
                    unit: unit as i32,
                    requests_per_unit: rpu,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// An overlay of `fields` on the per-user limit of [`pushed`], and one on a route Envoy Gateway
/// has not pushed (yet).
fn overlay(fields: &str) -> String {
    format!(
        "domain: {DOMAIN}
descriptors:
  - key: {ROUTE}
    value: {ROUTE}
    descriptors:
      - key: {USER}
        rate_limit: {{{fields}}}
  - key: httproute/default/later/rule/0/match/0/*
    value: httproute/default/later/rule/0/match/0/*
    descriptors:
      - key: {USER}
        rate_limit: {{reserve: 10}}
"
    )
}

/// A ConfigMap volume at `dir` holding `overlay.yaml` (`..data` swapped on each update).
fn configmap(dir: &Path, yaml: &str) {
    std::fs::create_dir_all(dir.join("..v1")).unwrap();
    std::fs::write(dir.join("..v1/overlay.yaml"), yaml).unwrap();
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/overlay.yaml", dir.join("overlay.yaml")).unwrap();
}

fn configmap_edit(dir: &Path, version: &str, yaml: &str) {
    std::fs::create_dir_all(dir.join(version)).unwrap();
    std::fs::write(dir.join(version).join("overlay.yaml"), yaml).unwrap();
    std::os::unix::fs::symlink(version, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
}

/// A user's request on the route, `hits` its own `hits_addend` (0: a check).
fn user(name: &str, hits: u64) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    report(DOMAIN, &[(ROUTE, ROUTE), (USER, name)], hits)
}

async fn answer(server: &Server, name: &str, hits: u64) -> (i32, u32) {
    codes(&call(server.ports.grpc_addr(), user(name, hits), &[]).await)[0]
}

/// The admin listener's look-up of `name`'s limit on the route.
async fn looked_up(server: &Server, name: &str) -> serde_json::Value {
    let admin = server.ports.admin.expect("the admin listener");
    let entries: Vec<serde_json::Value> = [(ROUTE, ROUTE), (USER, name)]
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    let body = serde_json::json!({"domain": DOMAIN, "descriptors": [{"entries": entries}]});
    let r = reqwest::Client::new()
        .post(format!("http://{admin}/admin/look-up"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    v["limits"][0].clone()
}

async fn rlconfig(server: &Server) -> String {
    let debug = server.ports.debug.expect("the debug port");
    reqwest::get(format!("http://{debug}/rlconfig"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// `/rlconfig` once it holds `what` (the overlay's poll and the push are another thread's), or
/// the test fails after 20 s.
async fn rlconfig_with(server: &Server, what: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = rlconfig(server).await;
        if text.contains(what) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {what:?} in /rlconfig:\n{text}\nstderr:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The binary over xDS, a real ADS server having pushed one limit of 1000 an hour (and acked),
/// with an overlay of `fields` in a ConfigMap-like volume, and one more setting.
struct Overlaid {
    ads: Ads,
    server: Server,
    volume: std::path::PathBuf,
    _dir: TempDir,
}

impl Overlaid {
    async fn start(fields: &str, setting: (&str, &str)) -> Overlaid {
        let mut ads = Ads::start().await;
        ads.push("v1", vec![pushed(pb::RateLimitUnit::Hour, 1000)]);
        let dir = TempDir::new("xds-overlay");
        let volume = dir.path().join("overlay");
        configmap(&volume, &overlay(fields));
        let (url, at) = (ads.addr.to_string(), volume.display().to_string());
        let server = Server::start(
            Path::new(BIN),
            &["serve"],
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", &url),
                ("TURNSTILE_XDS_OVERLAY", &at),
                setting,
            ],
        );
        ads.wait_ack(1, "v1").await;
        Overlaid {
            ads,
            server,
            volume,
            _dir: dir,
        }
    }
}

/// Through the binary, from a real ADS push: `reserve: 300` on a budget of 1000 an hour holds it
/// as a file's does; a push that raises the limit keeps the overlay, and the counts and holds;
/// an edited ConfigMap applies without a restart; a bad edit is refused and the last good
/// overlay stays; a path nothing pushed is a warning and a line of `/rlconfig`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_budget_takes_reserve_from_the_overlay() {
    let overlaid = Overlaid::start(
        "reserve: 300, reserve_for: 10m",
        ("TURNSTILE_ADMIN_ADDR", "127.0.0.1:0"),
    )
    .await;
    let (mut ads, server, volume) = (overlaid.ads, overlaid.server, overlaid.volume);
    let at = volume.display().to_string();
    clear_of_window_edge(3600, 120).await;

    let text = rlconfig_with(&server, "reserve=300").await;
    let file = format!("{at}/overlay.yaml");
    let line = (text.lines())
        .find(|l| l.contains(USER))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(&format!(
            "requests_per_unit=1000 algorithm=fixed_window reserve=300 reserve_for=600000ms \
             overlay=reserve,reserve_for from {file}"
        )),
        "{line}"
    );
    // The path to write, as the overlay says it.
    let path = format!(
        "overlay_path={{domain: \"{DOMAIN}\", descriptors: [{{key: \"{ROUTE}\", value: \
         \"{ROUTE}\", descriptors: [{{key: \"{USER}\", rate_limit: {{}}}}]}}]}}"
    );
    assert!(line.ends_with(&path), "{line}");
    assert!(
        text.contains(&format!(
            "overlay {file}: descriptors[1].descriptors[0]: \"{DOMAIN}\" > key \
             \"httproute/default/later/rule/0/match/0/*\" value \
             \"httproute/default/later/rule/0/match/0/*\" > key \"{USER}\": matches no limit in \
             the current push"
        )),
        "{text}"
    );
    assert!(server
        .stderr()
        .contains("matches no limit in the current push"));

    let mut alice = Vec::new();
    for _ in 0..4 {
        alice.push(answer(&server, "alice", 0).await);
    }
    assert_eq!(alice, [(OK, 700), (OK, 400), (OK, 100), (OVER, 0)]);
    // The admin look-up says what is held, and which fields the overlay wrote.
    let limit = looked_up(&server, "alice").await;
    assert_eq!(
        (limit["held"].as_u64(), limit["reserve"].as_u64()),
        (Some(900), Some(300))
    );
    assert_eq!(
        limit["overlay"],
        format!("reserve,reserve_for from {file}").as_str(),
        "{limit}"
    );
    // A report counts its usage and releases its request's hold, as with a file.
    assert_eq!(answer(&server, "bob", 0).await, (OK, 700));
    assert_eq!(answer(&server, "bob", 250).await, (OK, 750));
    assert_eq!(answer(&server, "bob", 0).await, (OK, 450));

    // Envoy Gateway raises the limit: the overlay still applies, alice's 900 held still hold.
    ads.push("v2", vec![pushed(pb::RateLimitUnit::Hour, 2000)]);
    ads.wait_ack(1, "v2").await;
    rlconfig_with(&server, "requests_per_unit=2000").await;
    assert_eq!(answer(&server, "alice", 0).await, (OK, 2000 - 900 - 300));

    // The ConfigMap edited: the next check holds 500, no restart.
    configmap_edit(&volume, "..v2", &overlay("reserve: 500"));
    rlconfig_with(&server, "reserve=500").await;
    assert_eq!(answer(&server, "carol", 0).await, (OK, 1500));
    // Alice's holds outlived the edit too. A hold is a check, worth the limit's `reserve` now
    // (as after a file's edit): her 4 checks hold 2000 of 2000, and a fifth is refused.
    assert_eq!(answer(&server, "alice", 0).await, (OVER, 0));
    assert_eq!(looked_up(&server, "alice").await["held"], 2000);

    // A bad edit is refused, naming the field; the last good overlay stays.
    let bad = overlay("reserve: 500, requests_per_unit: 5000");
    configmap_edit(&volume, "..v3", &bad);
    logged(&server, "requests_per_unit` is the pushed config's").await;
    assert!(server.stderr().contains("line 7"), "{}", server.stderr());
    assert_eq!(answer(&server, "dave", 0).await, (OK, 1500));
    // One that reads well but the push refuses (a hold past the limit) is refused too, and the
    // next push still takes the last good overlay.
    configmap_edit(&volume, "..v4", &overlay("reserve: 5000"));
    logged(&server, "reserve 5000 is more than the limit's 2000").await;
    assert_eq!(answer(&server, "erin", 0).await, (OK, 1500));
    let mut v3 = pushed(pb::RateLimitUnit::Hour, 2000);
    v3.descriptors[0].descriptors[0]
        .rate_limit
        .as_mut()
        .unwrap()
        .name = "per-user".into();
    ads.push("v3", vec![v3]);
    ads.wait_ack(1, "v3").await;
    rlconfig_with(&server, "name=per-user").await;
    assert_eq!(answer(&server, "frank", 0).await, (OK, 1500));
    server.stop();
}

/// The overlay is a file the xDS door follows like any other: with polling off
/// (`TURNSTILE_RELOAD_INTERVAL_MS=0`), an edit is read on SIGHUP, and only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_overlay_again_with_polling_off() {
    let overlaid = Overlaid::start("reserve: 300", ("TURNSTILE_RELOAD_INTERVAL_MS", "0")).await;
    let (server, volume) = (&overlaid.server, &overlaid.volume);
    rlconfig_with(server, "reserve=300").await;
    configmap_edit(volume, "..v2", &overlay("reserve: 500"));
    // Nothing polls: the edit waits for the signal.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rlconfig(server).await.contains("reserve=300"));
    server.signal("HUP");
    rlconfig_with(server, "reserve=500").await;
    overlaid.server.stop();
}

/// Waits until the server's log holds `what` (the overlay's poll is another thread's), or the
/// test fails after 20 s.
async fn logged(server: &Server, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !server.stderr().contains(what) {
        assert!(
            std::time::Instant::now() < deadline,
            "no {what:?} in the log:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An overlay that sets a field the push owns stops the start, naming the file, the line and
/// the field; so does a field that does not exist.
#[test]
fn a_bad_overlay_stops_the_start_naming_the_field() {
    let dir = TempDir::new("xds-overlay-bad");
    for (field, said) in [
        (
            "requests_per_unit: 5",
            "`requests_per_unit` is the pushed config's",
        ),
        ("reserv: 5", "unknown field `reserv`"),
    ] {
        let file = dir.write("overlay.yaml", &overlay(&format!("reserve: 1, {field}")));
        let at = file.display().to_string();
        let err = start_fails(
            &["serve"],
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", "127.0.0.1:1"),
                ("TURNSTILE_XDS_OVERLAY", &at),
            ],
        );
        assert!(err.contains(&at), "{err}");
        assert!(err.contains(said), "{err}");
        assert!(
            err.contains("descriptors[0].descriptors[0].rate_limit."),
            "{err}"
        );
        assert!(err.contains("line 7"), "{err}");
    }
}

/// `turnstile check` with the overlay: each of its limits, and the fields it writes.
#[test]
fn check_lists_the_fields_the_overlay_writes() {
    let dir = TempDir::new("xds-overlay-check");
    let file = dir.write(
        "overlay.yaml",
        &overlay("reserve: 300, algorithm: sliding_window"),
    );
    let at = file.display().to_string();
    let out = binary::command(
        Path::new(BIN),
        &["check"],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("TURNSTILE_XDS_OVERLAY", &at),
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "overlay {at}: descriptors[0].descriptors[0]: \"{DOMAIN}\" > key \"{ROUTE}\" value \
             \"{ROUTE}\" > key \"{USER}\": algorithm=sliding_window reserve=300"
        )),
        "{stdout}"
    );
    assert!(stderr.contains("xDS overlay OK"), "{stderr}");
}

/// Every answer of one sequence of calls and clock moves, on the limits a file writes and on
/// the same limits pushed with the overlay's fields: `algorithm` (a token bucket's burst, a
/// sliding window's estimate), `unit_multiplier` (windows of two hours) and `calendar` (days of
/// Europe/Berlin) answer alike, resets included.
#[tokio::test]
async fn algorithm_unit_multiplier_and_calendar_behave_as_in_a_file() {
    use pb::RateLimitUnit::{Day, Hour, Minute};
    let fields = [
        ("bucket", Minute, 60, "algorithm: token_bucket, burst: 5"),
        ("sliding", Minute, 10, "algorithm: sliding_window"),
        ("two_hours", Hour, 10, "unit_multiplier: 2"),
        ("berlin", Day, 10, "calendar: Europe/Berlin"),
    ];
    let mut file = format!("domain: {DOMAIN}\ndescriptors:\n");
    let mut laid = format!("domain: {DOMAIN}\ndescriptors:\n");
    let mut descriptors = Vec::new();
    for (key, unit, rpu, f) in fields {
        let name = format!("{unit:?}").to_ascii_lowercase();
        file.push_str(&format!(
            "  - key: {key}\n    rate_limit: {{unit: {name}, requests_per_unit: {rpu}, {f}}}\n"
        ));
        laid.push_str(&format!("  - key: {key}\n    rate_limit: {{{f}}}\n"));
        descriptors.push(pb::RateLimitDescriptor {
            key: key.into(),
            rate_limit: Some(pb::RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: rpu,
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let dir = TempDir::new("xds-overlay-windows");
    let at = dir.write("overlay.yaml", &laid).display().to_string();
    let mut ads = Ads::start().await;
    ads.push(
        "v1",
        vec![pb::RateLimitConfig {
            name: DOMAIN.into(),
            domain: DOMAIN.into(),
            descriptors,
        }],
    );
    let url = ads.addr.to_string();
    let pushed = TestServer::start_xds(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", &url),
        ("TURNSTILE_XDS_OVERLAY", &at),
    ])
    .await
    .expect("starts");
    ads.wait_ack(1, "v1").await;
    let written = TestServer::start(&file).await;

    let mut answers: [Vec<Vec<(i32, u32, u64)>>; 2] = Default::default();
    for (server, out) in [&pushed, &written].into_iter().zip(answers.iter_mut()) {
        for step in 0..60 {
            let mut row = Vec::new();
            for (key, ..) in fields {
                for _ in 0..3 {
                    let r = server.call(one(DOMAIN, &[(key, "u")])).await;
                    let s = &r.statuses[0];
                    let reset = (s.duration_until_reset.as_ref()).map_or(0, |d| d.seconds as u64);
                    row.push((s.code, s.limit_remaining, reset));
                }
            }
            out.push(row);
            // Three calls a limit a second, then 25 minutes a step: past the hours' and the
            // days' edges, Berlin's midnight among them.
            let by = if step < 12 { 1 } else { 1500 };
            server.advance(Duration::from_secs(by));
        }
    }
    assert_eq!(answers[0], answers[1]);
    // Not a fixed window of 60 a minute: the bucket (a burst of 5, one back a second) refuses
    // in the third second, 7 calls in.
    assert_eq!(answers[0][2][2].0, OVER, "{:?}", answers[0]);
}
