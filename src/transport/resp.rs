//! ThrottleCrab's Redis-protocol transport: `THROTTLE`, `PING` and `QUIT` over RESP2, one tokio
//! task per connection, so any Redis client library (and `redis-cli`) is a turnstile client.
//!
//! Frames are decoded and replies encoded by the `redis-protocol` crate. Before a frame reaches
//! it, [`frame_len`] walks the frame's headers without recursion: it finds where a command ends,
//! caps its size, and refuses nested arrays. No command has them, and the crate's recursive parser
//! overflows the stack (aborting the process) on a few thousand nested `*1\r\n`.
//!
//! Commands of one connection are answered in the order they came, pipelined or not: every
//! complete command in the read buffer is decided, its reply appended, and the replies written
//! together before the next read.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::decode::decode_bytes;
use redis_protocol::resp2::encode::extend_encode_borrowed;
use redis_protocol::resp2::types::{BorrowedFrame, BytesFrame};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::service::throttle::{throttle, ThrottleLimits, ThrottleRequest};
use crate::service::RateLimiter;

/// A command bigger than this (THROTTLE needs a few hundred bytes) is a protocol error and
/// closes the connection, so a client cannot make the server buffer without bound.
const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Arguments in one command; THROTTLE has six.
const MAX_ARGS: i64 = 64;
/// Replies to a long pipeline are written once they reach this much.
const FLUSH_AT: usize = 64 * 1024;
/// Connections over the cap being told so at once; past this they are just closed.
const REFUSALS_IN_FLIGHT: usize = 64;

/// The RESP server's settings. Off unless `TURNSTILE_RESP_ADDR` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RespSettings {
    pub addr: SocketAddr,
    /// Without it only loopback addresses may be bound: the transport takes limits from the
    /// caller, so it is meant for applications on the same host (or pod).
    pub allow_remote: bool,
    pub max_connections: usize,
    /// A connection that sends nothing (or reads nothing we write) this long is closed.
    pub idle_timeout: Duration,
    pub limits: ThrottleLimits,
}

impl Default for RespSettings {
    fn default() -> Self {
        RespSettings {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 6380),
            allow_remote: false,
            max_connections: 10_000,
            idle_timeout: Duration::from_secs(300),
            limits: ThrottleLimits::default(),
        }
    }
}

impl RespSettings {
    /// Refuses a non-loopback address unless `allow_remote`.
    pub fn check_addr(&self) -> Result<(), String> {
        if self.allow_remote || self.addr.ip().is_loopback() {
            Ok(())
        } else {
            Err(format!(
                "the RESP transport would listen on {}, which is not a loopback address; set \
                 TURNSTILE_RESP_ALLOW_REMOTE=true to serve other hosts",
                self.addr
            ))
        }
    }

    /// Binds `addr` (refusing a non-loopback one unless `allow_remote`), ready for
    /// `tokio::net::TcpListener::from_std` on the runtime that will serve it.
    pub fn bind(&self) -> io::Result<std::net::TcpListener> {
        self.check_addr()
            .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
        let socket = Socket::new(
            Domain::for_address(self.addr),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&self.addr.into())?;
        // Thousands of clients may connect at once (a deploy restarting them all).
        socket.listen(1024)?;
        Ok(socket.into())
    }
}

struct Ctx {
    limiter: RateLimiter,
    limits: ThrottleLimits,
    idle_timeout: Duration,
}

/// Serves RESP on `listener` until `shutdown` completes: then stops accepting, lets every
/// connection answer the commands it has read, and returns once all are closed. Each connection
/// is a task on the current runtime. Refuses to serve a non-loopback listener unless
/// `settings.allow_remote`.
///
/// `server::start` binds it with [`RespSettings::bind`] beside the other listeners (so a taken
/// port fails the start) and runs it on the admin runtime until the stop signal.
pub async fn serve(
    listener: TcpListener,
    limiter: RateLimiter,
    settings: RespSettings,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let local = listener.local_addr()?;
    RespSettings {
        addr: local,
        ..settings.clone()
    }
    .check_addr()
    .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
    let max = settings
        .max_connections
        .min(Semaphore::MAX_PERMITS)
        .min(u32::MAX as usize)
        .max(1) as u32;
    let permits = Arc::new(Semaphore::new(max as usize));
    let refusals = Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT));
    let ctx = Arc::new(Ctx {
        limiter,
        limits: settings.limits,
        idle_timeout: settings.idle_timeout,
    });
    let (stop, stopped) = watch::channel(false);
    tracing::info!(addr = %local, max_connections = max, "RESP transport listening");
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, usually: back off instead of spinning.
                    tracing::warn!(error = %e, "RESP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let ctx = ctx.clone();
                let stopped = stopped.clone();
                tokio::spawn(async move {
                    let _open = Open::new(permit, ctx.clone());
                    connection(stream, &ctx, stopped).await;
                });
            }
            Err(_) => {
                ctx.limiter
                    .metrics()
                    .throttle
                    .resp_connections_refused
                    .fetch_add(1, Ordering::Relaxed);
                if let Ok(permit) = refusals.clone().try_acquire_owned() {
                    tokio::spawn(refuse(stream, permit));
                }
            }
        }
    }
    drop(listener);
    let _ = stop.send(true);
    // Every connection holds a permit until it is closed.
    let _ = permits.acquire_many(max).await;
    tracing::info!(addr = %local, "RESP transport stopped");
    Ok(())
}

