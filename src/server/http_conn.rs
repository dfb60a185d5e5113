//! Serving an HTTP listener with its read bounds (`transport::http::HttpBounds`): every port,
//! whichever door's router it serves, and the ports that answer while the start waits. A
//! request whose headers have not ended in time closes its connection (hyper's header timer,
//! which on a kept-alive connection runs from the previous answer), and so does a connection
//! with no request in flight for the idle timeout; the body's bound is the router's outer layer.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::transport::http::{bound_body, HttpBounds};

/// Serves `router` on `listener` until `end` completes, then lets each open connection finish
/// what it is answering (HTTP/1 closes after it, HTTP/2 sends a GOAWAY) and returns once all
/// have closed.
pub(super) async fn serve<L>(
    what: &'static str,
    mut listener: L,
    router: axum::Router,
    bounds: HttpBounds,
    end: impl Future<Output = ()> + Send + 'static,
) where
    L: Listener<Addr = SocketAddr>,
{
    let router = router.layer(axum::middleware::from_fn(move |req, next| {
        bound_body(bounds, req, next)
    }));
    let mut builder = Builder::new(TokioExecutor::new());
    (builder.http1())
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.headers);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let (stop, stopped) = watch::channel(false);
    let mut open = JoinSet::new();
    let mut end = std::pin::pin!(end);
    loop {
        tokio::select! {
            (io, peer) = listener.accept() => {
                let conn = connection(&builder, io, peer, router.clone(), bounds.idle, stopped.clone());
                open.spawn(conn);
            }
            Some(_) = open.join_next(), if !open.is_empty() => {}
            () = &mut end => break,
        }
    }
    drop(listener);
    let _ = stop.send(true);
    while open.join_next().await.is_some() {}
    tracing::debug!(server = what, "HTTP port closed");
}

/// One connection: the router answers each request with the peer's address at hand (the
/// loopback checks of `/throttle` and the admin port read it); closed gracefully when idle for
/// `idle` or when the port stops.
fn connection<Io>(
    builder: &Arc<Builder<TokioExecutor>>,
    io: Io,
    peer: SocketAddr,
    router: axum::Router,
    idle: Duration,
    mut stopped: watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send + 'static
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let builder = builder.clone();
    let activity = Arc::new(Activity::new());
    let seen = activity.clone();
    let service = tower::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        let answered = router.clone().oneshot(req.map(axum::body::Body::new));
        let activity = seen.clone();
        activity.begin();
        async move {
            let resp = answered.await;
            activity.end();
            Ok::<_, Infallible>(resp.unwrap_or_else(|e| match e {}))
        }
    });
    async move {
        let service = TowerToHyperService::new(service);
        let conn = builder.serve_connection(TokioIo::new(io), service);
        let mut conn = std::pin::pin!(conn);
        let mut closing = false;
        loop {
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = stopped.wait_for(|s| *s), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                () = activity.idle_for(idle), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// A connection's requests in flight and when the last one ended.
struct Activity {
    in_flight: AtomicUsize,
    /// Nanoseconds from `base`.
    last: AtomicU64,
    base: Instant,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            in_flight: AtomicUsize::new(0),
            last: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn end(&self) {
        let now = self.base.elapsed().as_nanos() as u64;
        self.last.store(now, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Completes once no request has been in flight for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = Duration::from_nanos(self.last.load(Ordering::Acquire));
            tokio::time::sleep_until((self.base + last + idle).into()).await;
            let unchanged = self.last.load(Ordering::Acquire) == last.as_nanos() as u64;
            if unchanged && self.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            if self.in_flight.load(Ordering::Acquire) > 0 {
                // A request is being answered: look again one idle period after now.
                tokio::time::sleep(idle).await;
            }
        }
    }
}
