//! The one place the server builds its doors from the settings. Served as `limitador-server`, the
//! RLS and HTTP ports are Limitador's door; otherwise Envoy's, with GoCC's `/rate` and
//! ThrottleCrab's `/throttle` beside it on the HTTP port (and `THROTTLE` on the RESP port, and RLQS
//! on the gRPC port, both built with the workers). The rest of `server` asks [`Doors`] for the same
//! few things, whichever door it is, and names none: the RLS port's answerer, the gRPC services
//! beside it (as one tonic `Routes`), the HTTP port's router, the RESP port's handle, the files
//! followed, the limits served and where they came from. What every door keeps (bounds, client
//! values, the calls' series and spans, the wait's answers, HTTP timeouts) is kept where these are
//! served, so a door cannot leave it out; adding a door is its own files and one arm of the `match`
//! in [`Doors::build`].

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tonic::service::Routes;

use super::context::Context;
use super::overlay::{LoadedOverlay, OverlayFile, Overlays};
use super::reload::{recorded, Followed, Install, Reload, Reloader};
use super::Health;
use crate::config::limitador::{CustomLabels, Files, LabelsExpr, Limits};
use crate::config::ConfigError;
use crate::service::gocc::GoccService;
use crate::service::limitador::{LimitadorMetrics, LimitadorService};
use crate::service::rlqs::{DemandExchange, RlqsHub, RlqsStats};
use crate::service::ReloadStats;
use crate::service::{ThrottleService, ThrottleStats};
use crate::settings::limitador::LimitadorSettings;
use crate::settings::Settings;
use crate::source::files::{fingerprint, Watched};
use crate::store::redis::RedisStore;
use crate::telemetry::{Metrics, Shown};
use crate::transport::grpc::RlsAnswerer;
use crate::transport::http::{self, Described, HttpState, MetricsState};
use crate::transport::limitador::{LimitadorGrpc, LimitadorRls};
use crate::transport::rlqs::RlqsService;
use crate::transport::throttle::RespStats;
pub(super) use crate::transport::throttle::{serve_shared as serve_resp, RespShared};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

/// A gRPC service a door serves beside `ShouldRateLimit`, through the same per-call layer.
type DoorGrpc = LimitadorGrpc;
/// What a door reads at start besides the config: `limitador-server`'s limits and `-L` files.
pub type DoorFiles = Files;

/// What the server serves, door by door, and follows.
pub(super) struct Doors {
    /// The door that answers the RLS port, and what comes with it.
    pub(super) rls: RlsDoor,
    /// The gRPC services beside `ShouldRateLimit`, through the same per-call layer: the RLS
    /// door's own (Kuadrant's, as `limitador-server`) and RLQS, served beside either door.
    pub(super) grpc: Routes,
    /// `THROTTLE` and `CL.THROTTLE` on the RESP port, when `TURNSTILE_RESP_ADDR` is set.
    pub(super) resp: Option<Arc<RespShared>>,
}

/// The door answering `ShouldRateLimit` (Envoy's or Limitador's), and what comes with it.
pub(super) struct RlsDoor {
    /// Who answers `ShouldRateLimit` on the RLS port.
    pub(super) answerer: RlsAnswerer,
    /// The door's gRPC service beside it, if any.
    pub(super) grpc: Option<DoorGrpc>,
    /// The HTTP port's router (`HOST:PORT`), the door's calls counted and bounded.
    pub(super) http: axum::Router,
    /// Every file the door follows, polled and reloaded on SIGHUP alike.
    pub(super) followed: Vec<Followed>,
    /// The limits served, one per line, as `/rlconfig` and the status page show them (none:
    /// the live config's own, which reloads and xDS replace).
    pub(super) described: Option<Described>,
    /// Over files, the live config's domain count as reloads change it (health under
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub(super) domains: Option<watch::Receiver<usize>>,
    /// Over xDS, the overlay in force, for the xDS client (its files are followed).
    pub(super) overlays: Option<Overlays>,
}

/// What the doors beside the RLS door count in: made before the context, whose registry shows
/// them, and handed to the doors when they are built.
#[derive(Clone, Default)]
pub struct DoorStats {
    pub rlqs: Arc<RlqsStats>,
    /// The direct APIs' decisions (`THROTTLE`, `/throttle`).
    pub throttle: Arc<ThrottleStats>,
    /// The RESP port's connections and commands.
    pub resp: Arc<RespStats>,
}

impl DoorStats {
    /// For the registry, in the order `/metrics` shows them.
    pub(super) fn metrics(&self) -> Vec<Arc<dyn Metrics>> {
        vec![self.resp.clone(), self.throttle.clone(), self.rlqs.clone()]
    }
}

