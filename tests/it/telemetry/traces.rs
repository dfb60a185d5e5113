//! Logs and traces of the binary as operators run it: JSON log lines carrying the request id,
//! OTLP traces continuing Envoy's context (W3C `traceparent` and b3) received by a collector in
//! this test, a failed export logged, and tracing and header settings that would do nothing
//! refused or warned about.

use crate::common::tempdir::TempDir;

use crate::common::binary::{block_on, call, request, wait_for, Server, BIN, V1};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(30);

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;

#[test]
fn json_log_lines_parse_and_carry_the_request_id() {
    let t = TempDir::new("json");
    std::fs::write(t.path().join("a.yaml"), V1).unwrap();
    let cfg = t.path().join("a.yaml").display().to_string();
    let server = Server::start(
        Path::new(BIN),
        &["serve", "--config", &cfg],
        &[("LOG_FORMAT", "json"), ("LOG_LEVEL", "debug")],
    );
    // Kubernetes merges stdout and stderr: the ready line on stdout is a JSON log event too.
    let ready: serde_json::Value = serde_json::from_str(&server.ready)
        .unwrap_or_else(|e| panic!("ready line is not JSON ({e}): {}", server.ready));
    assert_eq!(ready["fields"]["message"], "listening", "{ready}");
    assert!(
        ready["level"].is_string() && ready["timestamp"].is_string(),
        "{ready}"
    );
    let grpc = server.ports.grpc_addr();
    block_on(async {
        call(
            grpc,
            request("productpage-ratelimit", "PATH", "/x"),
            &[("x-request-id", "req-7f3a")],
        )
        .await;
        call(grpc, request("productpage-ratelimit", "PATH", "/y"), &[]).await;
    });
    let stderr = server.stop();
    let mut answered = Vec::new();
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        if v["fields"]["message"] == "answered" {
            answered.push(v);
        }
    }
    assert_eq!(answered.len(), 2, "{stderr}");
    assert_eq!(
        answered[0]["span"]["request_id"], "req-7f3a",
        "{}",
        answered[0]
    );
    assert_eq!(answered[0]["fields"]["grpc_status"], 0);
    // Without x-request-id, one is made: 16 hex digits.
    let made = answered[1]["span"]["request_id"].as_str().unwrap();
    assert!(
        made.len() == 16 && made.chars().all(|c| c.is_ascii_hexdigit()),
        "{made}"
    );
}

struct Collector(tokio::sync::mpsc::UnboundedSender<ExportTraceServiceRequest>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A span as the collector got it: (trace id, parent span id, name, resource attributes).
type Got = (String, String, String, HashMap<String, String>);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An OTLP collector on 127.0.0.1: gRPC (`TraceService`) or HTTP (`POST /v1/traces`,
/// protobuf); what it receives comes out of the channel.
fn collector(
    rt: &tokio::runtime::Runtime,
    grpc: bool,
) -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let addr = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        if grpc {
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(Collector(tx)))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
            );
        } else {
            let app = axum::Router::new().route(
                "/v1/traces",
                axum::routing::post(move |body: axum::body::Bytes| {
                    let tx = tx.clone();
                    async move {
                        let req = <ExportTraceServiceRequest as prost::Message>::decode(body)
                            .expect("OTLP protobuf body");
                        let _ = tx.send(req);
                        prost::Message::encode_to_vec(&ExportTraceServiceResponse::default())
                    }
                }),
            );
            tokio::spawn(async move { axum::serve(l, app).await });
        }
        addr
    });
    (addr, rx)
}

#[test]
fn traces_continue_envoys_context_over_otlp_grpc() {
    traces_continue_envoys_context(true);
}

/// TRACING_EXPORTER_PROTOCOL unset: OTLP/HTTP, as envoyproxy/ratelimit (and so Envoy Gateway,
/// which sets only the endpoint) expect.
#[test]
fn traces_continue_envoys_context_over_otlp_http() {
    traces_continue_envoys_context(false);
}

