//! YAML files and environment → a validated, typed config; `turnstile check` uses the same code.
//!
//! Parsing is done by serde (which reports the path and line of a type error or an unknown
//! key); validation then walks the parsed tree and reports rule violations with the file and the
//! path inside it, e.g. `config/a.yaml: descriptors[1].rate_limit.unit: invalid unit "fortnite"`.

mod raw;
pub mod settings;
pub mod watch;
pub mod xds;

use std::collections::hash_map::Entry;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fnv::FnvHashMap;

use raw::{RawDescriptor, RawFile, RawRateLimit};

/// A config error, naming the file and the place in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    /// Path inside the file (`descriptors[0].rate_limit.unit`), empty for whole-file errors.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.path, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// The seven window units of envoyproxy/ratelimit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// Window length; week, month and year are 7, 30 and 365 days as in the reference.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The `RateLimitResponse.RateLimit.Unit` number.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// Envoy's `envoy.type.v3.RateLimitUnit` (used by the descriptor `limit` override) has no week.
    pub fn from_envoy_override(n: i32) -> Option<Unit> {
        Some(match n {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

/// How a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Windows aligned to the Unix epoch; envoyproxy/ratelimit's behaviour and the default.
    FixedWindow,
    /// Weighted estimate over the current and the previous aligned window.
    SlidingWindow,
    /// GCRA: `requests_per_unit` per unit sustained, bursts of up to `burst`.
    TokenBucket { burst: u32 },
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket { .. } => "token_bucket",
        }
    }
}

/// Queued waiting: an over-limit request waits up to `max_wait` for capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueueSpec {
    pub max_waiting: u32,
    pub max_wait: Duration,
}

/// One limit of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    pub name: Option<Arc<str>>,
    pub unit: Unit,
    pub requests_per_unit: u32,
    pub unlimited: bool,
    pub replaces: Vec<String>,
    pub algorithm: Algorithm,
    pub queue: Option<QueueSpec>,
}

/// A descriptor node of the config tree.
#[derive(Debug)]
pub struct Node {
    pub key: String,
    pub value: Option<String>,
    /// Empty when the node only whitelists or only groups children.
    pub limits: Vec<RateLimit>,
    pub children: Level,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// `domain.key_value.key2` as envoyproxy/ratelimit names the node in its stats.
    pub stat_key: String,
    /// Where the node was defined, for `check` and `/rlconfig`.
    pub origin: String,
    /// envoyproxy/ratelimit's per-limit stats for this node.
    pub stats: crate::telemetry::LimitStats,
}

/// The nodes of one depth, grouped by key for lookup.
#[derive(Debug, Default)]
pub struct Level {
    pub(crate) groups: FnvHashMap<String, KeyGroup>,
}

#[derive(Debug, Default)]
pub(crate) struct KeyGroup {
    pub(crate) exact: FnvHashMap<String, Node>,
    /// In file order: the first matching pattern wins.
    pub(crate) wildcards: Vec<Node>,
    pub(crate) default: Option<Box<Node>>,
}

impl Level {
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Every node of this level, exact before wildcard before key-only, for listings.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        let mut keys: Vec<&String> = self.groups.keys().collect();
        keys.sort();
        keys.into_iter().flat_map(move |k| {
            let g = &self.groups[k];
            let mut exact: Vec<&Node> = g.exact.values().collect();
            exact.sort_by(|a, b| a.value.cmp(&b.value));
            exact
                .into_iter()
                .chain(g.wildcards.iter())
                .chain(g.default.as_deref())
        })
    }
}

/// One domain's descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub name: String,
    pub root: Level,
}

/// Everything loaded: domains by name, and the direct API's keys.
#[derive(Debug, Default)]
pub struct Config {
    pub domains: FnvHashMap<String, Domain>,
    pub rate_api: Option<RateApi>,
}

