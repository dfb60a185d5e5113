//! The admin listener (`TURNSTILE_ADMIN_ADDR`, off by default): `POST /admin/look-up` and
//! `POST /admin/reset`, each taking `/json`'s body (a `RateLimitRequest` in proto3 JSON form);
//! `GET /admin/top`, the heavy hitters with clear values and their digests beside them; and
//! `POST /admin/digest`, the digests of the values given, as this process computes them.
//!
//! Protection: without `TURNSTILE_ADMIN_TOKEN_FILE` the listener must be bound to loopback
//! (settings refuse anything else) and answers loopback callers only; with it, every call must
//! carry `Authorization: Bearer <token>`. Every call is counted by action and outcome
//! (`turnstile_admin_actions_total`); refusals are logged, and resets by the service.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::{json, Value};

use super::admin_stats::{AdminAction, AdminOutcome, AdminStats};
use super::envoy::{JsonError, JsonRequest};
use super::status::TopView;
use crate::hitters::TopTable;
use crate::limiter::{Clock, Role};
use crate::service::{Acted, AdminError, Applies, EnvoyService, LiveLimits, Usage};
use crate::telemetry::{digest, Shown};

/// `TURNSTILE_ADMIN_ADDR` with `true` or a bare port: loopback, this port.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:6071";

/// Bodies as large as `/json` takes (axum's default for it).
const MAX_BODY: usize = 2 << 20;

/// `TURNSTILE_ADMIN_ADDR` and `TURNSTILE_ADMIN_TOKEN_FILE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSettings {
    pub addr: SocketAddr,
    /// When set, every call must present it; required to bind off loopback.
    pub token: Option<AdminToken>,
}

impl AdminSettings {
    /// Refuses a non-loopback address without a token: anyone who reaches it could reset any
    /// limit.
    pub fn check(&self) -> Result<(), String> {
        if self.token.is_some() || self.addr.ip().is_loopback() {
            return Ok(());
        }
        Err(format!(
            "TURNSTILE_ADMIN_ADDR={} is not a loopback address: set TURNSTILE_ADMIN_TOKEN_FILE \
             (callers then send `Authorization: Bearer <token>`) or bind 127.0.0.1",
            self.addr
        ))
    }
}

/// The bearer token callers must present; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// At least 16 visible ASCII characters, so it fits a header and is not guessed.
    pub fn new(text: &str) -> Result<AdminToken, String> {
        let t = text.trim();
        if t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("must hold one token of at least 16 visible ASCII characters".into());
        }
        Ok(AdminToken(t.to_owned()))
    }

    /// Compares in time independent of where the texts differ.
    fn matches(&self, given: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// What the admin handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// Look-ups and resets, planned as requests are.
    pub envoy: EnvoyService,
    pub token: Option<AdminToken>,
    /// What the listener did, by action and outcome.
    pub stats: Arc<AdminStats>,
    /// The live limits and their heavy hitters, for `/admin/top`.
    pub live: LiveLimits,
    pub top: Arc<TopTable>,
    pub clock: Clock,
}

pub fn admin_router(state: AdminState) -> Router {
    Router::new()
        .route("/admin/look-up", post(look_up))
        .route("/admin/reset", post(reset))
        .route("/admin/top", get(top))
        .route("/admin/digest", post(digests))
        .with_state(state)
}

/// A call refused or failed: its outcome (counted) and what the caller is told.
#[derive(Debug)]
struct Refusal {
    outcome: AdminOutcome,
    message: String,
}

impl Refusal {
    fn new(outcome: AdminOutcome, message: impl Into<String>) -> Refusal {
        Refusal {
            outcome,
            message: message.into(),
        }
    }

