//! Logs and traces: the `tracing` subscriber (text or JSON on stderr), the span every
//! `ShouldRateLimit` call runs in (with its request id), and, with `TRACING_ENABLED`, an
//! OpenTelemetry layer exporting those spans over OTLP (HTTP or gRPC), continuing Envoy's trace.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::field::{display, Empty};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use super::trace_export::Logged;

/// The target of request spans and of the events about a request as a whole.
/// `LOG_LEVEL` and `LOG_FORMAT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// A `tracing` filter: a level (`debug`) or directives (`info,turnstile=debug`).
    pub level: String,
    pub json: bool,
}

/// `TRACING_*` and `OTEL_EXPORTER_OTLP_ENDPOINT`: OpenTelemetry spans over OTLP/gRPC.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    pub service_name: String,
    pub service_namespace: Option<String>,
    pub service_instance_id: Option<String>,
    /// Fraction of new traces sampled; a trace Envoy started keeps Envoy's decision.
    pub sampling_rate: f64,
    /// `TRACING_EXPORTER_PROTOCOL`: http (the default, as in envoyproxy/ratelimit) or grpc.
    pub protocol: OtlpProtocol,
    /// Where spans go: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as given, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (plus `/v1/traces` over HTTP, as the OTLP spec says).
    /// None: the exporter's default, localhost:4318 (HTTP) or localhost:4317 (gRPC).
    pub endpoint: Option<String>,
}

/// How OTLP spans are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies.
    Http,
    Grpc,
}

pub const REQUEST_TARGET: &str = "turnstile::request";

/// Set once an OpenTelemetry layer is installed: only then is Envoy's context worth extracting.
static TRACING_ON: AtomicBool = AtomicBool::new(false);

/// Keeps the exporter alive; [`Telemetry::shutdown`] flushes the spans not yet sent.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    /// The tonic exporter's connection is driven by a small runtime of its own, so exporting
    /// never depends on (or blocks) the serving runtimes.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Telemetry {
    /// Sends what is buffered (waits up to 5 s). Call outside any runtime.
    pub fn shutdown(mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown_with_timeout(Duration::from_secs(5)) {
                tracing::warn!(error = %e, "trace exporter did not flush");
            }
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// The level names envoyproxy/ratelimit's logrus takes (`logrus.ParseLevel`, any case), each
/// with the `tracing` level it means here; panic and fatal lines are errors, so they still show.
const LEVELS: [(&str, &str); 8] = [
    ("panic", "error"),
    ("fatal", "error"),
    ("error", "error"),
    ("warn", "warn"),
    ("warning", "warn"),
    ("info", "info"),
    ("debug", "debug"),
    ("trace", "trace"),
];

/// `LOG_LEVEL` as a `tracing` filter: a logrus level name (any case), or directives such as
/// `info,turnstile=debug` whose bare words are level names. Anything else is refused: `tracing`
/// would read a bare unknown word as a target and log nothing else, not even errors.
pub fn log_filter(text: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "LOG_LEVEL={text} is not a log level (panic, fatal, error, warn, warning, info, \
             debug, trace) or a filter such as info,turnstile=debug"
        )
    };
    let mut out = Vec::new();
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = LEVELS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(directive));
        match bare {
            Some((_, level)) => out.push((*level).to_owned()),
            None if directive.contains(['=', '[']) => {
                let (target, level) = directive.rsplit_once('=').ok_or_else(bad)?;
                let level = LEVELS
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case(level.trim()))
                    .map_or(level.trim().to_ascii_lowercase(), |(_, l)| (*l).to_owned());
                out.push(format!("{target}={level}"));
            }
            None => return Err(bad()),
        }
    }
    let filter = out.join(",");
    if filter.is_empty() || EnvFilter::try_new(&filter).is_err() {
        return Err(bad());
    }
    Ok(filter)
}