/// Limits for the direct HTTP API (`/rate/{key}`): GoCC's model, with windows aligned to the
/// epoch and no sticky overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateApi {
    /// Whether callers may pass `maxRequests` / `maxRequestsInQueue` (for their request only).
    pub allow_overrides: bool,
    pub max_requests_cap: u32,
    pub max_in_queue_cap: u32,
    /// In file order; the first pattern matching the key applies.
    pub keys: Vec<RateApiKey>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateApiKey {
    /// A `*` glob over the key in the URL.
    pub pattern: String,
    pub window: Duration,
    pub max_requests: u32,
    /// 0: `canWait` is refused for these keys.
    pub max_in_queue: u32,
    pub max_wait: Duration,
}

impl RateApi {
    pub fn find(&self, key: &str) -> Option<&RateApiKey> {
        self.keys
            .iter()
            .find(|k| crate::descriptor::glob(&k.pattern, key))
    }
}

/// Options that change how files are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// `MERGE_DOMAIN_CONFIG`: files naming the same domain are merged instead of refused.
    pub merge_domains: bool,
    /// `RUNTIME_IGNOREDOTFILES=false` loads dotfiles too; by default they are skipped.
    pub include_dotfiles: bool,
}

impl Config {
    /// Loads a YAML file, or every `*.yaml`/`*.yml` of a directory (dotfiles ignored), in name order.
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Config, ConfigError> {
        let files = list_files(path, opts)?;
        let mut sources = Vec::with_capacity(files.len());
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| ConfigError {
                file: f.display().to_string(),
                path: String::new(),
                message: format!("cannot read: {e}"),
            })?;
            sources.push((f.display().to_string(), text));
        }
        Config::from_sources(&sources, opts)
    }

    /// Builds a config from `(file name, YAML text)` pairs; the file names only label errors.
    pub fn from_sources(
        sources: &[(String, String)],
        opts: LoadOptions,
    ) -> Result<Config, ConfigError> {
        let mut builder = Builder::default();
        for (file, text) in sources {
            builder.add_raw(file, parse_file(file, text)?, opts)?;
        }
        Ok(builder.finish())
    }

    /// Builds a config from already parsed files (`(label, file)` pairs), through the same
    /// validation as YAML; the xDS client uses it for `RateLimitConfig` resources.
    pub(crate) fn from_raw(
        files: Vec<(String, RawFile)>,
        opts: LoadOptions,
    ) -> Result<Config, ConfigError> {
        let mut builder = Builder::default();
        for (file, raw) in files {
            builder.add_raw(&file, raw, opts)?;
        }
        Ok(builder.finish())
    }

    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every loaded limit, one per line, sorted: `domain.key_value.key: unit=..., requests_per_unit=...`.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut names: Vec<&String> = self.domains.keys().collect();
        names.sort();
        for name in names {
            describe_level(&self.domains[name].root, &mut out);
        }
        out
    }
}

fn describe_level(level: &Level, out: &mut Vec<String>) {
    for node in level.nodes() {
        for l in &node.limits {
            let mut line = format!("{}: ", node.stat_key);
            if l.unlimited {
                line.push_str("unlimited");
            } else {
                line.push_str(&format!(
                    "unit={} requests_per_unit={} algorithm={}",
                    l.unit.name().to_ascii_uppercase(),
                    l.requests_per_unit,
                    l.algorithm.name()
                ));
                if let Algorithm::TokenBucket { burst } = l.algorithm {
                    line.push_str(&format!(" burst={burst}"));
                }
            }
            if let Some(n) = &l.name {
                line.push_str(&format!(" name={n}"));
            }
            if !l.replaces.is_empty() {
                line.push_str(&format!(" replaces={}", l.replaces.join(",")));
            }
            if let Some(q) = l.queue {
                line.push_str(&format!(
                    " queue.max_waiting={} queue.max_wait={}ms",
                    q.max_waiting,
                    q.max_wait.as_millis()
                ));
            }
            for (flag, on) in [
                ("shadow_mode", node.shadow_mode),
                ("quota_mode", node.quota_mode),
                ("detailed_metric", node.detailed_metric),
                ("share_threshold", node.share_threshold),
            ] {
                if on {
                    line.push_str(&format!(" {flag}"));
                }
            }
            out.push(line);
        }
        describe_level(&node.children, out);
    }
}

