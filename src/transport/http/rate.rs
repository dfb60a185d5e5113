//! The direct API for callers not behind Envoy (GoCC's): `/rate/{key}`, release, `/debug`.
//!
//! Keys and limits come from the config's `rate_api` section; decisions go through the same
//! shard actors as Envoy's, in a key space of their own. Per-request overrides apply to that
//! request only (never sticky) and only where the config allows them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::HttpState;
use crate::config::{Algorithm, QueueSpec, RateApi};
use crate::descriptor::key_hash;
use crate::limiter::{KeyInfo, Op, Params, Role};

/// Counter keys of the direct API start with this, so they never meet an Envoy domain's keys
/// (those start with the domain name, which cannot hold a NUL in practice).
const PREFIX: &str = "\0rate/";

#[derive(Debug, Deserialize)]
pub(crate) struct RateQuery {
    #[serde(rename = "canWait", default)]
    can_wait: Option<bool>,
    #[serde(rename = "maxRequests", default)]
    max_requests: Option<u32>,
    #[serde(rename = "maxRequestsInQueue", default)]
    max_in_queue: Option<u32>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

fn next_request_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Seeded from the clock once, so ids of a restarted process do not repeat old ones.
    if NEXT.load(Ordering::Relaxed) == 0 {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        let _ = NEXT.compare_exchange(0, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Logs a caller that gave up while waiting (GoCC's 499).
struct GaveUp<'a> {
    key: &'a str,
    armed: bool,
}

impl Drop for GaveUp<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::info!(status = 499, key = self.key, "caller gave up while waiting");
        }
    }
}

