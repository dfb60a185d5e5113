//! What every HTTP port keeps, whichever door serves on it: how long a client may take to send
//! a request's headers and body, how long a connection may sit idle, and how large a body may
//! be. The server applies them to every listener (`server/http_conn.rs`); the body's bound and
//! timeout are this layer, so a route cannot read more than the bound, or wait longer.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// `TURNSTILE_HTTP_HEADER_TIMEOUT`, `TURNSTILE_HTTP_BODY_TIMEOUT`, `TURNSTILE_HTTP_IDLE_TIMEOUT`
/// and the body's bound (`max_message_bytes`, as gRPC's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpBounds {
    /// From the first byte the server waits for (on a kept-alive connection, from the end of
    /// the previous answer) to the end of the request's headers; then the connection closes.
    pub headers: Duration,
    /// From the end of the headers to the end of the body; then 408 and the connection closes.
    pub body: Duration,
    /// A connection with no request in flight for this long is closed (HTTP/2's too).
    pub idle: Duration,
    /// A body over this many bytes is answered 413.
    pub max_body_bytes: usize,
}

impl Default for HttpBounds {
    fn default() -> HttpBounds {
        HttpBounds {
            headers: Duration::from_secs(60),
            body: Duration::from_secs(60),
            idle: Duration::from_secs(120),
            max_body_bytes: 1 << 20,
        }
    }
}

fn plain(code: StatusCode, text: String) -> Response {
    let close = [
        (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
        (header::CONNECTION, "close"),
    ];
    (code, close, text).into_response()
}

/// Reads the body within the bounds before the route sees it: over the bound, 413 naming it;
/// not ended in time, 408. Either closes the connection, as what is left of the body is unread.
pub async fn bound_body(bounds: HttpBounds, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let max = bounds.max_body_bytes;
    let declared = (parts.headers.get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let over = || {
        plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is over {max} bytes, the limit\n"),
        )
    };
    if declared.is_some_and(|n| n > max as u64) {
        return over();
    }
    let read = tokio::time::timeout(bounds.body, axum::body::to_bytes(body, max)).await;
    let bytes = match read {
        Ok(Ok(b)) => b,
        // `Limited`'s error says "length limit exceeded"; anything else is a broken body.
        Ok(Err(e)) if e.to_string().contains("length limit") => return over(),
        Ok(Err(e)) => {
            return plain(StatusCode::BAD_REQUEST, format!("request body: {e}\n"));
        }
        Err(_) => {
            let secs = bounds.body.as_secs_f64();
            let text = format!("request body not received within {secs} s\n");
            return plain(StatusCode::REQUEST_TIMEOUT, text);
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
