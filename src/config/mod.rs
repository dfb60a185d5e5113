//! YAML files and environment → a validated, typed config; `turnstile check` uses the same code.
//! The Envoy and RLQS doors' limits are the YAML's (validated in `build`), or xDS's resources
//! (`xds`) with turnstile's own fields from the overlay (`overlay`); GoCC's door reads its key
//! file too (`gocc`), and Limitador's door its limits file (`limitador`).
//!
//! Parsing is done by serde (which reports the path and line of a type error or an unknown
//! key); validation then walks the parsed tree and reports rule violations with the file and the
//! path inside it, e.g. `config/a.yaml: descriptors[1].rate_limit.unit: invalid unit "fortnite"`.

mod build;
pub use build::LiveConfig;
pub mod calendar;
pub mod go_regex;
pub mod gocc;
pub mod grammar;
pub mod limitador;
mod load;
pub mod overlay;
pub use calendar::{Calendar, CalendarError, Span};
pub use gocc::{GoccKeys, KeyLimits};
pub use load::{list_files, Sources};
pub use overlay::Overlay;
mod raw;
mod unit;
pub use unit::Unit;
mod exact;
pub use exact::Exact;
mod level;
pub use level::Level;
mod wildcards;
pub use wildcards::Wildcards;
pub mod xds;
mod yaml;
pub use yaml::options as yaml_options;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fnv::FnvHashMap;

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

/// How a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Windows aligned to the Unix epoch; envoyproxy/ratelimit's behaviour and the default.
    FixedWindow,
    /// Weighted estimate over the current and the previous aligned window.
    SlidingWindow,
    /// GCRA: `requests_per_unit` per unit sustained, bursts of up to `burst`.
    TokenBucket { burst: u32 },
    /// A fixed window that starts at its counter's first hit, not aligned to any clock:
    /// Limitador's (`limitador-server`'s limits file).
    FromFirstHit,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::FromFirstHit => "from_first_hit",
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateLimit {
    pub name: Option<Arc<str>>,
    pub unit: Unit,
    /// Windows of this many units (1 unless the file says `unit_multiplier`).
    pub unit_multiplier: u32,
    /// `calendar: <zone>`: windows follow that zone's calendar instead of the epoch's.
    pub calendar: Option<Calendar>,
    pub requests_per_unit: u32,
    pub unlimited: bool,
    pub replaces: Vec<String>,
    pub algorithm: Algorithm,
    pub queue: Option<QueueSpec>,
    /// With Redis: decide from memory and sync in the background (`Some(true)`), always
    /// exactly (`Some(false)`), or as `LOCAL_FIRST` says (`None`).
    pub local_first: Option<bool>,
    /// `reserve`: what each admitted check holds until its request's usage is reported.
    pub reserve: Option<Reserve>,
    /// The fields an xDS overlay wrote into the pushed limit, and its file
    /// (`reserve,reserve_for from /etc/overlay/ai.yaml`); none for a limit as written.
    pub overlay: Option<Arc<str>>,
}

/// A limit's reservations (`reserve`, `reserve_for`): each check of the limit that is admitted
/// (a descriptor whose own `hits_addend` is 0) holds `hits` for its request, and later checks
/// are judged against the usage counted plus what is held. The report of the request's usage
/// (its own `hits_addend` above 0) releases one reservation; one nobody reports releases itself
/// after `hold`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reserve {
    pub hits: u32,
    pub hold: Duration,
}

impl Reserve {
    /// How long a reservation holds when the limit does not say (`reserve_for`): longer than a
    /// gateway's longest stream (Envoy AI Gateway's LLM calls, minutes at most), short enough
    /// that a lost report does not starve the budget for long.
    pub const DEFAULT_HOLD: Duration = Duration::from_secs(600);
    /// The longest `reserve_for` taken.
    pub const MAX_HOLD: Duration = Duration::from_secs(86_400);
}

impl RateLimit {
    /// The window's length (or a token bucket's refill period) in seconds: the unit's times
    /// the multiplier. A calendar window's real length varies; this is its nominal one.
    pub fn window_secs(&self) -> u64 {
        self.unit.seconds() * u64::from(self.unit_multiplier.max(1))
    }

