//! The image, run the way clusters run it: Istio's sample (settings from the environment, the
//! config a mounted ConfigMap, Redis by host name), Envoy Gateway's (limits over xDS, mTLS), a
//! config edit, SIGTERM, a bad config.
//!
//! `scripts/image.sh` builds the image and `scripts/test.sh` runs these with `TURNSTILE_IMAGE`
//! naming it; without that variable each test returns at once and says so (a plain `cargo test`
//! builds no image). podman runs the containers with the flags scripts/image.sh uses (`PODMAN`
//! overrides them), each locked down as examples/kubernetes/rate-limit-service.yaml locks its
//! pods down: read-only root file system, a non-root uid, every capability dropped, no privilege
//! escalation, the config mounted read-only. They share the host's network: Redis and the ADS
//! server run on the host, and the servers in the containers listen on ports the kernel picks
//! (port 0), read back from their ready line.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::ads::Ads;
use crate::common::redis::{self, Redis};
use crate::common::tempdir::TempDir;
use crate::common::*;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::task::JoinSet;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};
use turnstile::config::xds::pb;

/// Long enough for a container to start on a loaded 2-core machine; tests poll, never sleep to
/// wait.
const DEADLINE: Duration = Duration::from_secs(60);

/// The podman command scripts/image.sh uses on this kind of machine.
const PODMAN: &str = "podman --storage-driver vfs --runtime runc --cgroup-manager cgroupfs";

/// The image under test, or `None` (and a note) when no image was built.
fn image() -> Option<String> {
    let image = std::env::var("TURNSTILE_IMAGE")
        .ok()
        .filter(|s| !s.is_empty());
    if image.is_none() {
        eprintln!(
            "skipped: TURNSTILE_IMAGE is not set (scripts/test.sh builds the image and sets it)"
        );
    }
    image
}