    fn status(&self) -> StatusCode {
        match self.outcome {
            AdminOutcome::Done => StatusCode::OK,
            AdminOutcome::BadRequest => StatusCode::BAD_REQUEST,
            AdminOutcome::NotFound => StatusCode::NOT_FOUND,
            AdminOutcome::Unauthorized => StatusCode::UNAUTHORIZED,
            AdminOutcome::Forbidden => StatusCode::FORBIDDEN,
            AdminOutcome::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut r = (
            status,
            Json(JsonError {
                error: self.message,
            }),
        )
            .into_response();
        if status == StatusCode::UNAUTHORIZED {
            (r.headers_mut()).insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// The caller may act: it shows the token, or (without one configured) calls from loopback.
fn admit(
    token: Option<&AdminToken>,
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
) -> Result<(), Refusal> {
    let Some(token) = token else {
        if peer.is_some_and(|p| p.ip().is_loopback()) {
            return Ok(());
        }
        let m = "the admin listener answers loopback callers only unless \
                 TURNSTILE_ADMIN_TOKEN_FILE is set";
        return Err(Refusal::new(AdminOutcome::Forbidden, m));
    };
    let given = (headers.get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if token.matches(g.trim()) => Ok(()),
        _ => {
            let why = if given.is_some() {
                "wrong admin token"
            } else {
                "the admin listener needs `Authorization: Bearer <token>` \
                 (the token in TURNSTILE_ADMIN_TOKEN_FILE)"
            };
            Err(Refusal::new(AdminOutcome::Unauthorized, why))
        }
    }
}

impl AdminState {
    /// Admits the caller and reads its query and body; refusals are logged.
    async fn admit_and_read(
        &self,
        action: AdminAction,
        req: Request,
    ) -> Result<(axum::body::Bytes, Vec<(String, String)>), Refusal> {
        let peer = (req.extensions().get::<ConnectInfo<SocketAddr>>()).map(|c| c.0);
        if let Err(refused) = admit(self.token.as_ref(), peer, req.headers()) {
            tracing::warn!(?peer, ?action, status = %refused.status(), "admin call refused");
            return Err(refused);
        }
        let query = Query::<Vec<(String, String)>>::try_from_uri(req.uri())
            .map_err(|e| bad(format!("bad query: {e}")))?
            .0;
        let body = axum::body::to_bytes(req.into_body(), MAX_BODY)
            .await
            .map_err(|e| bad(format!("bad body: {e}")))?;
        Ok((body, query))
    }

    /// Admits the caller and reads a `RateLimitRequest` body and the query.
    async fn read(
        &self,
        action: AdminAction,
        req: Request,
    ) -> Result<(RateLimitRequest, Vec<(String, String)>), Refusal> {
        let (body, query) = self.admit_and_read(action, req).await?;
        let parsed: JsonRequest =
            serde_json::from_slice(&body).map_err(|e| bad(format!("bad JSON body: {e}")))?;
        Ok((parsed.into_proto().map_err(bad)?, query))
    }

    fn count(&self, action: AdminAction, outcome: AdminOutcome) {
        self.stats.count(action, outcome);
    }

    /// The answer to an action: its JSON, or the refusal or failure; counted either way.
    fn answer(&self, action: AdminAction, result: Result<Value, Refusal>) -> Response {
        match result {
            Ok(body) => {
                self.count(action, AdminOutcome::Done);
                Json(body).into_response()
            }
            Err(refused) => {
                self.count(action, refused.outcome);
                refused.into_response()
            }
        }
    }
}

fn bad(m: String) -> Refusal {
    Refusal::new(AdminOutcome::BadRequest, m)
}

/// `GET /admin/top[?domain=&limit=]`: `/debug/top`'s lists with clear values, each with
/// `digest`, the form listeners without authentication show. 400 names a bad filter.
async fn top(State(s): State<AdminState>, req: Request) -> Response {
    let action = AdminAction::Top;
    let result = async {
        let (_, query) = s.admit_and_read(action, req).await?;
        let view = TopView {
            live: &s.live,
            table: &s.top,
            now_ns: s.clock.now(),
        };
        view.render(&query, Shown::Clear, true).map_err(bad)
    };
    let result = result.await;
    s.answer(action, result)
}

/// `POST /admin/digest` with `{"values": ["...", ...]}`: each value's digest under this
/// process's key, as the heavy hitters, GoCC's `/debug` and the logs show it.
async fn digests(State(s): State<AdminState>, req: Request) -> Response {
    let action = AdminAction::Digest;
    let result = async {
        let (body, _) = s.admit_and_read(action, req).await?;
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Values {
            values: Vec<String>,
        }
        let v: Values =
            serde_json::from_slice(&body).map_err(|e| bad(format!("bad JSON body: {e}")))?;
        let out: serde_json::Map<String, Value> = (v.values.iter())
            .map(|x| (x.clone(), json!(digest(x))))
            .collect();
        Ok(json!({ "digests": out }))
    };
    let result = result.await;
    s.answer(action, result)
}

fn failed(e: AdminError) -> Refusal {
    match e {
        AdminError::BadRequest(m) => Refusal::new(AdminOutcome::BadRequest, m),
        AdminError::NotFound(m) => Refusal::new(AdminOutcome::NotFound, m),
        AdminError::Unavailable(m) => Refusal::new(AdminOutcome::Unavailable, m),
    }
}

/// `POST /admin/look-up`: every limit that applies to the body's descriptors with what it has
/// used, counting nothing. 200; 400 bad body; 404 unknown domain or a descriptor without a
/// limit; 401/403 refused; 503 Redis unreachable.
async fn look_up(State(s): State<AdminState>, req: Request) -> Response {
    let action = AdminAction::LookUp;
    let result = async {
        let (req, query) = s.read(action, req).await?;
        if let Some((k, _)) = query.first() {
            let m = format!("unknown query parameter {k:?} (a look-up takes none)");
            return Err(Refusal::new(AdminOutcome::BadRequest, m));
        }
        let found = s.envoy.look_up(&req).await.map_err(failed)?;
        let limits: Vec<Value> = found.iter().map(looked_json).collect();
        Ok(json!({ "domain": req.domain, "limits": limits }))
    };
    let result = result.await;
    s.answer(action, result)
}

/// `POST /admin/reset[?limit=<name>]`: counts the body's descriptors from zero on every limit
/// that applies, or only the named one. Statuses as for the look-up.
async fn reset(State(s): State<AdminState>, req: Request) -> Response {
    let action = AdminAction::Reset;
    let result = async {
        let (req, query) = s.read(action, req).await?;
        let mut only = None;
        for (k, v) in &query {
            let m = match k.as_str() {
                "limit" if v.is_empty() => {
                    "limit= is empty: name the limit (its name: in the config), or leave \
                     ?limit= out to reset every limit that applies"
                        .to_owned()
                }
                "limit" if only.is_none() => {
                    only = Some(v.as_str());
                    continue;
                }
                "limit" => "limit= is given twice".to_owned(),
                _ => format!("unknown query parameter {k:?} (known: limit)"),
            };
            return Err(Refusal::new(AdminOutcome::BadRequest, m));
        }
        let done = s.envoy.reset(&req, only).await.map_err(failed)?;
        let limits: Vec<Value> = done.iter().map(reset_json).collect();
        Ok(json!({ "domain": req.domain, "limits": limits }))
    };
    let result = result.await;
    s.answer(action, result)
}

fn applies_json(a: &Applies) -> serde_json::Map<String, Value> {
    let role = match a.role {
        Role::Binding => "binding",
        Role::Joint(_) => "quota",
        Role::Shadow => "shadow",
    };
    let v = json!({
        "descriptor": a.descriptor,
        "name": a.name,
        "key": a.key,
        "unit": a.unit.name(),
        "unit_multiplier": a.unit_multiplier,
        "calendar": a.calendar,
        "requests_per_unit": a.requests_per_unit,
        "algorithm": a.algorithm.name(),
        "role": role,
        "unlimited": a.unlimited,
        "reserve": a.reserve,
        "overlay": a.overlay,
    });
    match v {
        Value::Object(o) => o,
        _ => unreachable!("json! of braces is an object"),
    }
}

const NS: u64 = 1_000_000_000;

fn looked_json(a: &Acted<Usage>) -> Value {
    let mut o = applies_json(&a.limit);
    if let Some(u) = &a.done {
        o.insert("used".into(), json!(u.used));
        o.insert("held".into(), json!(u.held));
        o.insert("remaining".into(), json!(u.remaining));
        o.insert(
            "resets_in_seconds".into(),
            json!(u.resets_in_ns.div_ceil(NS)),
        );
        let at = u.now.saturating_add(u.resets_in_ns).div_ceil(NS);
        o.insert("resets_at".into(), json!(at));
        o.insert("waiting".into(), json!(u.waiting));
    }
    Value::Object(o)
}

fn reset_json(a: &Acted<Option<u64>>) -> Value {
    let mut o = applies_json(&a.limit);
    o.insert("reset".into(), json!(a.done.is_some()));
    if let Some(Some(n)) = a.done {
        o.insert("store_keys_deleted".into(), json!(n));
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    fn outcome(r: Result<(), Refusal>) -> Option<(AdminOutcome, StatusCode)> {
        r.err().map(|refused| (refused.outcome, refused.status()))
    }

    /// Without a token only loopback callers act (the listener is bound to loopback then, so
    /// this is the second fence); with one, every caller shows it, loopback or not.
    #[test]
    fn callers_need_loopback_or_the_token() {
        let local: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let remote: SocketAddr = "203.0.113.7:40000".parse().unwrap();
        assert_eq!(outcome(admit(None, Some(local), &headers(None))), None);
        assert_eq!(
            outcome(admit(None, Some(remote), &headers(None))),
            Some((AdminOutcome::Forbidden, StatusCode::FORBIDDEN))
        );
        assert!(outcome(admit(None, None, &headers(None))).is_some());
        let token = AdminToken::new("0123456789abcdef-token\n").unwrap();
        let t = Some(&token);
        let unauthorized = Some((AdminOutcome::Unauthorized, StatusCode::UNAUTHORIZED));
        assert_eq!(outcome(admit(t, Some(local), &headers(None))), unauthorized);
        let wrong = headers(Some("Bearer 0123456789abcdef-tokeN"));
        assert_eq!(outcome(admit(t, Some(remote), &wrong)), unauthorized);
        let basic = headers(Some("Basic 0123456789abcdef-token"));
        assert_eq!(outcome(admit(t, Some(local), &basic)), unauthorized);
        let right = headers(Some("Bearer 0123456789abcdef-token"));
        assert_eq!(outcome(admit(t, Some(remote), &right)), None);
    }

    #[test]
    fn tokens_are_long_visible_and_never_printed() {
        assert!(AdminToken::new("short").is_err());
        assert!(AdminToken::new("has a space in the middle").is_err());
        let t = AdminToken::new("0123456789abcdef").unwrap();
        assert_eq!(format!("{t:?}"), "AdminToken(<redacted>)");
    }
}
