//! Starts the listeners and the runtimes, and stops them in order. The doors are built from
//! the settings in one place (`doors`); the rest of this module names none.
//!
//! Layout, chosen for speed: `workers` threads, each a tokio current-thread runtime polling its
//! own handle to one shared gRPC listening socket (an idle worker accepts the next connection),
//! with its share of the shard actors in its `LocalSet` (`worker`): a call whose key lives on its
//! own worker decides synchronously, with no message; nothing here uses work stealing
//! (BENCHMARKS.md measures why). Every worker also accepts RESP and HTTP connections (a clone of
//! the one RESP socket and of the HTTP socket each), so a `THROTTLE` or a `POST /throttle` whose
//! key lives on its worker decides in place too. The debug, Prometheus and admin ports, xDS and
//! the pollers run on the side thread (`side_thread`); the durable counters' journal on another
//! (`journal`). Sockets are bound first (`listeners`); a door's files are read again through
//! one path (`reload`); `run` is what the binary calls.

mod context;
mod doors;
mod draining;
mod http_conn;
mod journal;
mod linger;
mod listeners;
mod overlay;
mod reload;
mod run;
mod side_thread;
mod tls;
mod waiting;
mod worker;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::watch;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

pub use context::{Context, Stats};
pub use reload::log_gocc_warnings;
pub use run::{run, serve_until_terminated, terminated};

use crate::config::{Config, ConfigError};
use crate::limiter::Clock;
use crate::settings::{Settings, Storage};
use crate::source::files::{fingerprint, Watched};
use crate::telemetry::mapped::Exposition;
use crate::telemetry::{Registry, Shown};
use crate::transport::http::{self, MetricsState};
use crate::transport::waiting::StartWait;
use context::Starting;
use doors::RespShared;
use doors::{first_source, Doors};
pub use doors::{DoorFiles, DoorStats};
use listeners::{HttpPorts, Listeners};
pub use overlay::LoadedOverlay;
use side_thread::{Polled, Polls, SidePort, SideThread};
use waiting::Waiting;
use worker::{Grpc, Stopping};

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
    /// The admin listener's address, when `TURNSTILE_ADMIN_ADDR` is set.
    pub admin_addr: Option<SocketAddr>,
    /// What the server was built from, for callers that drive a part of it (tests, embedders).
    pub context: Context,
    /// What the doors beside the RLS door count in (registered with the context's).
    pub door_stats: DoorStats,
    /// The files the doors follow, read again by `reload_config` (SIGHUP); none over xDS.
    followed: Vec<reload::Followed>,
    tls: Option<Arc<tls::TlsState>>,
    health: Health,
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
    grace: Duration,
    admit_waiters: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `port` names the port and the settings that chose it.
    #[error("cannot listen on {addr}, {port}: {source}")]
    Bind {
        addr: SocketAddr,
        port: &'static str,
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
    /// The state dir (`TURNSTILE_STATE_DIR`) cannot be used.
    #[error("{0}")]
    State(String),
    /// The xDS overlay (`TURNSTILE_XDS_OVERLAY`) does not load.
    #[error("xDS overlay: {0}")]
    Overlay(ConfigError),
}

/// What health reports, over gRPC (both names) and `/healthcheck` alike.
#[derive(Clone)]
struct Health {
    reporter: HealthReporter,
    serving: Arc<AtomicBool>,
}

impl Health {
    /// Health, and the gRPC service that reports it. With xDS, health waits for the first
    /// config unless told to start without one (the third value says so); it is set before the
    /// xDS client starts, so its SERVING on the first config is never undone. With files and
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, it is SERVING while the live config has a
    /// domain (`domains` now; reloads keep it so, see `admin`).
    async fn start(
        settings: &Settings,
        domains: usize,
    ) -> (
        Health,
        HealthServer<impl tonic_health::pb::health_server::Health>,
        bool,
    ) {
        let (reporter, service) = tonic_health::server::health_reporter();
        let health = Health {
            reporter,
            serving: Arc::new(AtomicBool::new(true)),
        };
        let gated = (settings.xds.as_ref()).is_some_and(|x| !x.healthy_before_first_config());
        let files_gated = settings.xds.is_none() && settings.healthy_only_with_config;
        let waiting = gated || (files_gated && domains == 0);
        health.set(!waiting).await;
        (health, service, gated)
    }

