//! Every part's stats, registered once at start in the order `/metrics` shows them.

use std::sync::Arc;

use super::exposition::{Metrics, Pushed};
use super::Shown;

/// The parts the Prometheus text and the statsd push read, each a [`Metrics`] held and updated
/// by its own subsystem; this is a list of handles on them, cheap to clone. Adding a series to
/// a part touches that part's module only.
#[derive(Clone, Default)]
pub struct Registry {
    parts: Arc<[Arc<dyn Metrics>]>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("parts", &self.parts.len())
            .finish()
    }
}

impl Registry {
    /// The parts, rendered in this order.
    pub fn new(parts: Vec<Arc<dyn Metrics>>) -> Registry {
        Registry {
            parts: parts.into(),
        }
    }

    /// Prometheus text exposition: every part's families, in the order they were registered,
    /// client values in them as a port that shows them `shown` shows them.
    pub fn render(&self, shown: Shown) -> String {
        let mut out = String::with_capacity(8192);
        for p in self.parts.iter() {
            p.render_for(&mut out, shown);
        }
        out
    }

    /// What a statsd flush sends: every part's counters and timers (statsd's kinds).
    pub fn pushed(&self) -> Pushed {
        let mut out = Pushed::default();
        for p in self.parts.iter() {
            p.push(&mut out);
        }
        out
    }
}
