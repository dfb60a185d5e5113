//! Starts the listeners and the runtimes, and stops them in order.
//!
//! Layout, chosen for speed: `workers` threads, each a tokio current-thread runtime polling its
//! own handle to one shared gRPC listening socket (an idle worker accepts the next connection),
//! with its share of the shard actors in its `LocalSet`: a call whose key lives on its own
//! worker decides synchronously, with no message. A do-nothing tonic service costs about 9 µs of
//! CPU per call on a current-thread runtime against 21 µs on the multi-thread one, so nothing
//! here uses work stealing. The HTTP admin endpoints, the debug and Prometheus ports, and the
//! config and certificate watchers run on one more small thread of their own.
//!
//! gRPC is served on TCP or, with `GRPC_UDS`, a unix socket; either may be wrapped in TLS
//! (`tls`). Every `ShouldRateLimit` call goes through `layer`: its span and its latency.

mod debug;
mod layer;
mod tls;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::{watch, Barrier};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::StreamExt;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::admin::{self, AdminState};
use crate::config::settings::Settings;
use crate::config::watch::{self as config_watch, poll, Reloader, Watched};
use crate::config::{Config, ConfigError};
use crate::limiter::{Clock, Engine};
use crate::service::grpc::RlsService;
use crate::service::{AnswerSettings, RateLimiter};
use crate::telemetry::Metrics;

/// The encoded descriptors of the Envoy rate-limit protos, for server reflection.
const RLS_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/rls_descriptor.bin"));

/// Names the health service answers for.
const HEALTH_NAMES: [&str; 2] = ["", "ratelimit"];