    /// The window in words: `5 minute`, `1 month in Europe/Berlin`, `unlimited`.
    pub fn window_text(&self) -> String {
        if self.unlimited {
            return "unlimited".to_owned();
        }
        let mut t = format!("{} {}", self.unit_multiplier.max(1), self.unit.name());
        if let Some(c) = self.calendar {
            t.push_str(" in ");
            t.push_str(c.zone());
        }
        t
    }
}

/// A descriptor node of the config tree.
#[derive(Debug)]
pub struct Node {
    /// Shared by the nodes of one key at one level.
    pub key: Arc<str>,
    pub value: Option<Box<str>>,
    /// Empty when the node only whitelists or only groups children. Shared by the nodes with
    /// the same limits.
    pub limits: Arc<[RateLimit]>,
    pub children: Level,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    /// Boxed: most nodes have none, and a map inline would cost each node 24 bytes.
    pub metadata: Option<Box<serde_json::Map<String, serde_json::Value>>>,
    /// `domain.key_value.key2` as envoyproxy/ratelimit names the node in its stats; shared
    /// with the tables that bind per-limit stats and heavy hitters to it.
    pub stat_key: Arc<str>,
    /// Where the node was defined (see [`Config::origin`]): its file's number, then its index
    /// in each list of descriptors down to it.
    pub origin: Box<[u32]>,
    /// Dense number of the node within its config (0..`Config::node_count`): lets per-node
    /// state kept elsewhere (per-limit stats) live in a plain array.
    pub index: usize,
}

impl Node {
    /// Whether the config fixes the value this node matches (an exact `value:`), rather than
    /// taking the client's (no `value:`, or a wildcard).
    pub fn fixes_value(&self) -> bool {
        self.value.as_deref().is_some_and(|v| !v.contains('*'))
    }
}

/// One domain's descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub name: String,
    pub root: Level,
}

/// Everything loaded: domains by name, and the direct API's keys. Reading a location into one
/// (`Config::load` and its kin) is in `load.rs`, apart from the model on purpose.
#[derive(Debug, Default)]
pub struct Config {
    pub domains: FnvHashMap<String, Domain>,
    pub rate_api: Option<RateApi>,
    /// GoCC's key file (`CONFIG_FILE`): limits for the `/rate` keys no `rate_api` key matches.
    pub gocc: Option<GoccKeys>,
    /// Nodes in all the trees (see `Node::index`).
    node_count: usize,
    /// The files (or xDS resources) read, that nodes' origins number.
    files: Box<[Box<str>]>,
    /// Pushed over xDS: each limit's line in [`Config::describe`] says the overlay path to
    /// write for it.
    from_xds: bool,
    /// The overlay's entries that no pushed limit took, each a line (see [`Overlay`]).
    pub overlay_unmatched: Vec<String>,
}

/// Limits for the direct HTTP API (`/rate/{key}`): GoCC's model, with windows aligned to the
/// epoch; keys no pattern here matches fall to GoCC's defaults and key file (`Config::gocc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateApi {
    /// Whether callers may pass `maxRequests` / `maxRequestsInQueue` (sticky, as in GoCC).
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

/// How long a `/rate` caller may wait when the config does not say: long enough to drain a
/// full queue, plus a window, at most a day (the cap on any wait).
pub fn default_max_wait(window: Duration, max_requests: u32, max_in_queue: u32) -> Duration {
    let windows = u64::from(max_in_queue).div_ceil(u64::from(max_requests.max(1))) + 1;
    let ms = (window.as_millis() as u64).saturating_mul(windows);
    Duration::from_millis(ms.min(86_400_000))
}

impl RateApi {
    pub fn find(&self, key: &str) -> Option<&RateApiKey> {
        self.keys.iter().find(|k| glob(&k.pattern, key))
    }

