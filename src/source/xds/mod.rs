//! The xDS config source: an ADS (state of the world) client for envoyproxy/ratelimit's
//! `RateLimitConfig` resources, as Envoy Gateway serves them to its rate-limit service.
//!
//! One `RateLimitConfig` is one domain (one YAML file); every resource of a response together is
//! the whole config. Resources go through the same validation as YAML files
//! (`config::xds::config_from_resources`), so a config is accepted or refused the same way
//! whichever way it comes. A valid response is handed to the server's reload and ACKed; an
//! invalid one is NACKed with the validation error as `error_detail`, and the last good config
//! stays live. When the stream breaks the client reconnects with exponential backoff and
//! resubscribes with the last version it accepted; meanwhile the server keeps answering from the
//! last good config.

mod client;

use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

pub use client::run;
use client::strip_scheme;

use crate::config::LoadOptions;

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
    pub client_identity: Option<ClientIdentity>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`: the name to verify instead of the URL's host.
    pub server_name: Option<String>,
}

/// Our certificate towards the management server: its file, and its key's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ClientIdentity {
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> ClientIdentity {
        let (cert, key) = (cert.into(), key.into());
        ClientIdentity { cert, key }
    }
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
    /// `TURNSTILE_XDS_OVERLAY`: a YAML file, or a directory of them, of turnstile's own fields
    /// for pushed limits (`config::Overlay`), read at start and whenever it changes.
    pub overlay: Option<PathBuf>,
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
            if let Some(id) = &tls.client_identity {
                cfg = cfg.identity(Identity::from_pem(read(&id.cert)?, read(&id.key)?));
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

#[cfg(test)]
mod tests;
