//! `TURNSTILE_XDS_OVERLAY`: turnstile's own fields for limits that come over xDS.
//!
//! Envoy Gateway's `RateLimitConfig` carries a limit's `unit` and `requests_per_unit` and no
//! field for `reserve`, `algorithm` or the others turnstile adds. An overlay is written in the
//! config files' format (`domain`, `descriptors` by `key` and `value`, nested as the pushed
//! config nests them, a value's `*` wildcards) with `rate_limit` blocks that hold only those
//! fields; each applies to the limit pushed at the same domain and descriptor path, on every
//! push, as if it had been written there. What the push says stays the push's: an overlay that
//! sets `requests_per_unit`, `unit`, `unlimited`, `name`, `replaces` or a descriptor's flags is
//! refused, naming the file, the line and the field.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use fnv::FnvHashMap;
use serde::Deserialize;

use super::raw::{opt_scalar, RawDescriptor, RawQueue, RawRateLimit};
use super::yaml::{message, options};
use super::{glob, list_files, ConfigError, LoadOptions};

/// Fields the push owns: an overlay that names one is refused.
const PUSHED: &[&str] = &[
    "requests_per_unit",
    "unit",
    "unlimited",
    "name",
    "replaces",
    "rate_limits",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// The fields an overlay's `rate_limit` may set.
const OWN: &str =
    "reserve, reserve_for, algorithm, burst, unit_multiplier, calendar, queue, local_first";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverlayFile {
    #[serde(default, deserialize_with = "opt_scalar")]
    domain: Option<String>,
    #[serde(default)]
    descriptors: Option<Vec<RawOverlayDescriptor>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverlayDescriptor {
    #[serde(default, deserialize_with = "opt_scalar")]
    key: Option<String>,
    #[serde(default, deserialize_with = "opt_scalar")]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<Fields>,
    #[serde(default)]
    descriptors: Option<Vec<RawOverlayDescriptor>>,
}

/// An overlay's `rate_limit`: turnstile's fields alone, read as a file's are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fields {
    #[serde(default)]
    unit_multiplier: Option<u32>,
    #[serde(default, deserialize_with = "opt_scalar")]
    calendar: Option<String>,
    #[serde(default, deserialize_with = "opt_scalar")]
    algorithm: Option<String>,
    #[serde(default)]
    burst: Option<u32>,
    #[serde(default)]
    queue: Option<RawQueue>,
    #[serde(default)]
    local_first: Option<bool>,
    #[serde(default)]
    reserve: Option<u32>,
    #[serde(default, deserialize_with = "opt_scalar")]
    reserve_for: Option<String>,
}

impl Fields {
    /// The names of the fields set, in the order a file lists them.
    fn names(&self) -> Vec<&'static str> {
        [
            ("algorithm", self.algorithm.is_some()),
            ("burst", self.burst.is_some()),
            ("unit_multiplier", self.unit_multiplier.is_some()),
            ("calendar", self.calendar.is_some()),
            ("queue", self.queue.is_some()),
            ("local_first", self.local_first.is_some()),
            ("reserve", self.reserve.is_some()),
            ("reserve_for", self.reserve_for.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, set)| set.then_some(n))
        .collect()
    }
}

/// One overlay descriptor: what it matches, the fields it sets, the ones below it.
#[derive(Debug, PartialEq, Eq)]
struct OverlayDescriptor {
    key: String,
    value: Option<String>,
    limit: Option<OverlayLimit>,
    children: Vec<OverlayDescriptor>,
    /// `f.yaml: descriptors[0].descriptors[1]`, for the warning when it matches nothing.
    place: String,
    /// Dense number within the overlay: its slot in a build's [`OverlayMatches`].
    index: usize,
}

/// An overlay descriptor's `rate_limit`: the fields, and how the limits they apply to say so
/// (`reserve,reserve_for from f.yaml`).
#[derive(Debug, PartialEq, Eq)]
struct OverlayLimit {
    fields: Fields,
    said: Arc<str>,
}

