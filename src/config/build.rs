//! Validation: parsed YAML (or xDS resources) → the typed limit tree, every rule violation
//! reported with the file and the path inside it.

use std::sync::Arc;
use std::time::Duration;

use fnv::{FnvHashMap, FnvHashSet};

mod reserve;

use super::grammar::parse_bounded_duration;
use super::raw::{self, RawDescriptor, RawFile, RawRateLimit};
use super::{
    Algorithm, Calendar, Config, ConfigError, Domain, Level, LoadOptions, Node, QueueSpec, RateApi,
    RateApiKey, RateLimit, Unit,
};

#[derive(Default)]
pub(super) struct Builder {
    domains: FnvHashMap<String, Domain>,
    /// Which file defined each domain, for the duplicate-domain error.
    domain_files: FnvHashMap<String, String>,
    rate_api: Option<RateApi>,
    rate_api_file: Option<String>,
}

struct Ctx<'a> {
    file: &'a str,
    domain: &'a str,
}

impl Ctx<'_> {
    fn err(&self, path: &str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            path: path.to_owned(),
            message: message.into(),
        }
    }
}

/// Parses one YAML file; type errors and unknown keys are reported here, rules in `add_raw`.
pub(super) fn parse_file(file: &str, text: &str) -> Result<RawFile, ConfigError> {
    serde_yaml::from_str(text).map_err(|e| ConfigError {
        file: file.to_owned(),
        path: String::new(),
        message: yaml_message(&e),
    })
}

impl Builder {
    pub(super) fn finish(mut self) -> Config {
        let mut next = 0;
        for d in self.domains.values_mut() {
            d.root.finish();
            number(&mut d.root, &mut next);
        }
        Config {
            domains: self.domains,
            rate_api: self.rate_api,
            gocc: None,
            node_count: next,
        }
    }

    pub(super) fn add_raw(
        &mut self,
        file: &str,
        raw: RawFile,
        opts: LoadOptions,
    ) -> Result<(), ConfigError> {
        let domain = raw.domain.unwrap_or_default();
        let ctx = Ctx {
            file,
            domain: &domain,
        };
        if let Some(api) = raw.rate_api {
            if let Some(first) = &self.rate_api_file {
                return Err(ctx.err(
                    "rate_api",
                    format!("rate_api is already defined in {first}; define it once"),
                ));
            }
            self.rate_api = Some(build_rate_api(&ctx, api)?);
            self.rate_api_file = Some(file.to_owned());
            if domain.is_empty() && raw.descriptors.is_none() {
                return Ok(());
            }
        }
        if domain.is_empty() {
            return Err(ctx.err("domain", "domain must not be empty"));
        }
        let mut root = match self.domains.remove(&domain) {
            Some(existing) if opts.merge_domains => existing.root,
            Some(existing) => {
                let first = self.domain_files[&domain].clone();
                self.domains.insert(domain.clone(), existing);
                return Err(ctx.err(
                    "domain",
                    format!("duplicate domain \"{domain}\" (already defined in {first})"),
                ));
            }
            None => Level::default(),
        };
        add_level(
            &ctx,
            &mut root,
            raw.descriptors.unwrap_or_default(),
            "descriptors",
            &domain,
        )?;
        self.domain_files
            .entry(domain.clone())
            .or_insert_with(|| file.to_owned());
        self.domains.insert(
            domain.clone(),
            Domain {
                name: domain.clone(),
                root,
            },
        );
        Ok(())
    }
}

/// serde_yaml's message already carries the path and the line; keep it as it is.
fn yaml_message(e: &serde_yaml::Error) -> String {
    let msg = e.to_string();
    if msg.contains("unknown field") {
        format!("unknown key: {msg}")
    } else {
        msg
    }
}

