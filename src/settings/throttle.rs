//! ThrottleCrab's door's settings: the caps on the GCRA parameters callers send, and the RESP
//! port (`TURNSTILE_RESP_*`).

use std::time::Duration;

use super::env::{Env, Result};
use super::sections::listener_addr;
use crate::service::ThrottleLimits;
use crate::transport::throttle::RespSettings;

/// `TURNSTILE_THROTTLE_ALLOW_REMOTE` and the caps `TURNSTILE_THROTTLE_MAX_BURST`,
/// `_MAX_PERIOD_SECS`, `_MAX_COUNT`, `_MAX_KEY_LEN`.
pub(super) fn throttle(env: &Env<'_>) -> Result<ThrottleLimits> {
    let d = ThrottleLimits::default();
    let u32max = u64::from(u32::MAX);
    Ok(ThrottleLimits {
        allow_remote: env.flag("TURNSTILE_THROTTLE_ALLOW_REMOTE", false)?,
        max_burst: env.number_in(
            "TURNSTILE_THROTTLE_MAX_BURST",
            d.max_burst.into(),
            1,
            u32max,
        )? as u32,
        max_period_secs: env.number_in(
            "TURNSTILE_THROTTLE_MAX_PERIOD_SECS",
            d.max_period_secs,
            1,
            ThrottleLimits::PERIOD_CEILING_SECS,
        )?,
        max_count: env.number_in(
            "TURNSTILE_THROTTLE_MAX_COUNT",
            d.max_count.into(),
            1,
            u32max,
        )? as u32,
        max_key_len: env.number_in(
            "TURNSTILE_THROTTLE_MAX_KEY_LEN",
            d.max_key_len as u64,
            1,
            65_536,
        )? as usize,
    })
}

/// `None` when `TURNSTILE_RESP_ADDR` is unset (the transport is off). It takes `HOST:PORT`, a
/// bare `PORT` (on 127.0.0.1), or `true` for 127.0.0.1:6380.
pub(super) fn resp(env: &Env<'_>) -> Result<Option<RespSettings>> {
    let d = RespSettings::default();
    let text = env.get("TURNSTILE_RESP_ADDR");
    let addr = match &text {
        Some(text) => {
            listener_addr(text, d.addr).map_err(|e| format!("TURNSTILE_RESP_ADDR={text}: {e}"))?
        }
        None => d.addr,
    };
    let s = RespSettings {
        addr,
        allow_remote: env.flag("TURNSTILE_RESP_ALLOW_REMOTE", false)?,
        max_connections: env.number_in(
            "TURNSTILE_RESP_MAX_CONNECTIONS",
            d.max_connections as u64,
            1,
            1_000_000,
        )? as usize,
        idle_timeout: Duration::from_secs(env.number_in(
            "TURNSTILE_RESP_IDLE_TIMEOUT_SECS",
            d.idle_timeout.as_secs(),
            1,
            7 * 86_400,
        )?),
        limits: throttle(env)?,
    };
    if text.is_none() {
        return Ok(None);
    }
    s.check_addr()?;
    Ok(Some(s))
}
