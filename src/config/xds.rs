//! Config over xDS: an ADS (state of the world) client for envoyproxy/ratelimit's `RateLimitConfig`
//! resources, as Envoy Gateway serves them to its rate-limit service.
//!
//! One `RateLimitConfig` is one domain (one YAML file); every resource of a response together is
//! the whole config. Resources go through the same validation as YAML files
//! ([`Config::from_raw`]), so a config is accepted or refused the same way whichever way it comes.
//! A valid response is applied and ACKed; an invalid one is NACKed with the validation error as
//! `error_detail`, and the last good config stays live. When the stream breaks the client
//! reconnects with exponential backoff and resubscribes with the last version it accepted;
//! meanwhile the server keeps answering from the last good config.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::{value::Kind as PbKind, Any, Struct, Value as PbValue};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataKey;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::raw::{RawDescriptor, RawFile, RawRateLimit, RawReplaces};
use super::{Config, ConfigError, LoadOptions};

/// Types generated from `proto/ratelimit/config/ratelimit/v3/rls_conf.proto`.
pub mod pb {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    include!(concat!(
        env!("OUT_DIR"),
        "/ratelimit.config.ratelimit.v3.rs"
    ));
}

/// The resource type this client subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// A resource wrapped with a TTL or cache control; it carries the real resource inside.
const WRAPPED_TYPE_URL: &str = "type.googleapis.com/envoy.service.discovery.v3.Resource";

/// gRPC's INVALID_ARGUMENT, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// How an idle stream finds out the management server has gone away without closing it.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Client TLS towards the management server (`CONFIG_GRPC_XDS_SERVER_USE_TLS=true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`: the CA the server's certificate must chain to.
    pub ca_cert: PathBuf,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT` and `_KEY`: our certificate, for servers that require mTLS
    /// (Envoy Gateway does).
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`: the name to verify instead of the URL's host.
    pub server_name: Option<String>,
}

/// Settings of the xDS config source, from envoyproxy/ratelimit's environment variables.
#[derive(Debug, Clone, PartialEq)]
pub struct XdsSettings {
    /// `host:port` of the management server (`CONFIG_GRPC_XDS_SERVER_URL`, a gRPC dial target).
    pub server: String,
    /// `CONFIG_GRPC_XDS_NODE_ID`: the management server picks the snapshot by it.
    pub node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA` (`k1:v1,k2=v2`), sent as the node's metadata.
    pub node_metadata: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` (`k1:v1,k2:v2`), sent on the stream.
    pub headers: Vec<(String, String)>,
    pub tls: Option<XdsTls>,
    /// First reconnect delay (`XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`, 10s); doubles per failure.
    pub backoff_initial: Duration,
    /// Longest reconnect delay (`XDS_CLIENT_BACKOFF_MAX_INTERVAL`, 60s).
    pub backoff_max: Duration,
    /// Share of each delay that is randomised (`XDS_CLIENT_BACKOFF_RANDOM_FACTOR`, 0.5), so a
    /// fleet restarted together does not reconnect in lockstep; 0 with `XDS_CLIENT_BACKOFF_JITTER=false`.
    pub backoff_jitter: f64,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`: largest response accepted (tonic's 4 MiB when unset).
    pub max_message_bytes: Option<usize>,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: serve (with no limits) before the first config.
    pub force_start_without_initial_config: bool,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: even when forced to start, report unhealthy
    /// until the first config is loaded.
    pub healthy_only_with_config: bool,
    /// `MERGE_DOMAIN_CONFIG`: resources naming the same domain are merged instead of refused.
    pub load: LoadOptions,
}

impl XdsSettings {
    /// The dial target of `CONFIG_GRPC_XDS_SERVER_URL`: `host:port`, any `scheme://` removed.
    pub fn dial_target(url: &str) -> String {
        strip_scheme(url)
    }

    /// Whether health should report SERVING before the first config has been loaded.
    pub fn healthy_before_first_config(&self) -> bool {
        self.force_start_without_initial_config && !self.healthy_only_with_config
    }

    /// The endpoint to dial; TLS files are read here, at every connection attempt, so rotated
    /// certificates are picked up on the next reconnect.
    fn endpoint(&self) -> Result<Endpoint, String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let uri = format!("{scheme}://{}", self.server);
        let mut ep = Endpoint::from_shared(uri.clone())
            .map_err(|e| format!("invalid CONFIG_GRPC_XDS_SERVER_URL {}: {e}", self.server))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            let read = |p: &PathBuf| {
                std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
            };
            let mut cfg =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&tls.ca_cert)?));
            if let Some((cert, key)) = &tls.client_identity {
                cfg = cfg.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            if let Some(name) = &tls.server_name {
                cfg = cfg.domain_name(name.clone());
            }
            ep = ep
                .tls_config(cfg)
                .map_err(|e| format!("TLS settings for {uri}: {e}"))?;
        }
        Ok(ep)
    }
}

