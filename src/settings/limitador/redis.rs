//! Limitador's Redis storages as turnstile's Redis settings: `redis URL` (exact, every call
//! decided in Redis) and `redis_cached URL …` (local-first, synced every flush period), and
//! Limitador's own environment for them (`REDIS_URL`, `REDIS_LOCAL_CACHE_*`).
//!
//! The URL is read as Limitador's redis crate reads it (`redis://[user:pass@]host[:port][/db]`,
//! `rediss://` for TLS, `redis+unix:///path?user=&pass=&db=`), and becomes the variables
//! turnstile reads (`REDIS_URL=host:port`, `REDIS_AUTH`, `REDIS_TLS`, `REDIS_SOCKET_TYPE`). What
//! turnstile cannot do as the URL says is refused, naming it. A variable the mapping sets and
//! the environment sets to something else is refused too: neither silently wins.

use std::collections::BTreeMap;
use std::time::Duration;

use url::Url;

use crate::settings::Env;

/// Variables the command line stands for, each with its value (`None`: unset, whatever the
/// environment says); a variable not named is the environment's.
pub(super) type Vars = BTreeMap<&'static str, Option<String>>;

/// Limitador's defaults for `redis_cached` (limitador/src/storage/redis/mod.rs).
const DEFAULT_FLUSH_PERIOD_MS: i64 = 1000;

/// `redis_cached`'s flags, as given (`None`: not given).
#[derive(Debug, Default, Clone)]
pub(super) struct Cached {
    pub flush_period: Option<i64>,
    pub max_cached: Option<u64>,
    pub response_timeout: Option<u64>,
    pub batch_size: Option<u64>,
}

/// The variables of `redis URL`: decided in Redis, exactly. A store that fails answers
/// `UNAVAILABLE`, as Limitador's storage errors do, unless `TURNSTILE_REDIS_FAILURE_MODE` says
/// otherwise.
pub(super) fn exact(url: &str, env: &Env<'_>) -> Result<Vars, String> {
    let mut vars = url_vars(url)?;
    vars.insert("TURNSTILE_LOCAL_FIRST", Some("false".into()));
    if env.get("TURNSTILE_REDIS_FAILURE_MODE").is_none() {
        vars.insert("TURNSTILE_REDIS_FAILURE_MODE", Some("fail_closed".into()));
    }
    Ok(vars)
}

/// The variables of `redis_cached URL …`: local-first, synced every `--flush-period`. What
/// Limitador takes and turnstile does otherwise is taken and said in `warnings`: a batch size
/// (there is no batch to size) and a flush period outside turnstile's 1 ms to 60 s (the
/// nearest is used).
pub(super) fn cached(
    url: &str,
    flags: &Cached,
    env: &Env<'_>,
    warnings: &mut Vec<String>,
) -> Result<Vars, String> {
    if let Some(n) = flags.batch_size {
        warnings.push(format!(
            "--batch-size {n} (REDIS_LOCAL_CACHE_BATCH_SIZE) changes nothing in turnstile: each \
             flush period sends every counter used since the last, in one pipeline per shard"
        ));
    }
    let mut vars = url_vars(url)?;
    vars.insert("TURNSTILE_LOCAL_FIRST", Some("true".into()));
    let sync = "TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL";
    let period = match (flags.flush_period, env.get(sync)) {
        (None, Some(_)) => None,
        (given, _) => Some(given.unwrap_or(DEFAULT_FLUSH_PERIOD_MS)),
    };
    if let Some(ms) = period {
        // Limitador flushes without a pause at 0, and reads a negative period as a huge one.
        let synced = match ms {
            1..=60_000 => ms,
            0 => 1,
            _ => 60_000,
        };
        if synced != ms {
            warnings.push(format!(
                "--flush-period {ms} (REDIS_LOCAL_CACHE_FLUSHING_PERIOD_MS) is outside \
                 turnstile's sync interval, 1 to 60000 ms: it syncs every {synced} ms"
            ));
        }
        vars.insert(sync, Some(format!("{synced}ms")));
    }
    if let Some(ms) = flags.response_timeout {
        vars.insert("TURNSTILE_REDIS_DEADLINE_MS", Some(ms.to_string()));
    }
    if let Some(n) = flags.max_cached {
        vars.insert("TURNSTILE_MAX_KEYS", Some(n.to_string()));
    }
    Ok(vars)
}

