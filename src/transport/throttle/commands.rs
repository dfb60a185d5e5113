//! The commands: ThrottleCrab's `THROTTLE`, redis-cell's `CL.THROTTLE`, `PING`, `QUIT`, and what
//! client libraries send around them.

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::encode::extend_encode_borrowed;
use redis_protocol::resp2::types::BorrowedFrame;

use std::time::Instant;

use tracing::Instrument;

use super::ThrottleCtx;
use crate::service::metrics::{Door, Failed};
use crate::service::throttle::{ThrottleError, ThrottleRequest};
use crate::telemetry::trace::{request_span, REQUEST_TARGET};

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Flow {
    Continue,
    Quit,
}

/// What a connection has said about itself: the protocol it speaks since its `HELLO`.
#[derive(Debug, Default)]
pub(super) struct Session {
    /// RESP3 after `HELLO 3`. Every answer here is the same in both but for null and `HELLO`'s
    /// own map, so only those look at it.
    resp3: bool,
}

pub(super) async fn execute(
    args: &[Bytes],
    ctx: &ThrottleCtx,
    session: &mut Session,
    out: &mut BytesMut,
) -> Flow {
    // The two hot commands are matched without copying the name; each is a call of the
    // throttle door, traced and counted as every door's are.
    let cl = args[0].eq_ignore_ascii_case(b"CL.THROTTLE");
    if cl || args[0].eq_ignore_ascii_case(b"THROTTLE") {
        let start = Instant::now();
        let name = if cl { "CL.THROTTLE" } else { "THROTTLE" };
        let span = request_span(&http::HeaderMap::new(), "resp", name);
        let failed = if cl {
            cl_throttle_command(&args[1..], ctx, out)
                .instrument(span.clone())
                .await
        } else {
            throttle_command(&args[1..], ctx, out)
                .instrument(span.clone())
                .await
        };
        let took = start.elapsed();
        ctx.calls.door(Door::Throttle).count(failed, took);
        span.in_scope(|| {
            tracing::debug!(
                target: REQUEST_TARGET,
                door = Door::Throttle.name(),
                failed = failed.is_some(),
                micros = took.as_micros() as u64,
                "answered"
            )
        });
        return Flow::Continue;
    }
    let name = args[0].to_ascii_uppercase();
    match name.as_slice() {
        b"PING" => match args.len() {
            1 => encode(out, &BorrowedFrame::SimpleString(b"PONG")),
            2 => encode(out, &BorrowedFrame::BulkString(&args[1])),
            _ => error(out, "ERR wrong number of arguments for 'ping' command"),
        },
        b"QUIT" => {
            encode(out, &BorrowedFrame::SimpleString(b"OK"));
            return Flow::Quit;
        }
        _ => connection_command(&name, args, session, out),
    }
    Flow::Continue
}

/// What Redis clients send around their commands, answered as Redis would, so they work
/// unmodified: `ECHO` (`redis-cli --pipe` ends its input with one), `HELLO` (2 or 3: redis-py and
/// node-redis open with `HELLO 3` and do not fall back), `CLIENT SETNAME`/`SETINFO`/`GETNAME`,
/// `SELECT 0`, `INFO` (ioredis's ready check) and `COMMAND` (redis-cli's hints).
fn connection_command(name: &[u8], args: &[Bytes], session: &mut Session, out: &mut BytesMut) {
    let arg = |i: usize| args.get(i).map(|a| a.to_ascii_uppercase());
    match (name, args.len()) {
        (b"ECHO", 2) => encode(out, &BorrowedFrame::BulkString(&args[1])),
        (b"HELLO", _) => match arg(1).as_deref() {
            None => hello(out, session.resp3),
            Some(b"2") => {
                session.resp3 = false;
                hello(out, false)
            }
            Some(b"3") => {
                session.resp3 = true;
                hello(out, true)
            }
            Some(_) => error(out, "NOPROTO unsupported protocol version"),
        },
        (b"CLIENT", 3..) => match arg(1).as_deref() {
            Some(b"SETNAME") | Some(b"SETINFO") => encode(out, &BorrowedFrame::SimpleString(b"OK")),
            _ => error(out, "ERR unknown CLIENT subcommand"),
        },
        (b"CLIENT", 2) if arg(1).as_deref() == Some(b"GETNAME") => {
            if session.resp3 {
                out.extend_from_slice(b"_\r\n");
            } else {
                encode(out, &BorrowedFrame::Null)
            }
        }
        (b"SELECT", 2) if args[1].as_ref() == b"0" => {
            encode(out, &BorrowedFrame::SimpleString(b"OK"))
        }
        (b"SELECT", 2) => error(out, "ERR DB index is out of range"),
        (b"INFO", _) => encode(
            out,
            &BorrowedFrame::BulkString(
                b"# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\nloading:0\r\n",
            ),
        ),
        (b"COMMAND", _) => encode(out, &BorrowedFrame::Array(&[])),
        (b"ECHO" | b"SELECT", _) => error(
            out,
            &format!(
                "ERR wrong number of arguments for '{}' command",
                printable(&args[0]).to_ascii_lowercase()
            ),
        ),
        _ => error(
            out,
            &format!("ERR unknown command '{}'", printable(&args[0])),
        ),
    }
}

