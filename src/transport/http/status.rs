//! The operator's view on the debug port: `/debug/top` (heavy hitters per limit),
//! `/debug/status` (limits, their stats, shards, breaker, config loads) and the status page
//! at `/` that shows both and refreshes itself.

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use super::DebugState;
use crate::config::{Config, Level, Node};
use crate::hitters::{TopLists, TopTable, WINDOW_SECS};
use crate::limiter::{BreakerState, EngineStats};
use crate::service::metrics::{CallStats, Door, DoorCalls, Failed, RequestStats};
use crate::service::LiveLimits;
use crate::service::ReloadStats;
use crate::telemetry::{digest, Shown};

/// The status page: one file, no external assets.
const PAGE: &str = include_str!("status.html");

/// What `/` lists for clients that do not ask for HTML (as envoyproxy/ratelimit's debug port).
pub(super) const ENDPOINTS: &str =
    "/rlconfig: print out the currently loaded configuration for debugging\n\
     /metrics: Prometheus exposition of the service's metrics (off with USE_PROMETHEUS=false)\n\
     /debug/top: heavy hitters per limit as JSON (?domain=...&limit=<stat key>)\n\
     /debug/status: limits, their counters, shards, breaker and config loads as JSON\n";

/// `/`: the status page for browsers (`Accept: text/html`), the endpoint list otherwise.
pub(super) async fn root(headers: HeaderMap) -> Response {
    let html = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/html"));
    if html {
        ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
    } else {
        ([(header::CONTENT_TYPE, "text/plain")], ENDPOINTS).into_response()
    }
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": message }))).into_response()
}

/// The `domain` and `limit` filters of `/debug/top`, checked against the live config.
fn filters(
    query: &[(String, String)],
    config: &Config,
) -> Result<(Option<String>, Option<String>), String> {
    let (mut domain, mut limit) = (None, None);
    for (k, v) in query {
        let slot = match k.as_str() {
            "domain" => &mut domain,
            "limit" => &mut limit,
            _ => {
                return Err(format!(
                    "unknown query parameter {k:?} (known: domain, limit)"
                ))
            }
        };
        if v.is_empty() {
            return Err(format!("{k}= needs a value"));
        }
        if slot.replace(v.clone()).is_some() {
            return Err(format!("{k}= is given twice"));
        }
    }
    if let Some(d) = &domain {
        if config.domain(d).is_none() {
            let mut known: Vec<&str> = config.domains.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(format!(
                "no domain {d:?} in the loaded config (domains: {})",
                known.join(", ")
            ));
        }
    }
    if let Some(l) = &limit {
        let mut found = false;
        config.for_each_node(&mut |n| found |= *n.stat_key == **l && !n.limits.is_empty());
        if !found {
            return Err(format!(
                "no limit with stat key {l:?} in the loaded config (see /rlconfig)"
            ));
        }
        if let Some(d) = &domain {
            if !l.starts_with(&format!("{d}.")) {
                return Err(format!("limit {l:?} is not in domain {d:?}"));
            }
        }
    }
    Ok((domain, limit))
}

#[derive(Serialize)]
struct LimitTopJson {
    domain: String,
    /// The limit's stat key, as `/rlconfig` and the Prometheus series name it.
    limit: String,
    /// Each of the node's limits' windows (`1 minute`, `5 minute`, `1 month in Europe/Berlin`):
    /// a list's counts are the heavy hitters' own two minutes, not these windows.
    windows: Vec<String>,
    #[serde(flatten)]
    lists: TopLists,
}

/// `/debug/top`: per domain and limit, the top values by refused hits and by hits over the
/// current and the previous window, each descriptor value shown as the port shows client
/// values. 400 names a bad filter.
pub(super) async fn top(
    State(s): State<DebugState>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let view = TopView {
        live: &s.metrics.live,
        table: &s.top,
        now_ns: s.clock.now(),
    };
    match view.render(&query, s.shown, false) {
        Ok(body) => Json(body).into_response(),
        Err(m) => bad_request(m),
    }
}

/// What the heavy-hitter lists are read from.
pub(super) struct TopView<'a> {
    pub(super) live: &'a LiveLimits,
    pub(super) table: &'a TopTable,
    pub(super) now_ns: u64,
}

impl TopView<'_> {
    /// The lists `query` asks for (`domain`, `limit`), values shown as `shown` says, and with
    /// `with_digests` each value's digest beside it; the error names a bad filter.
    pub(super) fn render(
        &self,
        query: &[(String, String)],
        shown: Shown,
        with_digests: bool,
    ) -> Result<Value, String> {
        let live = self.live.load_full();
        let (domain, limit) = filters(query, &live.config)?;
        let table = self.table;
        table.tick(self.now_ns);
        let now = table.now_s();
        let mut limits = Vec::new();
        for (name, node, fixed) in nodes_with_limits(&live.config) {
            let wanted = domain.as_ref().is_none_or(|d| *d == name)
                && limit.as_ref().is_none_or(|l| **l == *node.stat_key);
            let Some(t) = live.top.of(node).filter(|_| wanted) else {
                continue;
            };
            // Only what clients send is a client value: a value the config fixes (`tokens:
            // input`) is the config's, shown as written.
            let client = |i: usize, x: &str| match fixed.get(i) {
                Some(true) => x.to_owned(),
                _ => digest(x),
            };
            let mut lists = t.lists(now, table.top_n());
            for v in lists.by_refused.iter_mut().chain(&mut lists.by_hits) {
                if with_digests {
                    let mut d = v.clone();
                    d.show_values(&client);
                    v.digest = Some(d.value);
                }
                if shown == Shown::Digest {
                    v.show_values(&client);
                }
            }
            limits.push(LimitTopJson {
                domain: name.to_owned(),
                limit: node.stat_key.to_string(),
                windows: node.limits.iter().map(|l| l.window_text()).collect(),
                lists,
            });
        }
        Ok(json!({
            "now": now,
            "window_seconds": WINDOW_SECS,
            "top_n": table.top_n(),
            "sample": table.sample(),
            "values": shown.name(),
            "limits": limits,
        }))
    }
}