/// Refuses a variable `vars` sets that the environment sets otherwise (read as turnstile reads
/// it, so `REDIS_TLS=1` agrees with `true`).
pub(super) fn agree(vars: &Vars, env: &Env<'_>, storage: &str) -> Result<(), String> {
    for (k, v) in vars {
        let (Some(mapped), Some(set)) = (v, env.get(k)) else {
            continue;
        };
        // Limitador's own variable here, read as its URL.
        if *k == "REDIS_URL" {
            continue;
        }
        let lookup = |_: &str| Some(mapped.clone());
        let ours = Env::new(&lookup);
        let same = match *k {
            "REDIS_TLS" | "TURNSTILE_LOCAL_FIRST" => env.flag(k, false)? == ours.flag(k, false)?,
            "TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL" => {
                env.duration(k, Duration::ZERO)? == ours.duration(k, Duration::ZERO)?
            }
            "TURNSTILE_REDIS_DEADLINE_MS" => env.millis(k, 0)? == ours.millis(k, 0)?,
            "TURNSTILE_MAX_KEYS" => env.number(k, 0u64)? == ours.number(k, 0u64)?,
            _ => set == *mapped,
        };
        if !same {
            let (mapped, set) = match *k {
                "REDIS_AUTH" => ("(the URL's credentials)", "(other credentials)"),
                _ => (mapped.as_str(), set.as_str()),
            };
            return Err(format!(
                "limitador-server: the storage `{storage}` means {k}={mapped}, and the \
                 environment sets {k}={set}: unset {k}, or change the command line"
            ));
        }
    }
    Ok(())
}

/// A Redis URL as Limitador's redis crate (0.27) reads it, as turnstile's variables.
pub(super) fn url_vars(text: &str) -> Result<Vars, String> {
    let bad = |why: String| format!("limitador-server: the Redis URL {}: {why}", redacted(text));
    let url = Url::parse(text).map_err(|e| bad(e.to_string()))?;
    let mut vars = Vars::new();
    vars.insert("BACKEND_TYPE", Some("redis".into()));
    vars.insert("REDIS_TYPE", Some("single".into()));
    let query: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    let (user, pass, db) = match url.scheme() {
        "redis" | "rediss" => tcp(&url, &query, &mut vars, &bad)?,
        "unix" | "redis+unix" => unix(&url, &query, &mut vars, &bad)?,
        other => {
            return Err(bad(format!(
                "the scheme `{other}` is not a Redis URL (redis, rediss, redis+unix, unix)"
            )))
        }
    };
    if !matches!(db.as_str(), "" | "0") {
        return Err(bad(format!(
            "the database `{db}` is not supported by turnstile, which counts in database 0"
        )));
    }
    let protocol = query.iter().find(|(k, _)| k == "protocol");
    if let Some((_, p)) = protocol.filter(|(_, p)| !matches!(p.as_str(), "2" | "resp2")) {
        return Err(bad(format!(
            "protocol={p}: turnstile speaks RESP2 to Redis (protocol=2, the default)"
        )));
    }
    // Without credentials, REDIS_AUTH is the environment's, as any setting beside the URL.
    if let Some(a) = auth(user, pass).map_err(bad)? {
        vars.insert("REDIS_AUTH", Some(a));
    }
    Ok(vars)
}

/// A URL's user, password and database.
type Credentials = (Option<String>, Option<String>, String);