fn podman(args: &[&str]) -> Output {
    let line = std::env::var("PODMAN").unwrap_or_else(|_| PODMAN.to_owned());
    let mut words = line.split_whitespace();
    Command::new(words.next().expect("PODMAN names a command"))
        .args(words)
        .args(args)
        .output()
        .expect("podman is installed (scripts/install-test-deps.sh installs it)")
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

// ---------------------------------------------------------------- a container as a pod

/// How a container is run: the Istio sample's defaults, changed per test.
struct Pod {
    /// `command:` of the pod spec (the image's entrypoint when empty).
    command: Vec<String>,
    env: Vec<(String, String)>,
    /// Host directory, path in the container; always read-only.
    mounts: Vec<(PathBuf, String)>,
    /// `runAsUser:runAsGroup`.
    user: String,
    /// Host names the container resolves to the host's loopback, through its /etc/hosts (as a
    /// cluster's DNS resolves Service names): `redis`, `envoy-gateway`.
    hosts: Vec<String>,
}

impl Pod {
    /// `/bin/ratelimit` with envoyproxy/ratelimit's variables, as Istio's sample runs it, on
    /// loopback ports the kernel picks.
    fn ratelimit(env: &[(&str, &str)]) -> Pod {
        let mut all: Vec<(String, String)> = [("USE_STATSD", "false"), ("LOG_LEVEL", "info")]
            .iter()
            .chain(&crate::common::binary::LOOPBACK)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Pod {
            command: vec!["/bin/ratelimit".into()],
            env: all,
            mounts: Vec::new(),
            user: "65532:65532".into(),
            hosts: Vec::new(),
        }
    }

    /// `limitador-server` with limitador-operator's arguments, in its order (kuadrant/
    /// limitador-operator `pkg/limitador/k8s_objects.go`), the limits file mounted at
    /// `/home/limitador/etc`; every port on loopback, chosen by the kernel.
    fn limitador(limits_dir: &Path) -> Pod {
        let mut env: Vec<(String, String)> = (crate::common::binary::LOOPBACK.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.extend([
            ("ENVOY_RLS_HOST".into(), "127.0.0.1".into()),
            ("HTTP_API_HOST".into(), "127.0.0.1".into()),
        ]);
        let args = [
            "limitador-server",
            "--http-port",
            "0",
            "--rls-port",
            "0",
            "--metric-labels-default",
            "descriptors[1]",
            "/home/limitador/etc/limitador-config.yaml",
            "memory",
        ];
        Pod {
            command: args.iter().map(|a| a.to_string()).collect(),
            env,
            mounts: vec![(limits_dir.to_owned(), "/home/limitador/etc".into())],
            user: "65532:65532".into(),
            hosts: Vec::new(),
        }
    }

    fn mount(mut self, host: &Path, at: &str) -> Pod {
        self.mounts.push((host.to_owned(), at.to_owned()));
        self
    }

    fn host(mut self, name: &str) -> Pod {
        self.hosts.push(name.to_owned());
        self
    }

    /// Starts it detached; the returned container is removed when dropped.
    fn run(&self, image: &str) -> Container {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "turnstile-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut args: Vec<String> = [
            "run",
            "--detach",
            "--name",
            &name,
            "--network",
            "host",
            // Kubernetes' readOnlyRootFilesystem: no tmpfs on /tmp or /run either.
            "--read-only",
            "--read-only-tmpfs=false",
            "--user",
            &self.user,
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            // Explicit: this machine's runtime cannot set podman's default limits.
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1000:1000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (k, v) in &self.env {
            args.push("--env".into());
            args.push(format!("{k}={v}"));
        }
        for name in &self.hosts {
            args.push("--add-host".into());
            args.push(format!("{name}:127.0.0.1"));
        }
        for (host, at) in &self.mounts {
            args.push("--volume".into());
            args.push(format!("{}:{at}:ro", host.display()));
        }
        let mut command = self.command.iter();
        if let Some(entrypoint) = command.next() {
            args.push("--entrypoint".into());
            args.push(entrypoint.clone());
        }
        args.push(image.to_owned());
        args.extend(command.cloned());
        podman_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        Container { name }
    }
}

struct Container {
    name: String,
}

/// The addresses a server announced in its ready line (`turnstile: listening grpc=.. ..`).
struct Listening {
    grpc: String,
    http: String,
    debug: String,
    metrics: String,
}

impl Container {
    fn logs(&self) -> String {
        let out = podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn running(&self) -> bool {
        podman_ok(&["inspect", "--format", "{{.State.Running}}", &self.name]) == "true"
    }

    /// Waits for the ready line; panics with the log if the container exits first.
    fn ready(&self) -> Listening {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let logs = self.logs();
            if let Some(line) = logs.lines().find(|l| l.starts_with("turnstile: listening")) {
                let field = |name: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(&format!("{name}=")))
                        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
                        .to_owned()
                };
                return Listening {
                    grpc: field("grpc"),
                    http: field("http"),
                    debug: field("debug"),
                    metrics: field("metrics"),
                };
            }
            assert!(
                self.running(),
                "{} exited before serving:\n{logs}",
                self.name
            );
            assert!(
                Instant::now() < deadline,
                "{} not serving within {DEADLINE:?}:\n{logs}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the container to exit (`podman wait` has no time limit: polled instead); its
    /// exit code.
    fn wait(&self) -> i32 {
        let deadline = Instant::now() + DEADLINE;
        while self.running() {
            assert!(
                Instant::now() < deadline,
                "{} still running after {DEADLINE:?}:\n{}",
                self.name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &self.name]);
        code.parse()
            .unwrap_or_else(|_| panic!("podman inspect printed exit code {code:?}"))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- log of {}:\n{}", self.name, self.logs());
        }
        let _ = podman(&["rm", "--force", "--time", "0", &self.name]);
    }
}

// ---------------------------------------------------------------- a ConfigMap volume

/// A directory laid out as kubelet lays out a ConfigMap volume: the files in a timestamped
/// directory, `..data` a symlink to it, each file a symlink through `..data`. An update writes a
/// new directory and swaps `..data` in one rename, as kubelet does.
struct ConfigMapVolume {
    dir: TempDir,
    version: usize,
}

impl ConfigMapVolume {
    fn new(files: &[(String, String)]) -> ConfigMapVolume {
        let mut v = ConfigMapVolume {
            dir: TempDir::new("configmap"),
            version: 0,
        };
        v.update(files);
        v
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn update(&mut self, files: &[(String, String)]) {
        self.version += 1;
        let root = self.dir.path();
        let data = format!("..v{}", self.version);
        for (name, text) in files {
            self.dir.write(&format!("{data}/{name}"), text);
        }
        let tmp = root.join("..data_tmp");
        symlink(&data, &tmp).unwrap();
        std::fs::rename(&tmp, root.join("..data")).unwrap();
        for (name, _) in files {
            let link = root.join(name);
            if link.symlink_metadata().is_err() {
                symlink(format!("..data/{name}"), link).unwrap();
            }
        }
    }
}

/// The files of the ConfigMap in examples/kubernetes/ratelimit-config.yaml.
fn example_configmap() -> Vec<(String, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/kubernetes/ratelimit-config.yaml"
    );
    let doc: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap())
        .expect("the example ConfigMap is YAML");
    doc["data"]
        .as_mapping()
        .expect("the ConfigMap has data")
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_owned(),
                v.as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

// ---------------------------------------------------------------- cluster DNS

/// A cluster's DNS as a pod sees it, for the names a test registers: a UDP server answering A
/// queries for them with 127.0.0.1 (the host, whose network the containers share), NXDOMAIN for
/// any other name, no records for other types; and the pod's resolv.conf pointing at it, with
/// Kubernetes' search path and ndots:5, to mount over /etc/resolv.conf. The image resolves
/// `redis` as a pod does: glibc's dns module tries `redis.default.svc.cluster.local` first.
struct ClusterDns {
    dir: TempDir,
    /// Every name asked for, as the server received it.
    asked: Arc<Mutex<Vec<String>>>,
}

impl ClusterDns {
    fn start(names: &[&str]) -> ClusterDns {
        // Port 53 (resolv.conf cannot name another) on an address of 127/8 of this process's
        // own, so that two test runs on one machine do not meet; binding 53 needs root, as
        // podman here does.
        let pid = std::process::id();
        let ip = std::net::Ipv4Addr::new(127, 53, (pid >> 8) as u8, (pid as u8).max(1));
        let socket = std::net::UdpSocket::bind((ip, 53))
            .unwrap_or_else(|e| panic!("cluster DNS on {ip}:53 (needs root): {e}"));
        let known: Vec<String> = names
            .iter()
            .map(|n| format!("{n}.default.svc.cluster.local"))
            .collect();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                if let Some((name, reply)) = dns_reply(&buf[..n], &known) {
                    log.lock().unwrap().push(name);
                    let _ = socket.send_to(&reply, from);
                }
            }
        });
        let dir = TempDir::new("dns");
        dir.write(
            "resolv.conf",
            &format!(
                "nameserver {ip}\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
            ),
        );
        ClusterDns { dir, asked }
    }

    fn resolv_conf(&self) -> PathBuf {
        self.dir.path().join("resolv.conf")
    }
}