/// What the doors are built on besides the context: the health they report, what the start
/// read for them, the fleet RLQS shares demand with (the Redis store), and the stop.
pub(super) struct Given<'a> {
    pub(super) stats: DoorStats,
    /// Over xDS, the overlay the start read, with its files' fingerprint before.
    pub(super) overlay: Option<LoadedOverlay>,
    pub(super) health: &'a Health,
    pub(super) files: Option<DoorFiles>,
    /// The fingerprint of the door's files taken before they were read.
    pub(super) baseline: u64,
    /// With Redis, the store RLQS shares demand with the fleet through.
    pub(super) redis: Option<Arc<RedisStore>>,
    /// RLQS streams end on it.
    pub(super) stop: watch::Receiver<bool>,
}

/// What `limitador-server` reads at start, and the fingerprint of its limits file taken before
/// it was read; none for the other doors, whose config is the start's `Config`.
pub(super) fn first_files(settings: &Settings) -> Result<Option<(DoorFiles, u64)>, ConfigError> {
    let Some(l) = &settings.limitador else {
        return Ok(None);
    };
    let baseline = fingerprint(&limits_file(l));
    let files = Files::read(&l.limits_file, l.custom_metric_labels.as_deref())?;
    Ok(Some((files, baseline)))
}

/// Limitador's limits file as the poller watches it (a ConfigMap's `..data` swap included).
fn limits_file(l: &LimitadorSettings) -> Watched {
    Watched::Files(vec![l.limits_file.clone()])
}

/// Where the first config came from, as the load log names it: the door's file, or none (over
/// xDS, nothing was read).
pub(super) fn first_source(settings: &Settings) -> Option<String> {
    match (&settings.limitador, &settings.xds) {
        (Some(l), _) => Some(l.limits_file.display().to_string()),
        (None, Some(_)) => None,
        (None, None) => Some(settings.config_path.display().to_string()),
    }
}

/// The files the door reads its limits from, as the poller watches them.
pub(super) fn first_watched(settings: &Settings) -> Watched {
    match &settings.limitador {
        Some(l) => limits_file(l),
        None => super::watched_config(settings),
    }
}

impl Doors {
    /// The doors `settings` ask for, on the context's parts; `limitador` is what
    /// `limitador-server` read at start, `baseline` the fingerprint of the config's files taken
    /// before they were read.
    pub(super) fn build(settings: &Settings, cx: &Context, given: Given<'_>) -> Doors {
        let shown = Shown::for_listener(settings.http_addr, settings.client_values.show_clear);
        let throttle = ThrottleService::new(cx.engine.clone(), given.stats.throttle.clone());
        let resp = (settings.resp.as_ref()).map(|r| {
            let (stats, calls) = (given.stats.resp.clone(), cx.stats.calls.clone());
            RespShared::new(throttle.clone(), r, stats, calls)
        });
        let hub = RlqsHub::new(
            cx.live.clone(),
            cx.engine.clock().clone(),
            given.stats.rlqs.clone(),
            (given.redis).map(|r| r as Arc<dyn DemandExchange>),
            settings.global_shadow_mode,
        );
        let rlqs = RateLimitQuotaServiceServer::new(RlqsService::new(hub, given.stop))
            .max_decoding_message_size(settings.request_limits.max_message_bytes);
        let baseline = given.baseline;
        let mut rls = match (&settings.limitador, given.files) {
            (Some(l), Some(files)) => limitador_door(settings, l, files, cx, shown, baseline),
            _ => {
                let door = envoy_door(settings, cx, given.health, throttle, shown, baseline);
                with_overlay(door, settings, cx, given.overlay)
            }
        };
        let mut grpc = Routes::builder();
        grpc.add_service(rlqs);
        if let Some(door) = rls.grpc.take() {
            grpc.add_service(door);
        }
        Doors {
            rls,
            grpc: grpc.routes(),
            resp,
        }
    }
}

/// Envoy's door, with GoCC's and ThrottleCrab's on its HTTP port.
fn envoy_door(
    settings: &Settings,
    cx: &Context,
    health: &Health,
    throttle: ThrottleService,
    shown: Shown,
    baseline: u64,
) -> RlsDoor {
    let state = HttpState {
        shown,
        envoy: cx.envoy.clone(),
        serving: health.serving.clone(),
        throttle,
        throttle_limits: settings.throttle,
        gocc: GoccService::new(cx.live.clone(), cx.engine.clone(), settings.gocc),
        metrics: MetricsState {
            registry: cx.registry.clone(),
            live: cx.live.clone(),
            described: None,
            shown,
        },
        shards: cx.stats.shards.clone(),
        calls: cx.stats.calls.clone(),
    };
    let mut door = RlsDoor {
        answerer: RlsAnswerer::Envoy(cx.envoy.clone()),
        grpc: None,
        http: http::router(state, settings.metrics),
        followed: Vec::new(),
        described: None,
        domains: None,
        overlays: None,
    };
    // Over xDS the limits are pushed, not read: no file to follow.
    if settings.xds.is_none() {
        let domains = cx.live.load_full().config.domains.len();
        let install = Install::new(cx.live.clone(), cx.stats.reloads.clone());
        let reloader = Arc::new(Reloader::new(settings.sources(), install, domains));
        door.domains = Some(reloader.domains());
        door.followed.push(Followed {
            watched: super::watched_config(settings),
            baseline,
            reload: reloader,
        });
    }
    door
}