fn add_level(
    ctx: &Ctx<'_>,
    level: &mut Level,
    raws: Vec<RawDescriptor>,
    path: &str,
    parent_stat: &str,
) -> Result<(), ConfigError> {
    // The level's `key_value` names, for the duplicate check: one look-up a node, so a level of
    // any size loads in linear time.
    let mut names: FnvHashSet<String> = level
        .nodes()
        .map(|n| composite(&n.key, n.value.as_deref()))
        .collect();
    // Room for each key's exact values at once: grown by doubling, the vectors would leave
    // their outgrown copies in the allocator's pages for as long as the config lives.
    let mut exact: FnvHashMap<&str, usize> = FnvHashMap::default();
    for raw in &raws {
        if let (Some(k), Some(v)) = (&raw.key, &raw.value) {
            if !v.is_empty() && !v.contains('*') {
                *exact.entry(k.as_str()).or_default() += 1;
            }
        }
    }
    for (k, n) in exact {
        level.group_to_fill(k).exact.reserve(n);
    }
    for (i, raw) in raws.into_iter().enumerate() {
        let here = format!("{path}[{i}]");
        // The level's one copy of the key, shared by its nodes.
        let key = Arc::clone(&level.group_to_fill(raw.key.as_deref().unwrap_or("")).key);
        let node = build_node(ctx, raw, key, &here, parent_stat)?;
        insert_node(ctx, level, &mut names, node, &here)?;
    }
    Ok(())
}

/// `key_value` (or `key`), as envoyproxy/ratelimit names a node in keys and stats.
fn composite(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{key}_{v}"),
        None => key.to_owned(),
    }
}

/// One descriptor and, below it, its children.
fn build_node(
    ctx: &Ctx<'_>,
    raw: RawDescriptor,
    key: Arc<str>,
    here: &str,
    parent_stat: &str,
) -> Result<Node, ConfigError> {
    if key.is_empty() {
        return Err(ctx.err(&format!("{here}.key"), "descriptor key must not be empty"));
    }
    let value = raw.value.clone().filter(|v| !v.is_empty());
    let stat_key: Arc<str> = format!("{parent_stat}.{}", composite(&key, value.as_deref())).into();
    let is_wildcard = value.as_deref().is_some_and(|v| v.contains('*'));
    if raw.share_threshold && !is_wildcard {
        return Err(ctx.err(
            &format!("{here}.share_threshold"),
            "share_threshold needs a value with a '*' wildcard",
        ));
    }
    let limits = build_limits(ctx, &raw, here)?;
    let metadata = match raw.metadata {
        None => None,
        Some(m) => match serde_json::to_value(&m) {
            Ok(serde_json::Value::Object(o)) => Some(o),
            _ => {
                return Err(ctx.err(
                    &format!("{here}.metadata"),
                    "metadata must be a map with string keys",
                ))
            }
        },
    };
    let mut node = Node {
        key,
        value: value.map(String::into_boxed_str),
        limits: limits.into_boxed_slice(),
        children: Level::default(),
        shadow_mode: raw.shadow_mode,
        quota_mode: raw.quota_mode,
        detailed_metric: raw.detailed_metric,
        value_to_metric: raw.value_to_metric,
        share_threshold: raw.share_threshold,
        metadata,
        stat_key,
        origin: format!("{}: {here}", ctx.file).into(),
        index: 0,
    };
    if let Some(children) = raw.descriptors {
        let path = format!("{here}.descriptors");
        let stat = node.stat_key.clone();
        add_level(ctx, &mut node.children, children, &path, &stat)?;
    }
    Ok(node)
}

/// Files `node` into its level: exact, wildcard (in file order) or key-only; `names` holds the
/// level's `key_value` names so far.
fn insert_node(
    ctx: &Ctx<'_>,
    level: &mut Level,
    names: &mut FnvHashSet<String>,
    node: Node,
    here: &str,
) -> Result<(), ConfigError> {
    let name = composite(&node.key, node.value.as_deref());
    let dup = || {
        ctx.err(
            here,
            format!("duplicate composite key \"{}.{name}\"", ctx.domain),
        )
    };
    // The reference compares `key_value` strings, so "a_b"+"c" and "a"+"b_c" collide too.
    if names.contains(&name) {
        return Err(dup());
    }
    let group = level.group_to_fill(&node.key);
    let pattern = node.value.as_deref().map(|v| v.contains('*'));
    match pattern {
        None => group.default = Some(Box::new(node)),
        Some(true) => group.wildcards.push(node),
        Some(false) => {
            if !group.exact.insert(node) {
                return Err(dup());
            }
        }
    }
    names.insert(name);
    Ok(())
}