    /// Its settings, then each key's limits in file order, one per line:
    /// `rate_api key "report-*": window=1000ms max_requests=10 max_in_queue=100 max_wait=5000ms`.
    pub fn describe(&self) -> Vec<String> {
        let mut out = vec![format!(
            "rate_api: allow_overrides={} max_requests_cap={} max_in_queue_cap={}",
            self.allow_overrides, self.max_requests_cap, self.max_in_queue_cap
        )];
        out.extend(self.keys.iter().map(|k| {
            format!(
                "rate_api key {:?}: window={}ms max_requests={} max_in_queue={} max_wait={}ms",
                k.pattern,
                k.window.as_millis(),
                k.max_requests,
                k.max_in_queue,
                k.max_wait.as_millis()
            )
        }));
        out
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

/// A config is what a build beside it reads (see [`LiveConfig`]), as the live limits are.
impl AsRef<Config> for Config {
    fn as_ref(&self) -> &Config {
        self
    }
}

impl Config {
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every loaded limit, one per line, sorted: `domain.key_value.key: unit=..., requests_per_unit=...`.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut names: Vec<&String> = self.domains.keys().collect();
        names.sort();
        for name in names {
            let domain = self.from_xds.then_some(name.as_str());
            describe_level(&self.domains[name].root, domain, &mut Vec::new(), &mut out);
        }
        out.extend(self.overlay_unmatched.iter().cloned());
        out
    }

    /// Where `node` was defined: `conf/a.yaml: descriptors[0].descriptors[1]`.
    pub fn origin(&self, node: &Node) -> String {
        let Some((file, at)) = node.origin.split_first() else {
            return String::new();
        };
        let mut out = (self.files.get(*file as usize)).map_or_else(String::new, |f| f.to_string());
        out.push(':');
        for (depth, i) in at.iter().enumerate() {
            out.push_str(if depth == 0 {
                " descriptors"
            } else {
                ".descriptors"
            });
            out.push_str(&format!("[{i}]"));
        }
        out
    }

    /// How many nodes the tree has: `Node::index` is below it.
    pub fn node_count(&self) -> usize {
        self.node_count
    }

    /// Every node of every domain, parents before children.
    pub fn for_each_node<'c>(&'c self, f: &mut dyn FnMut(&'c Node)) {
        for d in self.domains.values() {
            d.root.walk(f);
        }
    }
}

/// The lines of `level`'s limits and below; `domain` when pushed over xDS, which the lines
/// end with the overlay path of (`steps` are the keys and values down to `level`).
fn describe_level<'c>(
    level: &'c Level,
    domain: Option<&str>,
    steps: &mut Vec<(&'c str, Option<&'c str>)>,
    out: &mut Vec<String>,
) {
    for node in level.nodes() {
        steps.push((&node.key, node.value.as_deref()));
        for l in node.limits.iter() {
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
                if l.unit_multiplier > 1 {
                    line.push_str(&format!(" unit_multiplier={}", l.unit_multiplier));
                }
                if let Some(c) = l.calendar {
                    line.push_str(&format!(" calendar={}", c.zone()));
                }
            }
            if let Some(n) = &l.name {
                line.push_str(&format!(" name={n}"));
            }
            if !l.replaces.is_empty() {
                line.push_str(&format!(" replaces={}", l.replaces.join(",")));
            }
            if let Some(on) = l.local_first {
                line.push_str(&format!(" local_first={on}"));
            }
            if let Some(r) = l.reserve {
                line.push_str(&format!(
                    " reserve={} reserve_for={}ms",
                    r.hits,
                    r.hold.as_millis()
                ));
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
                ("value_to_metric", node.value_to_metric),
                ("share_threshold", node.share_threshold),
            ] {
                if on {
                    line.push_str(&format!(" {flag}"));
                }
            }
            if let Some(said) = &l.overlay {
                line.push_str(&format!(" overlay={said}"));
            }
            if let Some(d) = domain {
                line.push_str(&format!(
                    " overlay_path={}",
                    overlay::path_to_write(d, steps)
                ));
            }
            out.push(line);
        }
        describe_level(&node.children, domain, steps, out);
        steps.pop();
    }
}

/// `*` matches any run of characters (also none), anywhere in the pattern, any number of times.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    // Position of the last `*` seen and the text position it is currently matched up to.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests;
