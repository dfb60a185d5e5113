//! What a deployment's store is and can do, asked once at connect: its name and version
//! (`INFO server`: Redis, Valkey, or another store speaking RESP), and whether it runs
//! turnstile's scripts. Logged at start; the store keeps which deployments refused scripts
//! ([`Refusals`]), so a limit that needs them is refused before it is served
//! ([`RedisStore::check_config`]), and a fixed window's refund goes without a script there
//! (`scripts`).

use std::time::Duration;

use redis::Value;

use super::connect::{query, Conn, Deployment};
use super::RedisStore;
use crate::config::{Algorithm, Config, ConfigError, RateLimit};
use crate::limiter::Params;

/// A store that refused turnstile's scripts at connect, as the start named it.
#[derive(Debug, Clone)]
pub(super) struct NoScripts {
    /// The setting naming the deployment (`REDIS_URL`, `REDIS_PERSECOND_URL`).
    pub(super) setting: &'static str,
    /// `valkey 9.1.2`: what `INFO server` said it is.
    pub(super) store: String,
    /// The store's answer to a script (`ERR Could not find scripting engine 'lua'`).
    pub(super) answer: String,
}

impl NoScripts {
    /// Why a limit that needs scripts cannot be served here.
    pub(super) fn reason(&self) -> String {
        format!(
            "the store at {} ({}) cannot run scripts: it answered {:?}",
            self.setting, self.store, self.answer
        )
    }
}

/// The deployments whose store refused scripts at connect: none, as a rule.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    /// `REDIS_URL`'s.
    pub(super) main: Option<NoScripts>,
    /// `REDIS_PERSECOND_URL`'s, when set.
    pub(super) per_second: Option<NoScripts>,
}

/// What counts with a script, as the start's log and the refusals name it.
const WHAT_NEEDS_SCRIPTS: &str = "sliding windows, token buckets (THROTTLE and \
    CL.THROTTLE too), windows from the first hit (limitador-server's limits), limits with \
    `reserve`, and RLQS's demand exchange between replicas";

/// The store's name and version, and whether it ran a script.
struct Probed {
    name: String,
    version: String,
    /// The store's answer when it refused a script.
    refused: Option<String>,
}

impl Probed {
    /// `valkey 9.1.2`.
    fn store(&self) -> String {
        format!("{} {}", self.name, self.version)
    }
}

/// Asks `conn`'s store what it is, and loads every script (`SCRIPT LOAD`), so decisions do not
/// meet `NOSCRIPT` (see `exec`) unless the store forgets them later. A store that refuses
/// `SCRIPT LOAD` (an ACL, or a Cluster whose nodes each learn the scripts on first use) is
/// asked to run a script of no keys (`EVAL "return 1" 0`): its refusal is the store's answer.
/// A store that does not answer within `within` is taken to run scripts, as before this was
/// asked: the round trips will say otherwise.
async fn ask(conn: &Conn, within: Duration) -> Probed {
    let mut info = redis::pipe();
    info.cmd("INFO").arg("server");
    let text = match tokio::time::timeout(within, query(conn.clone(), info)).await {
        Ok(Ok(v)) => v.into_iter().next().and_then(text).unwrap_or_default(),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "INFO server failed; the store is not named");
            String::new()
        }
        Err(_) => String::new(),
    };
    let (name, version) = named(&text);
    Probed {
        name,
        version,
        refused: scripts_refused(conn, within).await,
    }
}

/// The store's answer when it runs no script, `None` when it does (or did not answer).
async fn scripts_refused(conn: &Conn, within: Duration) -> Option<String> {
    if !matches!(conn, Conn::Cluster(_)) {
        let mut load = redis::pipe();
        for src in super::scripts::ALL {
            load.cmd("SCRIPT").arg("LOAD").arg(src);
        }
        match tokio::time::timeout(within, query(conn.clone(), load)).await {
            Ok(Ok(_)) => return None,
            Ok(Err(e)) => tracing::debug!(error = %e, "SCRIPT LOAD failed; trying EVAL"),
            Err(_) => return None,
        }
    }
    let mut eval = redis::pipe();
    // The store's refusal comes back as the reply, in its own words (`ERR …`, `NOPERM …`).
    eval.ignore_errors();
    eval.cmd("EVAL").arg("return 1").arg(0);
    match tokio::time::timeout(within, query(conn.clone(), eval)).await {
        Ok(Ok(v)) => match v.into_iter().next() {
            Some(Value::ServerError(e)) => Some(answer(e.code(), e.details())),
            _ => None,
        },
        Ok(Err(e)) => Some(e),
        Err(_) => None,
    }
}

fn answer(code: &str, details: Option<&str>) -> String {
    match details {
        Some(d) => format!("{code} {d}"),
        None => code.to_owned(),
    }
}

