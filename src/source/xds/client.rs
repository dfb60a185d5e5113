//! The ADS client: subscribe, apply and ACK (or NACK) each response, reconnect with backoff.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::protobuf::{value::Kind as PbKind, Struct, Value as PbValue};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataKey;

use super::{XdsSettings, INVALID_ARGUMENT};
use crate::config::xds::{config_from_resources, TYPE_URL};
use crate::config::{Config, ConfigError, LiveConfig, Overlay};
use crate::source::{in_background, Update};

/// Runs the ADS client until the task is dropped: every config the management server sends is
/// validated and yielded on `updates` (`Ok` to apply, `Err` when it is NACKed), and answered once
/// the consumer has dealt with it; `ready` turns true once a config has been applied and stays
/// true, since the last good config stays live across disconnects. `overlays` holds the
/// overlay (`TURNSTILE_XDS_OVERLAY`) to apply to every push, and changes to each new one
/// read good from its files: the last push is built again with it, and it is kept only if that
/// build is.
pub async fn run(
    settings: XdsSettings,
    live: LiveConfig,
    mut overlays: watch::Receiver<Option<Arc<Overlay>>>,
    updates: mpsc::UnboundedSender<Update>,
    ready: watch::Sender<bool>,
) {
    let overlay = overlays.borrow_and_update().clone();
    let mut client = Client {
        node: node(&settings),
        settings,
        live,
        updates,
        ready,
        acked_version: String::new(),
        applied: None,
        received: false,
        overlay,
        overlays,
        kept: None,
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
        // An overlay edited while the server is away applies to the last push meanwhile.
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => break,
                Some(o) = next_overlay(&mut client.overlays) => client.reapply(o).await,
            }
        }
    }
}

/// The next overlay read good from its files; never, without an overlay.
async fn next_overlay(
    overlays: &mut watch::Receiver<Option<Arc<Overlay>>>,
) -> Option<Arc<Overlay>> {
    if overlays.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
    overlays.borrow_and_update().clone()
}

struct Client {
    settings: XdsSettings,
    /// The config being served, which a pushed config's build shares what it can with.
    live: LiveConfig,
    node: Node,
    /// Where the configs go: the server's reload.
    updates: mpsc::UnboundedSender<Update>,
    ready: watch::Sender<bool>,
    /// The version of the last config applied: sent on every NACK and when resubscribing.
    acked_version: String,
    /// A digest of the resources of the config applied last: the same resources again (after a
    /// reconnect) are ACKed without rebuilding, and the resources themselves are not kept.
    applied: Option<Digest>,
    /// Whether the current stream has delivered a response.
    received: bool,
    /// The overlay every push is built with, the last one that built.
    overlay: Option<Arc<Overlay>>,
    overlays: watch::Receiver<Option<Arc<Overlay>>>,
    /// With an overlay: the resources of the config applied last, to build again when the
    /// overlay changes (at most one response, which `max_message_bytes` bounds).
    kept: Option<Vec<Any>>,
}

