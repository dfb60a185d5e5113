//! Limitador's limits file (Kuadrant's `limitador-config.yaml`): a list of limits, each a
//! namespace, a maximum over a window of seconds, CEL conditions saying when it applies and CEL
//! variables naming what it counts per. Loaded into [`Limits`]: per namespace, the limits in
//! file order and an index from the `descriptors[N]["key"] == "value"` condition each has (all
//! Kuadrant writes) to the limits it can concern, so a call looks at those, and at the few
//! limits with no such condition, never at the whole namespace.

mod cel;
mod raw;

use std::hash::Hasher;

use fnv::{FnvHashMap, FnvHasher};
use smallvec::SmallVec;

pub use cel::{
    Condition, Entries, EntryRef, EvalError, LabelValue, LabelsExpr, Lazy, LimitNames, Variable,
};

use super::ConfigError;

/// Every namespace's limits, as one file gave them.
#[derive(Debug, Default)]
pub struct Limits {
    namespaces: FnvHashMap<String, Namespace>,
    /// Limits in all, namespaces together.
    pub count: usize,
}

/// One namespace's limits, and the index into them.
#[derive(Debug, Default)]
pub struct Namespace {
    /// In the order the file lists them.
    pub limits: Vec<Limit>,
    /// The hash of `(N, key, value)` ([`entry_hash`]) of each limit's first equality condition
    /// → the limits indexed by it. A hash names candidates; their conditions decide.
    index: FnvHashMap<u64, SmallVec<[u32; 1]>>,
    /// Limits without an equality condition: candidates of every call.
    scanned: Vec<u32>,
    /// Per descriptor index, the limits indexed by an entry of that descriptor: those of an
    /// index past the descriptors a call sent are its candidates too, so the call fails as
    /// Limitador's evaluation of them fails it.
    by_descriptor: Vec<Vec<u32>>,
}

/// One limit, compiled.
#[derive(Debug)]
pub struct Limit {
    pub namespace: String,
    pub max_value: u64,
    pub seconds: u64,
    pub name: Option<String>,
    pub id: Option<String>,
    /// As written, for `/limits`.
    pub written_conditions: Vec<String>,
    pub written_variables: Vec<String>,
    /// Compiled, each text once, sorted by text.
    pub conditions: Vec<Condition>,
    /// Compiled, each text once, sorted by text: the order of a counter's values.
    pub variables: Vec<Variable>,
    /// A digest of the limit's identity: its namespace, window and the sets of its condition
    /// and variable texts (not `max_value`, `name` or `id`), which name its counters.
    pub identity: u64,
    /// The line of the file it was read from.
    pub line: usize,
}

impl Limit {
    pub fn names(&self) -> LimitNames<'_> {
        LimitNames {
            name: self.name.as_deref(),
            id: self.id.as_deref(),
        }
    }
}

