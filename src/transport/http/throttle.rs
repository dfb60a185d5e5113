//! `POST /throttle`: ThrottleCrab's HTTP API (`throttlecrab-server/src/transport/http.rs`),
//! decided and answered like RESP's `THROTTLE` (see `service::throttle`).

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::HttpState;
use crate::service::throttle::{ThrottleError, ThrottleRequest};

/// ThrottleCrab's `HttpThrottleRequest` (`transport/http.rs`): fields it does not know are
/// ignored, as serde does there.
#[derive(Debug, Deserialize)]
struct Body {
    key: String,
    max_burst: i64,
    count_per_period: i64,
    period: i64,
    /// Optional, and may be null, as in ThrottleCrab's `HttpThrottleRequest`: 1 then.
    #[serde(default)]
    quantity: Option<i64>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// 200 with ThrottleCrab's `ThrottleResponse` whether allowed or not, as ThrottleCrab answers
/// (`http.rs:139-146`: a refusal is `"allowed": false`, not an HTTP error; `Retry-After` is added
/// to a refusal); 400 bad body or parameters over the caps, 503 no decision.
/// Callers off loopback get 403 unless `TURNSTILE_THROTTLE_ALLOW_REMOTE=true`.
pub(crate) async fn handle(State(s): State<HttpState>, req: Request) -> Response {
    let limits = &s.throttle_limits;
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    if !caller_allowed(peer, limits.allow_remote) {
        return error(
            StatusCode::FORBIDDEN,
            "/throttle answers loopback callers only (TURNSTILE_THROTTLE_ALLOW_REMOTE=true opens it)",
        );
    }
    // Bodies are a few fields: 64 KiB is plenty, and bounds what a caller can make us hold.
    let body = match axum::body::to_bytes(req.into_body(), 64 << 10).await {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad body: {e}")),
    };
    let b: Body = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            s.throttle.count_unread();
            return error(StatusCode::BAD_REQUEST, format!("bad JSON body: {e}"));
        }
    };
    let req = ThrottleRequest {
        key: b.key,
        max_burst: b.max_burst,
        count_per_period: b.count_per_period,
        period: b.period,
        quantity: b.quantity.unwrap_or(1),
    };
    match s.throttle.throttle(limits, &req).await {
        Ok(a) => {
            let mut resp = Json(json!({
                "allowed": a.allowed,
                "limit": a.limit,
                "remaining": a.remaining,
                "reset_after": a.reset_after,
                "retry_after": a.retry_after,
            }))
            .into_response();
            if !a.allowed {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(a.retry_after));
            }
            resp
        }
        Err(e @ ThrottleError::Invalid(_)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Loopback callers always; others only when allowed. An unknown peer counts as remote.
fn caller_allowed(peer: Option<SocketAddr>, allow_remote: bool) -> bool {
    allow_remote || peer.is_some_and(|a| a.ip().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::caller_allowed;

    #[test]
    fn only_loopback_unless_remote_is_allowed() {
        let v4 = "127.0.0.1:5000".parse().ok();
        let v6 = "[::1]:5000".parse().ok();
        let remote = "192.0.2.7:5000".parse().ok();
        assert!(caller_allowed(v4, false) && caller_allowed(v6, false));
        assert!(!caller_allowed(remote, false));
        assert!(
            !caller_allowed(None, false),
            "unknown peer counts as remote"
        );
        assert!(caller_allowed(remote, true));
    }
}