impl OverlayDescriptor {
    /// Whether this entry is for a pushed descriptor of `key` and `value`: the same key, and
    /// the same value text, or a pattern matching it; a key-only entry, key-only descriptors.
    fn matches(&self, key: &str, value: Option<&str>, pattern: bool) -> bool {
        if self.key != key {
            return false;
        }
        match (self.value.as_deref(), value) {
            (None, None) => !pattern,
            (Some(e), Some(v)) if !pattern => e == v,
            (Some(e), Some(v)) => e.contains('*') && glob(e, v),
            _ => false,
        }
    }
}

/// The overlay's entries by domain, as read from its files.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Overlay {
    domains: FnvHashMap<String, Vec<OverlayDescriptor>>,
    /// Entries in all domains.
    count: usize,
}

/// Which of an overlay's entries one build applied.
#[derive(Debug, Default)]
pub struct OverlayMatches(Vec<bool>);

impl Overlay {
    /// Reads the overlay at `path`: a YAML file, or every `*.yaml`/`*.yml` of a directory (a
    /// mounted ConfigMap), dotfiles skipped.
    pub fn load(path: &Path) -> Result<Overlay, ConfigError> {
        let mut overlay = Overlay::default();
        for f in list_files(path, LoadOptions::default())? {
            let file = f.display().to_string();
            let text = std::fs::read_to_string(&f).map_err(|e| ConfigError {
                file: file.clone(),
                path: String::new(),
                message: format!("cannot read: {e}"),
            })?;
            overlay.add_file(&file, &text)?;
        }
        Ok(overlay)
    }

    /// Builds an overlay from `(file name, YAML text)` pairs; the names only label errors.
    pub fn from_sources(sources: &[(String, String)]) -> Result<Overlay, ConfigError> {
        let mut overlay = Overlay::default();
        for (file, text) in sources {
            overlay.add_file(file, text)?;
        }
        Ok(overlay)
    }

