//! A single Redis over plain TCP or a unix socket, reached without the crate's multiplexer:
//! pipelines packed by the crate (`redis::Pipeline::get_packed_pipeline`) are written as they
//! are, and the replies are read here, straight into the integers the store decodes, instead
//! of into a tree of `redis::Value`s handed over through a channel per round trip.
//!
//! One connection per pool slot, made by the first round trip that needs it and driven by a
//! task on that round trip's thread (a shard's worker). Round trips go in the order they are
//! handed over and their replies come back in that order (Redis answers a connection's
//! commands in order); the replies of a round trip whose caller gave up (its deadline passed)
//! are read and dropped, as the crate's multiplexer does. A connection that fails (an I/O
//! error, Redis closing it, a reply that is not RESP, or no answer at all for longer than it
//! may take to connect) fails every round trip on it and is dropped; the next round trip
//! connects again. TLS goes through the crate's connection manager instead (see `connect`).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::decode::Ints;

/// Round trips handed over and not yet answered, per connection; more wait for room.
const MAX_PENDING: usize = 64;

/// A command's reply: its integers (see `decode::ints`), or the error Redis answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RespReply {
    Ints(Ints),
    Error(String),
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) addr: Addr,
    pub(super) nodelay: bool,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) db: i64,
    pub(super) connect_timeout: Duration,
}

#[derive(Debug, Clone)]
pub(super) enum Addr {
    Tcp(String, u16),
    Unix(PathBuf),
}

impl Target {
    /// The target of a client the crate would connect over plain TCP or a unix socket; `None`
    /// for TLS.
    pub(super) fn of(client: &redis::Client, connect_timeout: Duration) -> Option<Target> {
        let info = client.get_connection_info();
        let addr = match info.addr() {
            redis::ConnectionAddr::Tcp(h, p) => Addr::Tcp(h.clone(), *p),
            redis::ConnectionAddr::Unix(p) => Addr::Unix(p.clone()),
            _ => return None,
        };
        let r = info.redis_settings();
        Some(Target {
            addr,
            nodelay: info.tcp_settings().nodelay(),
            username: r.username().map(str::to_owned),
            password: r.password().map(str::to_owned),
            db: r.db(),
            connect_timeout,
        })
    }
}

struct Job {
    out: Vec<u8>,
    replies: usize,
    done: oneshot::Sender<Result<Vec<RespReply>, String>>,
}

/// A connection to a single Redis, made when first needed and again after it fails.
pub(super) struct Plain {
    target: Target,
    /// The current connection's driver; a closed one is replaced on the next round trip.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
}

impl Plain {
    pub(super) fn new(target: Target) -> Plain {
        Plain {
            target,
            jobs: Mutex::new(None),
        }
    }

    /// The current connection's driver, started (on this thread's runtime) if there is none.
    fn driver(&self) -> mpsc::Sender<Job> {
        let mut g = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        match &*g {
            Some(tx) if !tx.is_closed() => tx.clone(),
            _ => {
                let (tx, rx) = mpsc::channel(MAX_PENDING);
                tokio::spawn(drive(self.target.clone(), rx));
                *g = Some(tx.clone());
                tx
            }
        }
    }

    /// Writes `out` (packed commands) and reads `replies` replies, in order.
    pub(super) async fn round_trip(
        &self,
        out: Vec<u8>,
        replies: usize,
    ) -> Result<Vec<RespReply>, String> {
        let (done, answer) = oneshot::channel();
        let mut job = Job { out, replies, done };
        // A driver that stopped since it was handed out is replaced once.
        for _ in 0..2 {
            match self.driver().send(job).await {
                Ok(()) => {
                    return answer
                        .await
                        .unwrap_or_else(|_| Err("the connection to Redis closed".into()))
                }
                Err(mpsc::error::SendError(j)) => job = j,
            }
        }
        Err("the connection to Redis closed".into())
    }
}

