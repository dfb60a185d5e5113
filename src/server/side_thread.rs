//! The side thread: one small current-thread runtime for what the workers do not serve: the
//! debug, Prometheus and admin ports, the xDS client, and the config and
//! certificate pollers.

use std::net::TcpListener as StdListener;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::context::Context;
use super::doors::{first_watched, RlsDoor};
use super::draining::{drain_end, serve_http};
use super::overlay::Overlays;
use super::reload::{Followed, Install, Reload};
use super::tls::TlsState;
use super::worker::Stopping;
use super::{runtime, tls, Health, StartError, TlsShared};
use crate::hitters::TopTable;
use crate::limiter::Clock;
use crate::settings::Settings;
use crate::source::files::{fingerprint, poll, Watched};
use crate::source::in_background;
use crate::source::xds::XdsSettings;
use crate::telemetry::statsd::{self, StatsdSettings};
use crate::telemetry::{Registry, StatsdStats};
use crate::transport::http::HttpBounds;

/// What the side thread serves and watches.
pub(super) struct SideThread {
    /// The optional HTTP ports (`debug`, `Prometheus`, `admin`); the main one is the workers'.
    pub(super) http: Vec<SidePort>,
    /// With xDS: its settings, and the health to turn SERVING on the first config.
    pub(super) xds: Option<XdsClient>,
    /// With xDS: the overlay in force, for the client (its files are among `followed`).
    pub(super) overlays: Option<Overlays>,
    /// How xDS's configs go live.
    pub(super) install: Install,
    /// Every file a door follows (none over xDS), and TLS's certificates: polled alike, each
    /// from the fingerprint taken before it was read.
    pub(super) followed: Vec<Followed>,
    /// Files and `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: health follows the live config's
    /// domain count (SERVING with at least one).
    pub(super) health_by_domains: Option<DomainsHealth>,
    pub(super) interval: Duration,
    /// `USE_STATSD` or `USE_DOG_STATSD`: the push, flushed from here, off the request path,
    /// and what it reads.
    pub(super) statsd: Option<StatsdPush>,
    /// The heavy hitters, and the clock whose seconds turn their windows.
    pub(super) top: TopTick,
    /// `TURNSTILE_SHUTDOWN_GRACE_SECONDS`: the longest the HTTP ports wait for gRPC's drain.
    pub(super) grace: Duration,
    /// What every HTTP port keeps: read timeouts and the body's bound.
    pub(super) bounds: HttpBounds,
}

/// An HTTP port the side thread serves: its name in logs, its listener, its router.
pub(super) struct SidePort {
    pub(super) name: &'static str,
    pub(super) listener: StdListener,
    pub(super) router: axum::Router,
}

impl SidePort {
    pub(super) fn new(name: &'static str, listener: StdListener, router: axum::Router) -> Self {
        SidePort {
            name,
            listener,
            router,
        }
    }
}

/// The xDS client's settings, and the health it turns SERVING on the first config, if gated.
pub(super) struct XdsClient {
    settings: XdsSettings,
    gate: Option<Health>,
}

/// Health that follows the live config's domain count.
pub(super) struct DomainsHealth {
    domains: watch::Receiver<usize>,
    health: Health,
}

/// The statsd push: its settings, the registry it reads, and its own stats.
pub(super) struct StatsdPush {
    settings: StatsdSettings,
    registry: Registry,
    stats: Arc<StatsdStats>,
}

/// The heavy hitters, and the clock whose seconds turn their windows.
pub(super) struct TopTick {
    top: Arc<TopTable>,
    clock: Clock,
}

/// TLS's certificate files as the start saw them: their fingerprint (the baseline a poll
/// compares with), and the files.
pub(super) struct TlsPolled {
    baseline: u64,
    watched: Watched,
}

/// What the start saw of the files it polls, before anything else: the fingerprint of the
/// door's config files (taken before they were read, when they were), and TLS's certificate
/// files when gRPC uses TLS. A change made from then on is a change to reload.
pub(super) struct Polled {
    pub(super) config: u64,
    pub(super) tls: Option<TlsPolled>,
}

