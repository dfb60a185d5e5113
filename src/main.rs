//! The `turnstile` binary: parse the CLI, load and validate config, start, stop on a signal.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use turnstile::config::settings::{resolve, Settings};
use turnstile::config::Config;
use turnstile::limiter::Clock;

/// mimalloc: glibc malloc is a measurable share of every call of the tonic stack (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    version,
    about = "A rate-limit service for Envoy, drop-in for envoyproxy/ratelimit"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve gRPC and HTTP. Settings not given here come from envoyproxy/ratelimit's environment.
    Serve(ServeArgs),
    /// Validate a config, print every loaded limit, exit non-zero on any error.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
}

#[derive(clap::Args, Default)]
struct ServeArgs {
    /// A YAML file or a directory of *.yaml/*.yml (default: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY).
    #[arg(long)]
    config: Option<PathBuf>,
    /// gRPC listen address (default: GRPC_HOST:GRPC_PORT, 0.0.0.0:8081).
    #[arg(long)]
    grpc_addr: Option<String>,
    /// HTTP listen address (default: HOST:PORT, 0.0.0.0:8080).
    #[arg(long)]
    http_addr: Option<String>,
    /// Worker threads, each a current-thread runtime (default: TURNSTILE_WORKERS or cores - 1, at least 1).
    #[arg(long)]
    workers: Option<usize>,
    /// Shard actors (default: TURNSTILE_SHARDS or the worker count).
    #[arg(long)]
    shards: Option<usize>,
}

/// Exit codes: 1 bad settings or start failure, 2 invalid config.
const EXIT_SETTINGS: u8 = 1;
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    // Manifests written for envoyproxy/ratelimit run `/bin/ratelimit` with no arguments.
    let invoked_as = std::env::args()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let command = if invoked_as == "ratelimit" {
        Command::Serve(ServeArgs::default())
    } else {
        Cli::parse().command
    };
    match command {
        Command::Check { config } => {
            init_env_logging();
            check(&config)
        }
        Command::Serve(args) => serve(args),
    }
}

/// Logs from `LOG_LEVEL`/`LOG_FORMAT` alone: for `check`, and for reporting bad settings.
fn init_env_logging() {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    turnstile::telemetry::init_logging(
        &env("LOG_LEVEL").unwrap_or_else(|| "info".into()),
        env("LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json")),
    );
}

fn check(path: &std::path::Path) -> ExitCode {
    let settings = match Settings::from_env(|k| std::env::var(k).ok()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_SETTINGS);
        }
    };
    match Config::load(path, settings.load) {
        Ok(c) => {
            for line in c.describe() {
                println!("{line}");
            }
            eprintln!("config OK: {} domain(s)", c.domains.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let settings = Settings::from_env(|k| std::env::var(k).ok()).and_then(|mut s| {
        apply_args(&mut s, args)?;
        Ok(s)
    });
    let settings = match settings {
        Ok(s) => s,
        Err(e) => {
            init_env_logging();
            tracing::error!("{e}");
            return ExitCode::from(EXIT_SETTINGS);
        }
    };
    let telemetry = match turnstile::telemetry::init(&settings.log, settings.tracing.as_ref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_SETTINGS);
        }
    };
    for why in &settings.ignored {
        tracing::warn!("{why}");
    }
    if let Err(e) = turnstile::transport::http_limits() {
        tracing::error!("{e}");
        return ExitCode::from(EXIT_SETTINGS);
    }
    // Over xDS the limits arrive from the management server; the config location is not read
    // (Envoy Gateway points RUNTIME_ROOT at a directory that may be empty).
    let config = if settings.xds.is_some() {
        Config::default()
    } else {
        match Config::load(&settings.config_path, settings.load) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "invalid config");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start runtime");
            return ExitCode::from(EXIT_SETTINGS);
        }
    };
    let code = rt.block_on(async move {
        let running = match turnstile::server::start(&settings, config, Clock::System).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                return ExitCode::from(EXIT_SETTINGS);
            }
        };
        let grpc = match &running.grpc_uds {
            Some(p) => format!("unix:{}", p.display()),
            None => running.grpc_addr.to_string(),
        };
        let optional = |a: Option<std::net::SocketAddr>| a.map_or("off".into(), |a| a.to_string());
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
            config = %settings.config_path.display(),
            xds = settings.xds.is_some(),
            "serving"
        );
        // One machine-readable line on stdout, so scripts and tests can find ports chosen by the OS.
        let resp = optional(running.resp_addr);
        println!(
            "turnstile: listening grpc={grpc} http={} debug={debug_port} metrics={metrics_port} resp={resp}",
            running.http_addr
        );
        wait_for_signal(&running).await;
        tracing::info!("shutting down");
        running.shutdown().await;
        ExitCode::SUCCESS
    });
    // Outside the runtime: flushing waits on the exporter's own runtime.
    telemetry.shutdown();
    code
}

fn apply_args(s: &mut Settings, a: ServeArgs) -> Result<(), String> {
    if let Some(c) = a.config {
        s.config_path = c;
    }
    let addr = |text: String| -> Result<std::net::SocketAddr, String> {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| format!("address {text} needs a port (HOST:PORT)"))?;
        let port = port
            .parse()
            .map_err(|_| format!("address {text}: bad port"))?;
        resolve(host, port)
    };
    if let Some(g) = a.grpc_addr {
        s.grpc_addr = addr(g)?;
    }
    if let Some(h) = a.http_addr {
        s.http_addr = addr(h)?;
    }
    if let Some(w) = a.workers {
        s.workers = w.max(1);
        if a.shards.is_none() {
            s.shards = s.workers;
        }
    }
    if let Some(n) = a.shards {
        s.shards = n.max(1);
    }
    Ok(())
}

/// Returns on SIGTERM or SIGINT; SIGHUP reloads the config and the TLS certificates.
async fn wait_for_signal(running: &turnstile::server::Running) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading");
                // Errors are logged and counted by the reload itself.
                let _ = running.reload_config();
                running.reload_tls();
            }
        }
    }
}
