//! The Redis-protocol transport: ThrottleCrab's `THROTTLE`, redis-cell's `CL.THROTTLE`, `PING` and
//! `QUIT` over RESP2 (RESP3 after `HELLO 3`), one tokio task per connection, so any Redis client library (and `redis-cli`) is a turnstile client.
//!
//! Replies are encoded by the `redis-protocol` crate; commands are read by `codec`, which walks a
//! frame's headers without recursion: it finds where a command ends, caps its size, takes each
//! argument as a slice of the frame, and refuses nested arrays (no command has them; a recursive
//! parser overflows the stack on a few thousand nested `*1\r\n`).
//!
//! Commands of one connection are answered in the order they came, pipelined or not: every
//! complete command in the read buffer is decided, its reply appended, and the replies written
//! together before the next read.

mod codec;
mod commands;
mod stats;

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::service::metrics::DoorCalls;
use crate::service::throttle::ThrottleLimits;
use crate::service::ThrottleService;
use codec::next_command;
use commands::{error, execute, Flow, Session};
pub use stats::RespStats;

/// A command bigger than this (THROTTLE needs a few hundred bytes) is a protocol error and
/// closes the connection, so a client cannot make the server buffer without bound.
const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Arguments in one command; THROTTLE and CL.THROTTLE have six.
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

struct ThrottleCtx {
    throttle: ThrottleService,
    stats: Arc<RespStats>,
    /// Every door's calls: `THROTTLE` and `CL.THROTTLE` count in the throttle door's.
    calls: Arc<DoorCalls>,
    limits: ThrottleLimits,
    idle_timeout: Duration,
}

/// What every listener of the transport shares: the decisions, the settings, and the cap on
/// connections (one cap, however many threads accept).
pub struct RespShared {
    ctx: Arc<ThrottleCtx>,
    allow_remote: bool,
    max: u32,
    permits: Arc<Semaphore>,
    refusals: Arc<Semaphore>,
}

impl RespShared {
    /// Counting its connections in `stats`.
    pub fn new(
        throttle: ThrottleService,
        settings: &RespSettings,
        stats: Arc<RespStats>,
        calls: Arc<DoorCalls>,
    ) -> Arc<RespShared> {
        let max = settings
            .max_connections
            .min(Semaphore::MAX_PERMITS)
            .min(u32::MAX as usize)
            .max(1) as u32;
        Arc::new(RespShared {
            ctx: Arc::new(ThrottleCtx {
                throttle,
                calls,
                stats,
                limits: settings.limits,
                idle_timeout: settings.idle_timeout,
            }),
            allow_remote: settings.allow_remote,
            max,
            permits: Arc::new(Semaphore::new(max as usize)),
            refusals: Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT)),
        })
    }
}

/// Serves RESP on `listener` until `shutdown` completes: then stops accepting, lets every
/// connection answer the commands it has read, and returns once all are closed. Each connection
/// is a task on the current runtime, counted in `stats`. Refuses to serve a non-loopback listener
/// unless `settings.allow_remote`.
pub async fn serve(
    listener: TcpListener,
    throttle: ThrottleService,
    settings: RespSettings,
    stats: Arc<RespStats>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let shared = RespShared::new(throttle, &settings, stats, Arc::default());
    serve_shared(listener, shared, shutdown).await
}

/// [`serve`] with state shared with other listeners: `server::start` runs one on every worker
/// thread, each accepting from a clone of the one RESP socket, so a call whose key lives on its
/// worker's shards is decided in place, without crossing threads.
pub async fn serve_shared(
    listener: TcpListener,
    shared: Arc<RespShared>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let local = listener.local_addr()?;
    RespSettings {
        addr: local,
        allow_remote: shared.allow_remote,
        ..RespSettings::default()
    }
    .check_addr()
    .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
    let (max, ctx) = (shared.max, &shared.ctx);
    let (stop, stopped) = watch::channel(false);
    tracing::debug!(addr = %local, max_connections = max, "RESP transport listening");
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
        match shared.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let ctx = ctx.clone();
                let stopped = stopped.clone();
                tokio::spawn(async move {
                    let _open = Open::new(permit, ctx.clone());
                    connection(stream, &ctx, stopped).await;
                });
            }
            Err(_) => {
                ctx.stats.refused();
                if let Ok(permit) = shared.refusals.clone().try_acquire_owned() {
                    tokio::spawn(refuse(stream, permit));
                }
            }
        }
    }
    drop(listener);
    let _ = stop.send(true);
    // Every connection holds a permit until it is closed.
    let _ = shared.permits.acquire_many(max).await;
    tracing::debug!(addr = %local, "RESP transport stopped");
    Ok(())
}

/// A connection's hold on its place under the cap, counted in the open-connections gauge.
struct Open {
    _permit: OwnedSemaphorePermit,
    ctx: Arc<ThrottleCtx>,
}

impl Open {
    fn new(permit: OwnedSemaphorePermit, ctx: Arc<ThrottleCtx>) -> Open {
        ctx.stats.opened();
        Open {
            _permit: permit,
            ctx,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.ctx.stats.closed();
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

async fn connection(mut stream: TcpStream, ctx: &ThrottleCtx, mut stopped: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let mut input = BytesMut::with_capacity(1024);
    let mut out = BytesMut::new();
    let mut session = Session::default();
    // One stop future and one idle timer for the connection's life, rather than a timer and a
    // waiter registered on every read: the timer fires at most once per idle timeout, and is
    // moved on then if the connection was busy meanwhile.
    let stop = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    tokio::pin!(stop);
    let idle = tokio::time::sleep(ctx.idle_timeout);
    tokio::pin!(idle);
    let mut last = Instant::now();
    loop {
        loop {
            match next_command(&mut input) {
                Ok(Some(args)) => {
                    if execute(&args, ctx, &mut session, &mut out).await == Flow::Quit {
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
        if !write(&mut stream, &mut out, ctx.idle_timeout).await {
            return;
        }
        input.reserve(1024);
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => return,
                read = stream.read_buf(&mut input) => match read {
                    Ok(n) if n > 0 => {
                        last = Instant::now();
                        break;
                    }
                    // Closed by the client, or failed.
                    _ => return,
                },
                _ = &mut idle => {
                    let due = last + ctx.idle_timeout;
                    if Instant::now() >= due {
                        return;
                    }
                    idle.as_mut().reset(due);
                }
            }
        }
    }
}

/// Writes and clears `out`; false when the client is gone or reads nothing for the idle timeout.
/// What the socket takes at once is written without arming a timer.
async fn write(stream: &mut TcpStream, out: &mut BytesMut, timeout: Duration) -> bool {
    if out.is_empty() {
        return true;
    }
    let sent = match stream.try_write(out) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(_) => return false,
    };
    let done = if sent == out.len() {
        Ok(Ok(()))
    } else {
        tokio::time::timeout(timeout, stream.write_all(&out[sent..])).await
    };
    out.clear();
    matches!(done, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::codec::frame_len;
    use super::*;

    fn args(input: &[u8]) -> Result<Option<Vec<Bytes>>, &'static str> {
        next_command(&mut BytesMut::from(input)).map(|a| a.map(|a| a.into_vec()))
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
        assert_eq!(
            args(b"*2\r\n$1\r\nk\r\n:-5\r\n").unwrap().unwrap(),
            vec![Bytes::from("k"), Bytes::from("-5")],
            "integers are arguments too"
        );
        assert!(args(b"*1\r\n:5x\r\n").is_err());
        assert!(args(b"*1\r\n+5\r\n").is_err());
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