/// Connects, then writes the round trips handed over and answers each with its replies, until
/// the connection fails or the `Plain` is dropped.
async fn drive(target: Target, mut jobs: mpsc::Receiver<Job>) {
    let err = match connect(&target).await {
        Ok(Stream::Tcp(s)) => {
            let (r, w) = s.into_split();
            run(r, w, &mut jobs, target.connect_timeout).await
        }
        Ok(Stream::Unix(s)) => {
            let (r, w) = s.into_split();
            run(r, w, &mut jobs, target.connect_timeout).await
        }
        Err(e) => e,
    };
    // Whatever waits fails with the connection: its round trip may or may not have run.
    jobs.close();
    while let Some(j) = jobs.recv().await {
        let _ = j.done.send(Err(err.clone()));
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn connect(t: &Target) -> Result<Stream, String> {
    let fut = async {
        let mut s = match &t.addr {
            Addr::Tcp(h, p) => {
                let s = tokio::net::TcpStream::connect((h.as_str(), *p)).await?;
                s.set_nodelay(t.nodelay)?;
                Stream::Tcp(s)
            }
            Addr::Unix(p) => Stream::Unix(tokio::net::UnixStream::connect(p).await?),
        };
        let err = match &mut s {
            Stream::Tcp(s) => handshake(s, t).await,
            Stream::Unix(s) => handshake(s, t).await,
        };
        Ok::<_, std::io::Error>(err.map(|()| s))
    };
    match tokio::time::timeout(t.connect_timeout, fut).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(format!("cannot connect to Redis: {e}")),
        Err(_) => Err(format!(
            "cannot connect to Redis within {:?}",
            t.connect_timeout
        )),
    }
}

/// `AUTH` and `SELECT` as the target asks, before any round trip.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, t: &Target) -> Result<(), String> {
    let mut pipe = redis::pipe();
    if let Some(p) = &t.password {
        match &t.username {
            Some(u) => pipe.cmd("AUTH").arg(u).arg(p),
            None => pipe.cmd("AUTH").arg(p),
        };
    }
    if t.db != 0 {
        pipe.cmd("SELECT").arg(t.db);
    }
    if pipe.is_empty() {
        return Ok(());
    }
    let io = |e: std::io::Error| format!("cannot connect to Redis: {e}");
    s.write_all(&pipe.get_packed_pipeline()).await.map_err(io)?;
    let mut buf = Vec::with_capacity(256);
    let mut got = Vec::new();
    while got.len() < pipe.len() {
        if s.read_buf(&mut buf).await.map_err(io)? == 0 {
            return Err("Redis closed the connection during the handshake".into());
        }
        let used = parse_all(&buf, &mut got, pipe.len())?;
        buf.drain(..used);
    }
    match got.into_iter().find_map(|r| match r {
        RespReply::Error(e) => Some(e),
        RespReply::Ints(_) => None,
    }) {
        Some(e) => Err(format!("Redis refused the handshake: {e}")),
        None => Ok(()),
    }
}

/// A round trip written and waiting for its replies.
struct Pending {
    replies: Vec<RespReply>,
    want: usize,
    done: oneshot::Sender<Result<Vec<RespReply>, String>>,
    sent: Instant,
}

/// Drives one connection; answers why it stopped (every pending round trip has failed then).
async fn run<R, W>(
    mut r: R,
    mut w: W,
    jobs: &mut mpsc::Receiver<Job>,
    stuck_after: Duration,
) -> String
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut pending: VecDeque<Pending> = VecDeque::with_capacity(4);
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let err = loop {
        tokio::select! {
            job = jobs.recv(), if pending.len() < MAX_PENDING => {
                let Some(job) = job else {
                    // The store is gone.
                    break "the Redis store was dropped".to_owned();
                };
                // The oldest round trip, given up on, and unanswered for longer than a
                // connection may take to be made: Redis is not answering on this one.
                let stuck = pending.front().is_some_and(|p| {
                    p.done.is_closed() && p.sent.elapsed() > stuck_after
                });
                if stuck {
                    let e = format!("Redis did not answer for {stuck_after:?}");
                    let _ = job.done.send(Err(e.clone()));
                    break e;
                }
                if let Err(e) = w.write_all(&job.out).await {
                    let _ = job.done.send(Err(format!("Redis connection: {e}")));
                    break format!("Redis connection: {e}");
                }
                if job.replies == 0 {
                    let _ = job.done.send(Ok(Vec::new()));
                } else {
                    pending.push_back(Pending {
                        replies: Vec::with_capacity(job.replies),
                        want: job.replies,
                        done: job.done,
                        sent: Instant::now(),
                    });
                }
            }
            n = r.read_buf(&mut buf) => {
                match n {
                    Ok(0) => break "Redis closed the connection".to_owned(),
                    Ok(_) => {}
                    Err(e) => break format!("Redis connection: {e}"),
                }
                match deliver(&buf, &mut pending) {
                    Ok(used) => {
                        buf.drain(..used);
                    }
                    Err(e) => break e,
                }
            }
        }
    };
    for p in pending {
        let _ = p.done.send(Err(err.clone()));
    }
    err
}

