//! `rate_api`: the direct HTTP API's keys, validated into [`RateApi`].

use std::time::Duration;

use super::Ctx;
use crate::config::grammar::parse_bounded_duration;
use crate::config::raw;
use crate::config::{ConfigError, RateApi, RateApiKey};

pub(super) fn build_rate_api(ctx: &Ctx<'_>, raw: raw::RawRateApi) -> Result<RateApi, ConfigError> {
    let mut keys = Vec::with_capacity(raw.keys.len());
    for (i, k) in raw.keys.into_iter().enumerate() {
        let here = format!("rate_api.keys[{i}]");
        let pattern = k.key.unwrap_or_default();
        if pattern.is_empty() {
            return Err(ctx.err(
                &format!("{here}.key"),
                "key must not be empty (use \"*\" for any)",
            ));
        }
        let window_text = k.window.ok_or_else(|| {
            ctx.err(
                &format!("{here}.window"),
                "window is required (e.g. 1000ms, 1m)",
            )
        })?;
        let window = parse_bounded_duration(&window_text)
            .map_err(|m| ctx.err(&format!("{here}.window"), m))?;
        if window < Duration::from_millis(1) || window.subsec_nanos() % 1_000_000 != 0 {
            return Err(ctx.err(
                &format!("{here}.window"),
                "window must be a whole number of milliseconds, at least 1ms",
            ));
        }
        let max_requests = k
            .max_requests
            .ok_or_else(|| ctx.err(&format!("{here}.max_requests"), "max_requests is required"))?;
        let max_in_queue = k.max_in_queue.unwrap_or(0);
        if max_in_queue > 0 && max_requests == 0 {
            return Err(ctx.err(
                &format!("{here}.max_in_queue"),
                "a queue on max_requests: 0 would never admit anyone",
            ));
        }
        let max_wait = match k.max_wait {
            Some(t) => {
                let d = parse_bounded_duration(&t)
                    .map_err(|m| ctx.err(&format!("{here}.max_wait"), m))?;
                if d.is_zero() {
                    return Err(
                        ctx.err(&format!("{here}.max_wait"), "max_wait must be more than 0")
                    );
                }
                d
            }
            None => crate::config::default_max_wait(window, max_requests, max_in_queue),
        };
        keys.push(RateApiKey {
            pattern,
            window,
            max_requests,
            max_in_queue,
            max_wait,
        });
    }
    Ok(RateApi {
        allow_overrides: raw.allow_overrides,
        max_requests_cap: raw.max_requests_cap.unwrap_or(100_000),
        max_in_queue_cap: raw.max_in_queue_cap.unwrap_or(10_000),
        keys,
    })
}