fn build_limits(
    ctx: &Ctx<'_>,
    raw: &RawDescriptor,
    here: &str,
) -> Result<Vec<RateLimit>, ConfigError> {
    let list: Vec<(String, &RawRateLimit)> = match (&raw.rate_limit, &raw.rate_limits) {
        (Some(_), Some(_)) => {
            return Err(ctx.err(
                here,
                "use either rate_limit or rate_limits on a descriptor, not both",
            ))
        }
        (Some(one), None) => vec![(format!("{here}.rate_limit"), one)],
        (None, Some(many)) => {
            if many.is_empty() {
                return Err(ctx.err(
                    &format!("{here}.rate_limits"),
                    "rate_limits must list at least one limit",
                ));
            }
            many.iter()
                .enumerate()
                .map(|(i, r)| (format!("{here}.rate_limits[{i}]"), r))
                .collect()
        }
        (None, None) => Vec::new(),
    };
    let several = list.len() > 1;
    let mut out = Vec::with_capacity(list.len());
    for (path, r) in list {
        let limit = build_limit(ctx, r, &path)?;
        if several && limit.unlimited {
            return Err(ctx.err(
                &path,
                "unlimited makes no sense next to other limits on one descriptor",
            ));
        }
        out.push(limit);
    }
    Ok(out)
}

fn build_limit(ctx: &Ctx<'_>, r: &RawRateLimit, path: &str) -> Result<RateLimit, ConfigError> {
    let name = r.name.clone().filter(|n| !n.is_empty());
    let replaces = build_replaces(ctx, r, name.as_deref(), path)?;
    let unit = build_unit(ctx, r, path)?;
    let requests_per_unit = r.requests_per_unit.unwrap_or(0);
    let algorithm = build_algorithm(ctx, r, requests_per_unit, path)?;
    let queue = match &r.queue {
        None => None,
        Some(q) => Some(build_queue(ctx, q, requests_per_unit, path)?),
    };
    if r.local_first == Some(true) && algorithm == Algorithm::SlidingWindow {
        return Err(ctx.err(
            &format!("{path}.local_first"),
            "local_first supports fixed_window and token_bucket, not sliding_window \
             (its estimate needs the previous window's exact count; decide it exactly)",
        ));
    }
    let (unit_multiplier, calendar) = build_window(ctx, r, unit, algorithm, path)?;
    let reserve = reserve::build_reserve(ctx, r, (requests_per_unit, queue), path)?;
    Ok(RateLimit {
        name: name.map(Arc::from),
        unit,
        unit_multiplier,
        calendar,
        requests_per_unit,
        unlimited: r.unlimited,
        replaces,
        algorithm,
        queue,
        local_first: r.local_first,
        reserve,
    })
}

/// `unit_multiplier` and `calendar`: how long a window is and where it starts.
fn build_window(
    ctx: &Ctx<'_>,
    r: &RawRateLimit,
    unit: Unit,
    algorithm: Algorithm,
    path: &str,
) -> Result<(u32, Option<Calendar>), ConfigError> {
    let n = r.unit_multiplier.unwrap_or(1);
    if n == 0 {
        return Err(ctx.err(
            &format!("{path}.unit_multiplier"),
            "unit_multiplier must be at least 1 (windows of unit_multiplier × unit)",
        ));
    }
    // Windows past 10,000 years overflow nanosecond clocks; no budget needs them.
    if unit.seconds().saturating_mul(u64::from(n)) > 10_000 * 365 * 86_400 {
        return Err(ctx.err(
            &format!("{path}.unit_multiplier"),
            format!("unit_multiplier {n} makes a window longer than 10000 years"),
        ));
    }
    let Some(zone) = r.calendar.as_deref() else {
        return Ok((n, None));
    };
    if matches!(algorithm, Algorithm::TokenBucket { .. }) {
        return Err(ctx.err(
            &format!("{path}.calendar"),
            "calendar applies to fixed_window and sliding_window (a token bucket has no windows)",
        ));
    }
    let c = Calendar::new(zone, unit, n)
        .map_err(|e| ctx.err(&format!("{path}.calendar"), e.to_string()))?;
    Ok((n, Some(c)))
}