/// Limitador's door: its RLS answers, Kuadrant's service, its HTTP API; its limits file and
/// `-L` file followed.
fn limitador_door(
    settings: &Settings,
    l: &LimitadorSettings,
    files: Files,
    cx: &Context,
    shown: Shown,
    baseline: u64,
) -> RlsDoor {
    // Checked to compile when the settings were read.
    let labels = (l.metric_labels_default.as_deref()).and_then(|t| LabelsExpr::parse(t).ok());
    let metrics = Arc::new(LimitadorMetrics::new(
        l.limit_name_in_labels,
        labels,
        files.labels,
    ));
    let limitador = LimitadorService::new(files.limits, cx.engine.clone(), metrics.clone())
        .with_reservations(l.reservations);
    let bounds = settings.request_limits;
    let rls = LimitadorRls {
        limitador: limitador.clone(),
        headers: l.draft_03_headers,
        bounds,
    };
    let described: Described = {
        let limitador = limitador.clone();
        Arc::new(move || http::describe_limits(&limitador))
    };
    let router = http::limitador_router(http::LimitadorHttp {
        limitador: limitador.clone(),
        registry: cx.registry.clone(),
        shown,
        started_at: limitador.loaded().applied_at,
        calls: cx.stats.calls.clone(),
        bounds,
    });
    let mut followed = vec![Followed {
        watched: limits_file(l),
        baseline,
        reload: Arc::new(LimitsFile {
            path: l.limits_file.clone(),
            limitador,
            stats: cx.stats.reloads.clone(),
        }),
    }];
    if let Some(path) = &l.custom_metric_labels {
        let watched = Watched::Files(vec![path.clone()]);
        followed.push(Followed {
            baseline: fingerprint(&watched),
            watched,
            reload: Arc::new(LabelsFile {
                path: path.clone(),
                metrics,
                stats: cx.stats.reloads.clone(),
            }),
        });
    }
    RlsDoor {
        answerer: RlsAnswerer::Limitador(rls.clone()),
        grpc: Some(LimitadorGrpc::new(rls, bounds.max_message_bytes)),
        http: router,
        followed,
        described: Some(described),
        domains: None,
        overlays: None,
    }
}

/// Over xDS, Envoy's door with the overlay its pushes take: the one the start read, its files
/// followed when `TURNSTILE_XDS_OVERLAY` names them.
fn with_overlay(
    mut door: RlsDoor,
    settings: &Settings,
    cx: &Context,
    first: Option<LoadedOverlay>,
) -> RlsDoor {
    let Some(x) = &settings.xds else {
        return door;
    };
    let (first, baseline) = first.map_or((None, 0), |l| (Some(l.overlay), l.baseline));
    let overlays: Overlays = Arc::new(watch::Sender::new(first));
    if let Some(path) = &x.overlay {
        let file = OverlayFile {
            path: path.clone(),
            overlays: overlays.clone(),
            install: Install::new(cx.live.clone(), cx.stats.reloads.clone()),
        };
        door.followed.push(file.followed(baseline));
    }
    door.overlays = Some(overlays);
    door
}

/// Limitador's limits file: read again, its CEL compiled anew; counters are kept.
struct LimitsFile {
    path: PathBuf,
    limitador: LimitadorService,
    stats: Arc<ReloadStats>,
}

impl Reload for LimitsFile {
    fn reload(&self) -> Result<(), ConfigError> {
        let read = Limits::read(&self.path);
        let result = recorded(&self.stats, &self.path, &read);
        self.limitador.reload(read);
        result
    }
}

/// A `-L` file: its labels read again; those in use stay when it does not load.
struct LabelsFile {
    path: PathBuf,
    metrics: Arc<LimitadorMetrics>,
    stats: Arc<ReloadStats>,
}

impl Reload for LabelsFile {
    fn reload(&self) -> Result<(), ConfigError> {
        let read = CustomLabels::read(&self.path);
        let result = recorded(&self.stats, &self.path, &read);
        self.metrics.reload_custom_labels(read);
        result
    }
}
