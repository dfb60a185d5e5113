//! Which limit refused a request, named where Envoy and an operator can see it: the answer's
//! dynamic metadata (`refused_by`, for an access log's `%DYNAMIC_METADATA(...)%`), the IETF
//! `RateLimit-Policy` / `RateLimit` fields of the service-made headers, and a debug log line,
//! at most [`LOG_PER_SECOND`] a second so a flood cannot fill a disk.

use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;

use super::plan::{Applied, LimitRef, Plan};
use super::request::Request;
use crate::descriptor;
use crate::limiter::Outcome;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// The applied limit each descriptor's status reports, and its outcome (the answer's `best`).
pub(super) type Reported = [Option<(usize, Outcome)>];

/// Refusal log lines a second, at most; the ones past it are counted in the next line.
pub(super) const LOG_PER_SECOND: u64 = 10;

/// The limit a status describes, named as an operator finds it in the config.
pub(super) struct NamedLimit<'a> {
    /// The request's descriptor it is about.
    pub(super) descriptor: usize,
    /// The applied limit (its index in the plan).
    applied: usize,
    /// The `name:` of the rate limit, else its descriptor's path in the config
    /// (`domain.key_value.key`), else `override` for Envoy's per-descriptor `limit`.
    pub(super) limit: &'a str,
    pub(super) requests_per_unit: u32,
    /// The window's length: the unit's times `unit_multiplier` (a calendar window's nominal one).
    pub(super) unit_secs: u64,
    pub(super) unit: &'static str,
}

impl<'a> NamedLimit<'a> {
    /// The limit of descriptor `i`'s status: `best` is the applied limit the answer reported
    /// for each descriptor.
    pub(super) fn of(
        plan: &'a Plan<'_>,
        best: &[Option<(usize, Outcome)>],
        i: usize,
    ) -> Option<Self> {
        let (ai, _) = best.get(i).copied().flatten()?;
        let a: &Applied<'_> = &plan.applied[ai];
        let limit = match a.limit {
            LimitRef::Config(l) => match &l.name {
                Some(n) => &**n,
                None => plan.matches[i].as_ref().map_or("", |m| &m.node().stat_key),
            },
            LimitRef::Override { .. } => "override",
        };
        let unit = a.limit.unit();
        Some(NamedLimit {
            descriptor: i,
            applied: ai,
            limit,
            requests_per_unit: a.limit.requests_per_unit(),
            unit_secs: a.limit.window_ms() / 1000,
            unit: unit.name(),
        })
    }
}

/// The limit that refused: the first descriptor whose status is over its limit.
pub(super) fn refusing<'a>(
    plan: &'a Plan<'_>,
    best: &Reported,
    statuses: &[DescriptorStatus],
) -> Option<NamedLimit<'a>> {
    let i = statuses
        .iter()
        .position(|s| s.code == Code::OverLimit as i32)?;
    NamedLimit::of(plan, best, i)
}

/// `refused_by` in the dynamic metadata: the limit, the domain, the descriptor (its index and
/// its entries as `key=value`), the counter key and the limit's rate.
pub(super) fn metadata(
    req: &Request<'_>,
    plan: &Plan<'_>,
    named: &NamedLimit<'_>,
) -> serde_json::Value {
    let d = &req.descriptors[named.descriptor];
    let entries: Vec<String> = (d.entries.iter())
        .map(|e| format!("{}={}", e.key, e.value))
        .collect();
    serde_json::json!({
        "limit": named.limit,
        "domain": req.domain,
        "descriptor": named.descriptor,
        "entries": entries,
        "key": counter_key(req, plan, named),
        "requests_per_unit": named.requests_per_unit,
        "unit": named.unit.to_uppercase(),
    })
}

/// The refusing limit's counter key, as the admin listener's look-up and reset take it (the
/// second and later limits of a descriptor carry their index, as their ops do).
fn counter_key(req: &Request<'_>, plan: &Plan<'_>, named: &NamedLimit<'_>) -> String {
    let i = named.descriptor;
    let index = plan.limit_index(&plan.applied[named.applied]);
    descriptor::counter_key(
        req.domain,
        &req.descriptors[i].entries,
        plan.matches[i].as_ref(),
        index,
    )
}

/// The IETF fields (draft-ietf-httpapi-ratelimit-headers-11): `RateLimit-Policy` names the
/// limit with its quota and window, `RateLimit` what is left of it and when it resets.
pub(super) fn ietf_fields(
    named: &NamedLimit<'_>,
    status: &DescriptorStatus,
) -> [(String, String); 2] {
    let name = sf_string(named.limit);
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds);
    [
        (
            "RateLimit-Policy".to_owned(),
            format!("{name};q={};w={}", named.requests_per_unit, named.unit_secs),
        ),
        (
            "RateLimit".to_owned(),
            format!("{name};r={};t={reset}", status.limit_remaining),
        ),
    ]
}

/// A Structured Field String (RFC 9651): quoted, `"` and `\` escaped; what is not printable
/// ASCII becomes `?`.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// The refusal log: one debug line a refusal, at most [`LOG_PER_SECOND`] in a second of the
/// wall clock; the lines left out are counted in the next one written.
#[derive(Debug, Default)]
pub(super) struct RefusalLog {
    /// (second, lines written in it), packed: the second in the high 44 bits.
    window: AtomicU64,
    skipped: AtomicU64,
}

impl RefusalLog {
    pub(super) fn log(&self, req: &Request<'_>, plan: &Plan<'_>, named: &NamedLimit<'_>) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if !self.admit(now) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let d = &req.descriptors[named.descriptor];
        let entries: Vec<String> = (d.entries.iter())
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        tracing::debug!(
            domain = req.domain,
            descriptor = %entries.join(","),
            limit = named.limit,
            key = %counter_key(req, plan, named),
            skipped = self.skipped.swap(0, Ordering::Relaxed),
            "request refused"
        );
    }

    /// Whether a line may be written in second `now`.
    fn admit(&self, now: u64) -> bool {
        let mut cur = self.window.load(Ordering::Relaxed);
        loop {
            let (sec, n) = (cur >> 20, cur & 0xF_FFFF);
            let next = if sec != now {
                (now << 20) | 1
            } else if n < LOG_PER_SECOND {
                cur + 1
            } else {
                return false;
            };
            match (self.window).compare_exchange_weak(
                cur,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_field_strings_are_quoted_and_escaped() {
        assert_eq!(sf_string("edge.api_key"), "\"edge.api_key\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("é\n"), "\"??\"");
    }

    #[test]
    fn the_log_writes_at_most_its_rate_a_second() {
        let log = RefusalLog::default();
        let written = (0..100).filter(|_| log.admit(7)).count() as u64;
        assert_eq!(written, LOG_PER_SECOND);
        assert!(log.admit(8), "a new second starts afresh");
    }
}