/// A running server.
pub struct Running {
    /// The TCP address gRPC listens on; unspecified (`0.0.0.0:0`) when serving on `grpc_uds`.
    pub grpc_addr: SocketAddr,
    /// `GRPC_UDS`: the unix socket gRPC listens on instead of TCP.
    pub grpc_uds: Option<PathBuf>,
    pub http_addr: SocketAddr,
    /// None when the port could not be bound (logged; the service runs without it).
    pub debug_addr: Option<SocketAddr>,
    /// None when `USE_PROMETHEUS=false` or the port could not be bound.
    pub prometheus_addr: Option<SocketAddr>,
    /// The RESP THROTTLE transport's address, when `TURNSTILE_RESP_ADDR` is set.
    pub resp_addr: Option<SocketAddr>,
    pub limiter: RateLimiter,
    reloader: Arc<Reloader>,
    /// Limits come over xDS: the config location is not read.
    xds: bool,
    tls: Option<Arc<tls::TlsState>>,
    serving: Arc<AtomicBool>,
    health: HealthReporter,
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
    grace: Duration,
    admit_waiters: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen on unix socket {path}: {source}")]
    BindUnix {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{0}")]
    Redis(String),
    #[error("TLS: {0}")]
    Tls(String),
}

/// What one worker accepts gRPC connections from.
enum GrpcListener {
    Tcp(StdListener),
    Unix(StdUnixListener),
}

/// Starts serving `config` as `settings` say, with `clock` as the time source.
pub async fn start(
    settings: &Settings,
    config: Config,
    clock: Clock,
) -> Result<Running, StartError> {
    // Taken first, before anything is read: a change made from here on is a change to reload.
    let config_watched = Watched::Config {
        path: settings.config_path.clone(),
        root: Some(settings.runtime_root.clone())
            .filter(|r| settings.watch_root && settings.config_path.starts_with(r)),
        include_dotfiles: settings.load.include_dotfiles,
    };
    let config_baseline = config_watch::fingerprint(&config_watched);
    let tls_watched = settings.tls.as_ref().map(|t| {
        let w = tls::watched(t);
        (config_watch::fingerprint(&w), w)
    });

    let workers = settings.workers.max(1);
    let (grpc_listeners, grpc_addr) = match &settings.grpc_uds {
        Some(path) => (
            bind_uds(path, workers)?
                .into_iter()
                .map(GrpcListener::Unix)
                .collect::<Vec<_>>(),
            SocketAddr::from(([0, 0, 0, 0], 0)),
        ),
        None => {
            let l = bind_shared(settings.grpc_addr, workers)?;
            let addr = l[0].local_addr().map_err(|source| StartError::Bind {
                addr: settings.grpc_addr,
                source,
            })?;
            (l.into_iter().map(GrpcListener::Tcp).collect(), addr)
        }
    };
    let resp_listener = match &settings.resp {
        Some(r) => Some(r.bind().map_err(|source| StartError::Bind {
            addr: r.addr,
            source,
        })?),
        None => None,
    };
    let resp_addr = resp_listener.as_ref().and_then(|l| l.local_addr().ok());
    let http_listener = bind_shared(settings.http_addr, 1)?.remove(0);
    let http_addr = http_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            addr: settings.http_addr,
            source,
        })?;

    // The debug and Prometheus ports are not needed to answer Envoy: a port already taken is
    // logged and the service runs without it, as envoyproxy/ratelimit does with its debug port.
    let debug_listener = settings.debug_addr.and_then(|a| bind_optional(a, "debug"));
    let prometheus_listener = settings
        .prometheus
        .as_ref()
        .and_then(|p| bind_optional(p.addr, "Prometheus"));
    let local = |l: &Option<StdListener>| l.as_ref().and_then(|l| l.local_addr().ok());
    let debug_addr = local(&debug_listener);
    let prometheus_addr = local(&prometheus_listener);

    let redis = match &settings.redis {
        None => None,
        Some(r) => {
            let store = crate::backend::redis::RedisStore::connect(r)
                .await
                .map_err(StartError::Redis)?;
            let store: Arc<dyn crate::limiter::Store> = Arc::new(store);
            Some((store, r.policy.clone()))
        }
    };
    let (engine, shard_tasks) = Engine::with_backend(
        settings.shards,
        settings.shard_queue_capacity,
        settings.max_waiters,
        clock,
        redis,
        settings.max_keys,
    );
    let metrics = Arc::new(
        Metrics::new(settings.near_limit_ratio)
            .with_max_detailed_series(settings.max_detailed_series),
    );
    let _ = metrics.shards.set(engine.stats().to_vec());
    metrics.config_loaded();
    let tls = match &settings.tls {
        None => None,
        Some(t) => Some(Arc::new(
            tls::TlsState::new(t.clone(), metrics.clone()).map_err(StartError::Tls)?,
        )),
    };
    let live = Arc::new(ArcSwap::from_pointee(config));
    let reloader = Arc::new(Reloader::new(
        settings.config_path.clone(),
        settings.load,
        live.clone(),
        metrics.clone(),
    ));
    let limiter = RateLimiter::new(
        live,
        engine,
        AnswerSettings {
            response_headers: settings.response_headers.clone(),
            global_shadow_mode: settings.global_shadow_mode,
            request_limits: settings.request_limits,
        },
        metrics,
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    let serving = Arc::new(AtomicBool::new(true));
    let (stop, stop_rx) = watch::channel(false);
    // Every runtime keeps its shard actors alive until every server has finished, since a call
    // on one worker may be waiting on a shard of another.
    let barrier = Arc::new(Barrier::new(workers + 1));

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(RLS_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("descriptor sets built at compile time are valid");
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(RLS_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .expect("descriptor sets built at compile time are valid");

    let mut shard_tasks: Vec<Option<_>> = shard_tasks.into_iter().map(Some).collect();
    let mut threads = Vec::with_capacity(workers + 1);
    for (w, listener) in grpc_listeners.into_iter().enumerate() {
        let mine: Vec<_> = shard_tasks
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| i % workers == w)
            .filter_map(|(_, t)| t.take())
            .collect();
        let rls = RateLimitServiceServer::new(RlsService::new(limiter.clone()))
            .max_decoding_message_size(settings.request_limits.max_message_bytes);
        let health_service = health_service.clone();
        let reflection_v1 = reflection_v1.clone();
        let reflection_v1alpha = reflection_v1alpha.clone();
        let request_layer = layer::RequestLayer {
            metrics: limiter.metrics().clone(),
        };
        let tls = tls.clone();
        let (max_age, max_age_grace) = (
            settings.grpc_max_connection_age,
            settings.grpc_max_connection_age_grace,
        );
        let mut stop_rx = stop_rx.clone();
        let barrier = barrier.clone();
        let rt = runtime()?;
        let handle = std::thread::Builder::new()
            .name(format!("turnstile-worker-{w}"))
            .spawn(move || {
                // Shard tasks stay on this thread, so calls handled here decide synchronously.
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    for t in mine {
                        tokio::task::spawn_local(t.run());
                    }
                    let shutdown = async move {
                        let _ = stop_rx.wait_for(|s| *s).await;
                    };
                    let router = tonic::transport::Server::builder()
                        .max_connection_age(max_age)
                        .max_connection_age_grace(max_age_grace)
                        .layer(request_layer)
                        .add_service(health_service)
                        .add_service(reflection_v1)
                        .add_service(reflection_v1alpha)
                        .add_service(rls);
                    let result = match (listener, tls) {
                        (GrpcListener::Tcp(l), None) => {
                            let l = tokio::net::TcpListener::from_std(l)
                                .expect("listener registers with the runtime");
                            let incoming = TcpListenerStream::new(l).map(|s| {
                                if let Ok(s) = &s {
                                    let _ = s.set_nodelay(true);
                                }
                                s
                            });
                            router
                                .serve_with_incoming_shutdown(incoming, shutdown)
                                .await
                        }
                        (GrpcListener::Tcp(l), Some(tls)) => {
                            let l = tokio::net::TcpListener::from_std(l)
                                .expect("listener registers with the runtime");
                            router
                                .serve_with_incoming_shutdown(tls::incoming(l, tls), shutdown)
                                .await
                        }
                        (GrpcListener::Unix(l), None) => {
                            let l = tokio::net::UnixListener::from_std(l)
                                .expect("listener registers with the runtime");
                            router
                                .serve_with_incoming_shutdown(UnixListenerStream::new(l), shutdown)
                                .await
                        }
                        (GrpcListener::Unix(l), Some(tls)) => {
                            let l = tokio::net::UnixListener::from_std(l)
                                .expect("listener registers with the runtime");
                            router
                                .serve_with_incoming_shutdown(tls::incoming(l, tls), shutdown)
                                .await
                        }
                    };
                    if let Err(e) = result {
                        tracing::error!(worker = w, error = %e, "gRPC server failed");
                    }
                    barrier.wait().await;
                })
            })
            .map_err(StartError::Runtime)?;
        threads.push(handle);
    }

    let admin_state = AdminState {
        limiter: limiter.clone(),
        serving: serving.clone(),
    };
    let mut aux = Vec::new();
    if let Some(l) = debug_listener {
        aux.push(("debug", l, debug::debug_router(limiter.clone())));
    }
    if let (Some(l), Some(p)) = (prometheus_listener, &settings.prometheus) {
        aux.push((
            "Prometheus",
            l,
            debug::prometheus_router(limiter.clone(), &p.path),
        ));
    }
    let interval = settings.reload_interval;
    let watch_reloader = reloader.clone();
    let watch_tls = tls.clone();
    let resp = resp_listener.zip(settings.resp.clone());
    let files_off = settings.xds.is_some();
    let xds = settings.xds.clone();
    // With xDS, health waits for the first config unless told to start without one.
    let gate_health = xds
        .as_ref()
        .is_some_and(|x| !x.healthy_before_first_config());
    if gate_health {
        // Before the xDS task can start, so its SERVING on the first config is never undone.
        serving.store(false, Ordering::Release);
        for name in HEALTH_NAMES {
            health
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    }
    let (xds_live, xds_metrics) = (limiter.config().clone(), limiter.metrics().clone());
    let (gate_serving, gate_health_reporter) = (serving.clone(), health.clone());
    let resp_limiter = limiter.clone();
    let rt = runtime()?;
    threads.push(
        std::thread::Builder::new()
            .name("turnstile-admin".into())
            .spawn(move || {
                rt.block_on(async move {
                    let mut tasks = Vec::new();
                    if let Some((l, rs)) = resp {
                        let mut stop = stop_rx.clone();
                        let l = tokio::net::TcpListener::from_std(l)
                            .expect("listener registers with the runtime");
                        tasks.push(tokio::spawn(async move {
                            let shutdown = async move {
                                let _ = stop.wait_for(|s| *s).await;
                            };
                            if let Err(e) =
                                crate::transport::resp::serve(l, resp_limiter, rs, shutdown).await
                            {
                                tracing::error!(error = %e, "RESP transport failed");
                            }
                        }));
                    }
                    if let Some(x) = xds {
                        let (ready_tx, mut ready_rx) = watch::channel(false);
                        let mut stop = stop_rx.clone();
                        tasks.push(tokio::spawn(async move {
                            let apply = move |r: Result<Config, crate::config::ConfigError>| match r
                            {
                                Ok(c) => {
                                    config_watch::carry_stats(&xds_live.load(), &c);
                                    xds_live.store(Arc::new(c));
                                    xds_metrics.config_loaded();
                                }
                                Err(_) => {
                                    xds_metrics
                                        .config_load_error
                                        .fetch_add(1, Ordering::Relaxed);
                                }
                            };
                            tokio::select! {
                                _ = crate::config::xds::run(x, apply, ready_tx) => {}
                                _ = stop.wait_for(|s| *s) => {}
                            }
                        }));
                        if gate_health {
                            let stop = stop_rx.clone();
                            tasks.push(tokio::spawn(async move {
                                if ready_rx.wait_for(|r| *r).await.is_ok() && !*stop.borrow() {
                                    gate_serving.store(true, Ordering::Release);
                                    for name in HEALTH_NAMES {
                                        gate_health_reporter
                                            .set_service_status(name, ServingStatus::Serving)
                                            .await;
                                    }
                                }
                            }));
                        }
                    }
                    for (what, listener, router) in aux {
                        tasks.push(tokio::spawn(serve_http(
                            what,
                            listener,
                            router,
                            stop_rx.clone(),
                        )));
                    }
                    if !files_off {
                        tasks.push(tokio::spawn(poll(
                            config_watched,
                            config_baseline,
                            interval,
                            move || {
                                let _ = watch_reloader.reload();
                            },
                            stop_rx.clone(),
                        )));
                    }
                    if let (Some((baseline, watched)), Some(tls)) = (tls_watched, watch_tls) {
                        tasks.push(tokio::spawn(poll(
                            watched,
                            baseline,
                            interval,
                            move || tls.reload(),
                            stop_rx.clone(),
                        )));
                    }
                    serve_http("HTTP", http_listener, admin::router(admin_state), stop_rx).await;
                    for t in tasks {
                        let _ = t.await;
                    }
                    barrier.wait().await;
                })
            })
            .map_err(StartError::Runtime)?,
    );

    let running = Running {
        grpc_addr,
        grpc_uds: settings.grpc_uds.clone(),
        http_addr,
        debug_addr,
        prometheus_addr,
        resp_addr,
        limiter,
        reloader,
        xds: settings.xds.is_some(),
        tls,
        serving,
        health,
        stop,
        threads,
        grace: settings.shutdown_grace,
        admit_waiters: settings.admit_waiters_on_shutdown,
    };
    if !gate_health {
        running.set_serving().await;
    }
    Ok(running)
}