/// Builds the config that a set of `RateLimitConfig` resources describes, through the same
/// validation as YAML files. Errors name the resource: `RateLimitConfig "name": path: message`.
pub fn config_from_resources(resources: &[Any], opts: LoadOptions) -> Result<Config, ConfigError> {
    let mut files = Vec::with_capacity(resources.len());
    for (i, any) in resources.iter().enumerate() {
        let c = decode_resource(any).map_err(|message| ConfigError {
            file: format!("resources[{i}]"),
            path: String::new(),
            message,
        })?;
        files.push(c);
    }
    config_from_protos(files, opts)
}

/// As [`config_from_resources`], from decoded messages.
pub fn config_from_protos(
    configs: Vec<pb::RateLimitConfig>,
    opts: LoadOptions,
) -> Result<Config, ConfigError> {
    let files = configs
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let label = if c.name.is_empty() {
                format!("RateLimitConfig resources[{i}]")
            } else {
                format!("RateLimitConfig \"{}\"", c.name)
            };
            (label, raw_file(c))
        })
        .collect();
    Config::from_raw(files, opts)
}

fn decode_resource(any: &Any) -> Result<pb::RateLimitConfig, String> {
    if any.type_url == WRAPPED_TYPE_URL {
        let wrapped = Resource::decode(any.value.as_slice())
            .map_err(|e| format!("cannot decode {WRAPPED_TYPE_URL}: {e}"))?;
        let inner = wrapped
            .resource
            .ok_or_else(|| format!("wrapped resource \"{}\" has no body", wrapped.name))?;
        if inner.type_url != TYPE_URL {
            return Err(format!(
                "unexpected resource type {} (expected {TYPE_URL})",
                inner.type_url
            ));
        }
        return pb::RateLimitConfig::decode(inner.value.as_slice())
            .map_err(|e| format!("cannot decode RateLimitConfig: {e}"));
    }
    if any.type_url != TYPE_URL {
        return Err(format!(
            "unexpected resource type {} (expected {TYPE_URL})",
            any.type_url
        ));
    }
    pb::RateLimitConfig::decode(any.value.as_slice())
        .map_err(|e| format!("cannot decode RateLimitConfig: {e}"))
}

fn raw_file(c: pb::RateLimitConfig) -> RawFile {
    RawFile {
        domain: Some(c.domain),
        descriptors: Some(c.descriptors.into_iter().map(raw_descriptor).collect()),
        rate_api: None,
    }
}

fn raw_descriptor(d: pb::RateLimitDescriptor) -> RawDescriptor {
    RawDescriptor {
        key: Some(d.key),
        value: Some(d.value),
        rate_limit: d.rate_limit.map(raw_limit),
        rate_limits: None,
        descriptors: if d.descriptors.is_empty() {
            None
        } else {
            Some(d.descriptors.into_iter().map(raw_descriptor).collect())
        },
        shadow_mode: d.shadow_mode,
        quota_mode: d.quota_mode,
        detailed_metric: d.detailed_metric,
        value_to_metric: false,
        share_threshold: false,
        metadata: d.metadata.map(|s| struct_to_yaml(&s)),
    }
}

fn raw_limit(p: pb::RateLimitPolicy) -> RawRateLimit {
    // UNKNOWN is what an unset unit reads as, and an unlimited policy sets none.
    let unit = match pb::RateLimitUnit::try_from(p.unit) {
        Ok(pb::RateLimitUnit::Unknown) if p.unlimited => None,
        Ok(u) => Some(u.as_str_name().to_ascii_lowercase()),
        Err(_) => Some(p.unit.to_string()),
    };
    RawRateLimit {
        unit,
        requests_per_unit: Some(p.requests_per_unit),
        unlimited: p.unlimited,
        name: Some(p.name).filter(|n| !n.is_empty()),
        replaces: if p.replaces.is_empty() {
            None
        } else {
            Some(
                p.replaces
                    .into_iter()
                    .map(|r| RawReplaces { name: Some(r.name) })
                    .collect(),
            )
        },
        algorithm: None,
        burst: None,
        queue: None,
    }
}

fn struct_to_yaml(s: &prost_types::Struct) -> serde_yaml::Mapping {
    s.fields
        .iter()
        .map(|(k, v)| (serde_yaml::Value::String(k.clone()), value_to_yaml(v)))
        .collect()
}

