//! The RLQS fixture: Envoys running examples/envoy/envoy-rlqs.yaml as shipped (ports swapped
//! for free ones) in front of one turnstile and one upstream, and paced load with every
//! answer recorded, so a test can count what was admitted in any span of time.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::envoy::{client, Envoy, Turnstile, Upstream};
use super::tempdir::TempDir;

/// examples/envoy/envoy-rlqs.yaml with its fixed ports swapped: listener and admin on port 0,
/// the given upstream and turnstile.
pub fn shipped_envoy_yaml(upstream: SocketAddr, turnstile_grpc: SocketAddr) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut yaml = fs::read_to_string(root.join("examples/envoy/envoy-rlqs.yaml")).unwrap();
    let replacements = [
        ("port_value: 10000", "port_value: 0".to_string()),
        ("port_value: 9901", "port_value: 0".to_string()),
        (
            "port_value: 5678",
            format!("port_value: {}", upstream.port()),
        ),
        (
            "port_value: 8081",
            format!("port_value: {}", turnstile_grpc.port()),
        ),
        ("address: 0.0.0.0", "address: 127.0.0.1".to_string()),
    ];
    for (from, to) in &replacements {
        assert!(
            yaml.contains(from),
            "examples/envoy/envoy-rlqs.yaml no longer has `{from}`"
        );
        yaml = yaml.replace(from, to);
    }
    yaml
}

/// turnstile logs what its quota book decides, so a failed test leaves the story behind.
const LOGS: &[(&str, &str)] = &[("LOG_LEVEL", "turnstile::service::rlqs=debug,info")];

/// One turnstile and one upstream, for Envoys to be started in front of them.
pub struct Fleet {
    pub turnstile: Turnstile,
    pub upstream: Upstream,
    pub dir: TempDir,
}

impl Fleet {
    /// turnstile serving the limits file `limits` (a path is kept: tests rewrite it).
    pub fn start(test: &str, limits: &str) -> Fleet {
        Self::start_with(test, limits, &[])
    }

    /// As [`Fleet::start`], with more environment (e.g. Redis).
    pub fn start_with(test: &str, limits: &str, env: &[(String, String)]) -> Fleet {
        let dir = TempDir::new(&format!("rlqs-{test}"));
        let upstream = Upstream::start();
        let mut all: Vec<(&str, &str)> = LOGS.to_vec();
        all.extend(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let turnstile = Turnstile::start(dir.path(), &[("limits.yaml", limits)], &all);
        Fleet {
            turnstile,
            upstream,
            dir,
        }
    }

    /// turnstile serving the shipped examples/envoy/turnstile-rlqs.yaml.
    pub fn shipped(test: &str) -> Fleet {
        let dir = TempDir::new(&format!("rlqs-{test}"));
        let upstream = Upstream::start();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let config = root.join("examples/envoy/turnstile-rlqs.yaml");
        let turnstile = Turnstile::start_with_config(dir.path(), &config, LOGS);
        Fleet {
            turnstile,
            upstream,
            dir,
        }
    }

    /// An Envoy running the shipped RLQS example in front of this fleet.
    pub async fn envoy(&self, name: &str) -> Envoy {
        assert!(
            self.metrics()
                .await
                .contains("ratelimit_service_rlqs_streams"),
            "{} serves no RLQS: a build of another branch in a shared target dir?",
            super::envoy::turnstile_bin().display()
        );
        let yaml = shipped_envoy_yaml(self.upstream.addr, self.turnstile.grpc);
        let path = self.dir.write(&format!("{name}.yaml"), &yaml);
        let envoy = Envoy::start_file(self.dir.path(), name, &path).await;
        // The filter's own story (assignments taken, reports sent) in the Envoy's log.
        client()
            .post(format!(
                "http://{}/logging?rate_limit_quota=debug",
                envoy.admin
            ))
            .send()
            .await
            .expect("envoy admin /logging");
        envoy
    }

    /// Replaces the limits file and tells turnstile to reload it (SIGHUP).
    pub fn reload(&self, limits: &str) {
        fs::write(self.dir.path().join("limits/limits.yaml"), limits).unwrap();
        super::envoy::send_signal(self.turnstile.child.id(), "HUP");
    }

    /// turnstile's Prometheus text.
    pub async fn metrics(&self) -> String {
        client()
            .get(format!("http://{}/metrics", self.turnstile.http))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .unwrap()
    }
}

/// Requests sent at a steady rate with one `x-user`, each answer recorded with its time.
pub struct Load {
    answers: Arc<Mutex<Vec<(Duration, u16)>>>,
    stop: Arc<AtomicBool>,
    epoch: Instant,
}

impl Load {
    /// Starts sending `per_sec` requests a second to `envoy` as `user`; times are counted from
    /// `epoch`. Each request is its own task, so a slow answer does not slow the pace.
    pub fn start(envoy: &Envoy, user: &str, per_sec: u32, epoch: Instant) -> Load {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (url, user) = (format!("{}/", envoy.base), user.to_string());
        let (a, s) = (answers.clone(), stop.clone());
        tokio::spawn(async move {
            let http = client();
            let mut pace = tokio::time::interval(Duration::from_secs(1) / per_sec);
            while !s.load(Ordering::Relaxed) {
                pace.tick().await;
                let (http, url, user, a) = (http.clone(), url.clone(), user.clone(), a.clone());
                tokio::spawn(async move {
                    let sent = epoch.elapsed();
                    if let Ok(r) = http.get(&url).header("x-user", user).send().await {
                        let status = r.status().as_u16();
                        let _ = r.bytes().await;
                        a.lock().unwrap().push((sent, status));
                    }
                });
            }
        });
        Load {
            answers,
            stop,
            epoch,
        }
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// (admitted, refused with 429, sent) among requests sent between `from` and `to`.
    pub fn count(&self, from: Duration, to: Duration) -> (u64, u64, u64) {
        let answers = self.answers.lock().unwrap();
        let mut c = (0, 0, 0);
        for &(at, status) in answers.iter().filter(|(at, _)| *at >= from && *at < to) {
            match status {
                200 => c.0 += 1,
                429 => c.1 += 1,
                other => panic!("unexpected status {other} at {at:?}"),
            }
            c.2 += 1;
        }
        c
    }

    /// Sleeps until `at` after the epoch.
    pub async fn until(&self, at: Duration) {
        let now = self.epoch.elapsed();
        if at > now {
            tokio::time::sleep(at - now).await;
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop();
    }
}
