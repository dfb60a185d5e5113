//! Validation: parsed YAML (or xDS resources) → the typed limit tree, every rule violation
//! reported with the file and the path inside it; the YAML's `rate_api` keys for GoCC's door
//! (`gocc`).

use std::sync::Arc;

use fnv::{FnvHashMap, FnvHashSet};

mod domain;
mod gocc;
mod reserve;
mod shared;

pub(super) use domain::OpenDomain;
pub use shared::LiveConfig;
use shared::{counterpart, Interned};

use super::grammar::parse_bounded_duration;
use super::raw::{self, RawDescriptor, RawRateApi, RawRateLimit};
use super::{
    Algorithm, Calendar, Config, ConfigError, Domain, Level, Node, QueueSpec, RateApi, RateLimit,
    Unit,
};

/// A config being built; adding a domain's descriptors, a top-level one at a time, is in
/// `build/domain.rs`.
#[derive(Default)]
pub(super) struct Builder {
    /// The config being served, when this one is built to replace it.
    live: Option<Arc<dyn AsRef<Config> + Send + Sync>>,
    /// Keys and lists of limits, one copy each; an open domain holds them while it is built.
    interned: Interned,
    domains: FnvHashMap<String, Domain>,
    /// Which file defined each domain, for the duplicate-domain error.
    domain_files: FnvHashMap<String, String>,
    rate_api: Option<RateApi>,
    rate_api_file: Option<String>,
    /// The files read, in order: a node's origin starts with its file's number here.
    files: Vec<Box<str>>,
}

struct Ctx<'a> {
    file: &'a str,
    domain: &'a str,
}

/// Where a descriptor is: its path for errors (`descriptors[3].descriptors[0]`), and for its
/// node's origin its file's number and its index in each list down to it.
struct Here<'a> {
    path: &'a str,
    at: &'a [u32],
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

impl Builder {
    /// A builder of a config that will replace the live one, `live`.
    pub(super) fn beside(live: &LiveConfig) -> Builder {
        Builder {
            live: live.now(),
            ..Builder::default()
        }
    }

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
            files: self.files.into_boxed_slice(),
            from_xds: false,
            overlay_unmatched: Vec::new(),
        }
    }

    /// A file's `rate_api`: one file in the config may have it.
    pub(super) fn add_rate_api(&mut self, file: &str, api: RawRateApi) -> Result<(), ConfigError> {
        let ctx = Ctx { file, domain: "" };
        if let Some(first) = &self.rate_api_file {
            return Err(ctx.err(
                "rate_api",
                format!("rate_api is already defined in {first}; define it once"),
            ));
        }
        self.rate_api = Some(gocc::build_rate_api(&ctx, api)?);
        self.rate_api_file = Some(file.to_owned());
        Ok(())
    }
}

/// A level's `key_value` names, for the duplicate check: one look-up a node, so a level of any
/// size loads in linear time. Kept as hashes, 8 bytes a name: a hash seen before is checked
/// against the level's nodes, which only a duplicate (or a collision) makes happen.
#[derive(Default)]
struct Names(FnvHashSet<u64>);

impl Names {
    fn of(level: &Level) -> Names {
        Names(
            level
                .nodes()
                .map(|n| name_hash(&n.key, n.value.as_deref()))
                .collect(),
        )
    }

    /// Whether a node of `level` is named `key_value` already; if not, the name is taken now.
    fn take(&mut self, level: &Level, key: &str, value: Option<&str>) -> bool {
        let h = name_hash(key, value);
        if self.0.insert(h) {
            return true;
        }
        let name = composite(key, value);
        !level
            .nodes()
            .any(|n| composite(&n.key, n.value.as_deref()) == name)
    }
}

fn name_hash(key: &str, value: Option<&str>) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = fnv::FnvBuildHasher::default().build_hasher();
    h.write(key.as_bytes());
    if let Some(v) = value {
        h.write(b"_");
        h.write(v.as_bytes());
    }
    h.finish()
}

/// What the build of one level works with besides its descriptors: the build's interned keys
/// and limits, and the level it replaces in the config being served.
struct LevelCtx<'b, 's> {
    interned: &'b mut Interned,
    served: Option<&'s Level>,
    /// The level is read a descriptor at a time (the top one), so its size is not known before
    /// it is read: it starts as big as the one it replaces.
    size_as_served: bool,
}

/// `raws` into `level`, the list at `list` (its path, and its parent's place).
fn add_level(
    ctx: &Ctx<'_>,
    level: &mut Level,
    raws: Vec<RawDescriptor>,
    list: &Here<'_>,
    parent_stat: &str,
    beside: &mut LevelCtx<'_, '_>,
) -> Result<(), ConfigError> {
    let mut names = Names::of(level);
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
        let k = beside.interned.key(k);
        level.group_to_fill(&k).exact.reserve(n);
    }
    let mut at = list.at.to_vec();
    for (i, raw) in (0u32..).zip(raws) {
        let path = format!("{}[{i}]", list.path);
        at.push(i);
        let here = Here {
            path: &path,
            at: &at,
        };
        add_descriptor(ctx, level, &mut names, raw, &here, parent_stat, beside)?;
        at.pop();
    }
    Ok(())
}

