//! The command line: `turnstile serve` (or the binary named `ratelimit`, as manifests written
//! for envoyproxy/ratelimit run it; `limitador-server`, as limitador-operator runs Limitador),
//! `turnstile check` and `turnstile digest`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::settings::Overrides;

#[derive(Parser)]
#[command(
    version,
    about = "A rate-limit service for Envoy, drop-in for envoyproxy/ratelimit"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve gRPC and HTTP. Settings not given here come from envoyproxy/ratelimit's environment.
    Serve(ServeArgs),
    /// Validate a config, print every loaded limit, exit non-zero on any error. `--config`
    /// names a YAML file or directory, or GoCC's JSON key file (`*.json`); without it, the
    /// environment's locations are checked (RUNTIME_*, GoCC's CONFIG_FILE).
    Check {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Invoked as `limitador-server`, with Limitador's command line (not a subcommand of
    /// `turnstile`'s).
    #[command(skip)]
    Limitador(Box<crate::settings::limitador::LimitadorArgs>),
    /// Print each value's digest, as listeners without authentication show client values,
    /// under TURNSTILE_CLIENT_DIGEST_KEY (which must be set: without it each server process
    /// digests with a random key of its own; ask its admin listener, POST /admin/digest).
    Digest {
        #[arg(required = true)]
        values: Vec<String>,
    },
}

#[derive(clap::Args, Default)]
pub struct ServeArgs {
    /// A YAML file or a directory of *.yaml/*.yml (default: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// gRPC listen address (default: GRPC_HOST:GRPC_PORT, 0.0.0.0:8081).
    #[arg(long)]
    pub grpc_addr: Option<String>,
    /// HTTP listen address (default: HOST:PORT, 0.0.0.0:8080).
    #[arg(long)]
    pub http_addr: Option<String>,
    /// Worker threads, each a current-thread runtime (default: TURNSTILE_WORKERS or cores - 1, at least 1).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Shard actors (default: TURNSTILE_SHARDS or the worker count).
    #[arg(long)]
    pub shards: Option<usize>,
    /// Keep the in-memory counters on disk here, read back at the next start (default: TURNSTILE_STATE_DIR; unset: not kept).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

/// The binary invoked as `ratelimit`, as manifests written for envoyproxy/ratelimit run it:
/// `turnstile serve`, its flags included (`ratelimit --help` prints them).
#[derive(Parser)]
#[command(
    name = "ratelimit",
    version,
    about = "turnstile, invoked as envoyproxy/ratelimit's binary: serves as `turnstile serve` does"
)]
struct AsReference {
    #[command(flatten)]
    serve: ServeArgs,
}

impl Cli {
    /// The command of this process's arguments; under the name `ratelimit`, `serve`'s.
    pub fn command() -> Command {
        let argv0 = std::env::args()
            .next()
            .map(PathBuf::from)
            .unwrap_or_default();
        if argv0.file_name().is_some_and(|f| f == "ratelimit") {
            Command::Serve(AsReference::parse().serve)
        } else if argv0.file_name().is_some_and(|f| f == "limitador-server") {
            let args = crate::settings::limitador::LimitadorArgs::from_process();
            Command::Limitador(Box::new(args))
        } else {
            Cli::parse().command
        }
    }
}

impl From<ServeArgs> for Overrides {
    fn from(a: ServeArgs) -> Overrides {
        Overrides {
            config: a.config,
            grpc_addr: a.grpc_addr,
            http_addr: a.http_addr,
            workers: a.workers,
            state_dir: a.state_dir,
            shards: a.shards,
            checking: false,
        }
    }
}

/// `turnstile check`: every loaded limit on stdout, GoCC key file warnings and RLQS refusals on
/// stderr; the error naming file and path when the config does not load. Over xDS with
/// `TURNSTILE_XDS_OVERLAY`, the overlay is checked too: each of its limits on stdout, with the
/// fields it writes into the pushed limit at its path. With nothing to read at all
/// (`Sources::found_nothing`) and no overlay, that is the error: a check of no limits passes
/// nothing.
pub fn check(settings: &crate::settings::Settings) -> Result<(), crate::config::ConfigError> {
    let overlay = (settings.xds.as_ref()).and_then(|x| x.overlay.as_ref());
    if let Some(path) = overlay {
        let overlay = crate::config::Overlay::load(path)?;
        let lines = overlay.describe();
        lines.iter().for_each(|line| println!("{line}"));
        eprintln!(
            "xDS overlay OK: {} ({} limit(s))",
            path.display(),
            lines.len()
        );
    }
    let sources = settings.sources();
    if sources.found_nothing() && overlay.is_none() {
        return Err(crate::config::ConfigError {
            file: sources.path.display().to_string(),
            path: String::new(),
            message: format!(
                "nothing to check: {} (name the config with --config)",
                sources.nothing_found_message()
            ),
        });
    }
    let c = sources.load()?;
    c.describe().iter().for_each(|line| println!("{line}"));
    let rate_api = c
        .rate_api
        .as_ref()
        .map(|r| r.describe())
        .unwrap_or_default();
    rate_api.iter().for_each(|line| println!("{line}"));
    if let Some(g) = &c.gocc {
        g.warnings.iter().for_each(|w| eprintln!("{}: {w}", g.file));
        eprintln!("GoCC key file OK: {} ({} key(s))", g.file, g.entries.len());
    }
    // Valid for ShouldRateLimit; only Envoy's quota filter (RLQS) cannot use these.
    for why in crate::service::rlqs::refusals(&c) {
        eprintln!("RLQS: {why}");
    }
    let keys = c.rate_api.as_ref().map_or(0, |r| r.keys.len());
    eprintln!(
        "config OK: {} domain(s), {keys} rate_api key(s)",
        c.domains.len()
    );
    Ok(())
}

/// `turnstile digest`: `value<TAB>digest` per value on stdout; the error when the key is unset.
pub fn digest(settings: &crate::settings::Settings, values: &[String]) -> Result<(), String> {
    let Some(key) = &settings.client_values.digest_key else {
        return Err(
            "TURNSTILE_CLIENT_DIGEST_KEY is not set: each server process then digests \
                    with a random key of its own (its admin listener's POST /admin/digest \
                    computes them)"
                .into(),
        );
    };
    crate::telemetry::client_values::set_digest_key(key);
    for v in values {
        println!("{v}\t{}", crate::telemetry::digest(v));
    }
    Ok(())
}

/// `limitador-server --validate`: the limits file loads (its count of limits on stderr), or the
/// error naming the file and the line.
pub fn validate_limits(path: &std::path::Path) -> Result<(), crate::config::ConfigError> {
    let limits = crate::config::limitador::Limits::read(path)?;
    eprintln!("limits file OK: {} limit(s)", limits.count);
    Ok(())
}
