//! Config over xDS: an in-test ADS management server (tonic) feeds RateLimitConfig resources to
//! the client, and a real turnstile server decides with whatever the client last accepted.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::ads::{any, nonce, Ads};
use crate::common::tempdir::TempDir;
use crate::common::*;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use turnstile::config::xds::{self, pb, TYPE_URL};
use turnstile::config::{Config, LiveConfig, LoadOptions};
use turnstile::settings::Settings;
use turnstile::source::xds::{run as run_xds, XdsSettings};
use turnstile::source::Update;

/// Long enough for anything on a loaded 2-core machine; tests poll and never sleep to wait.
const DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------- the client under test

fn settings(ads: &Ads, extra: &[(&str, String)]) -> XdsSettings {
    let mut env = vec![
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_URL", ads.addr.to_string()),
        ("CONFIG_GRPC_XDS_NODE_ID", "test-node".to_owned()),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "20ms".to_owned()),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "200ms".to_owned()),
    ];
    env.extend_from_slice(extra);
    Settings::from_env(|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
        .expect("valid settings")
        .xds
        .expect("CONFIG_TYPE=GRPC_XDS_SOTW")
}

/// What the client yielded: the domain count of each applied config, or the rejection text.
type Updates = mpsc::UnboundedReceiver<Result<usize, String>>;

/// Starts the client against `ads`, storing every accepted config into `server`'s live config.
fn start_client(
    ads: &Ads,
    server: &TestServer,
) -> (tokio::task::JoinHandle<()>, watch::Receiver<bool>, Updates) {
    start_client_with(settings(ads, &[]), server)
}

fn start_client_with(
    settings: XdsSettings,
    server: &TestServer,
) -> (tokio::task::JoinHandle<()>, watch::Receiver<bool>, Updates) {
    let live = server.running().context.live.clone();
    let serving = {
        let live = live.clone();
        LiveConfig::new(move || live.load_full())
    };
    let (ready_tx, ready) = watch::channel(false);
    let (updates_tx, updates) = mpsc::unbounded_channel();
    let (configs_tx, mut configs) = mpsc::unbounded_channel::<Update>();
    let follow = async move {
        while let Some(Update { loaded, handled }) = configs.recv().await {
            let seen = match loaded {
                Ok(config) => {
                    let n = config.domains.len();
                    live.install(config);
                    Ok(n)
                }
                Err(e) => Err(e.to_string()),
            };
            drop(handled);
            let _ = updates_tx.send(seen);
        }
    };
    // No overlay: its sender is dropped at once.
    let overlays = watch::channel(None).1;
    let task = tokio::spawn(async move {
        let client = run_xds(settings, serving, overlays, configs_tx, ready_tx);
        tokio::join!(client, follow);
    });
    (task, ready, updates)
}

async fn next_update(updates: &mut Updates) -> Result<usize, String> {
    tokio::time::timeout(DEADLINE, updates.recv())
        .await
        .expect("an update in time")
        .expect("client alive")
}

