//! The statsd settings: envoyproxy/ratelimit's `USE_STATSD`, `USE_DOG_STATSD`, `STATSD_HOST`,
//! `STATSD_PORT`, `EXTRA_TAGS`, `STATS_FLUSH_INTERVAL` (`src/settings/settings.go:85-91`),
//! gostats' `STATSD_PROTOCOL`, and the DogStatsD mogrifiers (`src/godogstats/mogrifier_map.go`).

use std::time::Duration;

use super::env::{Env, Result};
use crate::config::go_regex;
use crate::telemetry::statsd::{tag_value, Mogrifier, Protocol, StatsdSettings};

/// `None` when neither statsd nor DogStatsD is on.
///
/// `USE_STATSD` defaults to true in the reference, sending to localhost:8125 whether or not
/// anything listens there. Here it defaults to true only when `STATSD_HOST` or `STATSD_PORT` is
/// set (a deployment that names a statsd wants its stats there); with neither, a pod would
/// push UDP or dial TCP into nothing every 10 s, so the default is off. `DISABLE_STATS=true`
/// turns the push off, as the reference's null sink does.
pub(super) fn statsd(env: &Env<'_>) -> Result<Option<StatsdSettings>> {
    let named = env.get("STATSD_HOST").is_some() || env.get("STATSD_PORT").is_some();
    let plain = env.flag("USE_STATSD", named)?;
    let dog = env.flag("USE_DOG_STATSD", false)?;
    if dog && plain && env.get("USE_STATSD").is_some() {
        // The reference's `runner.go:51-54` refuses to start with both.
        return Err(
            "USE_DOG_STATSD=true and USE_STATSD=true: one stats sink at a time \
                    (set USE_STATSD=false for DogStatsD)"
                .into(),
        );
    }
    let disabled = env.flag("DISABLE_STATS", false)?;
    let port = env.number_in("STATSD_PORT", 8125, 1, 65_535)? as u16;
    let protocol = env.choice(
        "STATSD_PROTOCOL",
        Protocol::Tcp,
        &[
            ("tcp", Protocol::Tcp),
            ("tcp4", Protocol::Tcp),
            ("tcp6", Protocol::Tcp),
            ("udp", Protocol::Udp),
            ("udp4", Protocol::Udp),
            ("udp6", Protocol::Udp),
        ],
    )?;
    let flush_interval = env.duration("STATS_FLUSH_INTERVAL", Duration::from_secs(10))?;
    if flush_interval < Duration::from_millis(1) {
        return Err(format!(
            "STATS_FLUSH_INTERVAL={} must be at least 1ms",
            env.get("STATS_FLUSH_INTERVAL").unwrap_or_default()
        ));
    }
    // Every value set is checked, whether the push is on or not.
    let mogrifiers = mogrifiers(env)?;
    let extra_tags = extra_tags(env)?;
    if disabled || !(plain || dog) {
        return Ok(None);
    }
    Ok(Some(StatsdSettings {
        host: env.string("STATSD_HOST", "localhost"),
        port,
        protocol,
        dog: dog.then_some(mogrifiers),
        extra_tags,
        flush_interval,
    }))
}

/// `EXTRA_TAGS=k1:v1,k2:v2`: pairs with an empty key or value are dropped and values cleaned
/// (gostats' `NewTagSet`, `ReplaceChars`), then sorted by key, a repeated key keeping its last.
fn extra_tags(env: &Env<'_>) -> Result<Vec<(String, String)>> {
    let mut tags: Vec<(String, String)> = Vec::new();
    for (k, v) in env.pairs("EXTRA_TAGS")? {
        if v.is_empty() {
            continue;
        }
        tags.retain(|(old, _)| *old != k);
        tags.push((k, tag_value(&v)));
    }
    tags.sort();
    Ok(tags)
}

/// `USE_DOG_STATSD_MOGRIFIERS=A,B` and, for each, `DOG_STATSD_MOGRIFIER_A_PATTERN`, `_NAME` and
/// `_TAGS` (`key:$1,...`), in order: the first that matches a name rewrites it.
fn mogrifiers(env: &Env<'_>) -> Result<Vec<Mogrifier>> {
    let names = env.get("USE_DOG_STATSD_MOGRIFIERS").unwrap_or_default();
    let mut out = Vec::new();
    for m in names.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let var = |s: &str| format!("DOG_STATSD_MOGRIFIER_{}_{s}", m.to_uppercase());
        let pattern = env.get(&var("PATTERN")).ok_or_else(|| {
            format!(
                "USE_DOG_STATSD_MOGRIFIERS={names}: {} is not set",
                var("PATTERN")
            )
        })?;
        let regex = go_regex::compile(&pattern).map_err(|e| {
            format!(
                "{}={pattern}: not a regular expression: {e}",
                var("PATTERN")
            )
        })?;
        let name = env.get(&var("NAME")).ok_or_else(|| {
            format!(
                "USE_DOG_STATSD_MOGRIFIERS={names}: {} is not set",
                var("NAME")
            )
        })?;
        let mut tags = env.pairs(&var("TAGS"))?;
        if let Some((k, _)) = tags.iter().find(|(_, v)| v.is_empty()) {
            return Err(format!("{}: tag {k} has no value", var("TAGS")));
        }
        tags.sort();
        out.push(Mogrifier {
            pattern: regex,
            name,
            tags,
        });
    }
    Ok(out)
}