/// `POST`/`GET /rate/{key}?canWait=&maxRequests=&maxRequestsInQueue=`.
pub(crate) async fn take(
    State(s): State<HttpState>,
    Path(key): Path<String>,
    Query(q): Query<RateQuery>,
) -> Response {
    let live = s.limiter.live();
    let config = &live.config;
    let Some(api) = config.rate_api.as_ref() else {
        return error(StatusCode::NOT_FOUND, "the config has no rate_api section");
    };
    let Some(k) = api.find(&key) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no rate_api key matches \"{key}\""),
        );
    };
    if (q.max_requests.is_some() || q.max_in_queue.is_some()) && !api.allow_overrides {
        return error(
            StatusCode::BAD_REQUEST,
            "per-request overrides are disabled (rate_api.allow_overrides: false)",
        );
    }
    let max_requests = q.max_requests.unwrap_or(k.max_requests);
    if max_requests > api.max_requests_cap {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "maxRequests {max_requests} is over the cap of {}",
                api.max_requests_cap
            ),
        );
    }
    let queue = if q.can_wait.unwrap_or(false) {
        let max_waiting = q.max_in_queue.unwrap_or(k.max_in_queue);
        if max_waiting > api.max_in_queue_cap {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "maxRequestsInQueue {max_waiting} is over the cap of {}",
                    api.max_in_queue_cap
                ),
            );
        }
        if max_waiting == 0 || max_requests == 0 {
            return error(
                StatusCode::BAD_REQUEST,
                format!("key \"{key}\" cannot wait: its queue holds 0 (max_in_queue)"),
            );
        }
        Some(QueueSpec {
            max_waiting,
            max_wait: k.max_wait,
        })
    } else {
        None
    };
    let id = next_request_id();
    let counter = format!("{PREFIX}{key}");
    let op = Op {
        hash: key_hash(&counter),
        key: counter,
        params: Params {
            requests_per_unit: max_requests,
            window_ms: k.window.as_millis() as u64,
            algorithm: Algorithm::FixedWindow,
        },
        hits: 1,
        refund: false,
        role: Role::Binding,
        queue,
        grant: Some(id),
    };
    let mut gave_up = GaveUp {
        key: &key,
        armed: queue.is_some(),
    };
    let decided = s.limiter.engine().decide(vec![op], false).await;
    gave_up.armed = false;
    let d = match decided {
        Ok(d) => d,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let out = d.outcomes[0];
    if out.over || out.blocked || d.timed_out {
        let retry_ms = if out.retry_ns == u64::MAX {
            None
        } else {
            Some(out.retry_ns.div_ceil(1_000_000))
        };
        let mut resp = (
            StatusCode::TOO_MANY_REQUESTS,
            Json(json!({
                "key": key,
                "error": if d.timed_out { "waited too long" } else { "rate limit exceeded" },
                "retry_after_ms": retry_ms,
            })),
        )
            .into_response();
        if let Some(ms) = retry_ms {
            if let Ok(v) = ms.div_ceil(1000).to_string().parse() {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        return resp;
    }
    Json(json!({
        "request_id": format!("{id:x}"),
        "key": key,
        "remaining": out.remaining,
        "reset_ms": out.reset_ns.div_ceil(1_000_000),
        "waited_ms": d.waited_ns / 1_000_000,
    }))
    .into_response()
}

/// `DELETE /rate/{key}/{request_id}`: gives the admitted hit back; the queue head gets it.
pub(crate) async fn release(
    State(s): State<HttpState>,
    Path((key, request_id)): Path<(String, String)>,
) -> Response {
    let Ok(id) = u64::from_str_radix(&request_id, 16) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("unknown request id \"{request_id}\""),
        );
    };
    let counter = format!("{PREFIX}{key}");
    let hash = key_hash(&counter);
    match s.limiter.engine().release(counter, hash, id).await {
        Ok(true) => {
            Json(json!({ "released": true, "key": key, "request_id": request_id })).into_response()
        }
        Ok(false) => error(
            StatusCode::NOT_FOUND,
            format!("request {request_id} of \"{key}\" is unknown or its window has ended"),
        ),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

fn describe(api: &RateApi, info: &KeyInfo) -> Option<(String, Value)> {
    let key = info.key.strip_prefix(PREFIX)?.to_owned();
    let k = api.find(&key)?;
    let params = Params {
        requests_per_unit: k.max_requests,
        window_ms: k.window.as_millis() as u64,
        algorithm: Algorithm::FixedWindow,
    };
    let window = info.now / (params.window_ms * 1_000_000);
    let denied = if info.denied.0 == window {
        info.denied.1
    } else {
        0
    };
    let v = json!({
        "Key": key,
        "Config": {
            "WindowMillis": params.window_ms,
            "MaxRequestsPerWindow": k.max_requests,
            "MaxRequestsInQueue": k.max_in_queue,
            "MaxWaitMillis": k.max_wait.as_millis() as u64,
        },
        "NumApprovedThisWindow": info.state.count_in_window(&params, info.now),
        "NumDeniedThisWindow": denied,
        "NumWaiting": info.waiting,
        "Found": true,
    });
    Some((key, v))
}

/// `GET /debug`: every direct API key's window.
pub(crate) async fn debug_all(State(s): State<HttpState>) -> Response {
    let live = s.limiter.live();
    let config = &live.config;
    let Some(api) = config.rate_api.as_ref() else {
        return Json(json!({ "Instances": {} })).into_response();
    };
    match s.limiter.engine().inspect(Some(PREFIX.to_owned())).await {
        Ok(infos) => {
            let instances: Map<String, Value> =
                infos.iter().filter_map(|i| describe(api, i)).collect();
            Json(json!({ "Instances": instances })).into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `GET /debug/{key}`: one key's window (404 with `"Found": false` when it has none).
pub(crate) async fn debug_key(State(s): State<HttpState>, Path(key): Path<String>) -> Response {
    let live = s.limiter.live();
    let config = &live.config;
    let counter = format!("{PREFIX}{key}");
    let found = match (
        config.rate_api.as_ref(),
        s.limiter.engine().inspect(Some(counter.clone())).await,
    ) {
        (Some(api), Ok(infos)) => infos
            .iter()
            .filter(|i| i.key == counter)
            .find_map(|i| describe(api, i)),
        (_, Err(e)) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        (None, _) => None,
    };
    match found {
        Some((_, v)) => Json(v).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({ "Key": key, "Found": false })),
        )
            .into_response(),
    }
}

/// `GET /healthz`.
pub(crate) async fn healthz(State(s): State<HttpState>) -> Response {
    if s.serving.load(Ordering::Acquire) {
        Json(json!({ "status": "ok" })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "shutting down" })),
        )
            .into_response()
    }
}