fn build_replaces(
    ctx: &Ctx<'_>,
    r: &RawRateLimit,
    name: Option<&str>,
    path: &str,
) -> Result<Vec<String>, ConfigError> {
    let mut replaces = Vec::new();
    for (i, rep) in r.replaces.iter().flatten().enumerate() {
        let n = rep.name.clone().unwrap_or_default();
        if n.is_empty() {
            return Err(ctx.err(
                &format!("{path}.replaces[{i}].name"),
                "replaces entry must name a limit",
            ));
        }
        if name == Some(n.as_str()) {
            return Err(ctx.err(
                &format!("{path}.replaces[{i}]"),
                format!("limit \"{n}\" replaces itself"),
            ));
        }
        replaces.push(n);
    }
    Ok(replaces)
}

/// The window unit; an unlimited limit has none (and no algorithm, burst or queue either).
fn build_unit(ctx: &Ctx<'_>, r: &RawRateLimit, path: &str) -> Result<Unit, ConfigError> {
    if !r.unlimited {
        let u = r.unit.clone().unwrap_or_default();
        return Unit::parse(&u).ok_or_else(|| {
            ctx.err(
                &format!("{path}.unit"),
                format!(
                    "invalid unit \"{u}\" (expected second, minute, hour, day, week, month or year)"
                ),
            )
        });
    }
    if r.unit.is_some() {
        return Err(ctx.err(
            &format!("{path}.unit"),
            "unit must not be set when unlimited is true",
        ));
    }
    for (field, set) in [
        ("algorithm", r.algorithm.is_some()),
        ("burst", r.burst.is_some()),
        ("queue", r.queue.is_some()),
        ("local_first", r.local_first.is_some()),
        ("unit_multiplier", r.unit_multiplier.is_some()),
        ("calendar", r.calendar.is_some()),
        ("reserve", r.reserve.is_some() || r.reserve_for.is_some()),
    ] {
        if set {
            return Err(ctx.err(
                &format!("{path}.{field}"),
                format!("{field} makes no sense when unlimited is true"),
            ));
        }
    }
    Ok(Unit::Second)
}

fn build_algorithm(
    ctx: &Ctx<'_>,
    r: &RawRateLimit,
    requests_per_unit: u32,
    path: &str,
) -> Result<Algorithm, ConfigError> {
    let algorithm = match r.algorithm.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("fixed_window") => Algorithm::FixedWindow,
        Some("sliding_window") => Algorithm::SlidingWindow,
        Some("token_bucket") => {
            let burst = r.burst.unwrap_or(requests_per_unit);
            if burst == 0 && requests_per_unit > 0 {
                return Err(ctx.err(&format!("{path}.burst"), "burst must be at least 1"));
            }
            Algorithm::TokenBucket { burst }
        }
        Some(other) => {
            return Err(ctx.err(
                &format!("{path}.algorithm"),
                format!(
                    "unknown algorithm \"{other}\" (expected fixed_window, sliding_window or token_bucket)"
                ),
            ))
        }
    };
    if r.burst.is_some() && !matches!(algorithm, Algorithm::TokenBucket { .. }) {
        return Err(ctx.err(
            &format!("{path}.burst"),
            "burst applies only to algorithm: token_bucket",
        ));
    }
    Ok(algorithm)
}