/// A bulk or verbatim string's text.
fn text(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::VerbatimString { text, .. } => Some(text),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// The store's name and version from `INFO server`'s text: Valkey says `server_name:valkey` and
/// `valkey_version:`; Dragonfly `dragonfly_version:`; Redis names no server and says
/// `redis_version:`, which the others keep too (the Redis they answer as).
fn named(info: &str) -> (String, String) {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::to_owned)
    };
    let name = field("server_name")
        .or_else(|| field("dragonfly_version").map(|_| "dragonfly".to_owned()))
        .unwrap_or_else(|| "redis".to_owned());
    let version = field(&format!("{name}_version"))
        .or_else(|| field("redis_version"))
        .unwrap_or_else(|| "(version not said)".to_owned());
    (name, version)
}

/// Why `limit` cannot count without scripts, `None` when `INCRBY` counts it.
fn needs(limit: &RateLimit) -> Option<String> {
    if limit.unlimited {
        return None;
    }
    if limit.reserve.is_some() {
        return Some("`reserve` holds through a script".to_owned());
    }
    match limit.algorithm {
        Algorithm::FixedWindow => None,
        a => Some(format!("algorithm {} counts through a script", a.name())),
    }
}

impl RedisStore {
    /// Asks each deployment's store what it is and whether it runs scripts, says so in the
    /// log, and keeps which refused them.
    pub(super) async fn probe(&mut self, within: Duration) {
        self.no_scripts.main = probed("REDIS_URL", &self.main, within).await;
        if let Some(d) = &self.per_second {
            self.no_scripts.per_second = probed("REDIS_PERSECOND_URL", d, within).await;
        }
    }

    /// The refusal of the store counting `p`'s keys, when it refused scripts (see
    /// `RedisStore::deployment`).
    pub(super) fn no_scripts(&self, p: &Params) -> Option<&NoScripts> {
        match &self.per_second {
            Some(_) if p.window_ms == 1000 => self.no_scripts.per_second.as_ref(),
            _ => self.no_scripts.main.as_ref(),
        }
    }

    /// Refuses `config` when a limit of it needs scripts and the store counting it refused them
    /// at connect: the error names the first such limit, why it needs them, and the store's
    /// answer. A limit is counted where its window says (one-second windows on
    /// `REDIS_PERSECOND_URL`, when set).
    pub fn check_config(&self, config: &Config) -> Result<(), ConfigError> {
        let main = &self.no_scripts.main;
        let one_second = match self.per_second {
            Some(_) => &self.no_scripts.per_second,
            None => main,
        };
        if main.is_none() && one_second.is_none() {
            return Ok(());
        }
        let mut found = None;
        config.for_each_node(&mut |node| {
            for l in node.limits.iter() {
                let one = l.window_secs() == 1 && l.calendar.is_none();
                let store = if one { one_second } else { main };
                let (Some(why), Some(store), None) = (needs(l), store, &found) else {
                    continue;
                };
                let origin = config.origin(node);
                let (file, path) = origin.split_once(": ").unwrap_or((&origin, ""));
                let name = l
                    .name
                    .as_deref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default();
                found = Some(ConfigError {
                    file: file.to_owned(),
                    path: path.to_owned(),
                    message: format!("{}{name}: {why}, and {}", node.stat_key, store.reason()),
                });
            }
        });
        found.map_or(Ok(()), Err)
    }

    /// Refuses to serve as `limitador-server` on a store that refused scripts: every limit of
    /// Limitador's counts from its first hit, through a script.
    pub fn check_first_hit(&self) -> Result<(), String> {
        let refused = (self.no_scripts.main.iter())
            .chain(&self.no_scripts.per_second)
            .next();
        match refused {
            None => Ok(()),
            Some(n) => Err(format!(
                "limitador-server's limits count from their first hit through a script, and {}",
                n.reason()
            )),
        }
    }
}

/// Asks `dep`'s store what it is and whether it runs scripts (`probe`), and says so in the
/// log: the store's name and version, and a store that refuses scripts with its answer and what
/// needs them.
async fn probed(setting: &'static str, dep: &Deployment, within: Duration) -> Option<NoScripts> {
    let first = dep.conns.first()?;
    let p = ask(first, within).await;
    let Some(answer) = p.refused.clone() else {
        tracing::info!(setting, store = %p.name, version = %p.version, scripts = true, "store connected");
        return None;
    };
    tracing::warn!(
        setting,
        store = %p.name,
        version = %p.version,
        scripts = false,
        answer = %answer,
        "store connected; it cannot run turnstile's scripts: {WHAT_NEEDS_SCRIPTS} need them, \
         and a config with such a limit is refused; fixed windows count with INCRBY and \
         refund with DECRBY"
    );
    Some(NoScripts {
        setting,
        store: p.store(),
        answer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_are_named_by_their_own_fields() {
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        assert_eq!(named(valkey), ("valkey".into(), "9.1.2".into()));
        let redis =
            "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\ngcc_version:12.2.0\r\n";
        assert_eq!(named(redis), ("redis".into(), "7.0.15".into()));
        let dragonfly = "# Server\r\nredis_version:7.4.0\r\ndragonfly_version:df-v1.30.0\r\n";
        assert_eq!(named(dragonfly), ("dragonfly".into(), "df-v1.30.0".into()));
        assert_eq!(named(""), ("redis".into(), "(version not said)".into()));
    }
}
