//! The rate-limit headers of IETF draft 03, as Limitador writes them (`--rate-limit-headers
//! DRAFT_VERSION_03`): the tightest counter first (least remaining), every counter's maximum
//! and window in `X-RateLimit-Limit`, the headers sorted by name.

use super::LimitCounter;

/// The headers of a call whose applicable counters are `counters`; none when no limit applied.
pub fn draft_03(counters: &[LimitCounter]) -> Vec<(String, String)> {
    let mut sorted: Vec<&LimitCounter> = counters.iter().collect();
    sorted.sort_by_key(|c| c.remaining);
    let Some(first) = sorted.first() else {
        return Vec::new();
    };
    let mut limit = first.max_value.to_string();
    for c in &sorted {
        limit.push_str(&format!(", {};w={}", c.max_value, c.seconds));
        if let Some(name) = &c.name {
            limit.push_str(&format!(";name=\"{}\"", name.replace('"', "'")));
        }
    }
    // Limitador reads the time left after the window began, so a new window shows a second
    // less than its length: whole seconds, rounded down from just under the time left.
    let reset = first.reset_ns.saturating_sub(1) / 1_000_000_000;
    vec![
        ("X-RateLimit-Limit".to_owned(), limit),
        (
            "X-RateLimit-Remaining".to_owned(),
            first.remaining.to_string(),
        ),
        ("X-RateLimit-Reset".to_owned(), reset.to_string()),
    ]
}