impl Polled {
    pub(super) fn now(settings: &Settings, baseline: Option<u64>) -> Polled {
        Polled {
            config: baseline.unwrap_or_else(|| fingerprint(&first_watched(settings))),
            tls: (settings.tls.as_ref().map(tls::watched)).map(|watched| TlsPolled {
                baseline: fingerprint(&watched),
                watched,
            }),
        }
    }
}

/// What the side thread polls: the files the doors follow, and TLS's certificates from what
/// the start saw of them; with files, the live config's domain count, for health.
pub(super) struct Polls<'a> {
    pub(super) followed: &'a [Followed],
    pub(super) domains: Option<watch::Receiver<usize>>,
    pub(super) tls_polled: Option<TlsPolled>,
    pub(super) tls: &'a TlsShared,
}

impl<'a> Polls<'a> {
    /// What `door` follows, and TLS's certificates as the start saw them.
    pub(super) fn of(
        door: &'a RlsDoor,
        tls_polled: Option<TlsPolled>,
        tls: &'a TlsShared,
    ) -> Polls<'a> {
        Polls {
            followed: &door.followed,
            domains: door.domains.clone(),
            tls_polled,
            tls,
        }
    }
}

/// TLS's certificate files, read again when they change.
struct TlsFiles(Arc<TlsState>);

impl Reload for TlsFiles {
    fn reload(&self) -> Result<(), crate::config::ConfigError> {
        self.0.reload();
        Ok(())
    }
}

impl SideThread {
    /// What the side thread serves and watches: the HTTP ports but the main one, xDS or the
    /// pollers, health by domains, the statsd push, the heavy hitters' tick.
    pub(super) fn new(
        settings: &Settings,
        cx: &Context,
        http: Vec<SidePort>,
        health: &Health,
        gate_health: bool,
        Polls {
            followed,
            domains,
            tls_polled,
            tls,
        }: Polls<'_>,
    ) -> SideThread {
        let mut followed = followed.to_vec();
        if let (Some(polled), Some(state)) = (tls_polled, tls.clone()) {
            let reload = Arc::new(TlsFiles(state));
            followed.push(Followed {
                watched: polled.watched,
                baseline: polled.baseline,
                reload,
            });
        }
        SideThread {
            http,
            xds: (settings.xds.clone()).map(|settings| XdsClient {
                settings,
                gate: gate_health.then(|| health.clone()),
            }),
            overlays: None,
            install: Install::new(cx.live.clone(), cx.stats.reloads.clone()),
            followed,
            health_by_domains: (domains).filter(|_| settings.healthy_only_with_config).map(
                |domains| DomainsHealth {
                    domains,
                    health: health.clone(),
                },
            ),
            interval: settings.reload_interval,
            statsd: (settings.statsd.clone()).map(|settings| StatsdPush {
                settings,
                registry: cx.registry.clone(),
                stats: cx.stats.statsd.clone(),
            }),
            top: TopTick {
                top: cx.top.clone(),
                clock: cx.engine.clock().clone(),
            },
            grace: settings.shutdown_grace,
            bounds: settings.http_bounds,
        }
    }
}

