//! Limitador's limits matched against a call: the limits of its namespace that apply (every
//! condition true, every variable bound), each with the values its counter is kept for, and
//! the counter key's text. Only the candidates the namespace's index gives are evaluated.

use std::fmt::Write;

use smallvec::SmallVec;

use super::Entry;
use crate::config::limitador::{Entries, EvalError, Lazy, Limit, Namespace};

/// A call's descriptors, each its entries in the order sent.
pub struct Sent<'r, 'a>(pub &'r [&'r [Entry<'a>]]);

impl Entries for Sent<'_, '_> {
    fn descriptors(&self) -> usize {
        self.0.len()
    }

    fn get(&self, index: usize, key: &str) -> Option<&str> {
        let entries = self.0.get(index)?;
        entries.iter().rev().find(|e| e.key == key).map(|e| e.value)
    }

    fn each(&self, index: usize, f: &mut dyn FnMut(&str, &str)) {
        for e in self.0.get(index).copied().unwrap_or_default() {
            f(e.key, e.value);
        }
    }
}

/// A limit that applies to a call, and its counter's values (one per variable, in the limit's
/// order of variables).
#[derive(Debug)]
pub struct Applicable<'c> {
    pub limit: &'c Limit,
    pub values: SmallVec<[String; 2]>,
}

/// The limits of `ns` that apply to a call sending `d`, in file order. An error fails the call
/// as Limitador fails it (an index past the descriptors sent).
pub fn applicable<'c>(
    ns: &'c Namespace,
    d: &dyn Entries,
) -> Result<SmallVec<[Applicable<'c>; 4]>, EvalError> {
    let mut cx = Lazy::default();
    let mut out = SmallVec::new();
    'limits: for at in ns.candidates(d) {
        let limit = &ns.limits[at as usize];
        let names = limit.names();
        for c in &limit.conditions {
            if !c.holds(d, &mut cx, names)? {
                continue 'limits;
            }
        }
        let mut values = SmallVec::with_capacity(limit.variables.len());
        for v in &limit.variables {
            match v.value(d, &mut cx, names)? {
                Some(value) => values.push(value),
                None => continue 'limits,
            }
        }
        out.push(Applicable { limit, values });
    }
    Ok(out)
}

/// The separator of a counter key's parts: a control character no Kuadrant value holds.
pub const SEPARATOR: char = '\u{1f}';

/// The counter key of `limit` for `values`: its namespace, its identity's digest, then the
/// values, so a namespace's counters share a prefix ([`namespace_prefix`]).
pub fn counter_key(limit: &Limit, values: &[String]) -> String {
    let len = limit.namespace.len() + 18 + values.iter().map(|v| v.len() + 1).sum::<usize>();
    let mut key = String::with_capacity(len);
    key.push_str(&limit.namespace);
    key.push(SEPARATOR);
    let _ = write!(key, "{:016x}", limit.identity);
    for v in values {
        key.push(SEPARATOR);
        key.push_str(v);
    }
    key
}

/// What every counter key of namespace `ns` starts with.
pub fn namespace_prefix(ns: &str) -> String {
    format!("{ns}{SEPARATOR}")
}

/// A counter key of namespace `ns` read back: its limit's identity digest and its values.
pub fn parse_counter_key<'k>(key: &'k str, ns: &str) -> Option<(u64, Vec<&'k str>)> {
    let rest = key.strip_prefix(ns)?.strip_prefix(SEPARATOR)?;
    let mut parts = rest.split(SEPARATOR);
    let identity = u64::from_str_radix(parts.next()?, 16).ok()?;
    Some((identity, parts.collect()))
}
