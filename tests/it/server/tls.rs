//! gRPC over TLS and mTLS with certificates made here (rcgen), certificate rotation picked up
//! without a restart, `GRPC_CLIENT_TLS_SAN`, and gRPC on a unix socket (`GRPC_UDS`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::tempdir::TempDir;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use turnstile::config::Config;
use turnstile::limiter::Clock;
use turnstile::server::{self, Running};
use turnstile::settings::Settings;

const DEADLINE: Duration = Duration::from_secs(20);
const CONFIG: &str = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A PEM certificate and its key.
struct Leaf {
    cert: String,
    key: String,
    der: Vec<u8>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            issuer: CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
        p.distinguished_name.push(DnType::CommonName, names[0]);
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    fn server(&self) -> Leaf {
        self.leaf(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn client(&self, name: &str) -> Leaf {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

fn settings(env: &[(&str, &str)]) -> Settings {
    let mut s = Settings::from_env(|k| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap_or_else(|e| panic!("{env:?}: {e}"));
    s.grpc_addr = "127.0.0.1:0".parse().unwrap();
    s.http_addr = "127.0.0.1:0".parse().unwrap();
    s.debug_addr = Some("127.0.0.1:0".parse().unwrap());
    s.prometheus = None;
    s.reload_interval = Duration::from_millis(50);
    s.workers = 2;
    s.shards = 2;
    s
}

async fn start(s: &Settings) -> Running {
    let config = Config::from_sources(&[("t.yaml".into(), CONFIG.into())], s.load).unwrap();
    server::start(s, config, Clock::System)
        .await
        .expect("server starts")
}

fn request() -> RateLimitRequest {
    crate::common::one("tls", &[("k", "v")])
}

async fn call_on(channel: Channel) -> Result<RateLimitResponse, String> {
    RateLimitServiceClient::new(channel)
        .should_rate_limit(request())
        .await
        .map(|r| r.into_inner())
        .map_err(|e| e.to_string())
}

/// One call over TLS trusting `ca`, presenting `identity` if given.
async fn tls_call(
    r: &Running,
    ca: &str,
    identity: Option<&Leaf>,
) -> Result<RateLimitResponse, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(&id.cert, &id.key));
    }
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", r.grpc_addr.port()))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(DEADLINE)
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    call_on(channel).await
}

async fn plain_call(r: &Running) -> Result<RateLimitResponse, String> {
    let channel = Endpoint::from_shared(format!("http://{}", r.grpc_addr))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    call_on(channel).await
}

/// The certificate the server presents to a new connection now.
async fn served_cert(r: &Running, cas: &[&Ca]) -> Vec<u8> {
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots
            .add(CertificateDer::from(ca.issuer.der().to_vec()))
            .unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(r.grpc_addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("handshake");
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

async fn debug_metric(r: &Running, name: &str) -> f64 {
    let body = reqwest::get(format!("http://{}/metrics", r.debug_addr.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name}"))
}

#[tokio::test]
async fn tls_serves_and_refuses_plaintext() {
    let t = TempDir::new("tls");
    let ca = Ca::new("ca");
    let server = ca.server();
    let cert = t.write("tls.crt", &server.cert).display().to_string();
    let key = t.write("tls.key", &server.key).display().to_string();
    let s = settings(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert),
        ("GRPC_SERVER_TLS_KEY", &key),
    ]);
    let r = start(&s).await;
    let resp = tls_call(&r, &ca.pem(), None).await.expect("TLS call");
    assert_eq!(resp.overall_code, 1);
    assert_eq!(resp.statuses[0].limit_remaining, 99);
    assert!(plain_call(&r).await.is_err(), "plaintext is refused");
    // A client that does not trust the server's CA fails.
    assert!(tls_call(&r, &Ca::new("other").pem(), None).await.is_err());
    assert!(debug_metric(&r, "ratelimit_service_tls_handshake_errors_total").await >= 1.0);
    r.shutdown().await;
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_ca() {
    let t = TempDir::new("mtls");
    let ca = Ca::new("ca");
    let server = ca.server();
    let cert = t.write("tls.crt", &server.cert).display().to_string();
    let key = t.write("tls.key", &server.key).display().to_string();
    let ca_file = t.write("ca.crt", &ca.pem()).display().to_string();
    // Envoy Gateway's name for the client CA.
    let s = settings(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert),
        ("GRPC_SERVER_TLS_KEY", &key),
        ("GRPC_SERVER_TLS_CA_CERT", &ca_file),
    ]);
    let r = start(&s).await;
    let e = tls_call(&r, &ca.pem(), None)
        .await
        .expect_err("no client cert");
    assert!(!e.is_empty());
    let rogue = Ca::new("rogue").client("envoy");
    tls_call(&r, &ca.pem(), Some(&rogue))
        .await
        .expect_err("client cert from another CA");
    let resp = tls_call(&r, &ca.pem(), Some(&ca.client("envoy")))
        .await
        .expect("client cert from the CA");
    assert_eq!(resp.overall_code, 1);
    r.shutdown().await;
}

#[tokio::test]
async fn mtls_client_san_is_checked() {
    let t = TempDir::new("san");
    let ca = Ca::new("ca");
    let server = ca.server();
    let cert = t.write("tls.crt", &server.cert).display().to_string();
    let key = t.write("tls.key", &server.key).display().to_string();
    let ca_file = t.write("ca.crt", &ca.pem()).display().to_string();
    let s = settings(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert),
        ("GRPC_SERVER_TLS_KEY", &key),
        ("GRPC_CLIENT_TLS_CACERT", &ca_file),
        ("GRPC_CLIENT_TLS_SAN", "envoy.internal"),
    ]);
    let r = start(&s).await;
    tls_call(&r, &ca.pem(), Some(&ca.client("envoy.internal")))
        .await
        .expect("the named client");
    tls_call(&r, &ca.pem(), Some(&ca.client("someone.else")))
        .await
        .expect_err("another name from the same CA");
    r.shutdown().await;
}

