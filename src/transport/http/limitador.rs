//! Limitador's HTTP API on the HTTP port, with its JSON and status codes: `/status` (the
//! operator's probes), `/metrics` (Limitador's series, then turnstile's), `/limits/{ns}`,
//! `/counters/{ns}`, `/check`, `/report` and `/check_and_report`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::config::limitador::Limit;
use crate::descriptor::limitador::{namespace_prefix, parse_counter_key};
use crate::descriptor::Entry;
use crate::limiter::State as KeyState;
use crate::service::limitador::{draft_03, set_variables, LimitadorCall, LimitadorService};
use crate::service::metrics::{Door, DoorCalls};
use crate::service::{within_bounds, RequestLimits};
use crate::telemetry::{Registry, Shown};

/// What the Limitador routes share.
#[derive(Clone)]
pub struct LimitadorHttp {
    pub limitador: LimitadorService,
    /// Turnstile's own series, after Limitador's on `/metrics`.
    pub registry: Registry,
    /// How the port shows client values (the metrics' labels from descriptors).
    pub shown: Shown,
    pub started_at: SystemTime,
    /// Every door's calls: `/check`, `/report` and `/check_and_report` count in Limitador's.
    pub calls: Arc<DoorCalls>,
    /// The bounds every door keeps on what a caller sends.
    pub bounds: RequestLimits,
}

pub fn limitador_router(state: LimitadorHttp) -> Router {
    let calls = Router::new()
        .route("/check", post(check))
        .route("/report", post(report))
        .route("/check_and_report", post(check_and_report));
    Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/limits/{namespace}", get(limits))
        .route("/counters/{namespace}", get(counters))
        .merge(super::calls::counted(calls, Door::Limitador, &state.calls))
        .with_state(state)
}

/// A time as Limitador's `/status` writes it (chrono's `NaiveDateTime`, UTC).
fn naive_utc(t: SystemTime) -> String {
    let ts = jiff::Timestamp::try_from(t).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    jiff::tz::TimeZone::UTC
        .to_datetime(ts)
        .strftime("%Y-%m-%dT%H:%M:%S%.f")
        .to_string()
}

/// Every limit served, one per line as `/limits` shows it, for `/rlconfig` and the status page.
pub fn describe_limits(l: &LimitadorService) -> Vec<String> {
    let loaded = l.loaded();
    (loaded.limits.namespaces())
        .flat_map(|(_, n)| n.limits.iter())
        .filter_map(|limit| serde_json::to_string(&LimitJson::from(limit)).ok())
        .collect()
}

/// `/status`, its fields in Limitador's order.
#[derive(Serialize)]
struct StatusJson {
    started_at: String,
    config_applied_at: String,
    config_version: u64,
    config_err_since: u64,
}

async fn status(State(s): State<LimitadorHttp>) -> Response {
    Json(StatusJson {
        started_at: naive_utc(s.started_at),
        config_applied_at: naive_utc(s.limitador.loaded().applied_at),
        config_version: s.limitador.loads().version.load(Relaxed),
        config_err_since: s.limitador.loads().err_since.load(Relaxed),
    })
    .into_response()
}

async fn metrics(State(s): State<LimitadorHttp>) -> Response {
    let mut text = String::with_capacity(8192);
    s.limitador.metrics().render(s.shown, &mut text);
    text.push_str(&s.registry.render(s.shown));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// A limit as `/limits` and `/counters` show it.
#[derive(Serialize)]
struct LimitJson<'a> {
    id: Option<&'a str>,
    namespace: &'a str,
    max_value: u64,
    seconds: u64,
    name: Option<&'a str>,
    conditions: Vec<&'a str>,
    variables: Vec<&'a str>,
}

impl<'a> From<&'a Limit> for LimitJson<'a> {
    fn from(l: &'a Limit) -> LimitJson<'a> {
        LimitJson {
            id: l.id.as_deref(),
            namespace: &l.namespace,
            max_value: l.max_value,
            seconds: l.seconds,
            name: l.name.as_deref(),
            conditions: l.conditions.iter().map(|c| c.text()).collect(),
            variables: l.variables.iter().map(|v| v.text()).collect(),
        }
    }
}

async fn limits(State(s): State<LimitadorHttp>, Path(ns): Path<String>) -> Response {
    let loaded = s.limitador.loaded();
    let limits: Vec<LimitJson<'_>> = (loaded.limits.namespace(&ns).into_iter())
        .flat_map(|n| n.limits.iter().map(LimitJson::from))
        .collect();
    Json(limits).into_response()
}

#[derive(Serialize)]
struct CounterJson<'a> {
    limit: LimitJson<'a>,
    set_variables: BTreeMap<String, String>,
    remaining: Option<u64>,
    expires_in_seconds: Option<u64>,
}

/// Counters a `/counters` answer lists at most, with a store (see `store/redis/scan.rs`).
const MAX_LISTED: usize = 10_000;