/// `redis://` and `rediss://`: the host and port, TLS, and the credentials in the URL.
fn tcp(
    url: &Url,
    query: &[(String, String)],
    vars: &mut Vars,
    bad: &dyn Fn(String) -> String,
) -> Result<Credentials, String> {
    match url.fragment() {
        None => {}
        Some("insecure") => {
            return Err(bad(
                "`#insecure` (no certificate check) is not supported by \
                 turnstile, which always verifies Redis's certificate: give its CA in \
                 REDIS_TLS_CACERT"
                    .into(),
            ))
        }
        Some(f) => return Err(bad(format!("the fragment `#{f}` means nothing"))),
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_owned(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        Some(url::Host::Ipv6(a)) => format!("[{a}]"),
        None => return Err(bad("no host".into())),
    };
    let port = url.port().unwrap_or(6379);
    vars.insert("REDIS_URL", Some(format!("{host}:{port}")));
    vars.insert("REDIS_SOCKET_TYPE", Some("tcp".into()));
    let tls = url.scheme() == "rediss";
    vars.insert("REDIS_TLS", Some(tls.to_string()));
    let user = Some(decoded(url.username()).map_err(bad)?).filter(|u| !u.is_empty());
    let pass = url.password().map(decoded).transpose().map_err(bad)?;
    let db = url.path().trim_matches('/').to_owned();
    for (k, _) in query {
        if k != "protocol" {
            return Err(bad(format!(
                "the parameter `{k}` is not supported by turnstile"
            )));
        }
    }
    Ok((user, pass, db))
}

/// `unix://` and `redis+unix://`: the socket's path, and the credentials in the query.
fn unix(
    url: &Url,
    query: &[(String, String)],
    vars: &mut Vars,
    bad: &dyn Fn(String) -> String,
) -> Result<Credentials, String> {
    let path = url
        .to_file_path()
        .map_err(|_| bad("no socket path".into()))?;
    vars.insert("REDIS_URL", Some(path.display().to_string()));
    vars.insert("REDIS_SOCKET_TYPE", Some("unix".into()));
    vars.insert("REDIS_TLS", Some("false".into()));
    let q = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    for (k, _) in query {
        if !["user", "pass", "db", "protocol"].contains(&k.as_str()) {
            return Err(bad(format!(
                "the parameter `{k}` is not supported by turnstile"
            )));
        }
    }
    Ok((q("user"), q("pass"), q("db").unwrap_or_default()))
}

/// `REDIS_AUTH` of a URL's credentials: `user:password`, or the password alone. Limitador's
/// crate authenticates only with a password, so a user alone would be dropped: refused.
fn auth(user: Option<String>, pass: Option<String>) -> Result<Option<String>, String> {
    match (user, pass) {
        (None, None) => Ok(None),
        (Some(u), None) => Err(format!(
            "the user `{u}` has no password (Limitador would not authenticate at all)"
        )),
        (Some(u), Some(_)) if u.contains(':') => Err("a user name holding `:`".into()),
        (Some(u), Some(p)) => Ok(Some(format!("{u}:{p}"))),
        // REDIS_AUTH reads `a:b` as user `a`, password `b`.
        (None, Some(p)) if p.contains(':') => Err(
            "a password holding `:` without a user name: write the user too \
             (redis://default:PASSWORD@…)"
                .into(),
        ),
        (None, Some(p)) => Ok(Some(p)),
    }
}

/// Percent-decoded `s`, as the crate decodes user names and passwords.
fn decoded(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "credentials that are not UTF-8".into())
}