    /// Whether the overlay has no entries.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn add_file(&mut self, file: &str, text: &str) -> Result<(), ConfigError> {
        let err = |path: &str, message: String| ConfigError {
            file: file.to_owned(),
            path: path.to_owned(),
            message,
        };
        let mut track = serde_path_to_error::Track::new();
        let read = serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
            Option::<RawOverlayFile>::deserialize(serde_path_to_error::Deserializer::new(
                de, &mut track,
            ))
        });
        let raw = read.map_err(|e| {
            let at = track.path().to_string();
            err(
                "",
                refusal(&at, &e).unwrap_or_else(|| message(&at, &e, || None)),
            )
        })?;
        let Some(raw) = raw else {
            return Ok(());
        };
        let domain = raw.domain.unwrap_or_default();
        if domain.is_empty() {
            return Err(err("domain", "domain must not be empty".into()));
        }
        let mut level = self.domains.remove(&domain).unwrap_or_default();
        let read = self.add_level(file, &mut level, raw.descriptors, "descriptors");
        self.domains.insert(domain, level);
        read
    }

    /// `raws`, the list at `path` of `file`, into `level`.
    fn add_level(
        &mut self,
        file: &str,
        level: &mut Vec<OverlayDescriptor>,
        raws: Option<Vec<RawOverlayDescriptor>>,
        path: &str,
    ) -> Result<(), ConfigError> {
        for (i, raw) in raws.into_iter().flatten().enumerate() {
            let here = format!("{path}[{i}]");
            let err = |message: String| ConfigError {
                file: file.to_owned(),
                path: here.clone(),
                message,
            };
            let key = raw.key.unwrap_or_default();
            if key.is_empty() {
                return Err(err("descriptor key must not be empty".into()));
            }
            let value = raw.value.filter(|v| !v.is_empty());
            let twin = level.iter().position(|e| e.key == key && e.value == value);
            // The same descriptor twice (in two files, or two places of one) is one entry: the
            // path to a limit is written again beside another, and only two limits for it clash.
            if let Some(t) = twin.filter(|t| level[*t].limit.is_some() && raw.rate_limit.is_some())
            {
                return Err(err(format!(
                    "this descriptor's rate_limit is in the overlay already, at {}",
                    level[t].place
                )));
            }
            let limit = match raw.rate_limit {
                Some(f) if f.names().is_empty() => {
                    return Err(err(format!(
                        "rate_limit sets nothing: an overlay's rate_limit sets some of {OWN}"
                    )))
                }
                Some(fields) => {
                    let said = format!("{} from {file}", fields.names().join(","));
                    let said = Arc::from(said);
                    Some(OverlayLimit { fields, said })
                }
                None => None,
            };
            let below = format!("{here}.descriptors");
            if let Some(t) = twin {
                let entry = &mut level[t];
                if limit.is_some() {
                    entry.limit = limit;
                    entry.place = format!("{file}: {here}");
                }
                self.add_level(file, &mut entry.children, raw.descriptors, &below)?;
                continue;
            }
            let mut entry = OverlayDescriptor {
                key,
                value,
                limit,
                children: Vec::new(),
                place: format!("{file}: {here}"),
                index: self.count,
            };
            self.count += 1;
            self.add_level(file, &mut entry.children, raw.descriptors, &below)?;
            level.push(entry);
        }
        Ok(())
    }

    /// Applies the overlay to `raw`, a top-level descriptor pushed for `domain`, and below it:
    /// each limit an entry is for takes the entry's fields, as if the push had them.
    pub(super) fn apply(
        &self,
        domain: &str,
        raw: &mut RawDescriptor,
        matched: &mut OverlayMatches,
    ) {
        if let Some(level) = self.domains.get(domain) {
            apply_one(level, raw, matched);
        }
    }

    /// A build's record of which entries it applied, all unapplied.
    pub(super) fn matched(&self) -> OverlayMatches {
        OverlayMatches(vec![false; self.count])
    }

    /// The entries with fields that no limit of a build took, one line each: what it is for
    /// and where it is written. Envoy Gateway may push their limits later.
    pub(super) fn unmatched(&self, matched: &OverlayMatches) -> Vec<String> {
        let mut out = Vec::new();
        let mut names: Vec<&String> = self.domains.keys().collect();
        names.sort();
        for d in names {
            unmatched_level(&self.domains[d], matched, &format!("{d:?}"), &mut out);
        }
        out
    }

    /// Each entry with fields, one line: where it applies and what it sets
    /// (`turnstile check`).
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut names: Vec<&String> = self.domains.keys().collect();
        names.sort();
        for d in names {
            describe_level(&self.domains[d], &format!("{d:?}"), &mut out);
        }
        out
    }
}

/// `raw` and its children, from the entries of its level.
fn apply_one(level: &[OverlayDescriptor], raw: &mut RawDescriptor, matched: &mut OverlayMatches) {
    let key = raw.key.as_deref().unwrap_or("");
    let value = raw.value.as_deref().filter(|v| !v.is_empty());
    // The same text first, then the first pattern (in file order) matching it.
    let entry = (level.iter().find(|e| e.matches(key, value, false)))
        .or_else(|| level.iter().find(|e| e.matches(key, value, true)));
    let Some(entry) = entry else {
        return;
    };
    if let (Some(o), Some(limit)) = (&entry.limit, raw.rate_limit.as_mut()) {
        set(limit, &o.fields, &o.said);
        matched.0[entry.index] = true;
    }
    for child in raw.descriptors.iter_mut().flatten() {
        apply_one(&entry.children, child, matched);
    }
}

/// `fields` written into the pushed `limit`, which says where they came from.
fn set(limit: &mut RawRateLimit, fields: &Fields, said: &Arc<str>) {
    let f = fields.clone();
    limit.unit_multiplier = f.unit_multiplier.or(limit.unit_multiplier);
    limit.calendar = f.calendar.or(limit.calendar.take());
    limit.algorithm = f.algorithm.or(limit.algorithm.take());
    limit.burst = f.burst.or(limit.burst);
    limit.queue = f.queue.or(limit.queue.take());
    limit.local_first = f.local_first.or(limit.local_first);
    limit.reserve = f.reserve.or(limit.reserve);
    limit.reserve_for = f.reserve_for.or(limit.reserve_for.take());
    limit.overlaid = Some(Arc::clone(said));
}