fn value_to_yaml(v: &prost_types::Value) -> serde_yaml::Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_yaml::Value::Null,
        Some(Kind::NumberValue(n)) => serde_yaml::Value::Number((*n).into()),
        Some(Kind::StringValue(s)) => serde_yaml::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_yaml::Value::Bool(*b),
        Some(Kind::StructValue(s)) => serde_yaml::Value::Mapping(struct_to_yaml(s)),
        Some(Kind::ListValue(l)) => {
            serde_yaml::Value::Sequence(l.values.iter().map(value_to_yaml).collect())
        }
    }
}

/// Runs the ADS client until the task is dropped: every config the management server sends is
/// validated and handed to `on_update` (`Ok` to apply, `Err` when it was NACKed); `ready` turns
/// true once a config has been applied and stays true, since the last good config stays live
/// across disconnects.
pub async fn run(
    settings: XdsSettings,
    on_update: impl Fn(Result<Config, ConfigError>) + Send + Sync + 'static,
    ready: watch::Sender<bool>,
) {
    let mut client = Client {
        node: node(&settings),
        settings,
        on_update,
        ready,
        acked_version: String::new(),
        applied: None,
        received: false,
    };
    let mut failures: u32 = 0;
    loop {
        client.received = false;
        match client.session().await {
            Ok(()) => {
                tracing::warn!(server = %client.settings.server, "xDS stream closed by the server")
            }
            Err(e) => {
                tracing::warn!(server = %client.settings.server, error = %e, "xDS stream failed")
            }
        }
        // A stream that delivered something was healthy: start the backoff over.
        if client.received {
            failures = 0;
        }
        let delay = backoff(&client.settings, failures);
        failures = failures.saturating_add(1);
        tracing::info!(delay = ?delay, "reconnecting to the xDS server");
        tokio::time::sleep(delay).await;
    }
}

struct Client<F> {
    settings: XdsSettings,
    node: Node,
    on_update: F,
    ready: watch::Sender<bool>,
    /// The version of the last config applied: sent on every NACK and when resubscribing.
    acked_version: String,
    /// The resources of the config applied last; the same resources again (after a reconnect)
    /// are ACKed without rebuilding.
    applied: Option<Vec<Any>>,
    /// Whether the current stream has delivered a response.
    received: bool,
}

impl<F: Fn(Result<Config, ConfigError>)> Client<F> {
    /// One stream: subscribe, then answer every response with an ACK or a NACK until it ends.
    async fn session(&mut self) -> Result<(), String> {
        let channel = self
            .settings
            .endpoint()?
            .connect()
            .await
            .map_err(|e| format!("cannot connect: {}", error_chain(&e)))?;
        let mut grpc = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(n) = self.settings.max_message_bytes {
            grpc = grpc.max_decoding_message_size(n);
        }
        let (tx, rx) = mpsc::channel(4);
        let subscribe = self.request(self.acked_version.clone(), String::new(), None);
        tx.try_send(subscribe)
            .expect("a new channel has room for the first request");
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        for (k, v) in &self.settings.headers {
            // Checked when the settings were read.
            if let (Ok(k), Ok(v)) = (MetadataKey::from_bytes(k.as_bytes()), v.parse()) {
                request.metadata_mut().insert(k, v);
            }
        }
        let mut inbound = grpc
            .stream_aggregated_resources(request)
            .await
            .map_err(|s| format!("cannot subscribe: {}", status_text(&s)))?
            .into_inner();
        tracing::info!(server = %self.settings.server, node = %self.settings.node_id, "subscribed to RateLimitConfig over xDS");
        while let Some(response) = inbound.message().await.map_err(|s| status_text(&s))? {
            self.received = true;
            let reply = self.handle(response);
            if tx.send(reply).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    /// Applies a response if it is valid; returns its ACK or NACK.
    fn handle(&mut self, response: DiscoveryResponse) -> DiscoveryRequest {
        let DiscoveryResponse {
            version_info,
            resources,
            type_url,
            nonce,
            ..
        } = response;
        if type_url != TYPE_URL {
            let message =
                format!("unexpected type {type_url}: this client only subscribes to {TYPE_URL}");
            tracing::warn!(version = %version_info, "{message}");
            return self.request(self.acked_version.clone(), nonce, Some(message));
        }
        if self.applied.as_ref() == Some(&resources) {
            tracing::debug!(version = %version_info, "xDS config unchanged");
            self.acked_version = version_info.clone();
            return self.request(version_info, nonce, None);
        }
        match config_from_resources(&resources, self.settings.load) {
            Ok(config) => {
                tracing::info!(
                    version = %version_info,
                    domains = config.domains.len(),
                    "xDS config applied"
                );
                (self.on_update)(Ok(config));
                self.ready.send_replace(true);
                self.applied = Some(resources);
                self.acked_version = version_info.clone();
                self.request(version_info, nonce, None)
            }
            Err(e) => {
                tracing::warn!(
                    version = %version_info,
                    kept = %self.acked_version,
                    error = %e,
                    "xDS config rejected; the last good config stays live"
                );
                let message = e.to_string();
                (self.on_update)(Err(e));
                self.request(self.acked_version.clone(), nonce, Some(message))
            }
        }
    }

    fn request(
        &self,
        version_info: String,
        response_nonce: String,
        error: Option<String>,
    ) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info,
            node: Some(self.node.clone()),
            type_url: TYPE_URL.to_owned(),
            response_nonce,
            error_detail: error.map(|message| RpcStatus {
                code: INVALID_ARGUMENT,
                message,
                details: Vec::new(),
            }),
            ..Default::default()
        }
    }
}

