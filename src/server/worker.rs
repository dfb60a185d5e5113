//! One worker thread: a tokio current-thread runtime serving gRPC on its handle to the shared
//! socket, with its share of the shard actors in its `LocalSet`, so a call whose key lives here
//! decides synchronously.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{watch, Barrier};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::StreamExt;
use tonic::service::Routes;
use tonic::transport::server::Router;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_reflection::server as reflection;
use tower_layer::{Identity, Stack};

use super::doors::Doors;
use super::doors::{serve_resp, RespShared};
use super::draining::{drain_end, serve_http};
use super::linger::{Linger, LingeringListener};
use super::listeners::GrpcListener;
use super::tls::{self, TlsState};
use super::Context;
use super::{runtime, StartError};
use crate::limiter::ShardTask;
use crate::service::metrics::DoorCalls;
use crate::settings::Settings;
use crate::transport::grpc::{CallLayer, RlsAnswerer, RlsService, ShouldRateLimit};
use crate::transport::http::HttpBounds;

/// The encoded descriptors of the Envoy rate-limit and rate-limit-quota protos, for server
/// reflection.
const RLS_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/rls_descriptor.bin"));

/// What every worker serves, the same way.
pub(super) struct Grpc<H> {
    /// Who answers `ShouldRateLimit`.
    pub(super) rls: RlsAnswerer,
    /// The doors' gRPC services beside it (`Doors::grpc`).
    pub(super) routes: Routes,
    /// Every door's calls, counted by the per-call layer.
    pub(super) calls: Arc<DoorCalls>,
    pub(super) health: HealthServer<H>,
    pub(super) max_message_bytes: usize,
    pub(super) max_age: Duration,
    pub(super) max_age_grace: Duration,
    pub(super) tls: Option<Arc<TlsState>>,
    /// How long a closing connection waits for its peer to close (`Linger`).
    pub(super) linger: Duration,
}

impl<H> Grpc<H> {
    /// The services from the context's parts and the doors'.
    pub(super) fn new(
        settings: &Settings,
        cx: &Context,
        doors: &Doors,
        health: HealthServer<H>,
        tls: Option<Arc<TlsState>>,
    ) -> Grpc<H> {
        Grpc {
            rls: doors.rls.answerer.clone(),
            routes: doors.grpc.clone(),
            calls: cx.stats.calls.clone(),
            health,
            max_message_bytes: settings.request_limits.max_message_bytes,
            max_age: settings.grpc_max_connection_age,
            max_age_grace: settings.grpc_max_connection_age_grace,
            tls,
            linger: settings.shutdown_grace,
        }
    }
}

/// How a worker stops: when `stop` turns true its server drains, then it waits at `barrier`
/// for every other server, since a call on one worker may be waiting on a shard of another.
#[derive(Clone)]
pub(super) struct Stopping {
    pub(super) stop: watch::Receiver<bool>,
    pub(super) barrier: Arc<Barrier>,
    /// Past `barrier` every call is answered; the shards live on until the durable counters'
    /// last save (on the journal's thread, when there is one) has passed this one too.
    pub(super) saved: Arc<Barrier>,
    /// gRPC servers still draining: each worker counts itself out when its server has ended;
    /// the HTTP port keeps answering (health 500) until none is left or the grace ends.
    pub(super) grpc_draining: Arc<watch::Sender<usize>>,
}

impl Stopping {
    /// For `workers` gRPC workers, the side thread and, with `journal`, the journal's thread
    /// (the side thread has no shard and no save to wait for at `saved`).
    pub(super) fn new(stop: watch::Receiver<bool>, workers: usize, journal: bool) -> Stopping {
        let journal = usize::from(journal);
        Stopping {
            stop,
            barrier: Arc::new(Barrier::new(workers + 1 + journal)),
            saved: Arc::new(Barrier::new(workers + journal)),
            grpc_draining: Arc::new(watch::Sender::new(workers)),
        }
    }
}

/// The gRPC services every worker serves: the rate-limit service (called by the per-call layer
/// itself, past the router), the doors' services beside it (`Doors::grpc`), health, reflection
/// (v1 and v1alpha, for grpcurl).
fn router<H: Health>(grpc: &Grpc<H>) -> Router<Stack<CallLayer<ShouldRateLimit>, Identity>> {
    let (reflection_v1, reflection_v1alpha) = reflection_services();
    tonic::transport::Server::builder()
        .max_connection_age(grpc.max_age)
        .max_connection_age_grace(grpc.max_age_grace)
        .layer(CallLayer {
            rls: ShouldRateLimit::new(RlsService::new(grpc.rls.clone()), grpc.max_message_bytes),
            rls_door: grpc.rls.door(),
            calls: grpc.calls.clone(),
        })
        .add_routes(grpc.routes.clone())
        .add_service(grpc.health.clone())
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
}