fn step(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("key {key:?} value {v:?}"),
        None => format!("key {key:?}"),
    }
}

fn unmatched_level(
    level: &[OverlayDescriptor],
    matched: &OverlayMatches,
    path: &str,
    out: &mut Vec<String>,
) {
    for e in level {
        let here = format!("{path} > {}", step(&e.key, e.value.as_deref()));
        if e.limit.is_some() && !matched.0[e.index] {
            out.push(format!(
                "overlay {}: {here}: matches no limit in the current push",
                e.place
            ));
        }
        unmatched_level(&e.children, matched, &here, out);
    }
}

fn describe_level(level: &[OverlayDescriptor], path: &str, out: &mut Vec<String>) {
    for e in level {
        let here = format!("{path} > {}", step(&e.key, e.value.as_deref()));
        if let Some(OverlayLimit { fields: f, .. }) = &e.limit {
            let mut line = format!("overlay {}: {here}:", e.place);
            let set = |line: &mut String, name: &str, v: Option<String>| {
                if let Some(v) = v {
                    let _ = write!(line, " {name}={v}");
                }
            };
            set(&mut line, "algorithm", f.algorithm.clone());
            set(&mut line, "burst", f.burst.map(|b| b.to_string()));
            let n = f.unit_multiplier.map(|n| n.to_string());
            set(&mut line, "unit_multiplier", n);
            set(&mut line, "calendar", f.calendar.clone());
            if let Some(q) = &f.queue {
                let w = q.max_waiting.map(|n| n.to_string());
                set(&mut line, "queue.max_waiting", w);
                set(&mut line, "queue.max_wait", q.max_wait.clone());
            }
            set(
                &mut line,
                "local_first",
                f.local_first.map(|b| b.to_string()),
            );
            set(&mut line, "reserve", f.reserve.map(|n| n.to_string()));
            set(&mut line, "reserve_for", f.reserve_for.clone());
            out.push(line);
        }
        describe_level(&e.children, &here, out);
    }
}

/// The refusal of a field an overlay may not set, at the line it is on: one the push owns,
/// or one that does not exist.
fn refusal(path: &str, e: &serde_saphyr::Error) -> Option<String> {
    let serde_saphyr::Error::SerdeUnknownField {
        field, location, ..
    } = e.without_snippet()
    else {
        return None;
    };
    let at = format!("line {}, column {}", location.line(), location.column());
    let field_path = match path.rsplit_once('.') {
        Some((parent, _)) if !parent.is_empty() && parent != "?" => format!("{parent}.{field}"),
        _ => field.clone(),
    };
    let why = if PUSHED.contains(&field.as_str()) {
        format!(
            "`{field}` is the pushed config's (Envoy Gateway's): an overlay sets only \
             turnstile's own fields of a rate_limit ({OWN})"
        )
    } else {
        format!("unknown field `{field}`: an overlay's rate_limit sets some of {OWN}")
    };
    Some(format!("{field_path}: {why}, at {at}"))
}

/// The path to write in an overlay for the limit of the node reached by `steps` (each a key
/// and its value) in `domain`, in YAML's flow style, ready to be pasted and filled in.
pub fn path_to_write(domain: &str, steps: &[(&str, Option<&str>)]) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut inner = String::new();
    for (i, (key, value)) in steps.iter().enumerate().rev() {
        let v = value
            .map(|v| format!(", value: {}", q(v)))
            .unwrap_or_default();
        inner = if i + 1 == steps.len() {
            format!("{{key: {}{v}, rate_limit: {{}}}}", q(key))
        } else {
            format!("{{key: {}{v}, descriptors: [{inner}]}}", q(key))
        };
    }
    format!("{{domain: {}, descriptors: [{inner}]}}", q(domain))
}

#[cfg(test)]
mod tests;