#[tokio::test]
async fn rotated_certificate_is_served_to_new_connections() {
    let t = TempDir::new("rotate");
    let ca = Ca::new("ca");
    let first = ca.server();
    let cert = t.write("tls.crt", &first.cert).display().to_string();
    let key = t.write("tls.key", &first.key).display().to_string();
    let s = settings(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert),
        ("GRPC_SERVER_TLS_KEY", &key),
    ]);
    let r = start(&s).await;
    assert_eq!(served_cert(&r, &[&ca]).await, first.der);

    // Rotate to a certificate of a new CA (as a CA rollover would), key first.
    let ca2 = Ca::new("ca2");
    let second = ca2.server();
    t.write("tls.key", &second.key);
    t.write("tls.crt", &second.cert);
    let end = Instant::now() + DEADLINE;
    while served_cert(&r, &[&ca, &ca2]).await != second.der {
        assert!(Instant::now() < end, "rotated certificate never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tls_call(&r, &ca2.pem(), None)
        .await
        .expect("call with the new CA");
    assert!(debug_metric(&r, "ratelimit_service_tls_reload_success_total").await >= 1.0);

    // A broken certificate is refused; the rotated one stays live.
    let errors = debug_metric(&r, "ratelimit_service_tls_reload_error_total").await;
    t.write("tls.crt", "not a certificate");
    let end = Instant::now() + DEADLINE;
    while debug_metric(&r, "ratelimit_service_tls_reload_error_total").await <= errors {
        assert!(Instant::now() < end, "broken certificate never noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(served_cert(&r, &[&ca, &ca2]).await, second.der);
    r.shutdown().await;
}

#[tokio::test]
async fn bad_tls_files_stop_the_start() {
    let t = TempDir::new("bad");
    let s = settings(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        (
            "GRPC_SERVER_TLS_CERT",
            &t.write("tls.crt", "junk").display().to_string(),
        ),
        (
            "GRPC_SERVER_TLS_KEY",
            &t.write("tls.key", "junk").display().to_string(),
        ),
    ]);
    let config = Config::from_sources(&[("t.yaml".into(), CONFIG.into())], s.load).unwrap();
    let e = match server::start(&s, config, Clock::System).await {
        Ok(_) => panic!("started with junk certificates"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("GRPC_SERVER_TLS_CERT"), "{e}");
    // And TLS without files is a settings error naming the variable.
    let e =
        Settings::from_env(|k| (k == "GRPC_SERVER_USE_TLS").then(|| "true".into())).unwrap_err();
    assert!(e.contains("GRPC_SERVER_TLS_CERT"), "{e}");
}

#[tokio::test]
async fn grpc_on_a_unix_socket() {
    let t = TempDir::new("uds");
    let sock = t.path().join("rls.sock");
    let sock_s = sock.display().to_string();
    let s = settings(&[("GRPC_UDS", &sock_s)]);
    let r = start(&s).await;
    assert_eq!(r.grpc_uds.as_deref(), Some(sock.as_path()));
    let path = sock.clone();
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .expect("connect over the socket");
    let resp = call_on(channel).await.expect("call over the socket");
    assert_eq!(resp.statuses[0].limit_remaining, 99);
    r.shutdown().await;
    assert!(!Path::new(&sock).exists(), "socket removed at shutdown");
}