/// Installs the global subscriber: logs to stderr as `log` says, and spans to OTLP when
/// `tracing` is given. Each has its own filter, so `LOG_LEVEL=warn` does not stop traces.
pub fn init(log: &LogSettings, tracing: Option<&TracingSettings>) -> Result<Telemetry, String> {
    let filter = log_filter(&log.level).map_err(|e| format!("bad settings: {e}"))?;
    let filter = EnvFilter::try_new(&filter).map_err(|e| format!("LOG_LEVEL: {e}"))?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let fmt = if log.json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let mut telemetry = Telemetry {
        provider: None,
        runtime: None,
    };
    let otel = match tracing {
        None => None,
        Some(t) => {
            let (provider, runtime) = provider(t)?;
            let tracer = provider.tracer("turnstile");
            telemetry.provider = Some(provider);
            telemetry.runtime = runtime;
            Some(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(
                        Targets::new()
                            .with_target("turnstile", LevelFilter::INFO)
                            .with_target(REQUEST_TARGET, LevelFilter::DEBUG),
                    ),
            )
        }
    };
    let on = otel.is_some();
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .try_init()
        .map_err(|e| format!("cannot install the log subscriber: {e}"))?;
    TRACING_ON.store(on, Ordering::Release);
    Ok(telemetry)
}

/// Logs only, at `level` (the filter of `LOG_LEVEL`, or `info` when it is what is wrong): for
/// reporting bad settings.
pub fn init_logging(level: &str, json: bool) {
    let level = log_filter(level).unwrap_or_else(|_| "info".to_owned());
    let _ = init(&LogSettings { level, json }, None);
}

fn provider(
    t: &TracingSettings,
) -> Result<(SdkTracerProvider, Option<tokio::runtime::Runtime>), String> {
    let err = |e: opentelemetry_otlp::ExporterBuildError| {
        format!("cannot build the OTLP trace exporter: {e}")
    };
    let (exporter, runtime) = match t.protocol {
        // The blocking HTTP client runs its own thread: nothing else is needed.
        OtlpProtocol::Http => {
            let mut b = opentelemetry_otlp::SpanExporter::builder().with_http();
            if let Some(e) = &t.endpoint {
                b = b.with_endpoint(e.clone());
            }
            (b.build().map_err(err)?, None)
        }
        OtlpProtocol::Grpc => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("turnstile-otlp")
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the trace exporter's runtime: {e}"))?;
            let exporter = {
                // tonic's channel spawns its connection task on the runtime current now.
                let _entered = runtime.enter();
                let mut b = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                if let Some(e) = &t.endpoint {
                    b = b.with_endpoint(e.clone());
                }
                b.build().map_err(err)?
            };
            (exporter, Some(runtime))
        }
    };
    let mut attributes = Vec::new();
    if let Some(ns) = &t.service_namespace {
        attributes.push(KeyValue::new("service.namespace", ns.clone()));
    }
    if let Some(id) = &t.service_instance_id {
        attributes.push(KeyValue::new("service.instance.id", id.clone()));
    }
    let resource = Resource::builder()
        .with_service_name(t.service_name.clone())
        .with_attributes(attributes)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(Logged::new(exporter))
        // A trace Envoy sampled is continued whatever the rate; the rate applies to new ones.
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            t.sampling_rate,
        ))))
        .with_resource(resource)
        .build();
    Ok((provider, runtime))
}