/// gRPC reflection, v1 and v1alpha, for grpcurl: the rate-limit services' descriptors and
/// health's. Served by the workers, and by the gRPC port while the start waits.
pub(super) fn reflection_services() -> (
    reflection::v1::ServerReflectionServer<impl reflection::v1::ServerReflection>,
    reflection::v1alpha::ServerReflectionServer<impl reflection::v1alpha::ServerReflection>,
) {
    let with_sets = |b: reflection::Builder<'static>| {
        b.register_encoded_file_descriptor_set(RLS_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let valid = "descriptor sets built at compile time are valid";
    (
        with_sets(reflection::Builder::configure())
            .build_v1()
            .expect(valid),
        (with_sets(reflection::Builder::configure()).build_v1alpha()).expect(valid),
    )
}

/// Starts every worker on its own thread, one per listener: shard `i` goes to worker
/// `i % workers`.
pub(super) fn spawn_all<H: Health>(
    listeners: Vec<GrpcListener>,
    shards: Vec<ShardTask>,
    grpc: &Grpc<H>,
    resp: Option<RespSocket>,
    http: Option<HttpSocket>,
    stopping: &impl Fn() -> Stopping,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    let workers = listeners.len();
    let mut dealt: Vec<Vec<ShardTask>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, t) in shards.into_iter().enumerate() {
        dealt[i % workers].push(t);
    }
    let mut threads = Vec::with_capacity(workers + 1);
    for (w, (listener, mine)) in listeners.into_iter().zip(dealt).enumerate() {
        // Every worker accepts RESP connections from the one socket.
        let resp = match &resp {
            Some((l, shared)) => {
                Some((l.try_clone().map_err(StartError::Runtime)?, shared.clone()))
            }
            None => None,
        };
        // And HTTP connections from the main HTTP socket, so `POST /throttle` decides in place.
        let http = match &http {
            Some(h) => Some(HttpSocket {
                listener: h.listener.try_clone().map_err(StartError::Runtime)?,
                router: h.router.clone(),
                grace: h.grace,
                bounds: h.bounds,
            }),
            None => None,
        };
        let served = Served { resp, http };
        threads.push(spawn(w, listener, mine, grpc, served, stopping())?);
    }
    Ok(threads)
}

/// The RESP socket and the transport's state, shared by every worker.
pub(super) type RespSocket = (std::net::TcpListener, Arc<RespShared>);
/// The main HTTP socket and what every worker serves on it.
pub(super) struct HttpSocket {
    pub(super) listener: std::net::TcpListener,
    pub(super) router: axum::Router,
    /// The longest it keeps answering after the stop while gRPC drains.
    pub(super) grace: Duration,
    pub(super) bounds: HttpBounds,
}

/// What a worker serves besides gRPC: its handles on the RESP and the main HTTP sockets.
struct Served {
    resp: Option<RespSocket>,
    http: Option<HttpSocket>,
}

impl Served {
    /// Starts serving on the current runtime; the handles end after the stop.
    fn start(self, w: usize, stopping: &Stopping) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Some((l, shared)) = self.resp {
            let mut stop = stopping.stop.clone();
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            tasks.push(tokio::spawn(async move {
                if let Err(e) = serve_resp(tcp(l), shared, shutdown).await {
                    tracing::error!(worker = w, error = %e, "RESP transport failed");
                }
            }));
        }
        if let Some(h) = self.http {
            let end = drain_end(stopping.stop.clone(), &stopping.grpc_draining, h.grace);
            let served = serve_http("HTTP", h.listener, h.router, h.bounds, end);
            tasks.push(tokio::spawn(served));
        }
        tasks
    }
}

/// Starts worker `w` on its own thread.
fn spawn<H: Health>(
    w: usize,
    listener: GrpcListener,
    shards: Vec<ShardTask>,
    grpc: &Grpc<H>,
    served: Served,
    mut stopping: Stopping,
) -> Result<JoinHandle<()>, StartError> {
    let router = router(grpc);
    let tls = grpc.tls.clone();
    let linger = grpc.linger;
    let rt = runtime()?;
    std::thread::Builder::new()
        .name(format!("turnstile-worker-{w}"))
        .spawn(move || {
            // Shard tasks stay on this thread, so calls handled here decide synchronously.
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                for t in shards {
                    tokio::task::spawn_local(t.run());
                }
                let served = served.start(w, &stopping);
                let shutdown = async move {
                    let _ = stopping.stop.wait_for(|s| *s).await;
                };
                let result = match (listener, tls) {
                    (GrpcListener::Tcp(l), None) => {
                        let incoming = TcpListenerStream::new(tcp(l)).map(|s| {
                            let s = s?;
                            let _ = s.set_nodelay(true);
                            Ok::<_, std::io::Error>(Linger::new(s, linger))
                        });
                        router
                            .serve_with_incoming_shutdown(incoming, shutdown)
                            .await
                    }
                    (GrpcListener::Tcp(l), Some(t)) => {
                        let l = LingeringListener {
                            inner: tcp(l),
                            grace: linger,
                        };
                        let incoming = tls::incoming(l, t);
                        router
                            .serve_with_incoming_shutdown(incoming, shutdown)
                            .await
                    }
                    (GrpcListener::Unix(l), None) => {
                        let incoming = UnixListenerStream::new(unix(l))
                            .map(|s| s.map(|s| Linger::new(s, linger)));
                        router
                            .serve_with_incoming_shutdown(incoming, shutdown)
                            .await
                    }
                    (GrpcListener::Unix(l), Some(t)) => {
                        let l = LingeringListener {
                            inner: unix(l),
                            grace: linger,
                        };
                        let incoming = tls::incoming(l, t);
                        router
                            .serve_with_incoming_shutdown(incoming, shutdown)
                            .await
                    }
                };
                if let Err(e) = result {
                    tracing::error!(worker = w, error = %e, "gRPC server failed");
                }
                (stopping.grpc_draining).send_modify(|n| *n = n.saturating_sub(1));
                // HTTP answers until every gRPC server has drained, this one's included.
                for t in served {
                    let _ = t.await;
                }
                stopping.barrier.wait().await;
                stopping.saved.wait().await;
            })
        })
        .map_err(StartError::Runtime)
}

fn tcp(l: std::net::TcpListener) -> tokio::net::TcpListener {
    tokio::net::TcpListener::from_std(l).expect("listener registers with the runtime")
}

fn unix(l: std::os::unix::net::UnixListener) -> tokio::net::UnixListener {
    tokio::net::UnixListener::from_std(l).expect("listener registers with the runtime")
}