/// A node with limits, in its domain, with whether the config fixes the value at each depth
/// of its path (an exact `value:`; no value or a wildcard takes the client's).
type ListedNode<'c> = (&'c str, &'c Node, Vec<bool>);

/// Every node with limits, domains sorted, nodes in listing order.
fn nodes_with_limits(config: &Config) -> Vec<ListedNode<'_>> {
    fn walk<'c>(
        domain: &'c str,
        level: &'c Level,
        path: &mut Vec<bool>,
        out: &mut Vec<ListedNode<'c>>,
    ) {
        for n in level.nodes() {
            path.push(n.fixes_value());
            if !n.limits.is_empty() {
                out.push((domain, n, path.clone()));
            }
            walk(domain, &n.children, path, out);
            path.pop();
        }
    }
    let mut names: Vec<&String> = config.domains.keys().collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        walk(name, &config.domains[name].root, &mut Vec::new(), &mut out);
    }
    out
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Every door's calls, summed.
fn summed(calls: &DoorCalls, f: &dyn Fn(&CallStats) -> u64) -> u64 {
    (Door::ALL.iter()).map(|d| f(calls.door(*d))).sum()
}

/// `/debug/status`: what the status page shows besides the heavy hitters. Stats are
/// totals since start; the page turns them into rates between two reads.
pub(super) async fn status(State(s): State<DebugState>) -> Response {
    let live = s.metrics.live.load_full();
    let counters = &s.status;
    let m = &*counters.requests;
    let lines = s.metrics.describe();
    let mut rules: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in &lines {
        if let Some((key, rule)) = line.split_once(": ") {
            rules.entry(key).or_default().push(rule);
        }
    }
    let limits: Vec<Value> = nodes_with_limits(&live.config)
        .into_iter()
        .map(|(domain, node, _)| {
            let st = live.stats.of(node);
            json!({
                "domain": domain,
                "limit": &*node.stat_key,
                "rules": rules.get(&*node.stat_key).cloned().unwrap_or_default(),
                "total_hits": load(&st.total_hits),
                "over_limit": load(&st.over_limit),
                "near_limit": load(&st.near_limit),
                "shadow_mode": load(&st.shadow_mode),
            })
        })
        .collect();
    let shards: Vec<Value> = (counters.shards.shards.iter())
        .zip(counters.shards.breakers())
        .map(|(st, breaker_state)| {
            let st = st.read();
            let ended = st.holds_reported + st.holds_expired + st.holds_withdrawn;
            json!({
                "keys": st.keys,
                "waiting": st.waiting,
                "queue_full": st.queue_full,
                // Holds of limits with `reserve`: made and not ended yet (one that expired
                // unseen in a store ends when its key is next decided), and those expired.
                "holds": st.holds_made.saturating_sub(ended),
                "holds_expired": st.holds_expired,
                "breaker": breaker(breaker_state),
            })
        })
        .collect();
    let mut version = fnv::FnvHasher::default();
    for line in &lines {
        version.write(line.as_bytes());
        version.write(b"\n");
    }
    let calls = |f: &dyn Fn(&CallStats) -> u64| summed(&counters.calls, f);
    let reloads = &counters.reloads;
    let last = reloads.log.last();
    let (loads, load_errors) = reloads.counts();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Json(json!({
        "now": now,
        "backend": s.storage,
        "config": {
            "version": format!("{:016x}", version.finish()),
            "limits": lines.len(),
            "loads": loads,
            "load_errors": load_errors,
            "live": last.live,
            "last_attempt": last.attempt,
        },
        "requests": {
            "total": calls(&|c: &CallStats| load(&c.requests)),
            "total_hits": load(&m.all.total_hits),
            "over_limit": load(&m.all.over_limit),
            "invalid_argument": calls(&|c: &CallStats| c.failed(Failed::InvalidArgument)),
            "overloaded": calls(&|c: &CallStats| c.failed(Failed::Overloaded)),
            "unavailable": calls(&|c: &CallStats| c.failed(Failed::Unavailable)),
        },
        "limits": limits,
        "shards": shards,
    }))
    .into_response()
}

/// The stats the status page reads besides the live limits': `ShouldRateLimit`'s, the
/// shards', the config loads'.
#[derive(Clone)]
pub struct StatusStats {
    pub requests: Arc<RequestStats>,
    /// Every door's calls.
    pub calls: Arc<DoorCalls>,
    pub shards: EngineStats,
    pub reloads: Arc<ReloadStats>,
}

fn breaker(state: u64) -> &'static str {
    BreakerState::from_gauge(state).map_or("unknown", BreakerState::name)
}