/// The answer to one query: the name asked and the reply packet; `None` for what is not a query.
fn dns_reply(query: &[u8], known: &[String]) -> Option<(String, Vec<u8>)> {
    // Header (12 bytes), then one question: labels, a zero byte, type and class.
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = *query.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question_end = at + 4;
    query.get(..question_end)?;
    let name = labels.join(".");
    let found = known.contains(&name);
    let answer_a = found && qtype == 1;
    let mut reply = query[..question_end].to_vec();
    // Response, recursion desired and available; NXDOMAIN for an unknown name.
    reply[2] = 0x81;
    reply[3] = if found { 0x80 } else { 0x83 };
    reply[4..12].copy_from_slice(&[0, 1, 0, answer_a as u8, 0, 0, 0, 0]);
    if answer_a {
        // The name by pointer to the question, A, IN, TTL 30 s, 4 bytes: 127.0.0.1.
        reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 127, 0, 0, 1]);
    }
    Some((name, reply))
}

// ---------------------------------------------------------------- certificates

/// Envoy Gateway's certificates, made here: a CA; the rate-limit service's certificate (server
/// and client use, named `envoy-ratelimit`) in a Secret-like directory with `ca.crt`, `tls.crt`,
/// `tls.key`; the ADS server's (`envoy-gateway`) and Envoy's client certificate as PEM pairs.
struct Pki {
    secret: TempDir,
    ca: String,
    xds_server: (String, String),
    envoy: (String, String),
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose as Eku,
            IsCa, KeyPair,
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |name: &str, usages: Vec<Eku>| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
            params.extended_key_usages = usages;
            (
                params.signed_by(&key, &ca).unwrap().pem(),
                key.serialize_pem(),
            )
        };
        let (cert, key) = leaf("envoy-ratelimit", vec![Eku::ServerAuth, Eku::ClientAuth]);
        let secret = TempDir::new("certs");
        secret.write("ca.crt", &ca.pem());
        secret.write("tls.crt", &cert);
        secret.write("tls.key", &key);
        Pki {
            secret,
            ca: ca.pem(),
            xds_server: leaf("envoy-gateway", vec![Eku::ServerAuth]),
            envoy: leaf("envoy", vec![Eku::ClientAuth]),
        }
    }
}

// ---------------------------------------------------------------- clients