/// The span a door's call runs in, named `name` (gRPC's `service/method`, HTTP's method and
/// route) over `system` (`grpc`, `http`, `resp`). Its `request_id` is Envoy's `x-request-id`
/// when sent, else one made here; every log line of the call carries it. With traces on, its
/// parent is the W3C `traceparent` or b3 context in the metadata.
///
/// It is a debug span: at `LOG_LEVEL=info` and above (and traces off) none is made, because
/// one costs about 0.75 µs of CPU per call (6% of a call answered from memory) and nothing
/// logs inside a call at those levels. A disabled span costs nothing.
pub fn request_span(headers: &http::HeaderMap, system: &'static str, name: &str) -> Span {
    let span = tracing::debug_span!(
        target: REQUEST_TARGET,
        "call",
        request_id = Empty,
        otel.name = Empty,
        otel.kind = Empty,
        rpc.system = Empty,
        otel.status_code = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    match headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
    {
        Some(id) => span.record("request_id", id),
        None => span.record("request_id", display(RequestId::next())),
    };
    if TRACING_ON.load(Ordering::Acquire) {
        span.record("otel.name", name);
        span.record("otel.kind", "server");
        span.record("rpc.system", system);
        if let Some(parent) = remote_context(headers) {
            let _ = span.set_parent(Context::new().with_remote_span_context(parent));
        }
    }
    span
}

/// Envoy's trace context: W3C `traceparent` (and `tracestate`) first, else b3, single
/// header (`b3: trace-span-sampled`) or multi (`x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled`).
pub fn remote_context(headers: &http::HeaderMap) -> Option<SpanContext> {
    let w3c = TraceContextPropagator::new().extract(&Headers(headers));
    let sc = w3c.span().span_context().clone();
    if sc.is_valid() {
        return Some(sc);
    }
    b3(headers).filter(SpanContext::is_valid)
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

fn b3(headers: &http::HeaderMap) -> Option<SpanContext> {
    let get = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
    let (trace, span, sampled) = match get("b3") {
        Some(single) => {
            let mut parts = single.split('-');
            (parts.next()?, parts.next()?, parts.next())
        }
        None => (
            get("x-b3-traceid")?,
            get("x-b3-spanid")?,
            get("x-b3-flags")
                .filter(|f| *f == "1")
                .map(|_| "d")
                .or_else(|| get("x-b3-sampled")),
        ),
    };
    // 64-bit b3 trace ids are the low half of a 128-bit one.
    let trace = match trace.len() {
        16 => TraceId::from_hex(&format!("{:0>32}", trace)).ok()?,
        32 => TraceId::from_hex(trace).ok()?,
        _ => return None,
    };
    if span.len() != 16 {
        return None;
    }
    let span = SpanId::from_hex(span).ok()?;
    // An absent decision is deferred to us; we take it as sampled, as Envoy does.
    let flags = match sampled {
        Some("0") | Some("false") => TraceFlags::default(),
        _ => TraceFlags::SAMPLED,
    };
    Some(SpanContext::new(
        trace,
        span,
        flags,
        true,
        TraceState::default(),
    ))
}

/// A request id made here: 16 hex digits, a random per-process start plus a counter, so ids
/// from replicas do not collide and making one allocates nothing.
pub struct RequestId(u64);

impl RequestId {
    pub fn next() -> RequestId {
        static SEED: OnceLock<u64> = OnceLock::new();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let seed = *SEED.get_or_init(|| {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new().hash_one(std::process::id())
        });
        // splitmix64 of seed + n: consecutive ids look unrelated.
        let mut z = seed.wrapping_add(
            NEXT.fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        RequestId(z ^ (z >> 31))
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn w3c_wins_over_b3() {
        let h = headers(&[
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1"),
        ]);
        let sc = remote_context(&h).unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.span_id().to_string(), "b7ad6b7169203331");
        assert!(sc.is_sampled() && sc.is_remote());
    }

    #[test]
    fn b3_single_and_multi() {
        let sc = remote_context(&headers(&[(
            "b3",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-0-05e3ac9a4f6e3b90",
        )]))
        .unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "80f198ee56343ba864fe8b2a57d3eff7"
        );
        assert!(!sc.is_sampled());
        let sc = remote_context(&headers(&[
            ("x-b3-traceid", "64fe8b2a57d3eff7"),
            ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ("x-b3-sampled", "1"),
        ]))
        .unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "000000000000000064fe8b2a57d3eff7"
        );
        assert!(sc.is_sampled());
        assert!(remote_context(&headers(&[("b3", "0")])).is_none());
        assert!(remote_context(&headers(&[])).is_none());
    }

    #[test]
    fn request_ids_differ() {
        let a = RequestId::next().to_string();
        let b = RequestId::next().to_string();
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
    }
}