impl Running {
    /// Loads the config location again (SIGHUP does this): valid, it goes live with the stats
    /// of its limits kept; invalid, the old config stays and the error is logged and counted.
    pub fn reload_config(&self) -> Result<(), ConfigError> {
        if self.xds {
            return Ok(());
        }
        self.reloader.reload()
    }

    /// Reads the TLS certificate files again, if gRPC uses TLS.
    pub fn reload_tls(&self) {
        if let Some(t) = &self.tls {
            t.reload();
        }
    }

    async fn set_serving(&self) {
        for name in HEALTH_NAMES {
            self.health
                .set_service_status(name, ServingStatus::Serving)
                .await;
        }
    }

    /// Graceful stop: health goes NOT_SERVING, waiters are answered, listeners stop accepting,
    /// calls in flight are answered; gives up waiting after the grace period.
    pub async fn shutdown(self) {
        self.serving.store(false, Ordering::Release);
        for name in HEALTH_NAMES {
            self.health
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        self.limiter.engine().drain(self.admit_waiters).await;
        let _ = self.stop.send(true);
        let threads = self.threads;
        let joined = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        });
        if tokio::time::timeout(self.grace, joined).await.is_err() {
            tracing::warn!(grace = ?self.grace, "calls still in flight after the grace period");
        }
        if let Some(p) = &self.grpc_uds {
            let _ = std::fs::remove_file(p);
        }
    }
}

