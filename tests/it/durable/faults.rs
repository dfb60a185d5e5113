//! What a crash can lose, a state dir that is damaged, unusable or held, and one slow to read.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{check, entry, metric, start};
use crate::common::binary::start_fails;
use crate::common::tempdir::TempDir;

const LIMITS: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 1000000}
";

/// SIGKILL while calls are admitted: after the start, what is counted is at most what was
/// admitted (nothing counted that never was), and what is missing was admitted within about
/// the last sync interval before the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loses_at_most_the_last_sync_interval() {
    const INTERVAL: Duration = Duration::from_millis(200);
    let t = TempDir::new("durable-kill");
    let config = t.write("config.yaml", LIMITS);
    let state = t.path().join("state");
    let s = start(
        &config,
        &state,
        &[("TURNSTILE_STATE_SYNC_INTERVAL", "200ms")],
    );
    let http = s.ports.http;
    let admitted: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let load = {
        let admitted = admitted.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let body = json!({ "domain": "d", "descriptors": [entry("k", "load", 1)] });
            loop {
                let sent = client
                    .post(format!("http://{http}/json"))
                    .json(&body)
                    .send()
                    .await;
                let Ok(r) = sent else { return };
                let Ok(v) = r.json::<serde_json::Value>().await else {
                    return;
                };
                if v["overallCode"] == "OK" {
                    admitted.lock().unwrap().push(Instant::now());
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.kill();
    let killed = Instant::now();
    let _ = load.await;
    let admitted = admitted.lock().unwrap().clone();

    let s = start(&config, &state, &[]);
    let (_, left) = check(s.ports.http, "d", json!([entry("k", "load", 1)])).await;
    let counted = 1_000_000 - left[0] - 1;
    let total = admitted.len() as u64;
    // The last sync before the kill may still have been writing: an interval, and a second
    // of slack for a busy machine.
    let recent = (admitted.iter())
        .filter(|&&at| at + INTERVAL + Duration::from_secs(1) > killed)
        .count() as u64;
    assert!(counted <= total, "counted {counted}, admitted only {total}");
    assert!(
        total - counted <= recent,
        "lost {} of {total}; only {recent} were admitted in the last interval and a second",
        total - counted
    );
    assert!(counted > 0, "nothing was kept of {total}");
    s.stop();
}

/// A state file of random bytes does not stop the start: it is named in the log, counted and
/// set aside, and the process serves from nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_state_file_is_set_aside_and_the_start_goes_on() {
    let t = TempDir::new("durable-damaged");
    let config = t.write("config.yaml", LIMITS);
    let state = t.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(state.join("counters.3.snap"), noise).unwrap();
    let s = start(&config, &state, &[]);
    let (code, left) = check(s.ports.http, "d", json!([entry("k", "a", 1)])).await;
    assert_eq!((code.as_str(), left), ("OK", vec![999_999]));
    assert_eq!(metric(&s, "turnstile_state_damaged_files_total").await, 1.0);
    let log = s.stop();
    assert!(
        log.contains("damaged") && log.contains("counters.3.snap"),
        "the log names the file:\n{log}"
    );
    let kept: Vec<String> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        kept.iter()
            .any(|n| n.starts_with("counters.3.snap.damaged-")),
        "set aside for inspection: {kept:?}"
    );
}

/// A state file of a newer format version (a rollback after an upgrade) is not damage: the
/// start stops naming the file and both versions, and the file stays where it is, as it was.
#[test]
fn a_newer_format_version_stops_the_start_and_is_never_moved() {
    let t = TempDir::new("durable-newer");
    let config = t.write("config.yaml", LIMITS);
    let state = t.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // Version 2's header, then what a version 2 file may hold.
    let mut bytes = b"TSTATE\x00\x02".to_vec();
    bytes.extend_from_slice(&[7u8; 64]);
    let snap = state.join("counters.4.snap");
    std::fs::write(&snap, &bytes).unwrap();
    let err = start_fails(
        &["serve", "--config", config.to_str().unwrap()],
        &[("TURNSTILE_STATE_DIR", state.to_str().unwrap())],
    );
    assert!(
        err.contains("counters.4.snap") && err.contains("version 2") && err.contains("version 1"),
        "{err}"
    );
    assert!(!err.contains("not a turnstile state file"), "{err}");
    let names: Vec<String> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains(".damaged-")),
        "moved aside: {names:?}"
    );
    assert_eq!(std::fs::read(&snap).unwrap(), bytes, "left as it was");
}