/// `HELLO`'s answer: a map in RESP3, a flat array of field, value in RESP2.
fn hello(out: &mut BytesMut, resp3: bool) {
    use BorrowedFrame::{Array, BulkString, Integer};
    let fields = [
        BulkString(b"server"),
        BulkString(b"turnstile"),
        BulkString(b"version"),
        BulkString(env!("CARGO_PKG_VERSION").as_bytes()),
        BulkString(b"proto"),
        Integer(if resp3 { 3 } else { 2 }),
        BulkString(b"id"),
        Integer(1),
        BulkString(b"mode"),
        BulkString(b"standalone"),
        BulkString(b"role"),
        BulkString(b"master"),
        BulkString(b"modules"),
        Array(&[]),
    ];
    if resp3 {
        // A RESP3 map header, then the same field/value frames as RESP2's array.
        out.extend_from_slice(format!("%{}\r\n", fields.len() / 2).as_bytes());
        for f in &fields {
            encode(out, f);
        }
    } else {
        encode(out, &Array(&fields));
    }
}

/// `THROTTLE key max_burst count_per_period period [quantity]`, answered as ThrottleCrab does
/// (`throttlecrab-server/src/transport/redis/mod.rs:277-283`): `[allowed, limit, remaining,
/// reset_after, retry_after]`.
async fn throttle_command(args: &[Bytes], ctx: &ThrottleCtx, out: &mut BytesMut) -> Option<Failed> {
    let Some(req) = parse_throttle("throttle", args, ctx, out) else {
        return Some(Failed::InvalidArgument);
    };
    match ctx.throttle.throttle(&ctx.limits, &req).await {
        Ok(a) => integers(
            out,
            [
                a.allowed.into(),
                a.limit,
                a.remaining,
                a.reset_after,
                a.retry_after,
            ],
        ),
        Err(e) => return Some(throttle_error(out, e)),
    }
    None
}

/// `CL.THROTTLE key max_burst count_per_period period [quantity]`, answered as redis-cell does
/// (`src/lib.rs:82-87` in brandur/redis-cell): `[limited, max_burst + 1, remaining, retry_after,
/// reset_after]`.
async fn cl_throttle_command(
    args: &[Bytes],
    ctx: &ThrottleCtx,
    out: &mut BytesMut,
) -> Option<Failed> {
    let Some(req) = parse_throttle("cl.throttle", args, ctx, out) else {
        return Some(Failed::InvalidArgument);
    };
    match ctx.throttle.cl_throttle(&ctx.limits, &req).await {
        Ok(a) => integers(
            out,
            [
                a.limited.into(),
                a.limit,
                a.remaining,
                a.retry_after,
                a.reset_after,
            ],
        ),
        Err(e) => return Some(throttle_error(out, e)),
    }
    None
}

/// The arguments both commands take, `key max_burst count_per_period period [quantity]`; on
/// bad ones, writes the error and counts the call as invalid.
fn parse_throttle(
    command: &str,
    args: &[Bytes],
    ctx: &ThrottleCtx,
    out: &mut BytesMut,
) -> Option<ThrottleRequest> {
    let int = |i: usize, name: &str| -> Result<i64, String> {
        std::str::from_utf8(&args[i])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("ERR {name} is not an integer"))
    };
    let parsed = if !(4..=5).contains(&args.len()) {
        Err(format!(
            "ERR wrong number of arguments for '{command}' command"
        ))
    } else if let Ok(key) = std::str::from_utf8(&args[0]) {
        (|| {
            Ok(ThrottleRequest {
                key: key.to_owned(),
                max_burst: int(1, "max_burst")?,
                count_per_period: int(2, "count_per_period")?,
                period: int(3, "period")?,
                quantity: if args.len() == 5 {
                    int(4, "quantity")?
                } else {
                    1
                },
            })
        })()
    } else {
        Err("ERR key must be UTF-8".to_owned())
    };
    match parsed {
        Ok(r) => Some(r),
        Err(m) => {
            ctx.throttle.count_unread();
            error(out, &m);
            None
        }
    }
}

/// An array of five integers, written directly: every `THROTTLE` answer is one.
fn integers(out: &mut BytesMut, values: [i64; 5]) {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(b"*5\r\n");
    for v in values {
        out.extend_from_slice(b":");
        out.extend_from_slice(buf.format(v).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes the error; says which kind of failure it is.
fn throttle_error(out: &mut BytesMut, e: ThrottleError) -> Failed {
    error(out, &format!("ERR {e}"));
    match e {
        ThrottleError::Invalid(_) => Failed::InvalidArgument,
        ThrottleError::Overloaded => Failed::Overloaded,
        ThrottleError::Unavailable => Failed::Unavailable,
    }
}

fn encode(out: &mut BytesMut, frame: &BorrowedFrame<'_>) {
    // Cannot fail: the buffer is extended to the frame's length first.
    let _ = extend_encode_borrowed(out, frame, false);
}

/// An error reply. `message` must hold no CR or LF: callers never put client bytes in it
/// except through [`printable`].
pub(super) fn error(out: &mut BytesMut, message: &str) {
    encode(out, &BorrowedFrame::Error(message));
}

/// A client-sent name, shortened and with control characters replaced, for an error message.
fn printable(name: &[u8]) -> String {
    String::from_utf8_lossy(&name[..name.len().min(64)])
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}