async fn serve_http(
    what: &'static str,
    listener: StdListener,
    router: axum::Router,
    mut stop: watch::Receiver<bool>,
) {
    let listener =
        tokio::net::TcpListener::from_std(listener).expect("listener registers with the runtime");
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    // The peer address lets `/throttle` answer loopback callers only.
    let app = router.into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!(server = what, error = %e, "HTTP server failed");
    }
}

fn bind_optional(addr: SocketAddr, what: &str) -> Option<StdListener> {
    match bind_shared(addr, 1) {
        Ok(mut l) => Some(l.remove(0)),
        Err(e) => {
            tracing::error!(port = what, error = %e, "port not served");
            None
        }
    }
}

/// `GRPC_UDS`: one unix socket, `n` handles to it. A socket left behind by a previous run is
/// removed first; any other file at the path is an error.
fn bind_uds(path: &Path, n: usize) -> Result<Vec<StdUnixListener>, StartError> {
    let err = |source| StartError::BindUnix {
        path: path.to_path_buf(),
        source,
    };
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
    let first = StdUnixListener::bind(path).map_err(err)?;
    first.set_nonblocking(true).map_err(err)?;
    let mut out = Vec::with_capacity(n);
    for _ in 1..n {
        out.push(first.try_clone().map_err(err)?);
    }
    out.insert(0, first);
    Ok(out)
}

fn runtime() -> Result<tokio::runtime::Runtime, StartError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::Runtime)
}

/// One listening socket, and `n` handles to it: each worker's runtime polls its own handle and
/// whichever worker is free accepts the next connection. (Unlike `SO_REUSEPORT`, a second process
/// cannot silently bind the same port.)
fn bind_shared(addr: SocketAddr, n: usize) -> Result<Vec<StdListener>, StartError> {
    let err = |source| StartError::Bind { addr, source };
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(err)?;
    socket.set_reuse_address(true).map_err(err)?;
    if addr.is_ipv6() {
        // `::` serves IPv4 too, as HOST=:: does for envoyproxy/ratelimit.
        let _ = socket.set_only_v6(false);
    }
    socket.set_nonblocking(true).map_err(err)?;
    socket.bind(&addr.into()).map_err(err)?;
    socket.listen(1024).map_err(err)?;
    let first: StdListener = socket.into();
    let mut out = Vec::with_capacity(n);
    for _ in 1..n {
        out.push(first.try_clone().map_err(err)?);
    }
    out.insert(0, first);
    Ok(out)
}
