//! The environment, read through one grammar: every error names the variable and its value
//! (`VAR=value: why`).

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::time::Duration;

use crate::config::grammar::{parse_bool, parse_duration, BOOL_GRAMMAR};

pub(super) type Result<T> = std::result::Result<T, String>;

/// A view of the environment. A lookup function rather than `std::env`, so tests pass their
/// own variables; blank values count as unset, as envconfig treats them.
pub struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl<'a> Env<'a> {
    pub fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Env<'a> {
        Env { lookup }
    }

    /// The value of `k`, trimmed of nothing; `None` when unset or blank.
    pub fn get(&self, k: &str) -> Option<String> {
        (self.lookup)(k).filter(|v| !v.trim().is_empty())
    }

    pub fn string(&self, k: &str, default: &str) -> String {
        self.get(k).unwrap_or_else(|| default.to_owned())
    }

    /// `k`'s value as the user wrote it (`0`, not the `0ns` it parsed to), or `default` shown
    /// when unset: every error about a value that parsed but does not fit echoes it so.
    pub fn written(&self, k: &str, default: impl fmt::Debug) -> String {
        self.get(k)
            .unwrap_or_else(|| format!("{default:?} (its default)"))
    }

    /// `VAR=value is not ...`: `why` continues the sentence.
    fn bad(k: &str, v: &str, why: impl fmt::Display) -> String {
        format!("{k}={v} {why}")
    }

    /// A boolean in Go's grammar (`strconv.ParseBool`).
    pub fn flag(&self, k: &str, default: bool) -> Result<bool> {
        match self.get(k) {
            None => Ok(default),
            Some(v) => parse_bool(&v)
                .ok_or_else(|| Self::bad(k, &v, format_args!("is not a boolean ({BOOL_GRAMMAR})"))),
        }
    }

    /// A whole number.
    pub fn number<T: FromStr + fmt::Display>(&self, k: &str, default: T) -> Result<T> {
        match self.get(k) {
            None => Ok(default),
            Some(v) => v.trim().parse().map_err(|_| {
                // A whole number too large (or negative) for the setting is not a typo.
                let why = match v.trim().parse::<i128>() {
                    Ok(_) => "is out of range",
                    Err(_) => "is not a whole number",
                };
                Self::bad(k, &v, why)
            }),
        }
    }

    /// A whole number from `min` to `max`.
    pub fn number_in(&self, k: &str, default: u64, min: u64, max: u64) -> Result<u64> {
        let n = self.number(k, default)?;
        if (min..=max).contains(&n) {
            Ok(n)
        } else {
            Err(Self::bad(
                k,
                &self.written(k, n),
                format_args!("is not a whole number from {min} to {max}"),
            ))
        }
    }

    /// A decimal fraction from 0 to 1.
    pub fn fraction(&self, k: &str, default: f64) -> Result<f64> {
        match self.get(k) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| Self::bad(k, &v, "is not a number from 0 to 1")),
        }
    }

    /// A duration in Go's grammar (`time.ParseDuration`: `800ms`, `1m30s`, `1.5h`).
    pub fn duration(&self, k: &str, default: Duration) -> Result<Duration> {
        match self.get(k) {
            None => Ok(default),
            Some(v) => parse_duration(&v).map_err(|e| format!("{k}={v}: {e}")),
        }
    }

    /// Milliseconds as a whole number (the `..._MS` settings).
    pub fn millis(&self, k: &str, default: u64) -> Result<Duration> {
        Ok(Duration::from_millis(self.number(k, default)?))
    }

    /// One of a few names, case-insensitive; `choices` pairs each name with its value.
    pub fn choice<T: Copy>(&self, k: &str, default: T, choices: &[(&str, T)]) -> Result<T> {
        let Some(v) = self.get(k) else {
            return Ok(default);
        };
        choices
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(v.trim()))
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
                Self::bad(
                    k,
                    &v,
                    format_args!("is not supported (expected {})", names.join(", ")),
                )
            })
    }

    /// A `HOST`/`PORT` pair of variables.
    pub fn host_and_port(
        &self,
        host_k: &str,
        port_k: &str,
        default_port: u16,
    ) -> Result<SocketAddr> {
        let host = self.string(host_k, "0.0.0.0");
        let port = self.number(port_k, default_port)?;
        resolve(&host, port).map_err(|e| format!("{host_k}={host}: {e}"))
    }

    /// A Go-style `HOST:PORT` in one variable, where an empty host means every interface.
    pub fn address(&self, k: &str, default: &str) -> Result<SocketAddr> {
        let v = self.string(k, default);
        host_port(&v).map_err(|e| format!("{k}={v}: {e}"))
    }

    /// Two settings set together or not at all (a certificate and its key).
    pub fn both_or_neither(&self, a: &str, b: &str) -> Result<Option<(String, String)>> {
        let needs = |k: &str, v: &str, other: &str| {
            Self::bad(
                k,
                v,
                format_args!("needs {other} too: the two go together (set both or neither)"),
            )
        };
        match (self.get(a), self.get(b)) {
            (Some(x), Some(y)) => Ok(Some((x, y))),
            (None, None) => Ok(None),
            (Some(x), None) => Err(needs(a, &x, b)),
            (None, Some(y)) => Err(needs(b, &y, a)),
        }
    }

    /// `k1:v1,k2=v2` (envconfig's map syntax, with `=` also accepted).
    pub fn pairs(&self, k: &str) -> Result<Vec<(String, String)>> {
        let v = self.get(k).unwrap_or_default();
        v.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let at = (p.find([':', '='])).ok_or_else(|| {
                    Self::bad(k, &v, format_args!("has \"{p}\", which is not key:value"))
                })?;
                let (key, value) = (p[..at].trim(), p[at + 1..].trim());
                if key.is_empty() {
                    return Err(Self::bad(
                        k,
                        &v,
                        format_args!("has \"{p}\", whose key is empty"),
                    ));
                }
                Ok((key.to_owned(), value.to_owned()))
            })
            .collect()
    }
}

/// `HOST`/`PORT` style pairs; accepts IPv4, IPv6 (`::`, `[::1]`) and host names.
pub fn resolve(host: &str, port: u16) -> std::result::Result<SocketAddr, String> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = h.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (h, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve host {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("host {host} has no address"))
}

/// Go-style `HOST:PORT` where the host may be empty (`:9090` listens on every interface).
pub fn host_port(text: &str) -> std::result::Result<SocketAddr, String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("address {text} needs a port (HOST:PORT)"))?;
    let port = port
        .parse()
        .map_err(|_| format!("address {text}: bad port"))?;
    resolve(if host.is_empty() { "0.0.0.0" } else { host }, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)], f: impl FnOnce(&Env<'_>)) {
        let owned: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |k: &str| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        f(&Env::new(&lookup));
    }

    #[test]
    fn errors_name_the_variable_and_the_value() {
        with(&[("A", "yes"), ("N", "x1"), ("D", "1d")], |env| {
            let e = env.flag("A", false).unwrap_err();
            assert!(e.starts_with("A=yes is not a boolean"), "{e}");
            let e = env.number("N", 1u64).unwrap_err();
            assert!(e.starts_with("N=x1 is not a whole number"), "{e}");
            let e = env.duration("D", Duration::ZERO).unwrap_err();
            assert!(e.starts_with("D=1d: invalid duration"), "{e}");
        });
    }

    #[test]
    fn blank_is_unset() {
        with(&[("A", "  ")], |env| {
            assert_eq!(env.flag("A", true), Ok(true));
            assert_eq!(env.get("A"), None);
        });
    }
}
