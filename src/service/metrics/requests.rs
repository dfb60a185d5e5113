//! The per-limit stats Envoy's door's answer counts in (rendered with the live config, by
//! `limit_series`); the calls themselves are counted with every door's (`calls`).

use super::{DetailedSeries, LimitStats, LimitStatsTable, Tally, DEFAULT_MAX_DETAILED_SERIES};

/// envoyproxy/ratelimit's per-limit stats, as `ShouldRateLimit` (over gRPC and `/json`) counts
/// them. The request path holds them.
#[derive(Debug)]
pub struct RequestStats {
    pub near_limit_ratio: f64,
    /// Sums over every limit, including Envoy's `limit` overrides that have no config node.
    pub all: LimitStats,
    /// `detailed_metric` series, bounded.
    pub detailed: DetailedSeries,
    /// envoyproxy/ratelimit's per-limit stats, by stat key.
    pub limit_stats: LimitStatsTable,
}

impl Default for RequestStats {
    fn default() -> RequestStats {
        RequestStats {
            near_limit_ratio: 0.8,
            all: LimitStats::default(),
            detailed: DetailedSeries::new(DEFAULT_MAX_DETAILED_SERIES),
            limit_stats: LimitStatsTable::default(),
        }
    }
}

impl RequestStats {
    pub fn new(near_limit_ratio: f64) -> RequestStats {
        RequestStats {
            near_limit_ratio,
            ..Default::default()
        }
    }

    /// With room for `cap` `detailed_metric` series.
    pub fn with_max_detailed_series(mut self, cap: usize) -> RequestStats {
        self.detailed = DetailedSeries::new(cap);
        self
    }

    /// Hits beyond floor(limit × ratio) but within the limit: of a count over the limit,
    /// those of its hits below the limit, as envoyproxy/ratelimit counts them.
    fn near(&self, v: &Counted) -> u64 {
        let threshold = (f64::from(v.limit) * self.near_limit_ratio).floor() as u64;
        if v.over || v.shadow {
            let Some(before) = (u64::from(v.limit).saturating_add(v.past)).checked_sub(v.hits)
            else {
                return 0;
            };
            return u64::from(v.limit).saturating_sub(threshold.max(before));
        }
        let used = u64::from(v.limit.saturating_sub(v.remaining));
        used.saturating_sub(threshold).min(v.hits)
    }

    /// Counts one descriptor's hits in the series `domain` + `path` (a name the reference gives,
    /// see `descriptor::stat_path`: per-value series of `detailed_metric` and
    /// `value_to_metric`, overrides), in the capped map of per-value series. Call it instead of
    /// passing the node to [`RequestStats::record`] (pass `None` there, so the totals still count
    /// once): the node's own series is then left out of the exposition.
    pub fn record_series(&self, domain: &str, path: &str, v: Counted) {
        let near = self.near(&v);
        self.detailed.with_path(domain, path, |s| {
            s.add(v.hits, v.over, v.over_hits(), near, v.shadow)
        });
    }

    /// Counts one descriptor's hits against its limit's stats, and in `totals`, the call's tally
    /// for [`RequestStats::record_totals`].
    pub fn record(&self, stats: Option<&LimitStats>, v: Counted, totals: &mut Tally) {
        let near = self.near(&v);
        totals.add(v.hits, v.over, v.over_hits(), near, v.shadow);
        if let Some(s) = stats {
            s.add(v.hits, v.over, v.over_hits(), near, v.shadow);
        }
    }

    /// Adds a call's tally to the totals (the `all` series), once per call.
    pub fn record_totals(&self, totals: &Tally) {
        self.all.add_tally(totals);
    }
}

/// What one descriptor's limit counted, as the stats count it (the request's verdict is
/// `limiter::refuses`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub hits: u64,
    /// Over its limit, and not in shadow mode.
    pub over: bool,
    /// Over its limit in shadow mode (counted, not refused).
    pub shadow: bool,
    pub remaining: u32,
    pub limit: u32,
    /// How far past the limit the key is with these hits (`u64::MAX`: all of them are over).
    pub past: u64,
}

impl Counted {
    /// The part of the hits over the limit: all of them when the key was full before.
    fn over_hits(&self) -> u64 {
        self.hits.min(self.past)
    }
}