/// A connection's hold on its place under the cap, counted in the open-connections gauge.
struct Open {
    _permit: OwnedSemaphorePermit,
    ctx: Arc<Ctx>,
}

impl Open {
    fn new(permit: OwnedSemaphorePermit, ctx: Arc<Ctx>) -> Open {
        ctx.limiter
            .metrics()
            .throttle
            .resp_connections_open
            .fetch_add(1, Ordering::Relaxed);
        Open {
            _permit: permit,
            ctx,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.ctx
            .limiter
            .metrics()
            .throttle
            .resp_connections_open
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Tells a connection over the cap why it is closed.
async fn refuse(stream: TcpStream, _permit: OwnedSemaphorePermit) {
    let mut out = BytesMut::new();
    error(&mut out, "ERR too many connections");
    close(stream, &out).await;
}

/// Writes the last replies and closes gently: closing with unread data sends a reset, which can
/// destroy the replies before the client reads them. So the client's remaining bytes are read
/// (a second and a megabyte at most) after our side is shut.
async fn close(mut stream: TcpStream, last: &[u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(last).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        let mut budget = 1usize << 20;
        while budget > 0 {
            let n = stream.read(&mut sink).await?;
            if n == 0 {
                break;
            }
            budget = budget.saturating_sub(n);
        }
        io::Result::Ok(())
    })
    .await;
}

async fn connection(mut stream: TcpStream, ctx: &Ctx, mut stopped: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let mut input = BytesMut::with_capacity(1024);
    let mut out = BytesMut::new();
    loop {
        loop {
            match next_command(&mut input) {
                Ok(Some(args)) => {
                    if execute(&args, ctx, &mut out).await == Flow::Quit {
                        return close(stream, &out).await;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // The stream cannot be resynchronised after a framing error; Redis closes too.
                    error(&mut out, &format!("ERR {e}"));
                    return close(stream, &out).await;
                }
            }
            if out.len() >= FLUSH_AT && !write(&mut stream, &mut out, ctx.idle_timeout).await {
                return;
            }
        }
        if !write(&mut stream, &mut out, ctx.idle_timeout).await || *stopped.borrow() {
            return;
        }
        input.reserve(1024);
        tokio::select! {
            read = tokio::time::timeout(ctx.idle_timeout, stream.read_buf(&mut input)) => {
                match read {
                    Ok(Ok(n)) if n > 0 => {}
                    // Closed by the client, failed, or idle too long.
                    _ => return,
                }
            }
            _ = stopped.changed() => return,
        }
    }
}

/// Writes and clears `out`; false when the client is gone or reads nothing for the idle timeout.
async fn write(stream: &mut TcpStream, out: &mut BytesMut, timeout: Duration) -> bool {
    if out.is_empty() {
        return true;
    }
    let done = tokio::time::timeout(timeout, stream.write_all(out)).await;
    out.clear();
    matches!(done, Ok(Ok(())))
}

/// Takes the next complete command off `input`: `Ok(None)` until one has fully arrived. Skips
/// empty commands, as Redis does. Inline commands (`PING\r\n`, as typed into telnet) work too.
fn next_command(input: &mut BytesMut) -> Result<Option<Vec<Bytes>>, &'static str> {
    loop {
        if input.is_empty() {
            return Ok(None);
        }
        let args = if input[0] == b'*' {
            let Some(len) = frame_len(input)? else {
                return Ok(None);
            };
            let frame = input.split_to(len).freeze();
            match decode_bytes(&frame) {
                Ok(Some((BytesFrame::Array(items), n))) if n == len => items
                    .into_iter()
                    .map(|f| match f {
                        BytesFrame::BulkString(b) => Ok(b),
                        _ => Err("Protocol error: expected bulk strings"),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Ok(Some((BytesFrame::Null, n))) if n == len => Vec::new(),
                _ => return Err("Protocol error: invalid multibulk request"),
            }
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
fn frame_len(input: &[u8]) -> Result<Option<usize>, &'static str> {
    let Some((n, mut pos)) = header(input, 0, b'*')? else {
        return Ok(None);
    };
    if n > MAX_ARGS {
        return Err("Protocol error: too many arguments");
    }
    for _ in 0..n.max(0) {
        let Some((len, start)) = header(input, pos, b'$')? else {
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
        // The crate skips the two bytes after a bulk string unchecked; Redis does too, but a
        // client that gets this wrong is out of step with us for good.
        if &input[pos - 2..pos] != b"\r\n" {
            return Err("Protocol error: expected CRLF after a bulk string");
        }
    }
    Ok(Some(pos))
}

/// Reads `<kind><integer>\r\n` at `at`: the integer and where the next element starts.
fn header(input: &[u8], at: usize, kind: u8) -> Result<Option<(i64, usize)>, &'static str> {
    let Some(&first) = input.get(at) else {
        return Ok(None);
    };
    if first != kind {
        return Err(if kind == b'$' {
            "Protocol error: expected '$' (arguments are bulk strings)"
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
        Some(b'\n') => Ok(Some((n, at + 1 + cr + 2))),
        Some(_) => Err("Protocol error: expected CRLF"),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Quit,
}

async fn execute(args: &[Bytes], ctx: &Ctx, out: &mut BytesMut) -> Flow {
    let name = args[0].to_ascii_uppercase();
    match name.as_slice() {
        b"THROTTLE" => throttle_command(&args[1..], ctx, out).await,
        b"PING" => match args.len() {
            1 => encode(out, &BorrowedFrame::SimpleString(b"PONG")),
            2 => encode(out, &BorrowedFrame::BulkString(&args[1])),
            _ => error(out, "ERR wrong number of arguments for 'ping' command"),
        },
        b"QUIT" => {
            encode(out, &BorrowedFrame::SimpleString(b"OK"));
            return Flow::Quit;
        }
        _ => connection_command(&name, args, out),
    }
    Flow::Continue
}

/// What Redis clients send around their commands, answered as Redis would, so they work
/// unmodified: `ECHO` (`redis-cli --pipe` ends its input with one), `HELLO` (RESP2 only: `HELLO 3`
/// gets Redis's `NOPROTO`, and clients fall back), `CLIENT SETNAME`/`SETINFO`, `SELECT 0`,
/// `INFO` (ready checks) and `COMMAND` (redis-cli's hints).
fn connection_command(name: &[u8], args: &[Bytes], out: &mut BytesMut) {
    let arg = |i: usize| args.get(i).map(|a| a.to_ascii_uppercase());
    match (name, args.len()) {
        (b"ECHO", 2) => encode(out, &BorrowedFrame::BulkString(&args[1])),
        (b"HELLO", _) => match arg(1).as_deref() {
            None | Some(b"2") => hello(out),
            Some(b"3") => error(out, "NOPROTO sorry, this protocol version is not supported"),
            Some(_) => error(
                out,
                "ERR Protocol version is not an integer or out of range",
            ),
        },
        (b"CLIENT", 3..) => match arg(1).as_deref() {
            Some(b"SETNAME") | Some(b"SETINFO") => encode(out, &BorrowedFrame::SimpleString(b"OK")),
            _ => error(out, "ERR unknown CLIENT subcommand"),
        },
        (b"CLIENT", 2) if arg(1).as_deref() == Some(b"GETNAME") => {
            encode(out, &BorrowedFrame::Null)
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

/// `HELLO`'s answer in RESP2 (a flat array of field, value).
fn hello(out: &mut BytesMut) {
    use BorrowedFrame::{Array, BulkString, Integer};
    let fields = [
        BulkString(b"server"),
        BulkString(b"turnstile"),
        BulkString(b"version"),
        BulkString(env!("CARGO_PKG_VERSION").as_bytes()),
        BulkString(b"proto"),
        Integer(2),
        BulkString(b"mode"),
        BulkString(b"standalone"),
        BulkString(b"role"),
        BulkString(b"master"),
        BulkString(b"modules"),
        Array(&[]),
    ];
    encode(out, &Array(&fields));
}

/// `THROTTLE key max_burst count_per_period period [quantity]`.
async fn throttle_command(args: &[Bytes], ctx: &Ctx, out: &mut BytesMut) {
    if !(4..=5).contains(&args.len()) {
        return error(out, "ERR wrong number of arguments for 'throttle' command");
    }
    let Ok(key) = std::str::from_utf8(&args[0]) else {
        return error(out, "ERR key must be UTF-8");
    };
    let int = |i: usize, name: &str| -> Result<i64, String> {
        std::str::from_utf8(&args[i])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("ERR {name} is not an integer"))
    };
    let parsed = (|| {
        Ok::<_, String>(ThrottleRequest {
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
    })();
    let req = match parsed {
        Ok(r) => r,
        Err(m) => {
            ctx.limiter
                .metrics()
                .throttle
                .invalid
                .fetch_add(1, Ordering::Relaxed);
            return error(out, &m);
        }
    };
    match throttle(&ctx.limiter, &ctx.limits, &req).await {
        Ok(a) => {
            let n = |v: u64| BorrowedFrame::Integer(i64::try_from(v).unwrap_or(i64::MAX));
            let items = [
                BorrowedFrame::Integer(a.allowed.into()),
                n(a.limit.into()),
                n(a.remaining.into()),
                n(a.retry_after),
                n(a.reset_after),
            ];
            encode(out, &BorrowedFrame::Array(&items));
        }
        Err(e) => error(out, &format!("ERR {e}")),
    }
}

fn encode(out: &mut BytesMut, frame: &BorrowedFrame<'_>) {
    // Cannot fail: the buffer is extended to the frame's length first.
    let _ = extend_encode_borrowed(out, frame, false);
}

/// An error reply. `message` must hold no CR or LF: callers never put client bytes in it
/// except through [`printable`].
fn error(out: &mut BytesMut, message: &str) {
    encode(out, &BorrowedFrame::Error(message));
}

/// A client-sent name, shortened and with control characters replaced, for an error message.
fn printable(name: &[u8]) -> String {
    String::from_utf8_lossy(&name[..name.len().min(64)])
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(input: &[u8]) -> Result<Option<Vec<Bytes>>, &'static str> {
        next_command(&mut BytesMut::from(input))
    }

    #[test]
    fn frames_are_found_whole_or_waited_for() {
        let cmd = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n";
        assert_eq!(frame_len(cmd), Ok(Some(cmd.len())));
        for cut in 0..cmd.len() {
            assert_eq!(frame_len(&cmd[..cut]), Ok(None), "cut at {cut}");
        }
        let got = args(cmd).unwrap().unwrap();
        assert_eq!(got, vec![Bytes::from("PING"), Bytes::from("hi")]);
        assert_eq!(
            args(b"ping  hello\r\n").unwrap().unwrap(),
            vec![Bytes::from("ping"), Bytes::from("hello")]
        );
        // Empty commands are skipped; what follows them is read.
        assert_eq!(
            args(b"*0\r\n*-1\r\n\r\n*1\r\n$4\r\nQUIT\r\n")
                .unwrap()
                .unwrap(),
            vec![Bytes::from("QUIT")]
        );
    }

    #[test]
    fn hostile_frames_are_refused_without_recursing() {
        // Nested arrays would send the crate's parser this deep.
        let nested = b"*1\r\n".repeat(100_000);
        assert!(args(&nested).is_err());
        assert!(args(b"*1\r\n:5\r\n").is_err());
        assert!(args(b"*1\r\n$-1\r\n").is_err());
        assert!(
            args(b"*1\r\n$99999999\r\n").is_err(),
            "too big: no waiting for it"
        );
        assert!(args(b"*100000\r\n").is_err());
        assert!(args(b"*1\r\n$x\r\n").is_err());
        assert!(
            args(b"*1\r\n$1\r\naXY").is_err(),
            "CRLF after the bulk string"
        );
        assert!(args(&b"A".repeat(MAX_REQUEST_BYTES + 1)).is_err());
        assert!(args(&b"A".repeat(100)).unwrap().is_none());
    }

    #[test]
    fn a_non_loopback_bind_is_refused() {
        let s = RespSettings {
            addr: "0.0.0.0:0".parse().unwrap(),
            ..RespSettings::default()
        };
        assert_eq!(
            s.bind().unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
    }
}