fn limit(key: &str, value: &str, unit: pb::RateLimitUnit, rpu: u32) -> pb::RateLimitDescriptor {
    pb::RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit: Some(pb::RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: rpu,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn domain(name: &str, descriptors: Vec<pb::RateLimitDescriptor>) -> pb::RateLimitConfig {
    pb::RateLimitConfig {
        name: name.into(),
        domain: name.into(),
        descriptors,
    }
}

/// A config for another domain, so the server starts with something that is not under test.
const PLACEHOLDER: &str = "domain: placeholder\ndescriptors: [{key: k}]\n";

/// (code, requests_per_unit of the limit that applied) for one `path` descriptor of domain `gw`.
async fn decide(server: &TestServer, path: &str) -> (i32, Option<u32>) {
    let r = server.call(one("gw", &[("path", path)])).await;
    let s = &r.statuses[0];
    (
        s.code,
        s.current_limit.as_ref().map(|l| l.requests_per_unit),
    )
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn push_update_invalid_and_disconnect() {
    use pb::RateLimitUnit::{Minute, Unknown};
    let mut ads = Ads::start().await;
    let server = TestServer::start(PLACEHOLDER).await;
    let (task, mut ready, mut updates) = start_client(&ads, &server);

    // Subscribe: node id, the RateLimitConfig type, no version yet.
    let (stream, sub) = ads.wait_request("subscription", |_, _| true).await;
    assert_eq!(stream, 1);
    assert_eq!(sub.node.as_ref().map(|n| n.id.as_str()), Some("test-node"));
    assert_eq!(sub.type_url, TYPE_URL);
    assert_eq!(
        (sub.version_info.as_str(), sub.response_nonce.as_str()),
        ("", "")
    );
    assert!(!*ready.borrow(), "not ready before a config arrives");
    assert_eq!(decide(&server, "/a").await, (OK, None), "no limits yet");

    // A config: its limits apply.
    ads.push(
        "1",
        vec![domain("gw", vec![limit("path", "/a", Minute, 2)])],
    );
    ads.wait_ack(1, "1").await;
    assert_eq!(next_update(&mut updates).await, Ok(1));
    tokio::time::timeout(DEADLINE, ready.wait_for(|r| *r))
        .await
        .expect("ready after the first config")
        .unwrap();
    assert_eq!(decide(&server, "/a").await, (OK, Some(2)));
    assert_eq!(decide(&server, "/a").await, (OK, Some(2)));
    assert_eq!(decide(&server, "/a").await, (OVER, Some(2)));

    // An update: the new limits apply.
    let v2 = domain(
        "gw",
        vec![
            limit("path", "/a", Minute, 5),
            limit("path", "/b", Minute, 1),
        ],
    );
    ads.push("2", vec![v2]);
    ads.wait_ack(1, "2").await;
    assert_eq!(next_update(&mut updates).await, Ok(1));
    assert_eq!(decide(&server, "/a").await, (OK, Some(5)));
    assert_eq!(decide(&server, "/b").await, (OK, Some(1)));
    assert_eq!(decide(&server, "/b").await, (OVER, Some(1)));

    // An invalid config: NACKed with the validation error, the old config stays live.
    ads.push(
        "3",
        vec![domain(
            "gw",
            vec![
                limit("path", "/a", Minute, 50),
                limit("path", "/b", Unknown, 50),
            ],
        )],
    );
    let want = nonce(1, "3");
    let (_, nack) = ads
        .wait_request("NACK of 3", |_, r| r.response_nonce == want)
        .await;
    assert_eq!(
        nack.version_info, "2",
        "a NACK names the version still in use"
    );
    let detail = nack.error_detail.expect("a NACK has error_detail");
    assert_eq!(detail.code, tonic::Code::InvalidArgument as i32);
    assert!(
        detail.message.contains(
            "RateLimitConfig \"gw\": descriptors[1].rate_limit.unit: invalid unit \"unknown\""
        ),
        "{}",
        detail.message
    );
    let rejected = next_update(&mut updates).await.unwrap_err();
    assert_eq!(rejected, detail.message, "on_update sees the same error");
    assert_eq!(decide(&server, "/a").await, (OK, Some(5)), "v2 still live");
    assert_eq!(
        decide(&server, "/b").await,
        (OVER, Some(1)),
        "v2 still live"
    );

    // The management server goes away and refuses streams for a while: the client keeps
    // retrying with backoff, the last good config keeps answering, health stays ready.
    ads.server.down.store(true, Ordering::SeqCst);
    ads.kick(true);
    let refused = &ads.server.refused;
    tokio::time::timeout(DEADLINE, async {
        while refused.load(Ordering::SeqCst) < 3 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the client retries while the server is down");
    assert_eq!(
        decide(&server, "/a").await,
        (OK, Some(5)),
        "v2 live while disconnected"
    );
    assert_eq!(
        decide(&server, "/b").await,
        (OVER, Some(1)),
        "v2 live while disconnected"
    );
    assert!(*ready.borrow(), "still ready: a config is loaded");

    // Back up with a new snapshot: the client resubscribes with the version it holds and
    // takes the next push.
    ads.push(
        "4",
        vec![domain("gw", vec![limit("path", "/a", Minute, 7)])],
    );
    ads.server.down.store(false, Ordering::SeqCst);
    let (stream, resub) = ads.wait_request("resubscription", |s, _| s > 1).await;
    assert_eq!(stream, 2);
    assert_eq!(
        resub.version_info, "2",
        "resubscribes with the last accepted version"
    );
    assert_eq!(resub.response_nonce, "");
    assert_eq!(resub.node.map(|n| n.id), Some("test-node".into()));
    ads.wait_ack(2, "4").await;
    assert_eq!(next_update(&mut updates).await, Ok(1));
    assert_eq!(decide(&server, "/a").await, (OK, Some(7)));
    assert_eq!(decide(&server, "/b").await, (OK, None), "/b is gone in v4");

    task.abort();
}

#[tokio::test]
async fn same_snapshot_after_reconnect_is_acked_without_reloading() {
    let mut ads = Ads::start().await;
    let server = TestServer::start(PLACEHOLDER).await;
    let (task, _ready, mut updates) = start_client(&ads, &server);
    ads.push(
        "1",
        vec![domain(
            "gw",
            vec![limit("path", "/a", pb::RateLimitUnit::Hour, 1)],
        )],
    );
    ads.wait_ack(1, "1").await;
    assert_eq!(next_update(&mut updates).await, Ok(1));
    assert_eq!(decide(&server, "/a").await, (OK, Some(1)));

    // The server ends the stream cleanly; the client comes back and gets the same snapshot.
    ads.kick(false);
    let (_, resub) = ads.wait_request("resubscription", |s, _| s == 2).await;
    assert_eq!(resub.version_info, "1");
    ads.wait_ack(2, "1").await;
    assert!(
        updates.try_recv().is_err(),
        "an unchanged snapshot is not rebuilt"
    );
    assert_eq!(
        decide(&server, "/a").await,
        (OVER, Some(1)),
        "counters kept"
    );
    task.abort();
}

#[tokio::test]
async fn an_empty_snapshot_removes_every_domain() {
    let mut ads = Ads::start().await;
    let server = TestServer::start(PLACEHOLDER).await;
    let (task, _ready, mut updates) = start_client(&ads, &server);
    ads.push(
        "1",
        vec![domain(
            "gw",
            vec![limit("path", "/a", pb::RateLimitUnit::Hour, 1)],
        )],
    );
    ads.wait_ack(1, "1").await;
    assert_eq!(next_update(&mut updates).await, Ok(1));
    ads.push("2", vec![]);
    ads.wait_ack(1, "2").await;
    assert_eq!(next_update(&mut updates).await, Ok(0));
    assert_eq!(decide(&server, "/a").await, (OK, None));
    task.abort();
}

#[tokio::test]
async fn duplicate_domains_are_nacked_unless_merging() {
    let mut ads = Ads::start().await;
    let server = TestServer::start(PLACEHOLDER).await;
    let (task, _ready, mut updates) = start_client(&ads, &server);
    let a = domain("gw", vec![limit("path", "/a", pb::RateLimitUnit::Hour, 1)]);
    let mut b = domain("gw", vec![limit("path", "/b", pb::RateLimitUnit::Hour, 1)]);
    b.name = "gw-2".into();
    let merged = xds::config_from_protos(
        vec![a.clone(), b.clone()],
        LoadOptions {
            merge_domains: true,
            ..Default::default()
        },
    )
    .expect("MERGE_DOMAIN_CONFIG merges them");
    assert_eq!(merged.describe().len(), 2);
    ads.push("1", vec![a, b]);
    let want = nonce(1, "1");
    let (_, nack) = ads
        .wait_request("NACK", |_, r| r.response_nonce == want)
        .await;
    assert_eq!(nack.version_info, "");
    let msg = nack.error_detail.unwrap().message;
    assert_eq!(
        msg,
        "RateLimitConfig \"gw-2\": domain: duplicate domain \"gw\" (already defined in RateLimitConfig \"gw\")"
    );
    assert!(next_update(&mut updates).await.is_err());
    task.abort();
}

/// A CA, a server certificate for `xds.test` and a client certificate, as PEM files on disk.
struct Pki {
    dir: TempDir,
    ca: String,
    server_cert: String,
    server_key: String,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa,
            KeyPair,
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |name: &str, usage| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
            params.extended_key_usages = vec![usage];
            (
                params.signed_by(&key, &ca).unwrap().pem(),
                key.serialize_pem(),
            )
        };
        let (server_cert, server_key) = leaf("xds.test", ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = leaf("ratelimit", ExtendedKeyUsagePurpose::ClientAuth);
        let dir = TempDir::new("xds-tls");
        for (name, pem) in [
            ("ca.crt", ca.pem()),
            ("tls.crt", client_cert),
            ("tls.key", client_key),
        ] {
            dir.write(name, &pem);
        }
        Pki {
            dir,
            ca: ca.pem(),
            server_cert,
            server_key,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// Envoy Gateway's setup: the management server requires a client certificate, and the client
/// checks the server's against the CA under the name given by the SAN setting (the URL's host
/// is an IP address the certificate does not name).
#[tokio::test]
async fn mutual_tls_as_envoy_gateway_sets_it_up() {
    let pki = Pki::new();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&pki.server_cert, &pki.server_key))
        .client_ca_root(Certificate::from_pem(&pki.ca));
    let mut ads = Ads::start_with(Some(tls)).await;
    let server = TestServer::start(PLACEHOLDER).await;
    let settings = settings(
        &ads,
        &[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", pki.path("ca.crt")),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", pki.path("tls.crt")),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", pki.path("tls.key")),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.test".into()),
        ],
    );
    let (task, _ready, mut updates) = start_client_with(settings, &server);
    ads.push(
        "1",
        vec![domain(
            "gw",
            vec![limit("path", "/a", pb::RateLimitUnit::Day, 3)],
        )],
    );
    ads.wait_ack(1, "1").await;
    assert_eq!(next_update(&mut updates).await, Ok(1));
    assert_eq!(decide(&server, "/a").await, (OK, Some(3)));
    task.abort();
}

/// The same limits as a YAML file and as RateLimitConfig resources give the same config.
#[test]
fn resources_and_yaml_build_the_same_config() {
    use pb::RateLimitUnit::{Minute, Second};
    let yaml = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_key}
  - key: api_key
    value: vip
    rate_limit: {unlimited: true}
  - key: remote_address
    shadow_mode: true
    quota_mode: true
    detailed_metric: true
    metadata: {team: payments, tier: 2}
    descriptors:
      - key: path
        value: "/api/*"
        rate_limit:
          unit: second
          requests_per_unit: 10
          replaces: [{name: per_key}]
  - key: whitelisted
"#;
    let from_yaml =
        Config::from_sources(&[("edge.yaml".into(), yaml.into())], LoadOptions::default()).unwrap();

    let mut metadata = prost_types::Struct::default();
    metadata.fields.insert(
        "team".into(),
        prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue("payments".into())),
        },
    );
    metadata.fields.insert(
        "tier".into(),
        prost_types::Value {
            kind: Some(prost_types::value::Kind::NumberValue(2.0)),
        },
    );
    let mut per_key = limit("api_key", "", Minute, 3);
    per_key.rate_limit.as_mut().unwrap().name = "per_key".into();
    let vip = pb::RateLimitDescriptor {
        key: "api_key".into(),
        value: "vip".into(),
        rate_limit: Some(pb::RateLimitPolicy {
            unlimited: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut path = limit("path", "/api/*", Second, 10);
    path.rate_limit.as_mut().unwrap().replaces = vec![pb::RateLimitReplace {
        name: "per_key".into(),
    }];
    let remote = pb::RateLimitDescriptor {
        key: "remote_address".into(),
        shadow_mode: true,
        quota_mode: true,
        detailed_metric: true,
        metadata: Some(metadata),
        descriptors: vec![path],
        ..Default::default()
    };
    let whitelisted = pb::RateLimitDescriptor {
        key: "whitelisted".into(),
        ..Default::default()
    };
    let resources = [domain("edge", vec![per_key, vip, remote, whitelisted])];
    let from_xds = xds::config_from_resources(
        resources.iter().map(any).collect::<Vec<_>>(),
        LoadOptions::default(),
        &LiveConfig::default(),
        None,
    )
    .unwrap();

    // The same lines, but that a pushed limit's also says the overlay path to write for it.
    let pushed: Vec<String> = (from_xds.describe().iter())
        .map(|l| {
            l.split(" overlay_path=")
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(pushed, from_yaml.describe());
    let node = |c: &Config| {
        let d = c.domain("edge").unwrap();
        let n = d
            .root
            .nodes()
            .find(|n| &*n.key == "remote_address")
            .unwrap();
        (
            n.metadata.clone(),
            n.shadow_mode,
            n.quota_mode,
            n.detailed_metric,
        )
    };
    let (meta, shadow, quota, detailed) = node(&from_xds);
    let meta = meta.expect("metadata carried over");
    assert_eq!(meta["team"], "payments");
    assert_eq!(meta["tier"].as_f64(), Some(2.0));
    assert_eq!((shadow, quota, detailed), (true, true, true));
    let (yaml_meta, ..) = node(&from_yaml);
    assert_eq!(yaml_meta.unwrap()["team"], "payments");

    // A unit number the protos do not know is refused, naming the number.
    let mut odd = limit("k", "", Minute, 1);
    odd.rate_limit.as_mut().unwrap().unit = 42;
    let err =
        xds::config_from_protos(vec![domain("x", vec![odd])], LoadOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "RateLimitConfig \"x\": descriptors[0].rate_limit.unit: invalid unit \"42\" (expected second, minute, hour, day, week, month or year)"
    );
}

/// The vendored proto and envoy-types' copy of the same file agree on the wire.
#[test]
fn vendored_proto_matches_envoy_types_on_the_wire() {
    use envoy_types::pb::ratelimit::config::ratelimit::v3 as theirs;
    let msg = theirs::RateLimitConfig {
        name: "n".into(),
        domain: "d".into(),
        descriptors: vec![theirs::RateLimitDescriptor {
            key: "k".into(),
            value: "v".into(),
            rate_limit: Some(theirs::RateLimitPolicy {
                unit: theirs::RateLimitUnit::Week as i32,
                requests_per_unit: 9,
                unlimited: false,
                name: "lim".into(),
                replaces: vec![theirs::RateLimitReplace { name: "o".into() }],
            }),
            descriptors: vec![],
            shadow_mode: true,
            detailed_metric: true,
            quota_mode: true,
            metadata: None,
        }],
    };
    let ours = pb::RateLimitConfig::decode(msg.encode_to_vec().as_slice()).unwrap();
    let d = &ours.descriptors[0];
    let p = d.rate_limit.as_ref().unwrap();
    assert_eq!((ours.name.as_str(), ours.domain.as_str()), ("n", "d"));
    assert_eq!(p.unit, pb::RateLimitUnit::Week as i32);
    assert_eq!((p.requests_per_unit, p.name.as_str()), (9, "lim"));
    assert_eq!(p.replaces[0].name, "o");
    assert!(d.shadow_mode && d.detailed_metric && d.quota_mode);
}

/// The server started as Envoy Gateway starts it: only the CONFIG_* settings, no files.
async fn gateway_server(ads: &Ads, extra: &[(&str, &str)]) -> TestServer {
    let mut env: Vec<(String, String)> = vec![
        ("CONFIG_TYPE".into(), "GRPC_XDS_SOTW".into()),
        ("CONFIG_GRPC_XDS_SERVER_URL".into(), ads.addr.to_string()),
        ("CONFIG_GRPC_XDS_NODE_ID".into(), "test-node".into()),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL".into(), "20ms".into()),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL".into(), "200ms".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    TestServer::start_env(PLACEHOLDER, env).await
}

async fn health(server: &TestServer) -> u16 {
    reqwest::get(format!("{}/healthcheck", server.http))
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn the_server_waits_for_its_first_config_then_applies_pushes() {
    use pb::RateLimitUnit::Minute;
    let mut ads = Ads::start().await;
    let server = gateway_server(&ads, &[]).await;
    ads.wait_request("subscription", |_, _| true).await;
    assert_eq!(
        health(&server).await,
        500,
        "NOT_SERVING before the first config"
    );
    ads.push(
        "1",
        vec![domain("gw", vec![limit("path", "/a", Minute, 2)])],
    );
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while health(&server).await != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "healthy after the first config"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(decide(&server, "/a").await, (1, Some(2)));
    ads.push(
        "2",
        vec![domain("gw", vec![limit("path", "/a", Minute, 7)])],
    );
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while decide(&server, "/a").await.1 != Some(7) {
        assert!(tokio::time::Instant::now() < deadline, "the update applies");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A reload request (SIGHUP) does not read files over xDS.
    server.running().reload_config().unwrap();
    assert_eq!(decide(&server, "/a").await.1, Some(7));
}

#[tokio::test]
async fn force_start_without_initial_config_is_healthy_at_once() {
    let ads = Ads::start().await;
    let server = gateway_server(&ads, &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")]).await;
    assert_eq!(health(&server).await, 200);
    assert_eq!(
        decide(&server, "/a").await,
        (1, None),
        "no limits yet: everything OK"
    );
}

/// The binary on xDS logs where its limits come from, the management server, and no file path
/// (it reads none: the default `RUNTIME_ROOT` location it used to name was never read).
#[test]
fn the_start_on_xds_names_the_management_server_not_a_file() {
    use crate::common::binary::{Server, BIN};
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = nobody.local_addr().unwrap().to_string();
    drop(nobody);
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", server.as_str()),
        ("CONFIG_GRPC_XDS_NODE_ID", "test-node"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ];
    let logs = Server::start(BIN.as_ref(), &["serve"], &env).stop();
    let serving = (logs.lines())
        .find(|l| l.contains(" serving "))
        .unwrap_or_else(|| panic!("no serving line:\n{logs}"));
    assert!(
        serving.contains(&format!("config=xds:{server}")),
        "{serving}"
    );
    assert!(!logs.contains("/srv/runtime_data"), "{logs}");
}