    async fn set(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in HEALTH_NAMES {
            self.reporter.set_service_status(name, status).await;
        }
    }
}

/// The config to serve first, and the fingerprint of its files taken before they were read
/// (when it came from them), so a change made while the server starts is reloaded.
#[derive(Debug)]
pub struct FirstConfig {
    pub config: Config,
    pub baseline: Option<u64>,
    /// What a door reads at start besides the config (`limitador-server`'s files).
    pub files: Option<DoorFiles>,
    /// Over xDS, the overlay (`TURNSTILE_XDS_OVERLAY`) read with its fingerprint; read at the
    /// start when none is given.
    pub overlay: Option<LoadedOverlay>,
}

/// A config given as it is (an embedder's, a test's): the files are fingerprinted at the start.
impl From<Config> for FirstConfig {
    fn from(config: Config) -> FirstConfig {
        FirstConfig {
            config,
            baseline: None,
            files: None,
            overlay: None,
        }
    }
}

/// The first config from where `settings` say: the config location, fingerprinted before it is
/// read; over xDS none (the limits arrive as its first update; the location is not read, as
/// Envoy Gateway points `RUNTIME_ROOT` at a directory that may be empty), but the overlay
/// their limits take, which must load.
pub fn first_config(settings: &Settings) -> Result<FirstConfig, ConfigError> {
    if let Some((files, baseline)) = doors::first_files(settings)? {
        return Ok(FirstConfig {
            baseline: Some(baseline),
            files: Some(files),
            ..Config::default().into()
        });
    }
    if let Some(x) = &settings.xds {
        let overlay = x.overlay.as_deref().map(overlay::load).transpose()?;
        return Ok(FirstConfig {
            overlay,
            ..Config::default().into()
        });
    }
    let baseline = fingerprint(&watched_config(settings));
    let sources = settings.sources();
    if sources.found_nothing() {
        tracing::warn!(
            looked = %sources.path.display(),
            "{}: serving NO limits, every request is answered OK (name the config with \
             --config or RUNTIME_ROOT)",
            sources.nothing_found_message()
        );
    }
    let config = sources.load()?;
    log_gocc_warnings(&config);
    Ok(FirstConfig {
        config,
        baseline: Some(baseline),
        files: None,
        overlay: None,
    })
}

/// Starts serving `first` as `settings` say, with `clock` as the time source.
pub async fn start(
    settings: &Settings,
    first: impl Into<FirstConfig>,
    clock: Clock,
) -> Result<Running, StartError> {
    start_telling(settings, first, clock, &StartWait::default()).await
}