fn node(settings: &XdsSettings) -> Node {
    let metadata = (!settings.node_metadata.is_empty()).then(|| Struct {
        fields: settings
            .node_metadata
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    PbValue {
                        kind: Some(PbKind::StringValue(v.clone())),
                    },
                )
            })
            .collect(),
    });
    Node {
        id: settings.node_id.clone(),
        metadata,
        user_agent_name: "turnstile".into(),
        ..Default::default()
    }
}

/// The delay before reconnect attempt `failures + 1`: doubling from the initial interval up to
/// the maximum, then spread by the jitter factor (never past the maximum).
fn backoff(settings: &XdsSettings, failures: u32) -> Duration {
    let base = settings
        .backoff_initial
        .saturating_mul(1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX))
        .min(settings.backoff_max);
    if settings.backoff_jitter == 0.0 {
        return base;
    }
    // A random number in [0, 1) without a dependency: std's hasher keys are random per process
    // and per `RandomState`.
    let r = (RandomState::new().build_hasher().finish() >> 11) as f64 / (1u64 << 53) as f64;
    let spread = 1.0 + settings.backoff_jitter * (2.0 * r - 1.0);
    base.mul_f64(spread).min(settings.backoff_max)
}

fn status_text(s: &tonic::Status) -> String {
    if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        format!("{:?}: {}", s.code(), s.message())
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A Go dial target as envoyproxy/ratelimit takes it (`host:port`, maybe `dns:///host:port`); an
/// `http://` or `https://` prefix is tolerated, TLS being decided by `CONFIG_GRPC_XDS_SERVER_USE_TLS`.
fn strip_scheme(url: &str) -> String {
    let url = url.trim();
    ["dns:///", "http://", "https://"]
        .iter()
        .find_map(|p| url.strip_prefix(p))
        .unwrap_or(url)
        .trim_end_matches('/')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<XdsSettings>, String> {
        crate::settings::Settings::from_env(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .map(|s| s.xds)
    }

    fn xds(vars: &[(&str, &str)]) -> XdsSettings {
        let mut all = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
        all.extend_from_slice(vars);
        settings(&all).unwrap().unwrap()
    }

    #[test]
    fn file_config_is_not_xds() {
        assert_eq!(settings(&[]), Ok(None));
        assert_eq!(settings(&[("CONFIG_TYPE", "FILE")]), Ok(None));
        assert!(settings(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")])
            .unwrap_err()
            .contains("CONFIG_TYPE=GRPC_XDS_DELTA is not supported"));
    }

    #[test]
    fn defaults_are_the_reference_defaults() {
        let s = xds(&[("CONFIG_TYPE", "grpc_xds_sotw")]);
        assert_eq!(s.server, "localhost:18000");
        assert_eq!(s.node_id, "default");
        assert_eq!(s.tls, None);
        assert_eq!(
            (s.backoff_initial, s.backoff_max),
            (Duration::from_secs(10), Duration::from_secs(60))
        );
        assert_eq!(s.backoff_jitter, 0.5);
        assert_eq!(s.max_message_bytes, None);
        assert!(!s.force_start_without_initial_config);
        assert!(!s.healthy_before_first_config());
        assert_eq!(s.load, LoadOptions::default());
    }

    #[test]
    fn envoy_gateway_settings() {
        let s = xds(&[
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ]);
        assert_eq!(s.server, "envoy-gateway:18001");
        assert_eq!(s.node_id, "envoy-ratelimit");
        assert_eq!(
            s.tls,
            Some(XdsTls {
                ca_cert: "/certs/ca.crt".into(),
                client_identity: Some(("/certs/tls.crt".into(), "/certs/tls.key".into())),
                server_name: None,
            })
        );
        assert!(s.healthy_before_first_config());
        let s = xds(&[
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ]);
        assert!(!s.healthy_before_first_config());
    }

    #[test]
    fn tls_needs_a_ca_and_a_whole_identity() {
        let ca = ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ca.crt");
        let on = ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "1");
        let err = |vars: &[(&str, &str)]| {
            let mut all = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
            all.extend_from_slice(vars);
            settings(&all).unwrap_err()
        };
        assert!(err(&[on]).contains("needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT"));
        assert!(err(&[on, ca, ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/c")]).contains("go together"));
        let s = xds(&[on, ca, ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.internal")]);
        let tls = s.tls.unwrap();
        assert_eq!(tls.client_identity, None);
        assert_eq!(tls.server_name.as_deref(), Some("xds.internal"));
        // Files are read when connecting, so a missing one is a connection error, not a panic.
        let s = xds(&[
            on,
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.crt"),
        ]);
        assert!(s
            .endpoint()
            .unwrap_err()
            .contains("cannot read /nonexistent/ca.crt"));
    }

    #[test]
    fn urls_metadata_headers_and_limits() {
        for (given, want) in [
            ("xds:18000", "xds:18000"),
            ("http://xds:18000/", "xds:18000"),
            ("https://xds:18000", "xds:18000"),
            ("dns:///xds:18000", "xds:18000"),
        ] {
            assert_eq!(xds(&[("CONFIG_GRPC_XDS_SERVER_URL", given)]).server, want);
        }
        let s = xds(&[
            ("CONFIG_GRPC_XDS_NODE_METADATA", "cluster:gw, zone=eu-1"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "x-team:rl,authorization:Bearer t",
            ),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "8388608"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
            ("MERGE_DOMAIN_CONFIG", "true"),
        ]);
        assert_eq!(
            s.node_metadata,
            [
                ("cluster".into(), "gw".into()),
                ("zone".into(), "eu-1".into())
            ]
        );
        assert_eq!(
            s.headers,
            [
                ("x-team".into(), "rl".into()),
                ("authorization".into(), "Bearer t".into())
            ]
        );
        assert_eq!(s.max_message_bytes, Some(8 << 20));
        assert_eq!(s.backoff_jitter, 0.0);
        assert!(s.load.merge_domains);
        let n = node(&s);
        assert_eq!(n.metadata.unwrap().fields.len(), 2);
        for bad in [
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "bad key:v"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "0"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "yes please"),
        ] {
            let mut all = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
            all.push(bad);
            assert!(settings(&all).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_maximum_and_jitters_within_it() {
        let mut s = xds(&[
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
        ]);
        let ms = |s: &XdsSettings, n| backoff(s, n).as_millis();
        assert_eq!(
            (0..6).map(|n| ms(&s, n)).collect::<Vec<_>>(),
            [100, 200, 400, 800, 1000, 1000]
        );
        assert_eq!(ms(&s, u32::MAX), 1000);
        s.backoff_jitter = 0.5;
        for n in 0..200 {
            let d = ms(&s, n % 3);
            let base = 100u128 << (n % 3);
            assert!(d >= base / 2 && d <= base * 3 / 2, "{d} around {base}");
        }
        for _ in 0..50 {
            assert!(ms(&s, 10) >= 500 && ms(&s, 10) <= 1000);
        }
    }

    #[test]
    fn wrapped_and_foreign_resources() {
        let config = pb::RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![],
        };
        let plain = Any {
            type_url: TYPE_URL.into(),
            value: config.encode_to_vec(),
        };
        let wrapped = Any {
            type_url: WRAPPED_TYPE_URL.into(),
            value: Resource {
                name: "n".into(),
                resource: Some(plain.clone()),
                ..Default::default()
            }
            .encode_to_vec(),
        };
        assert_eq!(decode_resource(&wrapped), Ok(config.clone()));
        let c = config_from_resources(&[wrapped], LoadOptions::default()).unwrap();
        assert!(c.domain("d").is_some());
        let foreign = Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: vec![],
        };
        let err = config_from_resources(&[plain, foreign], LoadOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("resources[1]: unexpected resource type type.googleapis.com/envoy.config.cluster.v3.Cluster (expected {TYPE_URL})")
        );
        let garbage = Any {
            type_url: TYPE_URL.into(),
            value: vec![0xff, 0xff],
        };
        assert!(decode_resource(&garbage)
            .unwrap_err()
            .starts_with("cannot decode RateLimitConfig"));
    }
}
