//! How the Redis keys are named: a counter key, its window's start, and what wraps them.

use std::io::Write;

use super::super::packed::{decimal, Packed};

/// A key as Redis names it: `CACHE_KEY_PREFIX` + `open` + the counter key + `close` + the
/// window's start, if any. Written where it is needed (a command's argument, or a `String` for
/// the admin listener), never held on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::redis) struct Name<'a> {
    /// The sorted set of a fixed window's holds: the whole name braced, then `_held`
    /// (`{<the window's key>}_held`), so it shares the window key's Cluster slot.
    pub(super) held: bool,
    pub(super) prefix: &'a str,
    pub(super) open: &'static str,
    pub(super) key: &'a str,
    pub(super) close: &'static str,
    pub(super) start: Option<WindowStart>,
}

impl Name<'_> {
    /// The start of the window the name counts, in ms (0 for a name without one).
    pub(in crate::store::redis) fn start_ms(&self) -> u64 {
        self.start.map_or(0, |s| s.ms)
    }

    /// What is written before and after the rest.
    fn wrap(&self) -> (&'static [u8], &'static [u8]) {
        if self.held {
            (b"{", b"}_held")
        } else {
            (b"", b"")
        }
    }

    pub(super) fn len(&self) -> usize {
        let (pre, post) = self.wrap();
        pre.len()
            + post.len()
            + self.prefix.len()
            + self.open.len()
            + self.key.len()
            + self.close.len()
            + 22
    }

    pub(super) fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let (pre, post) = self.wrap();
        out.write_all(pre)?;
        out.write_all(self.prefix.as_bytes())?;
        out.write_all(self.open.as_bytes())?;
        out.write_all(self.key.as_bytes())?;
        out.write_all(self.close.as_bytes())?;
        if let Some(s) = self.start {
            s.write_to(out)?;
        }
        out.write_all(post)
    }
}

impl Name<'_> {
    /// Writes the name as the next argument of `p`.
    pub(super) fn pack(&self, p: &mut Packed) {
        let mut d = [0u8; 20];
        let (pre, post) = self.wrap();
        let (digits, ms): (&[u8], &[u8]) = match self.start {
            None => (b"", b""),
            Some(s) if s.ms.is_multiple_of(1000) => (decimal(s.ms / 1000, &mut d), b""),
            Some(s) => (decimal(s.ms, &mut d), b"ms"),
        };
        p.parts(&[
            pre,
            self.prefix.as_bytes(),
            self.open.as_bytes(),
            self.key.as_bytes(),
            self.close.as_bytes(),
            digits,
            ms,
            post,
        ]);
    }
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut v = Vec::with_capacity(self.len());
        self.write_to(&mut v).map_err(|_| std::fmt::Error)?;
        f.write_str(&String::from_utf8_lossy(&v))
    }
}

/// A window's start as keys name it: epoch seconds, or milliseconds with `ms` for sub-second
/// windows of the direct API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WindowStart {
    pub(super) ms: u64,
}

impl WindowStart {
    pub(super) fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut buf = [0u8; 20];
        if self.ms.is_multiple_of(1000) {
            out.write_all(decimal(self.ms / 1000, &mut buf))
        } else {
            out.write_all(decimal(self.ms, &mut buf))?;
            out.write_all(b"ms")
        }
    }
}