/// One ShouldRateLimit call from the host with grpcurl and the repository's proto files, as a
/// person checking a deployment would; the overall code.
fn grpcurl_decide(grpc: &str, domain: &str, entries: &[(&str, &str)]) -> String {
    let entries: Vec<serde_json::Value> = entries
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    let body = serde_json::json!({"domain": domain, "descriptors": [{"entries": entries}]});
    let out = Command::new("grpcurl")
        .args(["-plaintext", "-import-path"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/proto"))
        .args(["-proto", "envoy/service/ratelimit/v3/rls.proto", "-d"])
        .arg(body.to_string())
        .arg(grpc)
        .arg("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .output()
        .expect("grpcurl is on PATH (scripts/install-test-deps.sh installs it)");
    assert!(
        out.status.success(),
        "grpcurl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON answer");
    answer["overallCode"]
        .as_str()
        .unwrap_or_else(|| panic!("no overallCode in {answer}"))
        .to_owned()
}

async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The sum of the samples whose series starts with `prefix` (a name, or a name and labels).
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Polls `url` until `pred` accepts its body; the body.
async fn poll(url: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (_, body) = get(url).await;
        if pred(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not seen at {url} within {DEADLINE:?}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn client(grpc: &str) -> RateLimitServiceClient<tonic::transport::Channel> {
    RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connects to the container's gRPC port")
}

// ---------------------------------------------------------------- tests

/// Istio's sample: `/bin/ratelimit`, settings from the environment only, Redis named `redis` as
/// in the sample and resolved inside the image through a cluster's DNS (glibc's dns module, the
/// pod's search path), the example ConfigMap mounted read-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_sample_decides_over_grpc_with_redis_by_host_name() {
    let Some(image) = image() else { return };
    let redis = Redis::start();
    let dns = ClusterDns::start(&["redis"]);
    let config = ConfigMapVolume::new(&example_configmap());
    let redis_url = format!("redis:{}", redis.port);
    let pod = Pod::ratelimit(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &redis_url),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
    ])
    .mount(config.path(), "/data/ratelimit/config")
    .mount(&dns.resolv_conf(), "/etc/resolv.conf");
    let c = pod.run(&image);
    let at = c.ready();

    let (status, _) = get(&format!("http://{}/healthcheck", at.http)).await;
    assert_eq!(status, 200, "/healthcheck while serving");

    // The sample's limit: one call a minute on /productpage; everything else 100.
    let productpage = [("PATH", "/productpage")];
    assert_eq!(
        grpcurl_decide(&at.grpc, "productpage-ratelimit", &productpage),
        "OK"
    );
    assert_eq!(
        grpcurl_decide(&at.grpc, "productpage-ratelimit", &productpage),
        "OVER_LIMIT"
    );
    assert_eq!(
        grpcurl_decide(&at.grpc, "productpage-ratelimit", &[("PATH", "/reviews")]),
        "OK"
    );

    // The counters are in the host's Redis, which the container found as `redis` through DNS.
    let asked = dns.asked.lock().unwrap().clone();
    assert!(
        asked.iter().any(|n| n == "redis.default.svc.cluster.local"),
        "the image asked the cluster DNS for redis, as a pod does; it asked for {asked:?}"
    );
    let keys = redis::cli(redis.port, &["--scan"]);
    assert!(
        keys.lines().any(|k| k.contains("productpage")),
        "counters in Redis, got keys {keys:?}"
    );

    // The reference's series on the Prometheus port (`{domain,key1}`, its default mapping), and
    // turnstile's own on the debug port (`{domain,descriptor}`): one over-limit answer on each.
    let series = "ratelimit_service_rate_limit_over_limit{domain=\"productpage-ratelimit\"";
    for url in [
        format!("http://{}/metrics", at.metrics),
        format!("http://{}/metrics", at.debug),
    ] {
        let (status, text) = get(&url).await;
        assert_eq!(status, 200, "{url}");
        assert_eq!(
            metric(&text, series),
            1.0,
            "one over-limit answer at {url}:\n{text}"
        );
    }
}

/// A ConfigMap edit (kubelet swapping `..data`) is served without a restart; an edit that fails
/// validation is refused and the previous limits keep serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_edit_is_picked_up_and_a_bad_one_refused() {
    let Some(image) = image() else { return };
    let file = |rpu: &str| {
        vec![(
            "config.yaml".to_owned(),
            format!(
                "domain: edit\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
            ),
        )]
    };
    let mut config = ConfigMapVolume::new(&file("100"));
    let pod = Pod::ratelimit(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
    ])
    .mount(config.path(), "/data/ratelimit/config");
    let c = pod.run(&image);
    let at = c.ready();
    let rlconfig = format!("http://{}/rlconfig", at.debug);
    poll(&rlconfig, "the first config", |b| {
        b.contains(" requests_per_unit=100 ")
    })
    .await;
    assert_eq!(grpcurl_decide(&at.grpc, "edit", &[("k", "a")]), "OK");

    config.update(&file("1"));
    poll(&rlconfig, "the edited config", |b| {
        b.contains(" requests_per_unit=1 ")
    })
    .await;
    assert_eq!(grpcurl_decide(&at.grpc, "edit", &[("k", "b")]), "OK");
    assert_eq!(
        grpcurl_decide(&at.grpc, "edit", &[("k", "b")]),
        "OVER_LIMIT"
    );

    config.update(&file("lots"));
    let metrics = format!("http://{}/metrics", at.debug);
    poll(&metrics, "the refused edit", |b| {
        metric(b, "ratelimit_service_config_load_error_total") >= 1.0
    })
    .await;
    assert_eq!(
        grpcurl_decide(&at.grpc, "edit", &[("k", "b")]),
        "OVER_LIMIT",
        "the last good limits still apply"
    );
    assert!(c.running());
}