impl Client {
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
        loop {
            tokio::select! {
                message = inbound.message() => {
                    let Some(response) = message.map_err(|s| inbound_error(&s))? else {
                        break;
                    };
                    self.received = true;
                    let reply = self.handle(response).await;
                    if tx.send(reply).await.is_err() {
                        break;
                    }
                }
                Some(o) = next_overlay(&mut self.overlays) => self.reapply(o).await,
            }
        }
        Ok(())
    }

    /// Builds the last push again with `overlay`, newly read from its files: built, it goes
    /// live and is the overlay from now on; refused, the last good config and overlay stay.
    async fn reapply(&mut self, overlay: Arc<Overlay>) {
        let Some(resources) = self.kept.clone() else {
            tracing::info!("xDS overlay read; it applies from the first push");
            self.overlay = Some(overlay);
            return;
        };
        match self.build(resources, Some(overlay.clone())).await {
            Ok(config) => {
                tracing::info!(version = %self.acked_version, "xDS overlay applied to the last push");
                warn_unmatched(&config);
                self.yield_update(Ok(config)).await;
                self.overlay = Some(overlay);
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "xDS overlay refused on the last push; the last good overlay stays"
                );
                self.yield_update(Err(e)).await;
            }
        }
    }

    /// `resources` built with `overlay`, in the background: a big config holds up neither the
    /// side thread (its ports, the statsd push) nor the workers.
    async fn build(
        &self,
        resources: Vec<Any>,
        overlay: Option<Arc<Overlay>>,
    ) -> Result<Config, ConfigError> {
        let (opts, live) = (self.settings.load, self.live.clone());
        let build = move || config_from_resources(resources, opts, &live, overlay.as_deref());
        in_background(build).await.unwrap_or_else(|message| {
            Err(ConfigError {
                file: "xDS".into(),
                path: String::new(),
                message,
            })
        })
    }

    /// Applies a response if it is valid; returns its ACK or NACK.
    async fn handle(&mut self, response: DiscoveryResponse) -> DiscoveryRequest {
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
        let digest = Digest::of(&resources);
        if self.applied == Some(digest) {
            tracing::debug!(version = %version_info, "xDS config unchanged");
            self.acked_version = version_info.clone();
            return self.request(version_info, nonce, None);
        }
        let kept = self.settings.overlay.is_some().then(|| resources.clone());
        match self.build(resources, self.overlay.clone()).await {
            Ok(config) => {
                tracing::info!(
                    version = %version_info,
                    domains = config.domains.len(),
                    "xDS config applied"
                );
                warn_unmatched(&config);
                self.yield_update(Ok(config)).await;
                self.ready.send_replace(true);
                self.applied = Some(digest);
                self.kept = kept;
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
                self.yield_update(Err(e)).await;
                self.request(self.acked_version.clone(), nonce, Some(message))
            }
        }
    }

    /// Hands `loaded` to the consumer and waits until it has dealt with it.
    async fn yield_update(&self, loaded: Result<Config, ConfigError>) {
        let (handled, done) = oneshot::channel();
        let update = Update {
            loaded,
            handled: Some(handled),
        };
        if self.updates.send(update).is_ok() {
            // Dropped, not sent: either way the update has been dealt with.
            let _ = done.await;
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

/// The overlay's entries the push has no limit for: a warning each (Envoy Gateway may push
/// them later; `/rlconfig` lists them too).
fn warn_unmatched(config: &Config) {
    for line in &config.overlay_unmatched {
        tracing::warn!("{line}");
    }
}

pub(super) fn node(settings: &XdsSettings) -> Node {
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
pub(super) fn backoff(settings: &XdsSettings, failures: u32) -> Duration {
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

/// Why the stream could not deliver a response; one over the size limit says which setting
/// raises it (a config of a few hundred thousand descriptors passes gRPC's 4 MB default).
fn inbound_error(s: &tonic::Status) -> String {
    let text = status_text(s);
    if s.code() == tonic::Code::OutOfRange {
        format!("{text} (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES raises the limit)")
    } else {
        text
    }
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
pub(super) fn strip_scheme(url: &str) -> String {
    let url = url.trim();
    ["dns:///", "http://", "https://"]
        .iter()
        .find_map(|p| url.strip_prefix(p))
        .unwrap_or(url)
        .trim_end_matches('/')
        .to_owned()
}

/// SHA-256 over a response's resources, each type URL and value length-prefixed, so two lists
/// share a digest only if they are the same resources in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Digest([u8; 32]);

impl Digest {
    fn of(resources: &[Any]) -> Digest {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for any in resources {
            for part in [any.type_url.as_bytes(), &any.value] {
                ctx.update(&(part.len() as u64).to_le_bytes());
                ctx.update(part);
            }
        }
        let mut out = [0; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        Digest(out)
    }
}