/// The TLS state, certificates read now (before any wait: a wrong file stops the start at once).
/// Starts the side thread; it ends once every server on it has drained after the stop (the
/// durable counters' journal has a thread of its own, `journal`).
pub(super) fn spawn(side: SideThread, stopping: Stopping) -> Result<JoinHandle<()>, StartError> {
    let rt = runtime()?;
    std::thread::Builder::new()
        .name("turnstile-side".into())
        .spawn(move || {
            rt.block_on(async move {
                let stop = stopping.stop;
                let mut tasks = Vec::new();
                if let Some(XdsClient { settings, gate }) = side.xds {
                    let overlays = (side.overlays.clone()).unwrap_or_default();
                    tasks.extend(run_xds(
                        settings,
                        gate,
                        overlays,
                        side.install.clone(),
                        &stop,
                    ));
                }
                let TopTick { top, clock } = side.top;
                tasks.push(tokio::spawn(tick_top(top, clock, stop.clone())));
                if let Some(StatsdPush {
                    settings,
                    registry,
                    stats,
                }) = side.statsd
                {
                    let push = push_statsd(settings, registry, stats, stop.clone());
                    tasks.push(tokio::spawn(push));
                }
                if let Some(DomainsHealth { domains, health }) = side.health_by_domains {
                    tasks.push(tokio::spawn(follow_domains(domains, health, stop.clone())));
                }
                for SidePort {
                    name,
                    listener,
                    router,
                } in side.http
                {
                    let end = drain_end(stop.clone(), &stopping.grpc_draining, side.grace);
                    let served = serve_http(name, listener, router, side.bounds, end);
                    tasks.push(tokio::spawn(served));
                }
                for f in side.followed {
                    tasks.push(tokio::spawn(follow(f, side.interval, stop.clone())));
                }
                for t in tasks {
                    let _ = t.await;
                }
                // The admin port's calls are answered too: the journal's last save may start.
                stopping.barrier.wait().await;
            })
        })
        .map_err(StartError::Runtime)
}

/// Reloads a followed file each time it changes, on the blocking pool (a file may be large, and
/// its limits are built anew).
async fn follow(f: Followed, interval: Duration, stop: watch::Receiver<bool>) {
    let reload = f.reload;
    let on_change = move || {
        let reload = reload.clone();
        async move {
            let _ = in_background(move || reload.reload()).await;
        }
    };
    poll(f.watched, f.baseline, interval, on_change, stop).await;
}

/// Moves the heavy hitters' coarse clock every second, so values are stamped and windows
/// turn over without the hot path reading the clock.
async fn tick_top(top: Arc<TopTable>, clock: Clock, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = every.tick() => top.tick(clock.now()),
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Pushes the reference's stats to statsd every flush interval, and once more at the stop.
async fn push_statsd(
    settings: StatsdSettings,
    registry: Registry,
    stats: Arc<StatsdStats>,
    stop: watch::Receiver<bool>,
) {
    let collect = move |e: &statsd::Exporter, s: &StatsdSettings| e.collect(s.format(), &registry);
    statsd::run(settings, stats, collect, stop).await;
}

/// Sets health as reloads change the live config's domain count, until the stop (from then on
/// shutdown owns health).
async fn follow_domains(
    mut domains: watch::Receiver<usize>,
    health: Health,
    stop: watch::Receiver<bool>,
) {
    let mut stopped = stop.clone();
    loop {
        let changed = tokio::select! {
            changed = domains.changed() => changed.is_ok(),
            _ = stopped.wait_for(|s| *s) => false,
        };
        let stopping = *stop.borrow();
        if !changed || stopping {
            return;
        }
        let n = *domains.borrow_and_update();
        health.set(n > 0).await;
    }
}

/// The xDS client, applying every config through the one reload path, with the overlay in
/// `overlays` (a good overlay read from its files replaces it); and the health gate that turns
/// SERVING once the first config is live.
fn run_xds(
    settings: XdsSettings,
    gate: Option<Health>,
    overlays: Overlays,
    install: Install,
    stop: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (ready_tx, mut ready_rx) = watch::channel(false);
    let (updates_tx, updates) = mpsc::unbounded_channel();
    let live = install.live();
    let mut stopped = stop.clone();
    let overlays_rx = overlays.subscribe();
    let mut tasks = Vec::new();
    tasks.extend([
        tokio::spawn(async move {
            let client = crate::source::xds::run(settings, live, overlays_rx, updates_tx, ready_tx);
            tokio::select! {
                _ = client => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        }),
        // Ends with the client, which holds the sending side.
        tokio::spawn(async move { install.follow("xDS", updates).await }),
    ]);
    if let Some(health) = gate {
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            if ready_rx.wait_for(|r| *r).await.is_ok() && !*stop.borrow() {
                health.set(true).await;
            }
        }));
    }
    tasks
}