/// The files a config location names: the file itself, or a directory's YAML files.
pub fn list_files(path: &Path, opts: LoadOptions) -> Result<Vec<PathBuf>, ConfigError> {
    let err = |message: String| ConfigError {
        file: path.display().to_string(),
        path: String::new(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot read: {e}")))?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| err(format!("cannot list: {e}")))? {
        let entry = entry.map_err(|e| err(format!("cannot list: {e}")))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if (name.starts_with('.') && !opts.include_dotfiles)
            || !(name.ends_with(".yaml") || name.ends_with(".yml"))
        {
            continue;
        }
        // Follows symlinks, so a Kubernetes ConfigMap's `..data/x.yaml` links count as files.
        if std::fs::metadata(entry.path())
            .map(|m| m.is_file())
            .unwrap_or(false)
        {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

#[derive(Default)]
struct Builder {
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
fn parse_file(file: &str, text: &str) -> Result<RawFile, ConfigError> {
    serde_yaml::from_str(text).map_err(|e| ConfigError {
        file: file.to_owned(),
        path: String::new(),
        message: yaml_message(&e),
    })
}

impl Builder {
    fn finish(self) -> Config {
        Config {
            domains: self.domains,
            rate_api: self.rate_api,
        }
    }

    fn add_raw(&mut self, file: &str, raw: RawFile, opts: LoadOptions) -> Result<(), ConfigError> {
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
    for (i, raw) in raws.into_iter().enumerate() {
        let here = format!("{path}[{i}]");
        let key = raw.key.clone().unwrap_or_default();
        if key.is_empty() {
            return Err(ctx.err(&format!("{here}.key"), "descriptor key must not be empty"));
        }
        let value = raw.value.clone().filter(|v| !v.is_empty());
        let composite = match &value {
            Some(v) => format!("{key}_{v}"),
            None => key.clone(),
        };
        let stat_key = format!("{parent_stat}.{composite}");
        let is_wildcard = value.as_deref().is_some_and(|v| v.contains('*'));
        if raw.share_threshold && !is_wildcard {
            return Err(ctx.err(
                &format!("{here}.share_threshold"),
                "share_threshold needs a value with a '*' wildcard",
            ));
        }
        let limits = build_limits(ctx, &raw, &here)?;
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
            key: key.clone(),
            value: value.clone(),
            limits,
            children: Level::default(),
            shadow_mode: raw.shadow_mode,
            quota_mode: raw.quota_mode,
            detailed_metric: raw.detailed_metric,
            value_to_metric: raw.value_to_metric,
            share_threshold: raw.share_threshold,
            metadata,
            stat_key: stat_key.clone(),
            origin: format!("{}: {here}", ctx.file),
            stats: Default::default(),
        };
        if let Some(children) = raw.descriptors {
            add_level(
                ctx,
                &mut node.children,
                children,
                &format!("{here}.descriptors"),
                &stat_key,
            )?;
        }
        let dup = || {
            ctx.err(
                &here,
                format!("duplicate composite key \"{}.{composite}\"", ctx.domain),
            )
        };
        // The reference compares `key_value` strings, so "a_b"+"c" and "a"+"b_c" collide too.
        let collides = level.nodes().any(|n| {
            let c = match &n.value {
                Some(v) => format!("{}_{v}", n.key),
                None => n.key.clone(),
            };
            c == composite
        });
        if collides {
            return Err(dup());
        }
        let group = level.groups.entry(key).or_default();
        match value {
            None => group.default = Some(Box::new(node)),
            Some(_) if is_wildcard => group.wildcards.push(node),
            Some(v) => match group.exact.entry(v) {
                Entry::Occupied(_) => return Err(dup()),
                Entry::Vacant(e) => {
                    e.insert(node);
                }
            },
        }
    }
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
    let mut replaces = Vec::new();
    for (i, rep) in r.replaces.iter().flatten().enumerate() {
        let n = rep.name.clone().unwrap_or_default();
        if n.is_empty() {
            return Err(ctx.err(
                &format!("{path}.replaces[{i}].name"),
                "replaces entry must name a limit",
            ));
        }
        if name.as_deref() == Some(n.as_str()) {
            return Err(ctx.err(
                &format!("{path}.replaces[{i}]"),
                format!("limit \"{n}\" replaces itself"),
            ));
        }
        replaces.push(n);
    }
    let unit = if r.unlimited {
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
        ] {
            if set {
                return Err(ctx.err(
                    &format!("{path}.{field}"),
                    format!("{field} makes no sense when unlimited is true"),
                ));
            }
        }
        Unit::Second
    } else {
        let u = r.unit.clone().unwrap_or_default();
        Unit::parse(&u).ok_or_else(|| {
            ctx.err(
                &format!("{path}.unit"),
                format!(
                    "invalid unit \"{u}\" (expected second, minute, hour, day, week, month or year)"
                ),
            )
        })?
    };
    let requests_per_unit = r.requests_per_unit.unwrap_or(0);
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
    let queue = match &r.queue {
        None => None,
        Some(q) => {
            let max_waiting = q.max_waiting.ok_or_else(|| {
                ctx.err(
                    &format!("{path}.queue.max_waiting"),
                    "max_waiting is required",
                )
            })?;
            if max_waiting == 0 {
                return Err(ctx.err(
                    &format!("{path}.queue.max_waiting"),
                    "max_waiting must be at least 1 (leave queue out to refuse at once)",
                ));
            }
            let text = q.max_wait.clone().ok_or_else(|| {
                ctx.err(
                    &format!("{path}.queue.max_wait"),
                    "max_wait is required (e.g. 800ms)",
                )
            })?;
            let max_wait =
                parse_duration(&text).map_err(|m| ctx.err(&format!("{path}.queue.max_wait"), m))?;
            if max_wait.is_zero() {
                return Err(ctx.err(
                    &format!("{path}.queue.max_wait"),
                    "max_wait must be more than 0",
                ));
            }
            if requests_per_unit == 0 {
                return Err(ctx.err(
                    &format!("{path}.queue"),
                    "a queue on requests_per_unit: 0 would never admit anyone",
                ));
            }
            Some(QueueSpec {
                max_waiting,
                max_wait,
            })
        }
    };
    Ok(RateLimit {
        name: name.map(Arc::from),
        unit,
        requests_per_unit,
        unlimited: r.unlimited,
        replaces,
        algorithm,
        queue,
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
        let window =
            parse_duration(&window_text).map_err(|m| ctx.err(&format!("{here}.window"), m))?;
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
                let d = parse_duration(&t).map_err(|m| ctx.err(&format!("{here}.max_wait"), m))?;
                if d.is_zero() {
                    return Err(
                        ctx.err(&format!("{here}.max_wait"), "max_wait must be more than 0")
                    );
                }
                d
            }
            // Long enough to drain a full queue, at most a day (the cap on any max_wait).
            None => {
                let windows = u64::from(max_in_queue).div_ceil(u64::from(max_requests.max(1))) + 1;
                let ms = (window.as_millis() as u64).saturating_mul(windows);
                Duration::from_millis(ms.min(86_400_000))
            }
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

/// `250ms`, `2s`, `1.5s`, `1m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration \"{text}\" (expected e.g. 800ms, 2s, 1m)"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration \"{text}\": unit must be ms, s, m or h"
            ))
        }
    };
    if !secs.is_finite() || secs > 86_400.0 {
        return Err(format!("duration \"{text}\" is out of range (at most 24h)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests;
