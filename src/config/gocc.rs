//! GoCC's key file (`CONFIG_FILE`), read as GoCC reads it (kivra/GoCC `pkg/config/config.go`):
//!
//! ```json
//! {"keys": [{"key_pattern": "^user-.*", "key_pattern_is_regex": true,
//!            "max_requests_per_window": 100, "max_requests_in_queue": 50, "window_millis": 60000}]}
//! ```
//!
//! - Go's `encoding/json` (`config.go:174-180`): field names match case-insensitively, unknown
//!   fields are skipped (reported here as warnings), `null` is the zero value, numbers must be
//!   whole.
//! - A pattern is the exact key, or with `key_pattern_is_regex` a Go regexp matched anywhere
//!   in the key (`config.go:161-172`; see `go_regex`).
//! - Every entry that matches is applied in file order, and a field of 0 leaves the value as it
//!   was (`pkg/limiter/limiter_manager/limiter_manager.go:215-252`).
//!
//! Stricter than GoCC, each with an error naming the entry: a regex that does not compile
//! (GoCC logs it on every request and never matches), negative numbers (GoCC's ticker panics on
//! a negative window), and values past the bounds below.

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use super::{go_regex, ConfigError};

/// The largest count GoCC accepts for `MAX_REQUESTS` and `MAX_REQUESTS_IN_QUEUE`
/// (`config.go:98-99`), here for the file's counts too.
pub const MAX_COUNT: u64 = 1_000_000_000;
/// The longest window: a day, as every duration in turnstile's YAML.
pub const MAX_WINDOW_MS: u64 = 86_400_000;

/// How a key is matched.
#[derive(Debug, Clone)]
pub enum KeyPattern {
    Exact(String),
    Regex(regex::Regex),
}

impl KeyPattern {
    pub fn matches(&self, key: &str) -> bool {
        match self {
            KeyPattern::Exact(k) => k == key,
            KeyPattern::Regex(r) => r.is_match(key),
        }
    }
}

/// One entry of `keys`; `None` where the file says 0 (unset).
#[derive(Debug, Clone)]
pub struct GoccEntry {
    pub pattern: KeyPattern,
    pub max_requests: Option<u32>,
    pub max_in_queue: Option<u32>,
    pub window: Option<Duration>,
}

/// A key's limits, as GoCC's `limiter_api.Config` holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyLimits {
    pub max_requests: u32,
    pub max_in_queue: u32,
    pub window: Duration,
}

/// The whole file.
#[derive(Debug, Clone, Default)]
pub struct GoccKeys {
    /// The path it was read from, for messages.
    pub file: String,
    pub entries: Vec<GoccEntry>,
    /// Fields GoCC would skip silently, one line each (`keys[0]: unknown field "x" ignored`).
    pub warnings: Vec<String>,
}

impl GoccKeys {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<GoccKeys, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            path: String::new(),
            message: format!("cannot read GoCC key file (CONFIG_FILE): {e}"),
        })?;
        GoccKeys::parse(&file, &text)
    }

    /// Parses GoCC's JSON; `file` labels errors.
    pub fn parse(file: &str, text: &str) -> Result<GoccKeys, ConfigError> {
        let err = |path: String, message: String| ConfigError {
            file: file.to_owned(),
            path,
            message,
        };
        let root: Value = serde_json::from_str(text)
            .map_err(|e| err(String::new(), format!("not valid JSON: {e}")))?;
        let mut out = GoccKeys {
            file: file.to_owned(),
            ..GoccKeys::default()
        };
        let top = match &root {
            Value::Null => return Ok(out),
            Value::Object(m) => m,
            _ => {
                return Err(err(
                    String::new(),
                    "expected an object {\"keys\": [...]}".into(),
                ))
            }
        };
        let keys = fields(top, &["keys"], "", &mut out.warnings)[0];
        let list = match keys {
            None | Some(Value::Null) => return Ok(out),
            Some(Value::Array(a)) => a,
            Some(_) => return Err(err("keys".into(), "expected a list of entries".into())),
        };
        for (i, v) in list.iter().enumerate() {
            let here = format!("keys[{i}]");
            match v {
                // Go decodes `null` into a zero entry: pattern "" matches no key.
                Value::Null => continue,
                Value::Object(m) => {
                    let e = entry(m, &here, &mut out.warnings).map_err(|(p, m)| err(p, m))?;
                    out.entries.push(e);
                }
                _ => return Err(err(here, "expected an object".into())),
            }
        }
        Ok(out)
    }

    /// `base` with every matching entry applied over it, in file order.
    pub fn apply(&self, key: &str, base: KeyLimits) -> KeyLimits {
        let mut l = base;
        for e in self.entries.iter().filter(|e| e.pattern.matches(key)) {
            l.max_requests = e.max_requests.unwrap_or(l.max_requests);
            l.max_in_queue = e.max_in_queue.unwrap_or(l.max_in_queue);
            l.window = e.window.unwrap_or(l.window);
        }
        l
    }
}

