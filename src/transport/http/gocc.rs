//! GoCC's direct API over HTTP: `/rate/{key}`, release, `/debug`, `/healthz`; decided by
//! `service::gocc`. Answers are GoCC's (kivra/GoCC `pkg/server/endpoints/endpoint_rate.go`):
//! 200 with the request id as the text body, 429 with no body, 400 and 403 with a text reason,
//! and release always 200 with no body. Text is `text/plain; charset=UTF-8`, as echo's
//! `c.String` writes it.

use std::sync::atomic::Ordering;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::HttpState;
use crate::service::gocc::{GoccAnswer, GoccError, GoccWindow, RawAsk};
use crate::telemetry::{digest, Shown};

/// echo's `MIMETextPlainCharsetUTF8`.
const TEXT: &str = "text/plain; charset=UTF-8";

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    let mut r = (status, body.into()).into_response();
    (r.headers_mut()).insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT));
    r
}

fn error(e: GoccError) -> Response {
    match e {
        GoccError::BadRequest(m) => text(StatusCode::BAD_REQUEST, m),
        GoccError::Forbidden(m) => text(StatusCode::FORBIDDEN, m),
        GoccError::Unavailable(e) => text(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// The first value of `name`, as Go's `url.Values.Get`.
fn first(q: &[(String, String)], name: &str) -> Option<String> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// `POST`/`GET /rate/{key}?canWait=&maxRequests=&maxRequestsInQueue=`.
pub(crate) async fn take(
    State(s): State<HttpState>,
    Path(key): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let raw = RawAsk {
        key,
        can_wait: first(&q, "canWait"),
        max_requests: first(&q, "maxRequests"),
        max_in_queue: first(&q, "maxRequestsInQueue"),
    };
    match s.gocc.take(&raw).await {
        Err(e) => error(e),
        Ok(GoccAnswer::Admitted { id, .. }) => text(StatusCode::OK, id.to_string()),
        Ok(GoccAnswer::Refused { retry_after, .. }) => {
            // No body, as GoCC's `c.NoContent(429)`; Retry-After is turnstile's addition.
            let mut resp = StatusCode::TOO_MANY_REQUESTS.into_response();
            let secs = retry_after.map(|d| d.as_nanos().div_ceil(1_000_000_000) as u64);
            if let Some(v) = secs.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            resp
        }
    }
}

/// `/rate/` with no key: GoCC's 400 for an empty key.
pub(crate) async fn empty_key() -> Response {
    text(StatusCode::BAD_REQUEST, "empty key provided")
}

/// `DELETE /rate/{key}/` with no id: GoCC's 400 for an empty id.
pub(crate) async fn empty_id() -> Response {
    text(StatusCode::BAD_REQUEST, "empty id provided")
}

/// `DELETE /rate/{key}/{request_id}`: gives the admitted hit back; the queue head gets it.
/// 200 whatever the id, as GoCC.
pub(crate) async fn release(
    State(s): State<HttpState>,
    Path((key, request_id)): Path<(String, String)>,
) -> Response {
    match s.gocc.release(&key, &request_id).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => error(e),
    }
}

/// GoCC's `/debug` form of one key's window, the key as the port shows client values.
fn describe(w: &GoccWindow, shown: Shown) -> Value {
    json!({
        "Key": shown.value(&w.key),
        "Config": {
            "WindowMillis": w.window_ms,
            "MaxRequestsPerWindow": w.max_requests,
            "MaxRequestsInQueue": w.max_in_queue,
        },
        "NumApprovedThisWindow": w.approved,
        "NumDeniedThisWindow": w.denied,
        "NumWaiting": w.waiting,
        "Found": true,
    })
}

/// `GET /debug`: every direct API key's window, keyed as the port shows client values.
pub(crate) async fn debug_all(State(s): State<HttpState>) -> Response {
    match s.gocc.windows(None).await {
        Ok(ws) => {
            let instances: Map<String, Value> = (ws.iter())
                .map(|w| (s.shown.value(&w.key).into_owned(), describe(w, s.shown)))
                .collect();
            Json(json!({ "Instances": instances })).into_response()
        }
        Err(e) => error(GoccError::Unavailable(e)),
    }
}

/// `GET /debug/{key}`: one key's window, found by the key or by its digest (`/debug/%23…`,
/// as `/debug` lists keys where it shows digests); 404 "Key not found" when it has none, as
/// GoCC (`pkg/server/endpoints/endpoint_debug.go:22`).
pub(crate) async fn debug_key(State(s): State<HttpState>, Path(key): Path<String>) -> Response {
    let found = match s.gocc.windows(Some(&key)).await {
        Ok(ws) => ws.into_iter().find(|w| w.key == key),
        Err(e) => return error(GoccError::Unavailable(e)),
    };
    let found = match found {
        Some(w) => Some(w),
        None if key.starts_with('#') => match s.gocc.windows(None).await {
            Ok(ws) => ws.into_iter().find(|w| digest(&w.key) == key),
            Err(e) => return error(GoccError::Unavailable(e)),
        },
        None => None,
    };
    match found {
        Some(w) => Json(describe(&w, s.shown)).into_response(),
        None => text(StatusCode::NOT_FOUND, "Key not found"),
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
