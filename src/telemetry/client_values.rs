//! Client values (descriptor values, the direct API's keys, RLQS bucket ids) as they leave the
//! process: in clear, or as a keyed digest an operator matches against their own logs.
//!
//! The rule: a listener without authentication that is bound beyond loopback shows digests
//! unless `TURNSTILE_SHOW_CLIENT_VALUES=true` says the operator holds the port private; a
//! loopback listener and the admin listener (its token, or loopback only) show clear values.
//! Logs at info level and above carry digests only; debug lines may carry clear values.
//! `detailed_metric` series are named by their values, as the reference names them: a config
//! opts into them.
//!
//! The digest is HMAC-SHA256 under the process's key, cut to 64 bits, in hex after a `#`. The
//! key is `TURNSTILE_CLIENT_DIGEST_KEY` (the same on every replica and across restarts, so
//! digests match between them and `turnstile digest` computes them offline), or random for the
//! process when unset. Without the key nobody can tell which value a digest stands for, even
//! for small value spaces such as IPv4 addresses.

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;
use std::sync::OnceLock;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes of the HMAC kept: 64 bits tell apart any list an operator reads.
const DIGEST_BYTES: usize = 8;

/// Shortest `TURNSTILE_CLIENT_DIGEST_KEY` taken.
pub const MIN_KEY_BYTES: usize = 16;

static KEY: OnceLock<hmac::Key> = OnceLock::new();

/// `TURNSTILE_CLIENT_DIGEST_KEY`: the secret digests are keyed with; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct DigestKey(Vec<u8>);

impl DigestKey {
    /// At least [`MIN_KEY_BYTES`] bytes, surrounding white space trimmed.
    pub fn new(text: &str) -> Result<DigestKey, String> {
        let t = text.trim();
        if t.len() < MIN_KEY_BYTES {
            return Err(format!("must be at least {MIN_KEY_BYTES} bytes"));
        }
        Ok(DigestKey(t.as_bytes().to_vec()))
    }
}

impl fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DigestKey(<redacted>)")
    }
}

/// Makes `key` the process's digest key. Call it once at start, before any digest is made;
/// false when a key was already in place (then that one stays).
pub fn set_digest_key(key: &DigestKey) -> bool {
    KEY.set(hmac::Key::new(hmac::HMAC_SHA256, &key.0)).is_ok()
}

fn key() -> &'static hmac::Key {
    KEY.get_or_init(|| {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .expect("the system's random source works");
        hmac::Key::new(hmac::HMAC_SHA256, &bytes)
    })
}

/// `#` and 16 hex digits: the keyed digest of `value`.
pub fn digest(value: &str) -> String {
    let tag = hmac::sign(key(), value.as_bytes());
    let mut out = String::with_capacity(1 + 2 * DIGEST_BYTES);
    out.push('#');
    for b in &tag.as_ref()[..DIGEST_BYTES] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// How one listener shows client values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    Clear,
    Digest,
}

impl Shown {
    /// For an unauthenticated listener at `addr`: clear on loopback or when `show_clear`
    /// (`TURNSTILE_SHOW_CLIENT_VALUES`), digests otherwise.
    pub fn for_listener(addr: SocketAddr, show_clear: bool) -> Shown {
        if show_clear || addr.ip().is_loopback() {
            Shown::Clear
        } else {
            Shown::Digest
        }
    }

    /// `value` as this listener shows it.
    pub fn value(self, value: &str) -> Cow<'_, str> {
        match self {
            Shown::Clear => Cow::Borrowed(value),
            Shown::Digest => Cow::Owned(digest(value)),
        }
    }

    /// What answers call the form: `clear` or `digest`.
    pub fn name(self) -> &'static str {
        match self {
            Shown::Clear => "clear",
            Shown::Digest => "digest",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_stable_short_and_differ_by_value() {
        let a = digest("203.0.113.9");
        assert_eq!(a, digest("203.0.113.9"));
        assert_eq!(a.len(), 17);
        assert!(a.starts_with('#') && a[1..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, digest("203.0.113.8"));
    }

    #[test]
    fn loopback_listeners_show_clear_values_others_digests_unless_told() {
        let open: SocketAddr = "0.0.0.0:6070".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:6070".parse().unwrap();
        let local6: SocketAddr = "[::1]:6070".parse().unwrap();
        assert_eq!(Shown::for_listener(open, false), Shown::Digest);
        assert_eq!(Shown::for_listener(open, true), Shown::Clear);
        assert_eq!(Shown::for_listener(local, false), Shown::Clear);
        assert_eq!(Shown::for_listener(local6, false), Shown::Clear);
        assert_eq!(Shown::Digest.value("alice"), digest("alice"));
        assert_eq!(Shown::Clear.value("alice"), "alice");
    }

    #[test]
    fn keys_are_long_enough_and_never_printed() {
        assert!(DigestKey::new("short").is_err());
        let k = DigestKey::new(" 0123456789abcdef\n").unwrap();
        assert_eq!(format!("{k:?}"), "DigestKey(<redacted>)");
    }
}