type EntryError = (String, String);

const ENTRY_FIELDS: [&str; 5] = [
    "key_pattern",
    "key_pattern_is_regex",
    "max_requests_per_window",
    "max_requests_in_queue",
    "window_millis",
];

fn entry(
    m: &Map<String, Value>,
    here: &str,
    warnings: &mut Vec<String>,
) -> Result<GoccEntry, EntryError> {
    let [pattern, is_regex, max_requests, max_in_queue, window] =
        fields(m, &ENTRY_FIELDS, here, warnings)[..]
    else {
        unreachable!("one value per field name");
    };
    let at = |f: &str| format!("{here}.{f}");
    let pattern = match pattern {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err((at("key_pattern"), "expected a string".into())),
    };
    let is_regex = match is_regex {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err((at("key_pattern_is_regex"), "expected true or false".into())),
    };
    let pattern = if is_regex {
        KeyPattern::Regex(go_regex::compile(&pattern).map_err(|e| {
            let msg = format!("\"{pattern}\" is not a valid Go regular expression: {e}");
            (at("key_pattern"), msg)
        })?)
    } else {
        KeyPattern::Exact(pattern)
    };
    let num = |v, f: &str| count(v, MAX_COUNT).map_err(|m| (at(f), m));
    Ok(GoccEntry {
        pattern,
        max_requests: num(max_requests, "max_requests_per_window")?.map(|n| n as u32),
        max_in_queue: num(max_in_queue, "max_requests_in_queue")?.map(|n| n as u32),
        window: (num(window, "window_millis")?)
            .map(|ms| {
                (ms <= MAX_WINDOW_MS)
                    .then(|| Duration::from_millis(ms))
                    .ok_or_else(|| (at("window_millis"), format!("{ms} is over a day")))
            })
            .transpose()?,
    })
}

/// A whole number from 0 to `max`; 0 and absent are `None` (GoCC's "unset").
fn count(v: Option<&Value>, max: u64) -> Result<Option<u64>, String> {
    let n = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n,
        Some(other) => return Err(format!("expected a whole number, found {other}")),
    };
    if let Some(i) = n.as_i64().filter(|i| *i < 0) {
        return Err(format!("{i} is negative (0 means unset)"));
    }
    match n.as_u64() {
        Some(0) => Ok(None),
        Some(u) if u <= max => Ok(Some(u)),
        Some(u) => Err(format!("{u} is over {max}")),
        None => Err(format!("{n} is not a whole number")),
    }
}

/// The values of `names` in `m`, matched case-insensitively as Go's `encoding/json` does;
/// fields not named are reported in `warnings`.
fn fields<'m>(
    m: &'m Map<String, Value>,
    names: &[&str],
    here: &str,
    warnings: &mut Vec<String>,
) -> Vec<Option<&'m Value>> {
    let mut found = vec![None; names.len()];
    for (k, v) in m {
        match names.iter().position(|n| n.eq_ignore_ascii_case(k)) {
            Some(i) => found[i] = Some(v),
            None => {
                let at = if here.is_empty() { "top level" } else { here };
                warnings.push(format!(
                    "{at}: unknown field \"{k}\" ignored (as GoCC ignores it)"
                ));
            }
        }
    }
    found
}