fn traces_continue_envoys_context(grpc: bool) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (collector, mut rx) = collector(&rt, grpc);
    let t = TempDir::new("otlp");
    std::fs::write(t.path().join("a.yaml"), V1).unwrap();
    let cfg = t.path().join("a.yaml").display().to_string();
    let endpoint = format!("http://{collector}");
    let protocol = if grpc { "grpc" } else { "" };
    let server = Server::start(
        Path::new(BIN),
        &["serve", "--config", &cfg],
        &[
            ("TRACING_EXPORTER_PROTOCOL", protocol),
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "rl-under-test"),
            ("TRACING_SERVICE_NAMESPACE", "ops"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            // Logs at warn: traces do not depend on the log level.
            ("LOG_LEVEL", "warn"),
        ],
    );
    let w3c_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let w3c_parent = "00f067aa0ba902b7";
    let b3_trace = "80f198ee56343ba864fe8b2a57d3eff7";
    let b3_parent = "e457b5a2e4d86bd1";
    let grpc = server.ports.grpc_addr();
    rt.block_on(async {
        call(
            grpc,
            request("productpage-ratelimit", "PATH", "/a"),
            &[("traceparent", &format!("00-{w3c_trace}-{w3c_parent}-01"))],
        )
        .await;
        call(
            grpc,
            request("productpage-ratelimit", "PATH", "/b"),
            &[("b3", &format!("{b3_trace}-{b3_parent}-1"))],
        )
        .await;
    });
    let mut got: Vec<Got> = Vec::new();
    let end = Instant::now() + DEADLINE;
    while got.len() < 2 {
        let left = end.saturating_duration_since(Instant::now());
        let req = rt
            .block_on(async { tokio::time::timeout(left, rx.recv()).await })
            .unwrap_or_else(|_| panic!("collector got {got:?} only"))
            .unwrap();
        for rs in req.resource_spans {
            let attrs: HashMap<String, String> = rs
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|kv| match kv.value?.value? {
                    AnyValue::StringValue(s) => Some((kv.key, s)),
                    _ => None,
                })
                .collect();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push((
                        hex(&s.trace_id),
                        hex(&s.parent_span_id),
                        s.name,
                        attrs.clone(),
                    ));
                }
            }
        }
    }
    server.stop();
    for (trace, parent) in [(w3c_trace, w3c_parent), (b3_trace, b3_parent)] {
        let span = got
            .iter()
            .find(|g| g.0 == trace)
            .unwrap_or_else(|| panic!("no span of trace {trace}: {got:?}"));
        assert_eq!(span.1, parent, "{span:?}");
        assert_eq!(
            span.2,
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        );
        assert_eq!(span.3["service.name"], "rl-under-test");
        assert_eq!(span.3["service.namespace"], "ops");
    }
}

/// Settings that do nothing as set say so: the IETF header form without the headers turned on
/// warns at start; an `https` OTLP endpoint (exported without TLS, it could never work) stops
/// the start naming the variable.
#[test]
fn settings_that_would_do_nothing_warn_or_stop_the_start() {
    let t = TempDir::new("partners");
    std::fs::write(t.path().join("a.yaml"), V1).unwrap();
    let cfg = t.path().join("a.yaml").display().to_string();
    let args = ["serve", "--config", cfg.as_str()];
    let server = Server::start(
        Path::new(BIN),
        &args,
        &[("TURNSTILE_RESPONSE_HEADERS", "ietf")],
    );
    let log = server.stop();
    assert!(
        log.contains(
            "TURNSTILE_RESPONSE_HEADERS does nothing without LIMIT_RESPONSE_HEADERS_ENABLED"
        ),
        "{log}"
    );
    let both = [
        ("TURNSTILE_RESPONSE_HEADERS", "ietf"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
    ];
    let log = Server::start(Path::new(BIN), &args, &both).stop();
    assert!(!log.contains("does nothing"), "{log}");

    for k in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        let err = crate::common::binary::start_fails(
            &args,
            &[("TRACING_ENABLED", "true"), (k, "https://collector:4318")],
        );
        assert!(
            err.contains(&format!("{k}=https://collector:4318"))
                && err.contains("https endpoints are not supported"),
            "{err}"
        );
    }
}

/// A collector that is not there: the failed export is logged (at most a line every 10 s,
/// with the count of failures since the last), not dropped in silence.
#[test]
fn a_failed_trace_export_is_logged() {
    let t = TempDir::new("otlp-down");
    std::fs::write(t.path().join("a.yaml"), V1).unwrap();
    let cfg = t.path().join("a.yaml").display().to_string();
    // A port nothing listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let server = Server::start(
        Path::new(BIN),
        &["serve", "--config", &cfg],
        &[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let grpc = server.ports.grpc_addr();
    block_on(call(
        grpc,
        request("productpage-ratelimit", "PATH", "/a"),
        &[],
    ));
    wait_for("a failed export logged", || {
        let log = server.stderr();
        (!log.contains("trace export failed")).then_some(log)
    });
    let log = server.stop();
    let lines: Vec<&str> = (log.lines())
        .filter(|l| l.contains("trace export failed"))
        .collect();
    assert!(lines[0].contains("failures=1"), "{log}");
}
