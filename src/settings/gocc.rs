//! GoCC's door's settings: the defaults of a key no `rate_api` key matches, whether callers may
//! override them, GoCC's key file; and GoCC's settings that change nothing here.

use std::path::PathBuf;
use std::time::Duration;

use super::env::{Env, Result};
use crate::config::gocc::MAX_COUNT;
use crate::config::KeyLimits;
use crate::service::gocc::GoccDefaults;

/// GoCC's settings (kivra/GoCC `pkg/config/config.go:26-31`, bounds `config.go:98-100`):
/// `MAX_REQUESTS` (1 to 10⁹, default 100), `MAX_REQUESTS_IN_QUEUE` (0 to 10⁹, default 400),
/// `WINDOW_MILLIS` (10 to 3600000, default 1000), `REQUESTS_CAN_SET_RATE` and
/// `REQUESTS_CAN_MOD_QUEUE` (default true); and `CONFIG_FILE`, GoCC's key file.
pub(super) fn gocc(env: &Env<'_>, xds: bool) -> Result<(GoccDefaults, Option<PathBuf>)> {
    let d = GoccDefaults::default();
    let defaults = GoccDefaults {
        limits: KeyLimits {
            max_requests: env.number_in("MAX_REQUESTS", 100, 1, MAX_COUNT)? as u32,
            max_in_queue: env.number_in("MAX_REQUESTS_IN_QUEUE", 400, 0, MAX_COUNT)? as u32,
            window: Duration::from_millis(env.number_in("WINDOW_MILLIS", 1000, 10, 3_600_000)?),
        },
        can_set_rate: env.flag("REQUESTS_CAN_SET_RATE", d.can_set_rate)?,
        can_mod_queue: env.flag("REQUESTS_CAN_MOD_QUEUE", d.can_mod_queue)?,
    };
    let file = env.get("CONFIG_FILE").map(PathBuf::from);
    if file.is_some() && xds {
        return Err(
            "CONFIG_FILE (GoCC's key file) is read with limits from files; \
                    CONFIG_TYPE=GRPC_XDS_SOTW takes them from xDS: unset one"
                .into(),
        );
    }
    Ok((defaults, file))
}

/// GoCC's settings (`config.go:35-40`) that change nothing here.
pub(super) const GOCC_UNUSED: [(&str, &str); 6] = [
    (
        "INSTANCE_URLS",
        "requests are not forwarded between instances; replicas share counters in Redis \
         (BACKEND_TYPE=redis), so any replica can answer any key",
    ),
    ("SERVER_TYPE", "one HTTP server serves HTTP/1.1 and h2c"),
    ("LOG_INCLUDES_SOURCE", "log lines name no source location"),
    (
        "LOG_2XX",
        "requests are not logged one by one; see /metrics",
    ),
    (
        "LOG_4XX",
        "requests are not logged one by one; see /metrics",
    ),
    (
        "LOG_5XX",
        "requests are not logged one by one; see /metrics",
    ),
];