/// The namespace's live counters: in memory, this replica's shards'; with a store, the store's,
/// which every replica counts in (at most [`MAX_LISTED`], found by a bounded scan).
async fn counters(State(s): State<LimitadorHttp>, Path(ns): Path<String>) -> Response {
    let engine = s.limitador.engine();
    let prefix = namespace_prefix(&ns);
    let listed = match engine.stored_first_hits(&prefix, MAX_LISTED).await {
        Some(stored) => stored,
        None => engine.inspect(Some(prefix)).await,
    };
    let keys = match listed {
        Ok(k) => k,
        Err(_) => return (StatusCode::INTERNAL_SERVER_ERROR, Json(())).into_response(),
    };
    let loaded = s.limitador.loaded();
    let Some(namespace) = loaded.limits.namespace(&ns) else {
        return Json(Vec::<CounterJson<'_>>::new()).into_response();
    };
    let mut out = Vec::new();
    for k in &keys {
        let KeyState::FromFirstHit { count, end } = k.state else {
            continue;
        };
        let Some((identity, values)) = parse_counter_key(&k.key, &ns) else {
            continue;
        };
        let Some(limit) = namespace.limits.iter().find(|l| l.identity == identity) else {
            continue;
        };
        if end <= k.now || values.len() != limit.variables.len() {
            continue;
        }
        out.push(CounterJson {
            limit: LimitJson::from(limit),
            // A value a client sent, shown as the port shows client values.
            set_variables: (set_variables(limit, &values).into_iter())
                .map(|(k, v)| (k, s.shown.value(&v).into_owned()))
                .collect(),
            remaining: Some(limit.max_value.saturating_sub(u64::from(count))),
            expires_in_seconds: Some((end - k.now) / 1_000_000_000),
        });
    }
    Json(out).into_response()
}

/// `/check`, `/report` and `/check_and_report`'s body.
#[derive(Deserialize)]
struct CallBody {
    namespace: String,
    values: HashMap<String, String>,
    delta: u64,
    response_headers: Option<String>,
}

async fn check(
    State(s): State<LimitadorHttp>,
    body: Result<Json<CallBody>, JsonRejection>,
) -> Response {
    decide(&s, body, LimitadorCall::Check).await
}

async fn report(
    State(s): State<LimitadorHttp>,
    body: Result<Json<CallBody>, JsonRejection>,
) -> Response {
    decide(&s, body, LimitadorCall::Report).await
}

async fn check_and_report(
    State(s): State<LimitadorHttp>,
    body: Result<Json<CallBody>, JsonRejection>,
) -> Response {
    decide(&s, body, LimitadorCall::CheckAndReport).await
}

/// Limitador's answers: 200 with `null` when admitted; limited, 429 with `null` for
/// `/check_and_report` and `Too many requests` for `/check`; a failed call 500 (`null` for
/// `/check_and_report`, `Internal server error` otherwise); a body that is not a request 400
/// naming what is wrong (`Json deserialize error: …`, or `Content type error`).
async fn decide(
    s: &LimitadorHttp,
    body: Result<Json<CallBody>, JsonRejection>,
    ask: LimitadorCall,
) -> Response {
    let text = |code: StatusCode, body: String| {
        let plain = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
        (code, plain, body).into_response()
    };
    let Json(a) = match body {
        Ok(b) => b,
        Err(JsonRejection::MissingJsonContentType(_)) => {
            return text(StatusCode::BAD_REQUEST, "Content type error".into())
        }
        Err(r) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("Json deserialize error: {}", r.body_text()),
            )
        }
    };
    // The HTTP API binds its values as `descriptors[0]`.
    let entries: Vec<Entry<'_>> = (a.values.iter())
        .map(|(k, v)| Entry { key: k, value: v })
        .collect();
    let bounded = within_bounds(&a.namespace, [entries.as_slice()].into_iter(), &s.bounds);
    if let Err(e) = bounded {
        return text(StatusCode::BAD_REQUEST, e.to_string());
    }
    let metered = ask == LimitadorCall::CheckAndReport;
    let descriptors: [&[Entry<'_>]; 1] = [&entries];
    let called = (s.limitador).call(&a.namespace, &descriptors, a.delta, ask, metered);
    let verdict = match called.await {
        Ok(v) => v,
        Err(_) if metered => {
            return (StatusCode::INTERNAL_SERVER_ERROR, Json(())).into_response();
        }
        Err(_) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal server error".into(),
            )
        }
    };
    let limited = verdict.limited && ask != LimitadorCall::Report;
    let mut resp = match (limited, ask) {
        (false, _) => (StatusCode::OK, Json(())).into_response(),
        (true, LimitadorCall::Check) => {
            text(StatusCode::TOO_MANY_REQUESTS, "Too many requests".into())
        }
        (true, _) => (StatusCode::TOO_MANY_REQUESTS, Json(())).into_response(),
    };
    if ask == LimitadorCall::CheckAndReport && a.response_headers.is_some() {
        for (k, v) in draft_03(&verdict.counters) {
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
                resp.headers_mut().insert(k, v);
            }
        }
    }
    resp
}