/// Reads every complete reply in `buf` into the pending round trips, answering those that are
/// complete; answers how many bytes it used.
fn deliver(buf: &[u8], pending: &mut VecDeque<Pending>) -> Result<usize, String> {
    let mut used = 0;
    while let Some(front) = pending.front_mut() {
        let want = front.want - front.replies.len();
        used += parse_all(&buf[used..], &mut front.replies, want)?;
        if front.replies.len() < front.want {
            break;
        }
        let p = pending.pop_front().expect("front");
        let _ = p.done.send(Ok(p.replies));
    }
    if used < buf.len() && pending.is_empty() {
        return Err("Redis sent a reply nobody asked for".into());
    }
    Ok(used)
}

/// Parses up to `want` complete replies from `buf` into `out`; answers the bytes used.
fn parse_all(buf: &[u8], out: &mut Vec<RespReply>, want: usize) -> Result<usize, String> {
    let mut used = 0;
    for _ in 0..want {
        match parse(&buf[used..])? {
            Some((reply, n)) => {
                out.push(reply);
                used += n;
            }
            None => break,
        }
    }
    Ok(used)
}

/// One complete RESP2 reply at the start of `buf` and its length, `None` if it is not all
/// there yet. Numbers become integers, arrays are flattened, anything else adds nothing (as
/// `decode::ints` reads a `redis::Value`).
pub(super) fn parse(buf: &[u8]) -> Result<Option<(RespReply, usize)>, String> {
    let mut ints = Ints::new();
    let mut error = None;
    match item(buf, 0, &mut ints, &mut error, 0)? {
        None => Ok(None),
        Some(end) => Ok(Some((
            match error {
                Some(e) => RespReply::Error(e),
                None => RespReply::Ints(ints),
            },
            end,
        ))),
    }
}

/// Nested arrays deeper than this are refused (no reply of ours nests at all).
const MAX_DEPTH: usize = 8;

/// The line starting at `at` (without its CRLF) and where the next one starts.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let i = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..i], at + i + 2))
}

fn number(s: &[u8]) -> Option<i64> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// An integer reply's number and where the next reply starts, read in one pass (every reply to
/// INCRBY is one); `None` for anything else, which [`item`] reads the long way.
fn integer(buf: &[u8], at: usize) -> Option<(i64, usize)> {
    let rest = buf.get(at..)?;
    let (neg, digits) = match rest {
        [b':', b'-', d @ ..] => (true, d),
        [b':', d @ ..] => (false, d),
        _ => return None,
    };
    let mut n: i64 = 0;
    for (i, &b) in digits.iter().enumerate().take(21) {
        match b {
            b'0'..=b'9' => n = n.checked_mul(10)?.checked_add(i64::from(b - b'0'))?,
            b'\r' if i > 0 && digits.get(i + 1) == Some(&b'\n') => {
                let used = rest.len() - digits.len() + i + 2;
                return Some((if neg { -n } else { n }, at + used));
            }
            _ => return None,
        }
    }
    None
}