/// As [`start`], telling `wait` what the start waits for meanwhile. Until it is done the bound
/// ports answer at once (`waiting`); dropped, it stops them.
async fn start_telling(
    settings: &Settings,
    first: impl Into<FirstConfig>,
    clock: Clock,
    wait: &StartWait,
) -> Result<Running, StartError> {
    let FirstConfig {
        config,
        baseline,
        files,
        overlay,
    } = first.into();
    let overlay = first_overlay(settings, overlay)?;
    let polled = Polled::now(settings, baseline);
    let mut listeners = Listeners::bind(settings)?;
    let bound = listeners.optional_addrs();
    let door_stats = DoorStats::default();
    let starting = Starting::new(wait.clone(), door_stats.metrics());
    let tls = tls_state(settings, &starting)?;
    let waiting = answer_while_waiting(settings, &listeners, &starting, &tls).await?;
    let built = Context::build(settings, config, clock, starting, first_source(settings)).await?;
    if let Some(w) = waiting {
        w.hand_over();
    }
    let cx = built.cx;
    let domains = cx.live.load_full().config.domains.len();
    let (health, health_service, gate_health) = Health::start(settings, domains).await;
    let (stop, stop_rx) = watch::channel(false);
    let given = doors::Given {
        stats: door_stats.clone(),
        overlay,
        health: &health,
        files,
        baseline: polled.config,
        redis: built.redis,
        stop: stop_rx.clone(),
    };
    let doors = Doors::build(settings, &cx, given);
    // Every runtime keeps its shard actors alive until every server has finished, since a call
    // on one worker may be waiting on a shard of another.
    let stopping = Stopping::new(stop_rx, settings.workers.max(1), built.journal.is_some());
    let stopping = || stopping.clone();
    let grpc = Grpc::new(settings, &cx, &doors, health_service, tls.clone());
    let resp = resp_socket(listeners.resp.take(), &doors);
    let http_addr = listeners.http_addr(settings)?;
    // The main HTTP port is served by the workers, the others by the side thread.
    let http = http_servers(settings, &cx, &doors, listeners.side_ports());
    let served = Some(main_http(listeners.http, &doors, settings));
    let shards = built.shard_tasks;
    let mut threads = worker::spawn_all(listeners.grpc, shards, &grpc, resp, served, &stopping)?;
    let polls = Polls::of(&doors.rls, polled.tls, &tls);
    let mut side = SideThread::new(settings, &cx, http, &health, gate_health, polls);
    side.overlays = doors.rls.overlays.clone();
    threads.push(side_thread::spawn(side, stopping())?);
    if let Some(j) = built.journal {
        threads.push(journal::spawn(j, cx.engine.clone(), stopping())?);
    }
    Ok(Running {
        grpc_addr: listeners.grpc_addr,
        grpc_uds: settings.grpc_uds.clone(),
        http_addr,
        debug_addr: bound.debug,
        prometheus_addr: bound.prometheus,
        resp_addr: bound.resp,
        admin_addr: bound.admin,
        context: cx,
        door_stats,
        followed: doors.rls.followed,
        tls,
        health,
        stop,
        threads,
        grace: settings.shutdown_grace,
        admit_waiters: settings.admit_waiters_on_shutdown,
    })
}

/// The overlay the start was given, or else the one `TURNSTILE_XDS_OVERLAY` names, read now.
fn first_overlay(
    settings: &Settings,
    given: Option<LoadedOverlay>,
) -> Result<Option<LoadedOverlay>, StartError> {
    match (
        given,
        settings.xds.as_ref().and_then(|x| x.overlay.as_ref()),
    ) {
        (None, Some(path)) => Ok(Some(overlay::load(path).map_err(StartError::Overlay)?)),
        (given, _) => Ok(given),
    }
}

type TlsShared = Option<Arc<tls::TlsState>>;

/// Only Redis and the durable counters make a start wait: meanwhile the bound ports answer at
/// once, saying what the start waits for.
async fn answer_while_waiting(
    settings: &Settings,
    listeners: &Listeners,
    starting: &Starting,
    tls: &TlsShared,
) -> Result<Option<Waiting>, StartError> {
    match settings.storage {
        Storage::Redis(_) | Storage::Durable(_) => {
            let stats = Registry::new(vec![starting.retries.clone()]);
            let wait = &starting.wait;
            let w = Waiting::serve(listeners, wait, stats, settings, tls.clone()).await;
            Ok(Some(w.map_err(StartError::Runtime)?))
        }
        Storage::Memory => Ok(None),
    }
}

fn tls_state(settings: &Settings, starting: &Starting) -> Result<TlsShared, StartError> {
    (settings.tls.clone())
        .map(|t| tls::TlsState::new(t, starting.tls.clone()).map(Arc::new))
        .transpose()
        .map_err(StartError::Tls)
}

/// The config location as the poller watches it.
fn watched_config(settings: &Settings) -> Watched {
    Watched::Config {
        path: settings.config_path.clone(),
        root: Some(settings.runtime_root.clone())
            .filter(|r| settings.watch_root && settings.config_path.starts_with(r)),
        include_dotfiles: settings.load.include_dotfiles,
        extra: settings.sources().extra_files(),
    }
}

