//! GoCC's direct API over HTTP: `/rate/{key}`, release, `/debug`, `/healthz`; decided by
//! `service::rate`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::HttpState;
use crate::service::rate::{self, RateAnswer, RateAsk, RateError, RateWindow};

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

/// Whole milliseconds, rounded up (a caller that waits this long is not early).
fn ms_ceil(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1_000_000) as u64
}

/// `POST`/`GET /rate/{key}?canWait=&maxRequests=&maxRequestsInQueue=`.
pub(crate) async fn take(
    State(s): State<HttpState>,
    Path(key): Path<String>,
    Query(q): Query<RateQuery>,
) -> Response {
    let ask = RateAsk {
        key,
        can_wait: q.can_wait.unwrap_or(false),
        max_requests: q.max_requests,
        max_in_queue: q.max_in_queue,
    };
    let key = &ask.key;
    match rate::take(&s.limiter, &ask).await {
        Err(RateError::NotFound(m)) => error(StatusCode::NOT_FOUND, m),
        Err(RateError::Invalid(m)) => error(StatusCode::BAD_REQUEST, m),
        Err(RateError::Unavailable(e)) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Ok(RateAnswer::Admitted {
            id,
            remaining,
            reset,
            waited,
        }) => Json(json!({
            "request_id": format!("{id:x}"),
            "key": key,
            "remaining": remaining,
            "reset_ms": ms_ceil(reset),
            "waited_ms": waited.as_millis() as u64,
        }))
        .into_response(),
        Ok(RateAnswer::Refused {
            timed_out,
            retry_after,
        }) => {
            let retry_ms = retry_after.map(ms_ceil);
            let body = json!({
                "key": key,
                "error": if timed_out { "waited too long" } else { "rate limit exceeded" },
                "retry_after_ms": retry_ms,
            });
            let mut resp = (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
            if let Some(v) = retry_ms.and_then(|ms| ms.div_ceil(1000).to_string().parse().ok()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            resp
        }
    }
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
    match rate::release(&s.limiter, &key, id).await {
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

/// GoCC's `/debug` form of one key's window.
fn describe(w: &RateWindow) -> Value {
    json!({
        "Key": w.key,
        "Config": {
            "WindowMillis": w.window_ms,
            "MaxRequestsPerWindow": w.max_requests,
            "MaxRequestsInQueue": w.max_in_queue,
            "MaxWaitMillis": w.max_wait_ms,
        },
        "NumApprovedThisWindow": w.approved,
        "NumDeniedThisWindow": w.denied,
        "NumWaiting": w.waiting,
        "Found": true,
    })
}

/// `GET /debug`: every direct API key's window.
pub(crate) async fn debug_all(State(s): State<HttpState>) -> Response {
    match rate::windows(&s.limiter, None).await {
        Ok(ws) => {
            let instances: Map<String, Value> =
                ws.iter().map(|w| (w.key.clone(), describe(w))).collect();
            Json(json!({ "Instances": instances })).into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `GET /debug/{key}`: one key's window (404 with `"Found": false` when it has none).
pub(crate) async fn debug_key(State(s): State<HttpState>, Path(key): Path<String>) -> Response {
    match rate::windows(&s.limiter, Some(&key)).await {
        Ok(ws) => match ws.first() {
            Some(w) => Json(describe(w)).into_response(),
            None => (
                StatusCode::NOT_FOUND,
                Json(json!({ "Key": key, "Found": false })),
            )
                .into_response(),
        },
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
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