/// A snapshot cut short: the keys before the cut are read back, the rest are not, and the
/// start goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_snapshot_gives_the_keys_before_the_cut() {
    let t = TempDir::new("durable-truncated");
    let config = t.write("config.yaml", LIMITS);
    let state = t.path().join("state");
    let s = start(&config, &state, &[]);
    for batch in 0..300u64 {
        let descriptors: Vec<_> = (batch * 10..batch * 10 + 10)
            .map(|i| entry("k", &format!("user-{i:05}"), 7))
            .collect();
        check(s.ports.http, "d", json!(descriptors)).await;
    }
    s.stop();
    // The next start writes every key as a new snapshot.
    start(&config, &state, &[]).stop();
    let snap = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "snap"))
        .expect("a snapshot");
    let len = std::fs::metadata(&snap).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&snap)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let s = start(&config, &state, &[]);
    let restored = metric(&s, "turnstile_state_restored_keys").await;
    assert_eq!(metric(&s, "turnstile_state_damaged_files_total").await, 1.0);
    // 3000 keys of about 45 bytes each in frames of 1 MiB: one frame, so a cut in its middle
    // keeps none of it; a bigger state keeps every whole frame before the cut.
    assert!(
        restored < 3000.0,
        "{restored} keys read from half a snapshot"
    );
    s.stop();
}

#[test]
fn an_unusable_state_dir_stops_the_start_naming_it() {
    let t = TempDir::new("durable-unusable");
    let config = t.write("config.yaml", LIMITS);
    let file = t.write("not-a-dir", "");
    let config = config.to_str().unwrap();
    let err = start_fails(
        &["serve", "--config", config],
        &[("TURNSTILE_STATE_DIR", file.to_str().unwrap())],
    );
    assert!(
        err.contains("TURNSTILE_STATE_DIR") && err.contains("is not a directory"),
        "{err}"
    );
    let err = start_fails(
        &["serve", "--config", config],
        &[("TURNSTILE_STATE_DIR", "/proc/turnstile-state")],
    );
    assert!(
        err.contains("TURNSTILE_STATE_DIR /proc/turnstile-state")
            && err.contains("cannot be created"),
        "{err}"
    );
    let err = start_fails(
        &["serve", "--config", config],
        &[
            ("TURNSTILE_STATE_DIR", t.path().to_str().unwrap()),
            ("REDIS_URL", "127.0.0.1:6379"),
        ],
    );
    assert!(
        err.contains("TURNSTILE_STATE_DIR") && err.contains("BACKEND_TYPE=redis"),
        "{err}"
    );
}

/// A rollout that briefly runs two pods on one volume: the second refuses to start, naming
/// the dir, and the first keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_dir_held_by_a_live_process_refuses_a_second_one() {
    let t = TempDir::new("durable-held");
    let config = t.write("config.yaml", LIMITS);
    let state = t.path().join("state");
    let s = start(&config, &state, &[]);
    let err = start_fails(
        &[
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        err.contains(&format!("TURNSTILE_STATE_DIR {}", state.display()))
            && err.contains("held by another running turnstile"),
        "{err}"
    );
    let (code, _) = check(s.ports.http, "d", json!([entry("k", "a", 1)])).await;
    assert_eq!(code, "OK");
    s.stop();
}

/// A state that takes long to read (a slow volume: here a snapshot that is a FIFO nobody
/// writes to, so the read waits as long as the test wants) hangs no probe: `/healthcheck`
/// answers 503 naming the read and the metrics port serves; SIGTERM ends the start, exit 0.
#[tokio::test]
async fn a_slow_state_read_answers_probes_and_stops_on_sigterm() {
    use crate::common::binary::{Starting, BIN};
    use crate::common::redis::free_port;

    let t = TempDir::new("durable-slow");
    let config = t.write("config.yaml", LIMITS);
    let state = t.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let fifo = state.join("counters.1.snap");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let (http, metrics) = (free_port().to_string(), free_port());
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let mut s = Starting::spawn(
        std::path::Path::new(BIN),
        &["serve", "--config", config.to_str().unwrap()],
        &[
            ("TURNSTILE_STATE_DIR", state.to_str().unwrap()),
            ("PORT", &http),
            ("PROMETHEUS_ADDR", &metrics_addr),
        ],
    );
    // A generous bound on each request: a connection that hangs fails here.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let health = format!("http://127.0.0.1:{http}/healthcheck");
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        match client.get(&health).send().await {
            Ok(r) => break (r.status().as_u16(), r.text().await.unwrap()),
            // Not bound yet.
            Err(e) if e.is_connect() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("/healthcheck: {e}"),
        }
    };
    assert_eq!(
        answer,
        (
            503,
            "waiting for the durable counters to be read back\n".into()
        )
    );
    let scraped = client
        .get(format!("http://{metrics_addr}/metrics"))
        .send()
        .await
        .expect("the metrics port answers");
    assert_eq!(scraped.status().as_u16(), 200);

    s.signal("TERM");
    let (status, stderr) = s
        .exit_within(Duration::from_secs(5))
        .expect("exits after SIGTERM");
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert!(
        stderr.contains("stopped while waiting for the durable counters to be read back"),
        "{stderr}"
    );
}
