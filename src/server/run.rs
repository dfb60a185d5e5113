//! Serving as the binary does: start, announce the ports, reload on SIGHUP, and drain when the
//! shutdown future completes (SIGTERM or SIGINT for the binary, anything for an embedder).

use std::future::Future;
use std::net::SocketAddr;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

use super::{start_telling, FirstConfig, Running, StartError};
use crate::limiter::Clock;
use crate::settings::Settings;
use crate::source::in_background;
use crate::transport::waiting::StartWait;

/// Serves `config` as `settings` say until `shutdown` completes, then stops gracefully.
pub async fn run(
    settings: &Settings,
    config: impl Into<FirstConfig>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    // A stop while the start waits (for Redis, for the durable counters) ends the wait: nothing
    // is served yet, so nothing needs draining.
    let wait = StartWait::default();
    let mut shutdown = std::pin::pin!(shutdown);
    let running = tokio::select! {
        started = start_telling(settings, config, Clock::System, &wait) => started?,
        () = &mut shutdown => {
            let what = wait.now().map_or("the start", |w| w.what());
            tracing::warn!("stopped while waiting for {what}; nothing was served");
            return Ok(());
        }
    };
    announce(settings, &running);
    tokio::select! {
        _ = shutdown => {}
        _ = reload_on_hangup(&running) => {}
    }
    tracing::info!("shutting down");
    running.shutdown().await;
    Ok(())
}

/// The serving log line, and one machine-readable line on stdout, so scripts and tests can find
/// ports chosen by the OS: `turnstile: listening grpc=.. http=..`, or with `LOG_FORMAT=json` a
/// JSON log event whose fields carry the same addresses.
fn announce(settings: &Settings, running: &Running) {
    let grpc = match &running.grpc_uds {
        Some(p) => format!("unix:{}", p.display()),
        None => running.grpc_addr.to_string(),
    };
    let optional = |a: Option<SocketAddr>| a.map_or("off".into(), |a| a.to_string());
    // Where the limits come from: the files read, or the management server (no file is read).
    let config = match &settings.xds {
        Some(x) => format!("xds:{}", x.server),
        None => settings.config_path.display().to_string(),
    };
    let (debug_port, metrics_port) = (
        optional(running.debug_addr),
        optional(running.prometheus_addr),
    );
    tracing::info!(
        %grpc,
        http = %running.http_addr,
        debug = %debug_port,
        metrics = %metrics_port,
        tls = settings.tls.is_some(),
        tracing = settings.tracing.is_some(),
        workers = settings.workers,
        shards = settings.shards,
        config = %config,
        xds = settings.xds.is_some(),
        "serving"
    );
    let resp = optional(running.resp_addr);
    let admin = optional(running.admin_addr);
    if settings.log.json {
        // Every line the process writes is JSON then, the ready line too: a log event on stdout.
        let mut timestamp = String::new();
        let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
        let event = serde_json::json!({
            "timestamp": timestamp,
            "level": "INFO",
            "target": "turnstile",
            "fields": {
                "message": "listening",
                "grpc": grpc,
                "http": running.http_addr.to_string(),
                "debug": debug_port,
                "metrics": metrics_port,
                "resp": resp,
                "admin": admin,
            },
        });
        println!("{event}");
    } else {
        println!(
            "turnstile: listening grpc={grpc} http={} debug={debug_port} metrics={metrics_port} resp={resp} admin={admin}",
            running.http_addr
        );
    }
}

/// SIGHUP reloads the config and the TLS certificates; never returns unless the handler
/// cannot be installed.
async fn reload_on_hangup(running: &Running) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("SIGHUP handler unavailable: reload by file change only");
        return std::future::pending().await;
    };
    while hup.recv().await.is_some() {
        tracing::info!(files = running.followed.len(), "SIGHUP: reloading");
        // Errors are logged and counted by the reload itself.
        for f in &running.followed {
            let reload = f.reload.clone();
            let _ = in_background(move || reload.reload()).await;
        }
        running.reload_tls();
    }
}

/// Serves `config` on a runtime of its own until SIGTERM or SIGINT, the signal handlers
/// installed before anything listens (what the binary's `serve` does).
pub fn serve_until_terminated(
    settings: &Settings,
    config: impl Into<FirstConfig>,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let shutdown = {
        let _in_runtime = rt.enter();
        terminated()
    };
    let served = rt.block_on(run(settings, config, shutdown));
    // Past the grace, what is still draining (a client holding its connection open) is left
    // behind: the process ends now rather than when that client lets go.
    rt.shutdown_background();
    served.map_err(|e| e.to_string())
}

/// Completes on SIGTERM or SIGINT. The handlers are installed when this is called (inside a
/// runtime), not when the future is first polled: a SIGTERM that arrives while the server is
/// still starting is then a shutdown, not the default action that kills the process.
pub fn terminated() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}
