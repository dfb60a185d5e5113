//! Limitador's metrics, named and labelled as Limitador names them, so Kuadrant's dashboards
//! and PodMonitor keep working: `authorized_calls`, `authorized_hits` and `limited_calls` by
//! `limitador_namespace` (and `limit_name` on `limited_calls` with `--limit-name-in-labels`),
//! each with the labels `--metric-labels-default` and a `-L` file give a call; `limitador_up` and
//! `datastore_partitioned`. At most [`MAX_SERIES`] label sets a family; calls past it are
//! counted in `turnstile_limitador_series_dropped_total`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use super::{LimitadorAnswer, LimitadorCall};
use arc_swap::ArcSwap;
use fnv::FnvHashMap;

use crate::config::limitador::{CustomLabels, LabelsExpr};
use crate::descriptor::limitador::Sent;
use crate::descriptor::Entry;
use crate::limiter::{BreakerState, EngineStats};
use crate::telemetry::Shown;

/// Label sets kept a family.
pub(super) const MAX_SERIES: usize = 10_000;

/// A series' labels, sorted by name.
type Labels = Vec<(String, String)>;

/// An admitted series: its `authorized_calls` and `authorized_hits`, each once counted (a check
/// counts no hits, a report no call, so one may be missing, as in Limitador).
#[derive(Debug, Default, Clone, Copy)]
struct Admitted {
    calls: Option<u64>,
    hits: Option<u64>,
}

/// The series by their labels: one look-up a call.
#[derive(Debug, Default)]
struct SeriesByLabels {
    authorized: FnvHashMap<Labels, Admitted>,
    limited_calls: FnvHashMap<Labels, u64>,
}

/// The calls' counters, and how to label them.
#[derive(Debug, Default)]
pub struct LimitadorMetrics {
    /// `--limit-name-in-labels`.
    limit_name_in_labels: bool,
    /// `--metric-labels-default`.
    default_labels: Option<LabelsExpr>,
    /// `-L/--custom-metric-labels`, replaced when its file is reloaded.
    custom_labels: ArcSwap<CustomLabels>,
    families: Mutex<SeriesByLabels>,
    dropped: AtomicU64,
    /// The engine's links to its store, whose breakers say `datastore_partitioned`.
    store: OnceLock<EngineStats>,
}

impl LimitadorMetrics {
    pub fn new(
        limit_name_in_labels: bool,
        default_labels: Option<LabelsExpr>,
        custom_labels: CustomLabels,
    ) -> LimitadorMetrics {
        LimitadorMetrics {
            limit_name_in_labels,
            default_labels,
            custom_labels: ArcSwap::from_pointee(custom_labels),
            ..LimitadorMetrics::default()
        }
    }

    /// `datastore_partitioned` from now on follows `store`'s breakers.
    pub(super) fn watch_store(&self, store: EngineStats) {
        let _ = self.store.set(store);
    }

    /// Whether the store cannot be reached, as Limitador's `datastore_partitioned` says it: a
    /// shard's breaker to it is open or probing (it opens on failed round trips and flushes,
    /// and closes when one goes through, as Limitador's flag flips on a flush's failure and
    /// back on a success). Never with counters in memory.
    fn partitioned(&self) -> bool {
        (self.store.get()).is_some_and(|s| s.breakers().any(|b| b != BreakerState::Closed.gauge()))
    }

    /// A `-L` file read again: valid, its labels apply from the next call (series counted so far
    /// keep theirs); invalid, the labels in use stay.
    pub fn reload_custom_labels(&self, read: Result<CustomLabels, crate::config::ConfigError>) {
        match read {
            Ok(l) => self.custom_labels.store(std::sync::Arc::new(l)),
            Err(e) => {
                tracing::error!(error = %e, "custom metric labels not reloaded: those in use stay")
            }
        }
    }

