//! An ADS management server (state of the world) for RateLimitConfig resources: serves one
//! snapshot to every stream, records every request, and can break streams or refuse new ones to
//! play a restart. Used by `source::xds` (the client in-process) and `image` (the image, as Envoy
//! Gateway configures it).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::Stream;
use tonic::transport::ServerTlsConfig;
use tonic::{Request, Response, Status, Streaming};
use turnstile::config::xds::{pb, TYPE_URL};

/// Long enough for anything on a loaded 2-core machine; tests poll and never sleep to wait.
const DEADLINE: Duration = Duration::from_secs(20);

/// What the management server currently serves: a version and its resources.
pub type Snapshot = Option<(String, Vec<Any>)>;

/// A minimal ADS server: serves one snapshot to every stream, records every request, and can
/// break streams or refuse new ones to play a restart.
#[derive(Clone)]
pub struct FakeAds {
    pub snapshot: Arc<watch::Sender<Snapshot>>,
    /// Every request received, with the number of the stream it came on (from 1).
    pub requests: mpsc::UnboundedSender<(u64, DiscoveryRequest)>,
    pub streams: Arc<AtomicU64>,
    /// While set, new streams are refused with UNAVAILABLE.
    pub down: Arc<AtomicBool>,
    pub refused: Arc<AtomicU64>,
    /// Bumped to break every open stream: with an error (`true`) or a clean end (`false`).
    pub kick: Arc<watch::Sender<(u64, bool)>>,
}

pub struct Ads {
    pub server: FakeAds,
    pub addr: std::net::SocketAddr,
    pub requests: mpsc::UnboundedReceiver<(u64, DiscoveryRequest)>,
}

impl Ads {
    pub async fn start() -> Ads {
        Ads::start_with(None).await
    }

    pub async fn start_with(tls: Option<ServerTlsConfig>) -> Ads {
        let (req_tx, requests) = mpsc::unbounded_channel();
        let server = FakeAds {
            snapshot: Arc::new(watch::channel(None).0),
            requests: req_tx,
            streams: Arc::default(),
            down: Arc::default(),
            refused: Arc::default(),
            kick: Arc::new(watch::channel((0, false)).0),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let svc = AggregatedDiscoveryServiceServer::new(server.clone());
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).expect("valid server TLS");
        }
        tokio::spawn(async move {
            builder
                .add_service(svc)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        Ads {
            server,
            addr,
            requests,
        }
    }

    pub fn push(&self, version: &str, configs: Vec<pb::RateLimitConfig>) {
        let resources = configs.iter().map(any).collect();
        self.server
            .snapshot
            .send_replace(Some((version.to_owned(), resources)));
    }

    pub fn kick(&self, with_error: bool) {
        self.server
            .kick
            .send_modify(|(n, e)| (*n, *e) = (*n + 1, with_error));
    }

    /// The next request the client sends that `pred` accepts; the ones before it are skipped.
    pub async fn wait_request(
        &mut self,
        what: &str,
        pred: impl Fn(u64, &DiscoveryRequest) -> bool,
    ) -> (u64, DiscoveryRequest) {
        let found = tokio::time::timeout(DEADLINE, async {
            loop {
                let (stream, req) = self.requests.recv().await.expect("server is alive");
                if pred(stream, &req) {
                    return (stream, req);
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no {what} within {DEADLINE:?}"))
    }

    pub async fn wait_ack(&mut self, stream: u64, version: &str) -> DiscoveryRequest {
        let nonce = nonce(stream, version);
        let (_, req) = self
            .wait_request(&format!("ACK of {version}"), |_, r| {
                r.response_nonce == nonce
            })
            .await;
        assert_eq!(req.version_info, version, "ACK carries the new version");
        assert!(req.error_detail.is_none(), "ACK has no error: {req:?}");
        req
    }
}

/// One `RateLimitConfig`, domain `saas`, of `tenants` tenants: each a `tenant` value with a
/// limit (100 a minute; the last one `last_rpu`) and a child `path` limit (10 a second), 2 ×
/// `tenants` descriptors, as a SaaS with a limit per customer has it.
pub fn saas(tenants: u32, last_rpu: u32) -> pb::RateLimitConfig {
    let limit = |unit: pb::RateLimitUnit, rpu: u32| {
        Some(pb::RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: rpu,
            ..Default::default()
        })
    };
    let descriptors = (0..tenants)
        .map(|i| pb::RateLimitDescriptor {
            key: "tenant".into(),
            value: format!("t{i}"),
            rate_limit: limit(
                pb::RateLimitUnit::Minute,
                if i + 1 == tenants { last_rpu } else { 100 },
            ),
            descriptors: vec![pb::RateLimitDescriptor {
                key: "path".into(),
                rate_limit: limit(pb::RateLimitUnit::Second, 10),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    pb::RateLimitConfig {
        name: "saas".into(),
        domain: "saas".into(),
        descriptors,
    }
}

pub fn nonce(stream: u64, version: &str) -> String {
    format!("{stream}-{version}")
}

pub fn any(c: &pb::RateLimitConfig) -> Any {
    Any {
        type_url: TYPE_URL.into(),
        value: c.encode_to_vec(),
    }
}

pub type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
pub type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for FakeAds {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        if self.down.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(Status::unavailable("restarting"));
        }
        let stream = self.streams.fetch_add(1, Ordering::SeqCst) + 1;
        let mut inbound = request.into_inner();
        let mut snapshot = self.snapshot.subscribe();
        let mut kick = self.kick.subscribe();
        kick.mark_unchanged();
        let requests = self.requests.clone();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            // State of the world: a new stream gets the current snapshot at once.
            snapshot.mark_changed();
            loop {
                tokio::select! {
                    r = inbound.message() => match r {
                        Ok(Some(req)) => {
                            let _ = requests.send((stream, req));
                        }
                        _ => break,
                    },
                    changed = snapshot.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let current = snapshot.borrow_and_update().clone();
                        if let Some((version, resources)) = current {
                            let response = DiscoveryResponse {
                                nonce: nonce(stream, &version),
                                version_info: version,
                                resources,
                                type_url: TYPE_URL.into(),
                                ..Default::default()
                            };
                            if tx.send(Ok(response)).await.is_err() {
                                break;
                            }
                        }
                    }
                    _ = kick.changed() => {
                        let (_, with_error) = *kick.borrow_and_update();
                        if with_error {
                            let _ = tx.send(Err(Status::unavailable("management server restarting"))).await;
                        }
                        break;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}