impl Limits {
    /// Reads and compiles the limits file at `path`.
    pub fn read(path: &std::path::Path) -> Result<Limits, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            path: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Limits::parse(&file, &text)
    }

    /// Reads the limits file `file` whose text is `text`. An error names the file, the line and
    /// what is wrong; nothing is half loaded.
    pub fn parse(file: &str, text: &str) -> Result<Limits, ConfigError> {
        let error = |path: String, message: String| ConfigError {
            file: file.to_owned(),
            path,
            message,
        };
        let raw = raw::parse(text).map_err(|e| {
            let at = (e.location()).and_then(|l| raw::limit_at(text, l.line() as usize));
            let path = at.map_or(String::new(), |(i, line)| {
                format!("line {line}: limits[{i}]")
            });
            error(path, e.to_string())
        })?;
        let mut limits = Limits::default();
        for (i, spanned) in raw.into_iter().enumerate() {
            let line = spanned.referenced.line() as usize;
            let at = |what: &str| format!("line {line}: limits[{i}]{what}");
            let limit = compile(spanned.value, line).map_err(|(what, m)| error(at(&what), m))?;
            limits.add(limit);
        }
        Ok(limits)
    }

    fn add(&mut self, limit: Limit) {
        let ns = self.namespaces.entry(limit.namespace.clone()).or_default();
        // One limit an identity, as Limitador keeps them in a set: the first written stays.
        if ns.limits.iter().any(|l| l.identity == limit.identity) {
            return;
        }
        let at = ns.limits.len() as u32;
        let indexed = limit.conditions.iter().find_map(|c| match c {
            Condition::Equals { entry, value, .. } => {
                Some((entry.index, entry_hash(entry.index, &entry.key, value)))
            }
            Condition::Cel(_) => None,
        });
        match indexed {
            Some((i, h)) => {
                ns.index.entry(h).or_default().push(at);
                if ns.by_descriptor.len() <= i {
                    ns.by_descriptor.resize_with(i + 1, Vec::new);
                }
                ns.by_descriptor[i].push(at);
            }
            None => ns.scanned.push(at),
        }
        ns.limits.push(limit);
        self.count += 1;
    }

    pub fn namespace(&self, name: &str) -> Option<&Namespace> {
        self.namespaces.get(name)
    }

    /// The namespaces, in no order.
    pub fn namespaces(&self) -> impl Iterator<Item = (&str, &Namespace)> {
        self.namespaces.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl Namespace {
    /// The limits a call with descriptors `d` may concern, in file order: those indexed by one
    /// of its entries, and those with no equality condition.
    pub fn candidates(&self, d: &dyn Entries) -> SmallVec<[u32; 8]> {
        let mut out: SmallVec<[u32; 8]> = SmallVec::new();
        if !self.index.is_empty() {
            for i in 0..d.descriptors() {
                d.each(i, &mut |k, v| {
                    if let Some(at) = self.index.get(&entry_hash(i, k, v)) {
                        out.extend_from_slice(at);
                    }
                });
            }
        }
        out.extend_from_slice(&self.scanned);
        for past in self.by_descriptor.iter().skip(d.descriptors()) {
            out.extend_from_slice(past);
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// What `limitador-server` reads at start: its limits file and its `-L` file, if any.
#[derive(Debug)]
pub struct Files {
    pub limits: Limits,
    pub labels: CustomLabels,
}

impl Files {
    pub fn read(
        limits: &std::path::Path,
        labels: Option<&std::path::Path>,
    ) -> Result<Files, ConfigError> {
        Ok(Files {
            limits: Limits::read(limits)?,
            labels: labels
                .map(CustomLabels::read)
                .transpose()?
                .unwrap_or_default(),
        })
    }
}

/// A `-L/--custom-metric-labels` file: a YAML map of label name → CEL expression, each label
/// of a call's metrics when its expression gives a value.
#[derive(Debug, Default)]
pub struct CustomLabels {
    pub labels: Vec<(String, LabelValue)>,
}

impl CustomLabels {
    /// Reads and compiles the file at `path`; an error names the file and the label.
    pub fn read(path: &std::path::Path) -> Result<CustomLabels, ConfigError> {
        let file = path.display().to_string();
        let error = |path: String, message: String| ConfigError {
            file: file.clone(),
            path,
            message,
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| error(String::new(), format!("cannot read: {e}")))?;
        let map: Option<std::collections::BTreeMap<String, String>> = if text.trim().is_empty() {
            None
        } else {
            serde_saphyr::from_str_with_options(&text, super::yaml_options())
                .map_err(|e| error(String::new(), e.to_string()))?
        };
        let mut labels = Vec::new();
        for (name, expr) in map.unwrap_or_default() {
            let valid = name
                .chars()
                .enumerate()
                .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
            if !valid || name.is_empty() {
                return Err(error(
                    name,
                    "not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)".into(),
                ));
            }
            // As Limitador: a label whose CEL does not parse is logged and dropped, the rest
            // apply.
            match LabelValue::parse(&expr) {
                Ok(value) => labels.push((name, value)),
                Err(e) => tracing::error!(
                    file = %file,
                    label = %name,
                    error = %e,
                    "custom metric label dropped: its CEL does not parse"
                ),
            }
        }
        Ok(CustomLabels { labels })
    }
}

/// The index's hash of entry `key` = `value` of descriptor `index`.
pub fn entry_hash(index: usize, key: &str, value: &str) -> u64 {
    let mut h = FnvHasher::default();
    h.write_u32(index as u32);
    h.write(key.as_bytes());
    h.write_u8(0xff);
    h.write(value.as_bytes());
    h.finish()
}

/// The largest `max_value` turnstile counts to (its counters are u32).
pub const MAX_VALUE: u64 = u32::MAX as u64;

/// A limit as written → compiled; an error says where in the limit (`.conditions[1]`).
fn compile(r: raw::RawLimit, line: usize) -> Result<Limit, (String, String)> {
    let namespace = match r.namespace {
        Some(n) if !n.is_empty() => n,
        _ => return Err((String::new(), "missing field `namespace`".into())),
    };
    // turnstile counts to u32::MAX: a larger maximum is that cap, everywhere the limit shows
    // (`/limits`, `/counters`' `remaining`, `X-RateLimit-Limit`), never a number it cannot keep.
    // Unwritten, 0 (refusing every call), as Limitador's serde default.
    let max_value = r.max_value.unwrap_or(0).min(MAX_VALUE);
    let seconds = match r.seconds {
        None => return Err((String::new(), "missing field `seconds`".into())),
        Some(0) => {
            return Err((
                ".seconds".into(),
                "a window of 0 seconds counts nothing".into(),
            ))
        }
        Some(s) => s,
    };
    let written_conditions: Vec<String> = (r.conditions.into_iter()).map(|s| s.value).collect();
    let written_variables: Vec<String> = (r.variables.into_iter()).map(|s| s.value).collect();
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v.dedup();
        v
    };
    let (conds, vars) = (sorted(&written_conditions), sorted(&written_variables));
    let mut conditions = Vec::with_capacity(conds.len());
    for c in &conds {
        let at = written_conditions.iter().position(|w| w == c).unwrap_or(0);
        conditions.push(Condition::parse(c).map_err(|e| (format!(".conditions[{at}]"), e))?);
    }
    let mut variables = Vec::with_capacity(vars.len());
    for v in &vars {
        let at = written_variables.iter().position(|w| w == v).unwrap_or(0);
        variables.push(Variable::parse(v).map_err(|e| (format!(".variables[{at}]"), e))?);
    }
    let mut h = FnvHasher::default();
    for part in [namespace.as_str(), &seconds.to_string()] {
        h.write(part.as_bytes());
        h.write_u8(0xff);
    }
    for c in &conds {
        h.write(c.as_bytes());
        h.write_u8(0xfe);
    }
    h.write_u8(0xff);
    for v in &vars {
        h.write(v.as_bytes());
        h.write_u8(0xfe);
    }
    Ok(Limit {
        namespace,
        max_value,
        seconds,
        name: r.name,
        id: r.id,
        written_conditions,
        written_variables,
        conditions,
        variables,
        identity: h.finish(),
        line,
    })
}

#[cfg(test)]
mod tests;