    /// Counts a call as Limitador does: admitted, an authorized call and (but for a check) its
    /// hits; refused, a limited call; a report, its hits alone.
    pub(super) fn counted(
        &self,
        namespace: &str,
        descriptors: &[&[Entry<'_>]],
        ask: LimitadorCall,
        delta: u64,
        answer: &LimitadorAnswer,
    ) {
        let mut labels = (self.default_labels.as_ref())
            .map(|l| l.labels(&Sent(descriptors)))
            .unwrap_or_default();
        let sent = Sent(descriptors);
        for (name, value) in self.custom_labels.load().labels.iter() {
            if let Some(v) = value.value(&sent) {
                labels.retain(|(k, _)| k != name);
                labels.push((name.clone(), v));
            }
        }
        labels.push(("limitador_namespace".to_owned(), namespace.to_owned()));
        let mut f = self.families.lock().unwrap_or_else(|p| p.into_inner());
        if answer.limited {
            if self.limit_name_in_labels {
                let name = answer.limited_by.clone().unwrap_or_default();
                labels.push(("limit_name".to_owned(), name));
            }
            labels.sort();
            if let Some(n) = self.series(&mut f.limited_calls, labels) {
                *n += 1;
            }
        } else {
            labels.sort();
            if let Some(a) = self.series(&mut f.authorized, labels) {
                if ask != LimitadorCall::Report {
                    *a.calls.get_or_insert(0) += 1;
                }
                if ask != LimitadorCall::Check {
                    *a.hits.get_or_insert(0) += delta;
                }
            }
        }
    }

    /// The series of `labels` in `family`, made when there is room for one more.
    fn series<'f, V: Default>(
        &self,
        family: &'f mut FnvHashMap<Labels, V>,
        labels: Labels,
    ) -> Option<&'f mut V> {
        if family.len() >= MAX_SERIES && !family.contains_key(&labels) {
            self.dropped.fetch_add(1, Relaxed);
            return None;
        }
        Some(family.entry(labels).or_default())
    }

    /// The families in Prometheus text, label values shown as `shown` says (the port's rule
    /// for client values).
    pub fn render(&self, shown: Shown, out: &mut String) {
        let f = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let sorted = |pick: &dyn Fn(&Admitted) -> Option<u64>| {
            let mut v: Vec<(&Labels, u64)> = (f.authorized.iter())
                .filter_map(|(l, a)| Some((l, pick(a)?)))
                .collect();
            v.sort();
            v
        };
        let (calls, hits) = (sorted(&|a| a.calls), sorted(&|a| a.hits));
        let mut limited: Vec<(&Labels, u64)> =
            f.limited_calls.iter().map(|(l, n)| (l, *n)).collect();
        limited.sort();
        let family =
            |out: &mut String, name: &str, help: Option<&str>, series: &[(&Labels, u64)]| {
                if series.is_empty() {
                    return;
                }
                if let Some(h) = help {
                    let _ = writeln!(out, "# HELP {name} {h}");
                }
                let _ = writeln!(out, "# TYPE {name} counter");
                for (labels, v) in series {
                    out.push_str(name);
                    write_labels(out, labels, shown);
                    let _ = writeln!(out, " {v}");
                }
                out.push('\n');
            };
        family(out, "authorized_calls", Some("Authorized calls"), &calls);
        family(out, "authorized_hits", None, &hits);
        family(out, "limited_calls", Some("Limited calls"), &limited);
        drop((calls, hits, limited));
        drop(f);
        out.push_str("# HELP limitador_up Limitador is running\n# TYPE limitador_up gauge\nlimitador_up 1\n\n");
        out.push_str(
            "# HELP datastore_partitioned Limitador is partitioned from backing datastore\n",
        );
        let partitioned = u8::from(self.partitioned());
        let _ = writeln!(
            out,
            "# TYPE datastore_partitioned gauge\ndatastore_partitioned {partitioned}\n"
        );
        let _ = writeln!(
            out,
            "# HELP turnstile_limitador_series_dropped_total Calls not counted in a Limitador series: \
             its family had {MAX_SERIES} label sets already\n\
             # TYPE turnstile_limitador_series_dropped_total counter\n\
             turnstile_limitador_series_dropped_total {}\n",
            self.dropped.load(Relaxed)
        );
    }
}

fn write_labels(out: &mut String, labels: &Labels, shown: Shown) {
    if labels.is_empty() {
        return;
    }
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // The namespace is the operator's; every other value came from a client.
        let v = if k == "limitador_namespace" {
            v.into()
        } else {
            shown.value(v)
        };
        let _ = write!(out, "{k}=\"{}\"", escape(&v));
    }
    out.push('}');
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