fn item(
    buf: &[u8],
    at: usize,
    ints: &mut Ints,
    error: &mut Option<String>,
    depth: usize,
) -> Result<Option<usize>, String> {
    if let Some((n, next)) = integer(buf, at) {
        ints.push(n);
        return Ok(Some(next));
    }
    let bad = || "Redis sent something that is not RESP".to_owned();
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some((head, next)) = line(buf, at + 1) else {
        return Ok(None);
    };
    match kind {
        b':' => {
            ints.push(number(head).ok_or_else(bad)?);
            Ok(Some(next))
        }
        b'+' => {
            ints.extend(number(head));
            Ok(Some(next))
        }
        b'-' => {
            error.get_or_insert_with(|| String::from_utf8_lossy(head).into_owned());
            Ok(Some(next))
        }
        b'$' => {
            let n = number(head).ok_or_else(bad)?;
            if n < 0 {
                return Ok(Some(next));
            }
            let end = next + n as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(bad());
            }
            ints.extend(number(&buf[next..end]));
            Ok(Some(end + 2))
        }
        b'*' => {
            let n = number(head).ok_or_else(bad)?;
            if depth >= MAX_DEPTH {
                return Err(bad());
            }
            let mut at = next;
            for _ in 0..n.max(0) {
                match item(buf, at, ints, error, depth + 1)? {
                    Some(end) => at = end,
                    None => return Ok(None),
                }
            }
            Ok(Some(at))
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    /// Every reply as the crate reads it, then through `decode::ints`.
    fn crate_reads(bytes: &[u8]) -> RespReply {
        let v = redis::parse_redis_value(bytes).expect("valid RESP");
        match v {
            Value::ServerError(e) => RespReply::Error(
                format!("{} {}", e.code(), e.details().unwrap_or_default())
                    .trim_end()
                    .to_owned(),
            ),
            v => RespReply::Ints(super::super::decode::ints(v)),
        }
    }

    #[test]
    fn replies_read_as_the_crate_reads_them() {
        let cases: &[&[u8]] = &[
            b":42\r\n",
            b":-7\r\n",
            b":0\r\n",
            b":9223372036854775807\r\n",
            b":-9223372036854775807\r\n",
            b":1234567890123456789\r\n",
            b":-9223372036854775808\r\n",
            b"+OK\r\n",
            b"+12\r\n",
            b"$2\r\n17\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$3\r\nabc\r\n",
            b"*3\r\n:1\r\n:5\r\n:0\r\n",
            b"*2\r\n:1\r\n$16\r\n1700000123456000\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*2\r\n*2\r\n:1\r\n:2\r\n:3\r\n",
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            b"-ERR wrong number of arguments\r\n",
        ];
        for c in cases {
            let (r, n) = parse(c).unwrap().expect("complete");
            assert_eq!(n, c.len(), "{}", String::from_utf8_lossy(c));
            assert_eq!(r, crate_reads(c), "{}", String::from_utf8_lossy(c));
            // Every proper prefix is incomplete, never wrong.
            for cut in 0..c.len() {
                assert_eq!(parse(&c[..cut]).unwrap(), None);
            }
        }
        assert!(parse(b"?what\r\n").is_err());
        assert!(parse(b"$2\r\n123\r\n").is_err());
        assert!(parse(&b"*1\r\n".repeat(MAX_DEPTH + 1)).is_err());
    }

    #[test]
    fn replies_go_to_their_round_trips_in_order() {
        let (a, mut ra) = oneshot::channel();
        let (b, mut rb) = oneshot::channel();
        let mut pending = VecDeque::from([
            Pending {
                replies: Vec::new(),
                want: 2,
                done: a,
                sent: Instant::now(),
            },
            Pending {
                replies: Vec::new(),
                want: 1,
                done: b,
                sent: Instant::now(),
            },
        ]);
        // The first round trip's replies and half of the second's.
        let bytes = b":1\r\n*2\r\n:0\r\n:3\r\n:9";
        let used = deliver(bytes, &mut pending).unwrap();
        assert_eq!(used, bytes.len() - 2);
        assert_eq!(
            ra.try_recv().unwrap().unwrap(),
            vec![
                RespReply::Ints([1].into_iter().collect()),
                RespReply::Ints([0, 3].into_iter().collect())
            ]
        );
        assert!(rb.try_recv().is_err());
        assert_eq!(deliver(b":9\r\n", &mut pending).unwrap(), 4);
        assert_eq!(
            rb.try_recv().unwrap().unwrap(),
            vec![RespReply::Ints([9].into_iter().collect())]
        );
        assert!(deliver(b":1\r\n", &mut pending).is_err());
    }
}