/// `text` with its password hidden, for messages.
fn redacted(text: &str) -> String {
    match Url::parse(text) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("****"));
            u.to_string()
        }
        Ok(_) => text.to_owned(),
        Err(_) => "(unreadable)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(url: &str) -> BTreeMap<&'static str, String> {
        (url_vars(url).unwrap().into_iter())
            .filter_map(|(k, v)| Some((k, v?)))
            .collect()
    }

    #[test]
    fn urls_become_turnstiles_variables() {
        let v = vars("redis://127.0.0.1:6390");
        assert_eq!(v["REDIS_URL"], "127.0.0.1:6390");
        assert_eq!(v["REDIS_TLS"], "false");
        assert!(!v.contains_key("REDIS_AUTH"));
        let v = vars("rediss://app:p%40ss%2Fw@redis.example/0");
        assert_eq!(v["REDIS_URL"], "redis.example:6379");
        assert_eq!(v["REDIS_TLS"], "true");
        assert_eq!(v["REDIS_AUTH"], "app:p@ss/w");
        assert_eq!(
            vars("redis://:secret@[::1]:7000")["REDIS_URL"],
            "[::1]:7000"
        );
        assert_eq!(vars("redis://:secret@h:1")["REDIS_AUTH"], "secret");
        let v = vars("redis+unix:///run/redis.sock?pass=pw");
        assert_eq!(v["REDIS_URL"], "/run/redis.sock");
        assert_eq!(v["REDIS_SOCKET_TYPE"], "unix");
        assert_eq!(v["REDIS_AUTH"], "pw");
        assert_eq!(vars("redis://h:1/?protocol=resp2")["REDIS_URL"], "h:1");
    }

    #[test]
    fn what_cannot_be_mapped_is_refused_naming_it() {
        let err = |u: &str| url_vars(u).unwrap_err();
        assert!(err("redis://h:1/2").contains("database `2`"));
        assert!(err("rediss://h:1/#insecure").contains("#insecure"));
        assert!(err("redis://h:1/?timeout=3").contains("`timeout`"));
        assert!(err("redis://h:1/?protocol=3").contains("protocol=3"));
        assert!(err("redis://bob@h:1").contains("user `bob` has no password"));
        assert!(err("redis://:a:b@h:1").contains("password holding `:`"));
        assert!(err("http://h:1").contains("scheme `http`"));
        assert!(err("127.0.0.1:6379").contains("Redis URL"));
        // The password never shows.
        assert!(!err("redis://u:hunter2@h:1/5").contains("hunter2"));
    }

    #[test]
    fn cached_flags_map_or_warn() {
        let none = |_: &str| None;
        let env = Env::new(&none);
        let mut warned = Vec::new();
        let flags = Cached {
            flush_period: Some(250),
            max_cached: Some(500),
            response_timeout: Some(350),
            batch_size: None,
        };
        let v = cached("redis://h:1", &flags, &env, &mut warned).unwrap();
        assert_eq!(
            v["TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL"].as_deref(),
            Some("250ms")
        );
        assert_eq!(v["TURNSTILE_REDIS_DEADLINE_MS"].as_deref(), Some("350"));
        assert_eq!(v["TURNSTILE_MAX_KEYS"].as_deref(), Some("500"));
        let default = cached("redis://h:1", &Cached::default(), &env, &mut warned).unwrap();
        assert_eq!(
            default["TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL"].as_deref(),
            Some("1000ms")
        );
        let batch = Cached {
            batch_size: Some(100),
            ..Cached::default()
        };
        assert!(warned.is_empty(), "{warned:?}");
        cached("redis://h:1", &batch, &env, &mut warned).unwrap();
        assert!(warned[0].starts_with("--batch-size 100"), "{warned:?}");
        // Taken as Limitador takes them, at the nearest interval turnstile syncs at.
        for (ms, synced) in [(0, "1ms"), (120_000, "60000ms"), (-5, "60000ms")] {
            let period = Cached {
                flush_period: Some(ms),
                ..Cached::default()
            };
            let v = cached("redis://h:1", &period, &env, &mut warned).unwrap();
            assert_eq!(
                v["TURNSTILE_LOCAL_FIRST_SYNC_INTERVAL"].as_deref(),
                Some(synced)
            );
            let said = format!("--flush-period {ms} (");
            assert!(warned.last().unwrap().starts_with(&said), "{warned:?}");
        }
    }

    #[test]
    fn the_environment_may_agree_but_not_contradict() {
        let set = |k: &str| match k {
            "REDIS_TLS" => Some("1".to_owned()),
            "REDIS_AUTH" => Some("other".to_owned()),
            _ => None,
        };
        let env = Env::new(&set);
        let tls = url_vars("rediss://h:1").unwrap();
        agree(&tls, &env, "redis").unwrap();
        let both = url_vars("rediss://:pw@h:1").unwrap();
        let e = agree(&both, &env, "redis").unwrap_err();
        assert!(e.contains("REDIS_AUTH") && !e.contains("pw"), "{e}");
        let plain = url_vars("redis://h:1").unwrap();
        assert!(agree(&plain, &env, "redis")
            .unwrap_err()
            .contains("REDIS_TLS"));
    }
}
