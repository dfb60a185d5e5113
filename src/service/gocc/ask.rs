//! A `/rate/{key}` call's parameters, read and checked in the order GoCC's handler reads them
//! (kivra/GoCC `pkg/server/endpoints/endpoint_rate.go:70-122`), so a call with several faults
//! gets GoCC's answer to the first.

use super::GoccError;
use crate::config::grammar::{parse_bool, BOOL_GRAMMAR};
use crate::service::RequestLimits;

/// GoCC's "no change" value (`pkg/limiter/limiter_api/limiter_api.go:54-56`): an override
/// equal to it counts as not given.
const NO_CHANGE: i32 = -1_000_000_000;

/// The parameters as the query carried them (the first of each name, as Go's
/// `url.Values.Get`), not yet parsed.
#[derive(Debug, Clone, Default)]
pub struct RawAsk {
    pub key: String,
    pub can_wait: Option<String>,
    pub max_requests: Option<String>,
    pub max_in_queue: Option<String>,
}

/// What a key's callers may override, and within which bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    pub can_set_rate: bool,
    pub can_mod_queue: bool,
    /// `maxRequests` is from 1 to this (GoCC: 1 to 10⁹, `pkg/config/config.go:98`).
    pub max_requests_cap: u32,
    /// `maxRequestsInQueue` is from 0 to this (GoCC: 0 to 10⁹, `config.go:99`).
    pub max_in_queue_cap: u32,
    /// The setting that switches overrides off, for the 403's message.
    pub switched_by: [&'static str; 2],
}

/// A checked call: the key trimmed, the overrides within bounds and allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoccAsk {
    pub key: String,
    pub can_wait: bool,
    pub max_requests: Option<u32>,
    pub max_in_queue: Option<u32>,
}

/// The key, trimmed as Go's `strings.TrimSpace` (`endpoint_rate.go:70`); empty is a 400, and
/// so is one over the bound every door keeps on a value a caller sends (a key is kept, as a
/// counter and in `/debug`).
pub(super) fn key(raw: &str) -> Result<&str, GoccError> {
    let k = raw.trim();
    if k.is_empty() {
        return Err(GoccError::BadRequest("empty key provided".into()));
    }
    let max = RequestLimits::default().max_value_len;
    if k.len() > max {
        let n = k.len();
        return Err(GoccError::BadRequest(format!(
            "key is {n} bytes (limit {max})"
        )));
    }
    Ok(k)
}

/// Checks `raw` against `rules`, in GoCC's order: `canWait`, `maxRequests` parsed then allowed,
/// `maxRequestsInQueue` parsed then allowed, then both bounded.
pub(super) fn check(raw: &RawAsk, rules: &Rules) -> Result<GoccAsk, GoccError> {
    let key = key(&raw.key)?.to_owned();
    let can_wait = match blank(&raw.can_wait) {
        None => false,
        Some(t) => parse_bool(t).ok_or_else(|| {
            bad(format!(
                "failed to parse canWait query parameter: \"{t}\" is not one of {BOOL_GRAMMAR}"
            ))
        })?,
    };
    let max_requests = int("maxRequests", &raw.max_requests)?;
    if max_requests.is_some() && !rules.can_set_rate {
        return Err(disabled("maxRequests", rules.switched_by[0]));
    }
    let max_in_queue = int("maxRequestsInQueue", &raw.max_in_queue)?;
    if max_in_queue.is_some() && !rules.can_mod_queue {
        return Err(disabled("maxRequestsInQueue", rules.switched_by[1]));
    }
    let max_requests = bounded("maxRequests", max_requests, 1, rules.max_requests_cap)?;
    let max_in_queue = bounded(
        "maxRequestsInQueue",
        max_in_queue,
        0,
        rules.max_in_queue_cap,
    )?;
    Ok(GoccAsk {
        key,
        can_wait,
        max_requests,
        max_in_queue,
    })
}

fn bad(m: String) -> GoccError {
    GoccError::BadRequest(m)
}