/// What `/metrics` and `/rlconfig` read on a port showing client values as `shown`.
fn metrics_state(cx: &Context, doors: &Doors, shown: Shown) -> MetricsState {
    MetricsState {
        registry: cx.registry.clone(),
        live: cx.live.clone(),
        described: doors.rls.described.clone(),
        shown,
    }
}

/// The RESP socket and the service it serves, when the port is on; every worker accepts from
/// the socket.
fn resp_socket(
    listener: Option<StdListener>,
    doors: &Doors,
) -> Option<(StdListener, Arc<RespShared>)> {
    let (l, shared) = listener.zip(doors.resp.clone())?;
    if let Ok(addr) = l.local_addr() {
        tracing::info!(%addr, "RESP transport listening");
    }
    Some((l, shared))
}

/// The main HTTP port, served by every worker: the door's router.
fn main_http(listener: StdListener, doors: &Doors, settings: &Settings) -> worker::HttpSocket {
    worker::HttpSocket {
        listener,
        router: doors.rls.http.clone(),
        grace: settings.shutdown_grace,
        bounds: settings.http_bounds,
    }
}

/// The debug, Prometheus and admin ports that are bound, each with its router (the main HTTP
/// port's is the door's, `Doors::http`).
fn http_servers(
    settings: &Settings,
    cx: &Context,
    doors: &Doors,
    ports: HttpPorts,
) -> Vec<SidePort> {
    let show_clear = settings.client_values.show_clear;
    let shown = |l: &StdListener| match l.local_addr() {
        Ok(a) => Shown::for_listener(a, show_clear),
        Err(_) if show_clear => Shown::Clear,
        Err(_) => Shown::Digest,
    };
    let metrics = settings.metrics;
    let mut out = Vec::new();
    if let Some(l) = ports.debug {
        let state = http::DebugState {
            metrics: metrics_state(cx, doors, shown(&l)),
            status: cx.stats.status(),
            top: cx.top.clone(),
            clock: cx.engine.clock().clone(),
            storage: settings.storage.name(),
            shown: shown(&l),
        };
        let router = http::debug_router(state, metrics);
        out.push(SidePort::new("debug", l, router));
    }
    if let (Some(l), Some(p)) = (ports.prometheus, &settings.prometheus) {
        let now = std::time::Instant::now();
        let exposition = Exposition::new(p.mapper.clone(), cx.registry.clone(), now);
        let router = http::prometheus_router(exposition, &p.path);
        out.push(SidePort::new("Prometheus", l, router));
    }
    if let (Some(l), Some(a)) = (ports.admin, &settings.admin) {
        let state = http::AdminState {
            envoy: cx.envoy.clone(),
            token: a.token.clone(),
            stats: cx.stats.admin.clone(),
            live: cx.live.clone(),
            top: cx.top.clone(),
            clock: cx.engine.clock().clone(),
        };
        out.push(SidePort::new("admin", l, http::admin_router(state)));
    }
    out
}

impl Running {
    /// Reads every file the doors follow again (SIGHUP does this): valid, each goes live with
    /// the stats of its limits kept; invalid, what is live stays and the error is logged and
    /// counted. The first error is returned, after every file was tried.
    pub fn reload_config(&self) -> Result<(), ConfigError> {
        let mut first = Ok(());
        for f in &self.followed {
            if let (Err(e), Ok(())) = (f.reload.reload(), &first) {
                first = Err(e);
            }
        }
        first
    }

    /// Reads the TLS certificate files again, if gRPC uses TLS.
    pub fn reload_tls(&self) {
        if let Some(t) = &self.tls {
            t.reload();
        }
    }

    /// Graceful stop: health goes NOT_SERVING, waiters are answered, listeners stop accepting,
    /// calls in flight are answered; gives up waiting after the grace period.
    pub async fn shutdown(self) {
        self.health.set(false).await;
        self.context.engine.drain(self.admit_waiters).await;
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

fn runtime() -> Result<tokio::runtime::Runtime, StartError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::Runtime)
}
