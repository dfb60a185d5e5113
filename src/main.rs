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
    let (settings, check) = match Cli::command() {
        Command::Check { config } => (Settings::from_process(Overrides::check(config)), true),
        Command::Serve(args) => (Settings::from_process(args.into()), false),
        Command::Limitador(args) => (args.settings(), false),
        Command::Digest { values } => return digest(&values),
    };
    let settings = match settings {
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
    let validate = settings.limitador.as_ref().filter(|l| l.validate);
    let code = if let Some(l) = validate {
        config_code(turnstile::cli::validate_limits(&l.limits_file))
    } else if check {
        config_code(turnstile::cli::check(&settings))
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

/// `turnstile check`, `limitador-server --validate`: exit 0 when the config loads, 2 (with the
/// error) when not.
fn config_code(checked: Result<(), turnstile::config::ConfigError>) -> ExitCode {
    match checked {
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
    if let Err(e) = turnstile::server::serve_until_terminated(settings, first) {
        tracing::error!(error = %e, "cannot start");
        return ExitCode::from(EXIT_SETTINGS);
    }
    ExitCode::SUCCESS
}
