//! RESP2 framing: the next whole command off the input (multibulk or inline), or a wait for more.

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use super::{MAX_ARGS, MAX_REQUEST_BYTES};

/// A command's arguments, slices of the frame it came in.
pub(super) type Args = SmallVec<[Bytes; 8]>;

/// Where each argument of a multibulk command lies in its frame.
type Spans = SmallVec<[(usize, usize); 8]>;

/// Takes the next complete command off `input`: `Ok(None)` until one has fully arrived. Skips
/// empty commands, as Redis does. Inline commands (`PING\r\n`, as typed into telnet) work too.
pub(super) fn next_command(input: &mut BytesMut) -> Result<Option<Args>, &'static str> {
    loop {
        if input.is_empty() {
            return Ok(None);
        }
        let args: Args = if input[0] == b'*' {
            let mut spans = Spans::new();
            let Some(len) = frame(input, &mut spans)? else {
                return Ok(None);
            };
            let frame = input.split_to(len).freeze();
            spans.iter().map(|&(s, e)| frame.slice(s..e)).collect()
        } else {
            let Some(end) = input.iter().position(|&b| b == b'\n') else {
                return if input.len() > MAX_REQUEST_BYTES {
                    Err("Protocol error: too big inline request")
                } else {
                    Ok(None)
                };
            };
            if end > MAX_REQUEST_BYTES {
                return Err("Protocol error: too big inline request");
            }
            let line = input.split_to(end + 1).freeze();
            line.split(|b| b.is_ascii_whitespace())
                .filter(|w| !w.is_empty())
                .map(|w| line.slice_ref(w))
                .collect()
        };
        if !args.is_empty() {
            return Ok(Some(args));
        }
    }
}

/// The length of the multibulk command at the start of `input` (`*N\r\n` then N bulk strings),
/// `Ok(None)` while it is incomplete. Walks headers only, never recursing.
#[cfg(test)]
pub(super) fn frame_len(input: &[u8]) -> Result<Option<usize>, &'static str> {
    frame(input, &mut Spans::new())
}

/// Walks the multibulk command at the start of `input`, noting where each argument lies: a bulk
/// string's bytes, or an integer's digits (`:3`: ThrottleCrab's server takes integers for the
/// numbers, `throttlecrab-server/src/transport/redis/mod.rs`, `parse_integer`). A null array
/// (`*-1`) is an empty command.
fn frame(input: &[u8], spans: &mut Spans) -> Result<Option<usize>, &'static str> {
    let Some((n, _, mut pos)) = header(input, 0, b'*')? else {
        return Ok(None);
    };
    if n > MAX_ARGS {
        return Err("Protocol error: too many arguments");
    }
    for _ in 0..n.max(0) {
        if input.get(pos) == Some(&b':') {
            let Some((_, digits_end, next)) = header(input, pos, b':')? else {
                return Ok(None);
            };
            spans.push((pos + 1, digits_end));
            pos = next;
            continue;
        }
        let Some((len, _, start)) = header(input, pos, b'$')? else {
            return Ok(None);
        };
        let len = usize::try_from(len)
            .ok()
            .filter(|l| *l <= MAX_REQUEST_BYTES)
            .ok_or("Protocol error: invalid bulk length")?;
        pos = start + len + 2;
        if pos > MAX_REQUEST_BYTES {
            return Err("Protocol error: request too big");
        }
        if pos > input.len() {
            return Ok(None);
        }
        // Redis skips the two bytes after a bulk string unchecked, but a client that gets this
        // wrong is out of step with us for good.
        if &input[pos - 2..pos] != b"\r\n" {
            return Err("Protocol error: expected CRLF after a bulk string");
        }
        spans.push((start, start + len));
    }
    Ok(Some(pos))
}

/// Reads `<kind><integer>\r\n` at `at`: the integer, where its digits end and where the next
/// element starts.
fn header(input: &[u8], at: usize, kind: u8) -> Result<Option<(i64, usize, usize)>, &'static str> {
    let Some(&first) = input.get(at) else {
        return Ok(None);
    };
    if first != kind {
        return Err(if kind == b'$' {
            "Protocol error: expected '$' (arguments are bulk strings or integers)"
        } else {
            "Protocol error: expected '*'"
        });
    }
    // An i64 has at most 20 characters.
    let rest = &input[at + 1..];
    let Some(cr) = rest.iter().take(21).position(|&b| b == b'\r') else {
        return if rest.len() >= 21 {
            Err("Protocol error: invalid length")
        } else {
            Ok(None)
        };
    };
    let n = std::str::from_utf8(&rest[..cr])
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or("Protocol error: invalid length")?;
    match rest.get(cr + 1) {
        None => Ok(None),
        Some(b'\n') => Ok(Some((n, at + 1 + cr, at + 1 + cr + 2))),
        Some(_) => Err("Protocol error: expected CRLF"),
    }
}