/// One descriptor (and its children) built and filed into `level`.
fn add_descriptor(
    ctx: &Ctx<'_>,
    level: &mut Level,
    names: &mut Names,
    raw: RawDescriptor,
    here: &Here<'_>,
    parent_stat: &str,
    beside: &mut LevelCtx<'_, '_>,
) -> Result<(), ConfigError> {
    let key = beside.interned.key(raw.key.as_deref().unwrap_or(""));
    let group = level.group_to_fill(&key);
    let value = raw.value.as_deref().filter(|v| !v.is_empty());
    let served = counterpart(beside.served, &key, value, group.wildcards.len());
    if beside.size_as_served && group.exact.capacity() == 0 {
        if let Some(g) = (beside.served).and_then(|l| l.group(&key)) {
            group.exact.reserve(g.exact.len());
        }
    }
    let node = build_node(ctx, raw, key, here, parent_stat, beside, served)?;
    insert_node(ctx, level, names, node, here.path)
}

/// `key_value` (or `key`), as envoyproxy/ratelimit names a node in keys and stats.
fn composite(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{key}_{v}"),
        None => key.to_owned(),
    }
}

/// One descriptor and, below it, its children; `served` is the node it replaces in the config
/// being served, if any.
fn build_node(
    ctx: &Ctx<'_>,
    mut raw: RawDescriptor,
    key: Arc<str>,
    place: &Here<'_>,
    parent_stat: &str,
    beside: &mut LevelCtx<'_, '_>,
    served: Option<&Node>,
) -> Result<Node, ConfigError> {
    let here = place.path;
    if key.is_empty() {
        return Err(ctx.err(&format!("{here}.key"), "descriptor key must not be empty"));
    }
    let value = raw.value.take().filter(|v| !v.is_empty());
    let stat_key = format!("{parent_stat}.{}", composite(&key, value.as_deref()));
    let stat_key = shared::stat_key(stat_key, served);
    let is_wildcard = value.as_deref().is_some_and(|v| v.contains('*'));
    if raw.share_threshold && !is_wildcard {
        return Err(ctx.err(
            &format!("{here}.share_threshold"),
            "share_threshold needs a value with a '*' wildcard",
        ));
    }
    let limits = build_limits(ctx, &raw, here)?;
    let mut node = Node {
        key,
        value: value.map(String::into_boxed_str),
        limits: beside.interned.limits(limits, served),
        children: Level::default(),
        shadow_mode: raw.shadow_mode,
        quota_mode: raw.quota_mode,
        detailed_metric: raw.detailed_metric,
        value_to_metric: raw.value_to_metric,
        share_threshold: raw.share_threshold,
        metadata: raw.metadata.map(Box::new),
        stat_key,
        origin: place.at.into(),
        index: 0,
    };
    if let Some(children) = raw.descriptors {
        let path = format!("{here}.descriptors");
        let stat = node.stat_key.clone();
        let list = Here {
            path: &path,
            at: place.at,
        };
        // A list of children is read whole: `add_level` sizes its level from it.
        let mut below = LevelCtx {
            interned: beside.interned,
            served: served.map(|n| &n.children),
            size_as_served: false,
        };
        add_level(ctx, &mut node.children, children, &list, &stat, &mut below)?;
    }
    Ok(node)
}

/// Files `node` into its level: exact, wildcard (in file order) or key-only; `names` holds the
/// level's `key_value` names so far.
fn insert_node(
    ctx: &Ctx<'_>,
    level: &mut Level,
    names: &mut Names,
    node: Node,
    here: &str,
) -> Result<(), ConfigError> {
    let dup = |node: &Node| {
        let name = composite(&node.key, node.value.as_deref());
        ctx.err(
            here,
            format!("duplicate composite key \"{}.{name}\"", ctx.domain),
        )
    };
    // The reference compares `key_value` strings, so "a_b"+"c" and "a"+"b_c" collide too.
    if !names.take(level, &node.key, node.value.as_deref()) {
        return Err(dup(&node));
    }
    let group = level.group_to_fill(&node.key);
    let pattern = node.value.as_deref().map(|v| v.contains('*'));
    match pattern {
        None => group.default = Some(Box::new(node)),
        Some(true) => group.wildcards.push(node),
        Some(false) => group.exact.insert(node).map_err(|node| dup(&node))?,
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

/// One limit; an error on a limit an xDS overlay wrote into says so, and which fields it wrote.
fn build_limit(ctx: &Ctx<'_>, r: &RawRateLimit, path: &str) -> Result<RateLimit, ConfigError> {
    build_written(ctx, r, path).map_err(|mut e| {
        if let Some(said) = &r.overlaid {
            e.message = format!("{} (the xDS overlay wrote {said})", e.message);
        }
        e
    })
}

fn build_written(ctx: &Ctx<'_>, r: &RawRateLimit, path: &str) -> Result<RateLimit, ConfigError> {
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
    let reserve = reserve::build_reserve(ctx, r, requests_per_unit, algorithm, queue, path)?;
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
        overlay: r.overlaid.clone(),
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
