//! The one grammar for values written by people, in YAML and in the environment alike: Go's
//! `strconv.ParseBool` and `time.ParseDuration`, as envoyproxy/ratelimit (envconfig) reads them.

use std::time::Duration;

/// Go's `strconv.ParseBool`: `1 t T TRUE true True` and `0 f F FALSE false False`; nothing else.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim() {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// What [`parse_bool`] accepts, for error messages.
pub const BOOL_GRAMMAR: &str = "1, t, T, TRUE, true, True, 0, f, F, FALSE, false or False";

/// Go's `time.ParseDuration`: a sequence of decimal numbers, each with a unit (`ns`, `us`, `µs`,
/// `ms`, `s`, `m`, `h`), such as `800ms`, `1.5h` or `1m30s`; a lone `0` is zero. No negatives.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration \"{text}\" (expected e.g. 800ms, 10s, 1m30s, 1.5h)");
    let bad_unit = |unit: &str| {
        format!(
            "invalid duration \"{text}\": unit must be ns, us, ms, s, m or h (found \"{unit}\")"
        )
    };
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    rest = rest.strip_prefix('+').unwrap_or(rest);
    if rest.is_empty() || rest.starts_with('-') {
        return Err(bad());
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return Err(bad());
        }
        let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => return Err(bad_unit(unit)),
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// A duration in a limit's YAML: Go's grammar, at most a day (the longest wait worth holding).
pub fn parse_bounded_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d > Duration::from_secs(86_400) {
        return Err(format!("duration \"{text}\" is out of range (at most 24h)"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_booleans_and_nothing_else() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in ["yes", "no", "on", "off", "tRUE", "", "2"] {
            assert_eq!(parse_bool(bad), None, "{bad}");
        }
    }

    #[test]
    fn go_durations() {
        for (text, ms) in [
            ("0", 0),
            ("10s", 10_000),
            ("250ms", 250),
            ("1m30s", 90_000),
            ("1.5h", 5_400_000),
            ("1500us", 1),
            ("+2s", 2_000),
        ] {
            assert_eq!(parse_duration(text).unwrap().as_millis(), ms, "{text}");
        }
        for bad in ["", "10", "s", "-1s", "1x", "1s2", "1h 30m", ".s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("5").unwrap_err().contains("unit must be"));
        assert!(parse_duration("5x").unwrap_err().contains("unit must be"));
        assert!(parse_bounded_duration("25h")
            .unwrap_err()
            .contains("out of range"));
    }
}
