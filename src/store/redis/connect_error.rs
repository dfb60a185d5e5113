//! Why a deployment could not be reached at start, and which password a refusal is about:
//! `NOAUTH` and `WRONGPASS` read from any error (a pipeline's included) and the variable to set.

use super::{RedisTarget, RedisType};

/// Why a deployment could not be reached at start: a wrong setting (no wait helps) or Redis
/// not answering yet (worth another try).
#[derive(Debug)]
pub(super) enum ConnectError {
    Setting(String),
    Unreachable(String),
}

/// The password a deployment's refusal is about: its variable (`REDIS_AUTH`,
/// `REDIS_PERSECOND_AUTH`) and whether it is set. None for Sentinels, whose refusals
/// `refused_password` tells apart.
#[derive(Clone, Copy)]
pub(super) struct Password {
    var: &'static str,
    set: bool,
}

impl Password {
    /// The password of `t`, the deployment `REDIS_URL` names, or `REDIS_PERSECOND_URL` when
    /// `per_second`.
    pub(super) fn of(t: &RedisTarget, per_second: bool) -> Option<Password> {
        let var = if per_second {
            "REDIS_PERSECOND_AUTH"
        } else {
            t.auth_named
        };
        (t.kind != RedisType::Sentinel).then_some(Password {
            var,
            set: t.auth.is_some(),
        })
    }
}

impl ConnectError {
    /// A Redis error, with `what` was tried: a refused or missing password (`pw`) is a setting,
    /// anything else may pass.
    pub(super) fn of(e: &redis::RedisError, what: String, pw: Option<Password>) -> ConnectError {
        match (auth_code(e), pw) {
            (Some("NOAUTH"), Some(pw)) => {
                let hint = if pw.set { "check" } else { "set" };
                ConnectError::Setting(format!(
                    "{what}: the server requires a password ({e}): {hint} {}",
                    pw.var
                ))
            }
            (Some(_), Some(pw)) if pw.set => ConnectError::Setting(format!(
                "{what}: the password was refused ({e}): check {}",
                pw.var
            )),
            (Some(_), _) => ConnectError::Setting(format!("{what}: {e}")),
            (None, _) => ConnectError::Unreachable(format!("{what}: {e}")),
        }
    }

    pub(super) fn message(&self) -> &str {
        match self {
            ConnectError::Setting(m) | ConnectError::Unreachable(m) => m,
        }
    }
}

/// A refused or missing password (as `ConnectError::of` tells a setting).
pub(super) fn is_auth(e: &redis::RedisError) -> bool {
    auth_code(e).is_some()
}

/// `NOAUTH` (no password given, one required) or `WRONGPASS` (refused), if `e` is either. A
/// pipeline's errors are the server's, one per command, and redis-rs gives no code for an
/// error it does not know (`NOAUTH`): they are read too.
fn auth_code(e: &redis::RedisError) -> Option<&'static str> {
    let mut codes: Vec<String> = (e.clone().into_server_errors())
        .map(|v| v.iter().map(|(_, s)| s.code().to_owned()).collect())
        .unwrap_or_default();
    codes.extend(e.code().map(str::to_owned));
    if codes.iter().any(|c| c == "NOAUTH") {
        Some("NOAUTH")
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || codes.iter().any(|c| c == "WRONGPASS")
    {
        Some("WRONGPASS")
    } else {
        None
    }
}

impl From<String> for ConnectError {
    fn from(m: String) -> ConnectError {
        ConnectError::Setting(m)
    }
}
