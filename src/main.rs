//! The `turnstile` binary: parse the CLI, read the settings, start telemetry, load the limits,
//! then serve until SIGTERM (`turnstile::server::run`) or, for `check`, list them.

use std::process::ExitCode;

use turnstile::cli::{Cli, Command};
use turnstile::settings::{Overrides, Settings};

/// mimalloc: glibc malloc is a measurable share of every call of the tonic stack (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit codes: 1 bad settings or start failure, 2 invalid config.
const EXIT_SETTINGS: u8 = 1;
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let (flags, check) = match Cli::command() {
        Command::Check { config } => (config.map(Overrides::config).unwrap_or_default(), true),
        Command::Serve(args) => (args.into(), false),
        Command::Digest { values } => return digest(&values),
    };
    let settings = match Settings::from_process(flags) {
        Ok(s) => s,
        Err(e) => {
            // Reported in the log format asked for (`LOG_FORMAT=json`: one JSON object).
            let log = Settings::log_from_process();
            turnstile::telemetry::init_logging(&log.level, log.json);
            tracing::error!(error = %e, "bad settings");
            return ExitCode::from(EXIT_SETTINGS);
        }
    };
    if let Some(key) = &settings.client_values.digest_key {
        turnstile::telemetry::client_values::set_digest_key(key);
    }
    let tracing = settings.tracing.as_ref().filter(|_| !check);
    let telemetry = match turnstile::telemetry::init(&settings.log, tracing) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_SETTINGS);
        }
    };
    settings
        .ignored
        .iter()
        .for_each(|why| tracing::warn!("{why}"));
    let code = if check {
        check_config(&settings)
    } else {
        serve(&settings)
    };
    // Outside the runtime: flushing waits on the exporter's own runtime.
    telemetry.shutdown();
    code
}

/// `turnstile digest`: exit 0 with the digests, 1 when the settings or the key are missing.
fn digest(values: &[String]) -> ExitCode {
    let done = Settings::from_process(Overrides::default())
        .and_then(|s| turnstile::cli::digest(&s, values));
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_SETTINGS)
        }
    }
}

/// `turnstile check`: exit 0 when the config loads, 2 (with the error) when not.
fn check_config(settings: &Settings) -> ExitCode {
    match turnstile::cli::check(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn serve(settings: &Settings) -> ExitCode {
    let first = match turnstile::server::first_config(settings) {
        Ok(first) => first,
        Err(e) => {
            tracing::error!(error = %e, "invalid config");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let served = turnstile::server::serve_until_terminated(settings, first);
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            ExitCode::from(EXIT_SETTINGS)
        }
    }
}