/// Envoy Gateway's deployment: no files, the limits from an ADS server on the host, named
/// `envoy-gateway` as EG names its controller's Service, and Redis by host name (both through
/// /etc/hosts entries here: glibc's files module; the Istio test covers DNS). mTLS on both
/// connections, as EG sets it up: one certificate from the Secret mounted at /certs serves gRPC
/// (clients must present a certificate of the CA) and is the xDS client's certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_limits_arrive_over_xds() {
    let Some(image) = image() else { return };
    use pb::RateLimitUnit::Minute;
    let limit = |rpu: u32| pb::RateLimitConfig {
        name: "eg".into(),
        domain: "eg".into(),
        descriptors: vec![pb::RateLimitDescriptor {
            key: "route".into(),
            rate_limit: Some(pb::RateLimitPolicy {
                unit: Minute as i32,
                requests_per_unit: rpu,
                ..Default::default()
            }),
            ..Default::default()
        }],
    };
    let pki = Pki::new();
    let ads_tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&pki.xds_server.0, &pki.xds_server.1))
        .client_ca_root(Certificate::from_pem(&pki.ca));
    let mut ads = Ads::start_with(Some(ads_tls)).await;
    ads.push("v1", vec![limit(2)]);
    let redis = Redis::start();
    let xds_url = format!("envoy-gateway:{}", ads.addr.port());
    let redis_url = format!("redis:{}", redis.port);
    let pod = Pod {
        // Any uid, as OpenShift assigns: nothing in the image depends on being 65532.
        user: "1000710000:0".into(),
        ..Pod::ratelimit(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &xds_url),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ])
        .mount(pki.secret.path(), "/certs")
        .host("envoy-gateway")
        .host("redis")
    };
    let c = pod.run(&image);
    let at = c.ready();
    let (_, first) = ads
        .wait_request("the ACK of v1", |_, r| {
            r.version_info == "v1" && !r.response_nonce.is_empty()
        })
        .await;
    assert_eq!(
        first.node.as_ref().map(|n| n.id.as_str()),
        Some("envoy-ratelimit")
    );
    assert!(first.error_detail.is_none(), "v1 accepted: {first:?}");

    // Envoy's side: a client certificate of the CA, the server checked under its Service name.
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .identity(Identity::from_pem(&pki.envoy.0, &pki.envoy.1))
        .domain_name("envoy-ratelimit");
    let channel = Endpoint::from_shared(format!("https://{}", at.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("an mTLS connection to the container");
    let mut rls = RateLimitServiceClient::new(channel);
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = rls
            .should_rate_limit(one("eg", &[("route", "a")]))
            .await
            .unwrap();
        codes.push(r.into_inner().overall_code);
    }
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );

    ads.push("v2", vec![limit(5)]);
    ads.wait_request("the ACK of v2", |_, r| {
        r.version_info == "v2" && !r.response_nonce.is_empty()
    })
    .await;
    let r = rls
        .should_rate_limit(one("eg", &[("route", "b")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(5)
    );

    let (status, _) = get(&format!("http://{}/healthcheck", at.http)).await;
    assert_eq!(status, 200);
}

/// `podman stop` (SIGTERM, then SIGKILL after the grace) while calls wait in a queue: every
/// call is answered, and the process exits 0 on its own, before the grace runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_every_call_in_flight_and_exits_zero() {
    let Some(image) = image() else { return };
    const ADMITTED: usize = 20;
    // A day's room for ADMITTED; as many more queue for the next day (which has room for exactly
    // that many, so none is refused at once), and only shutdown answers them during the test.
    const WAITING: usize = ADMITTED;
    let config = ConfigMapVolume::new(&[(
        "config.yaml".to_owned(),
        format!(
            "domain: stop\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: {ADMITTED}\n      queue: {{max_waiting: 100, max_wait: 24h}}\n"
        ),
    )]);
    let pod = Pod::ratelimit(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
    ])
    .mount(config.path(), "/data/ratelimit/config");
    let c = pod.run(&image);
    let at = c.ready();
    let rls = client(&at.grpc).await;
    for _ in 0..ADMITTED {
        let r = rls
            .clone()
            .should_rate_limit(one("stop", &[("k", "x")]))
            .await
            .unwrap();
        assert_eq!(r.into_inner().overall_code, Code::Ok as i32);
    }
    let mut calls = JoinSet::new();
    for _ in 0..WAITING {
        let mut rls = rls.clone();
        calls.spawn(async move { rls.should_rate_limit(one("stop", &[("k", "x")])).await });
    }
    let metrics = format!("http://{}/metrics", at.debug);
    poll(&metrics, "every call waiting", |b| {
        metric(b, "ratelimit_service_queue_waiting") == WAITING as f64
    })
    .await;

    let name = c.name.clone();
    let stop = tokio::task::spawn_blocking(move || podman(&["stop", "--time", "30", &name]));
    let mut answered = 0;
    while let Some(call) = calls.join_next().await {
        let r = call
            .unwrap()
            .expect("a call in flight at SIGTERM is answered");
        // Refused at shutdown (TURNSTILE_SHUTDOWN_WAITERS=refuse, the default).
        assert_eq!(r.into_inner().overall_code, Code::OverLimit as i32);
        answered += 1;
    }
    assert_eq!(answered, WAITING);
    let stopped = stop.await.unwrap();
    assert!(
        stopped.status.success(),
        "podman stop: {}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    // 137 would mean SIGKILL after the 30 s grace.
    assert_eq!(c.wait(), 0, "exit code after SIGTERM");
}