fn build_queue(
    ctx: &Ctx<'_>,
    q: &raw::RawQueue,
    requests_per_unit: u32,
    path: &str,
) -> Result<QueueSpec, ConfigError> {
    let at = |field: &str| format!("{path}.queue.{field}");
    let max_waiting = q
        .max_waiting
        .ok_or_else(|| ctx.err(&at("max_waiting"), "max_waiting is required"))?;
    if max_waiting == 0 {
        return Err(ctx.err(
            &at("max_waiting"),
            "max_waiting must be at least 1 (leave queue out to refuse at once)",
        ));
    }
    let text = q
        .max_wait
        .clone()
        .ok_or_else(|| ctx.err(&at("max_wait"), "max_wait is required (e.g. 800ms)"))?;
    let max_wait = parse_bounded_duration(&text).map_err(|m| ctx.err(&at("max_wait"), m))?;
    if max_wait.is_zero() {
        return Err(ctx.err(&at("max_wait"), "max_wait must be more than 0"));
    }
    if requests_per_unit == 0 {
        return Err(ctx.err(
            &format!("{path}.queue"),
            "a queue on requests_per_unit: 0 would never admit anyone",
        ));
    }
    Ok(QueueSpec {
        max_waiting,
        max_wait,
    })
}

fn build_rate_api(ctx: &Ctx<'_>, raw: raw::RawRateApi) -> Result<RateApi, ConfigError> {
    let mut keys = Vec::with_capacity(raw.keys.len());
    for (i, k) in raw.keys.into_iter().enumerate() {
        let here = format!("rate_api.keys[{i}]");
        let pattern = k.key.unwrap_or_default();
        if pattern.is_empty() {
            return Err(ctx.err(
                &format!("{here}.key"),
                "key must not be empty (use \"*\" for any)",
            ));
        }
        let window_text = k.window.ok_or_else(|| {
            ctx.err(
                &format!("{here}.window"),
                "window is required (e.g. 1000ms, 1m)",
            )
        })?;
        let window = parse_bounded_duration(&window_text)
            .map_err(|m| ctx.err(&format!("{here}.window"), m))?;
        if window < Duration::from_millis(1) || window.subsec_nanos() % 1_000_000 != 0 {
            return Err(ctx.err(
                &format!("{here}.window"),
                "window must be a whole number of milliseconds, at least 1ms",
            ));
        }
        let max_requests = k
            .max_requests
            .ok_or_else(|| ctx.err(&format!("{here}.max_requests"), "max_requests is required"))?;
        let max_in_queue = k.max_in_queue.unwrap_or(0);
        if max_in_queue > 0 && max_requests == 0 {
            return Err(ctx.err(
                &format!("{here}.max_in_queue"),
                "a queue on max_requests: 0 would never admit anyone",
            ));
        }
        let max_wait = match k.max_wait {
            Some(t) => {
                let d = parse_bounded_duration(&t)
                    .map_err(|m| ctx.err(&format!("{here}.max_wait"), m))?;
                if d.is_zero() {
                    return Err(
                        ctx.err(&format!("{here}.max_wait"), "max_wait must be more than 0")
                    );
                }
                d
            }
            None => super::default_max_wait(window, max_requests, max_in_queue),
        };
        keys.push(RateApiKey {
            pattern,
            window,
            max_requests,
            max_in_queue,
            max_wait,
        });
    }
    Ok(RateApi {
        allow_overrides: raw.allow_overrides,
        max_requests_cap: raw.max_requests_cap.unwrap_or(100_000),
        max_in_queue_cap: raw.max_in_queue_cap.unwrap_or(10_000),
        keys,
    })
}

/// Gives every node of `level` and below its `index`, counting on from `next`.
fn number(level: &mut Level, next: &mut usize) {
    for g in level.groups_mut() {
        let nodes = g
            .exact
            .values_mut()
            .chain(g.wildcards.iter_mut())
            .chain(g.default.as_deref_mut());
        for n in nodes {
            n.index = *next;
            *next += 1;
            number(&mut n.children, next);
        }
    }
}
