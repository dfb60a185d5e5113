//! Starts the listeners and the runtimes, and stops them in order.
//!
//! Layout, chosen for speed: `workers` threads, each a tokio current-thread runtime with its own
//! `SO_REUSEPORT` gRPC listener (the kernel spreads connections over them) and its share of the
//! shard actors. A do-nothing tonic service costs about 9 µs of CPU per call on a current-thread
//! runtime against 21 µs on the multi-thread one, so nothing here uses work stealing. The HTTP
//! admin endpoints run on one more small thread of their own.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::{watch, Barrier};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::admin::{self, AdminState};
use crate::config::settings::Settings;
use crate::config::Config;
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
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub limiter: RateLimiter,
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
    #[error("cannot start runtime: {0}")]
    Runtime(std::io::Error),
}

/// Starts serving `config` as `settings` say, with `clock` as the time source.
pub async fn start(
    settings: &Settings,
    config: Config,
    clock: Clock,
) -> Result<Running, StartError> {
    let workers = settings.workers.max(1);
    let grpc_listeners = bind_shared(settings.grpc_addr, workers)?;
    let grpc_addr = grpc_listeners[0]
        .local_addr()
        .map_err(|source| StartError::Bind {
            addr: settings.grpc_addr,
            source,
        })?;
    let http_listener = bind_shared(settings.http_addr, 1)?.remove(0);
    let http_addr = http_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            addr: settings.http_addr,
            source,
        })?;

    let metrics = Arc::new(Metrics::new(settings.near_limit_ratio));
    metrics.config_load_success.fetch_add(1, Ordering::Relaxed);
    let (engine, shard_tasks) = Engine::new(
        settings.shards,
        settings.shard_queue_capacity,
        settings.max_waiters,
        clock,
    );
    let limiter = RateLimiter::new(
        Arc::new(ArcSwap::from_pointee(config)),
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
        let mut stop_rx = stop_rx.clone();
        let barrier = barrier.clone();
        let rt = runtime()?;
        let handle = std::thread::Builder::new()
            .name(format!("turnstile-worker-{w}"))
            .spawn(move || {
                rt.block_on(async move {
                    for t in mine {
                        tokio::spawn(t.run());
                    }
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("listener registers with the runtime");
                    let incoming = TcpListenerStream::new(listener).map(|s| {
                        if let Ok(s) = &s {
                            let _ = s.set_nodelay(true);
                        }
                        s
                    });
                    let shutdown = async move {
                        let _ = stop_rx.wait_for(|s| *s).await;
                    };
                    let result = tonic::transport::Server::builder()
                        .add_service(health_service)
                        .add_service(reflection_v1)
                        .add_service(reflection_v1alpha)
                        .add_service(rls)
                        .serve_with_incoming_shutdown(incoming, shutdown)
                        .await;
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
    let mut stop_rx = stop_rx.clone();
    let rt = runtime()?;
    threads.push(
        std::thread::Builder::new()
            .name("turnstile-admin".into())
            .spawn(move || {
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(http_listener)
                        .expect("listener registers with the runtime");
                    let shutdown = async move {
                        let _ = stop_rx.wait_for(|s| *s).await;
                    };
                    if let Err(e) = axum::serve(listener, admin::router(admin_state))
                        .with_graceful_shutdown(shutdown)
                        .await
                    {
                        tracing::error!(error = %e, "HTTP server failed");
                    }
                    barrier.wait().await;
                })
            })
            .map_err(StartError::Runtime)?,
    );

    let running = Running {
        grpc_addr,
        http_addr,
        limiter,
        serving,
        health,
        stop,
        threads,
        grace: settings.shutdown_grace,
        admit_waiters: settings.admit_waiters_on_shutdown,
    };
    running.set_serving().await;
    Ok(running)
}

impl Running {
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
    }
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