/// A config that fails validation at start: the container exits non-zero and its log names the
/// file and what is wrong, so `kubectl logs` shows it.
#[test]
fn a_bad_config_exits_non_zero_with_the_error_in_the_log() {
    let Some(image) = image() else { return };
    let config = ConfigMapVolume::new(&[(
        "config.yaml".to_owned(),
        "domain: bad\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
            .to_owned(),
    )]);
    let pod = Pod::ratelimit(&[
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
    ])
    .mount(config.path(), "/data/ratelimit/config");
    let c = pod.run(&image);
    let code = c.wait();
    let logs = c.logs();
    assert_ne!(code, 0, "exit code with a bad config; log:\n{logs}");
    assert!(
        logs.contains("config.yaml") && logs.contains("fortnight"),
        "the log names the file and the bad value:\n{logs}"
    );
}

/// limitador-operator's container as it writes it, with only the image changed: Kuadrant's
/// limits decided over gRPC, the probes' `/status` answered.
#[tokio::test]
async fn limitador_operator_runs_the_image_as_limitador_server() {
    let Some(image) = image() else { return };
    let dir = TempDir::new("limitador-image");
    dir.write(
        "limitador-config.yaml",
        "- name: per-user\n  namespace: ns/route\n  max_value: 2\n  seconds: 60\n  \
         conditions: ['descriptors[0][\"limit.per_user__3f2a1b9c\"] == \"1\"']\n  \
         variables: ['descriptors[0][\"auth.identity.userid\"]']\n",
    );
    let c = Pod::limitador(dir.path()).run(&image);
    let at = c.ready();
    let entries = [
        ("limit.per_user__3f2a1b9c", "1"),
        ("auth.identity.userid", "alice"),
    ];
    let codes: Vec<String> = (0..3)
        .map(|_| grpcurl_decide(&at.grpc, "ns/route", &entries))
        .collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"]);
    let (code, status) = get(&format!("http://{}/status", at.http)).await;
    assert_eq!(code, 200);
    assert!(status.contains(r#""config_version":0"#), "{status}");
}