fn disabled(name: &str, setting: &str) -> GoccError {
    GoccError::Forbidden(format!("{name} query parameter is disabled ({setting})"))
}

/// The value trimmed (`strings.TrimSpace`), `None` when absent or blank: GoCC's "unset"
/// (`endpoint_rate.go:234-252`).
fn blank(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|t| !t.is_empty())
}

/// Go's `strconv.ParseInt(t, 10, 32)` (`endpoint_rate.go:245`): an optional sign, decimal
/// digits, within 32 bits; GoCC's [`NO_CHANGE`] is unset.
fn int(name: &str, v: &Option<String>) -> Result<Option<i32>, GoccError> {
    let Some(t) = blank(v) else {
        return Ok(None);
    };
    match t.parse::<i32>() {
        Ok(NO_CHANGE) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(bad(format!(
            "failed to parse {name} query parameter: \"{t}\" is not a whole number \
             from -2147483648 to 2147483647"
        ))),
    }
}

fn bounded(name: &str, v: Option<i32>, min: u32, max: u32) -> Result<Option<u32>, GoccError> {
    match v {
        None => Ok(None),
        Some(n) if n >= 0 && (min..=max).contains(&(n as u32)) => Ok(Some(n as u32)),
        Some(n) => Err(bad(format!(
            "{name} out of bounds: {n} is not from {min} to {max}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: Rules = Rules {
        can_set_rate: true,
        can_mod_queue: true,
        max_requests_cap: 1_000_000_000,
        max_in_queue_cap: 1_000_000_000,
        switched_by: ["A", "B"],
    };

    fn ask(key: &str, q: [Option<&str>; 3]) -> RawAsk {
        RawAsk {
            key: key.into(),
            can_wait: q[0].map(Into::into),
            max_requests: q[1].map(Into::into),
            max_in_queue: q[2].map(Into::into),
        }
    }

    #[test]
    fn go_parse_rules() {
        let ok = |q| check(&ask(" k ", q), &OPEN).unwrap();
        assert!(ok([Some(" T "), None, None]).can_wait);
        assert!(!ok([Some(""), None, None]).can_wait);
        assert_eq!(ok([None, Some(" +7 "), None]).max_requests, Some(7));
        assert_eq!(ok([None, Some("-1000000000"), None]).max_requests, None);
        assert_eq!(ok([None, None, Some("0")]).max_in_queue, Some(0));
        assert_eq!(ok([None, None, None]).key, "k");
        let err = |q| check(&ask("k", q), &OPEN).unwrap_err();
        for q in [
            [Some("yes"), None, None],
            [None, Some("1_000"), None],
            [None, Some("2147483648"), None],
            [None, Some("0"), None],
            [None, Some("1000000001"), None],
            [None, None, Some("-1")],
        ] {
            assert!(matches!(err(q), GoccError::BadRequest(_)), "{q:?}");
        }
        assert!(matches!(
            check(&ask("  ", [None; 3]), &OPEN),
            Err(GoccError::BadRequest(m)) if m == "empty key provided"
        ));
    }

    #[test]
    fn first_fault_in_gocc_order() {
        let closed = Rules {
            can_set_rate: false,
            ..OPEN
        };
        // A bad canWait is reported before a forbidden override, which is reported before
        // a bad maxRequestsInQueue and any bound.
        let e = check(&ask("k", [Some("x"), Some("5"), Some("y")]), &closed);
        assert!(matches!(e, Err(GoccError::BadRequest(m)) if m.contains("canWait")));
        let e = check(&ask("k", [None, Some("0"), Some("y")]), &closed);
        assert!(matches!(e, Err(GoccError::Forbidden(m)) if m.contains("(A)")));
        let e = check(&ask("k", [None, Some("0"), Some("y")]), &OPEN);
        assert!(matches!(e, Err(GoccError::BadRequest(m)) if m.contains("maxRequestsInQueue")));
    }
}
