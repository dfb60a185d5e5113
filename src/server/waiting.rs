//! The ports during a start that waits (for Redis, or for the durable counters to be read back):
//! bound already, they answer at once as `transport::waiting` says instead of holding
//! connections, until the start hands them over to the server proper.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic_health::ServingStatus;

use super::http_conn;
use super::listeners::{GrpcListener, Listeners};
use super::tls::{self, Accept, TlsState};
use super::HEALTH_NAMES;
use crate::settings::Settings;
use crate::telemetry::mapped::Exposition;
use crate::telemetry::Registry;
use crate::transport::http;
use crate::transport::waiting::{http_router, resp_error, NotYetLayer, StartWait};

/// The ports' answers during the wait; dropped or handed over, they stop accepting.
pub(super) struct Waiting {
    stop: watch::Sender<bool>,
}

impl Waiting {
    /// Answers on every bound port while `wait` says what the start waits for; `/metrics` on
    /// the HTTP and debug ports serves `stats` (the start's own), the Prometheus port what
    /// its mapping makes of them.
    pub(super) async fn serve(
        ls: &Listeners,
        wait: &StartWait,
        stats: Registry,
        settings: &Settings,
        tls: Option<Arc<TlsState>>,
    ) -> io::Result<Waiting> {
        let (stop, rx) = watch::channel(false);
        serve_grpc(&ls.grpc[0], wait, tls, &rx).await?;
        let serve = |l: &std::net::TcpListener, router: axum::Router| -> io::Result<()> {
            let listener = UntilStop {
                inner: tcp(l)?,
                stop: rx.clone(),
            };
            let end = stopped(rx.clone());
            let bounds = settings.http_bounds;
            tokio::spawn(http_conn::serve("waiting", listener, router, bounds, end));
            Ok(())
        };
        // turnstile's own series (the start's stats, for now) where they are served.
        let own = || http_router(wait.clone(), settings.metrics.then(|| stats.clone()));
        serve(&ls.http, own())?;
        if let Some(l) = &ls.debug {
            serve(l, own())?;
        }
        if let Some(l) = &ls.admin {
            serve(l, http_router(wait.clone(), None))?;
        }
        // The reference's series, mapped from the same stats as once serving.
        if let (Some(l), Some(p)) = (&ls.prometheus, &settings.prometheus) {
            let exposition = Exposition::new(p.mapper.clone(), stats.clone(), Instant::now());
            serve(l, http::prometheus_router(exposition, &p.path))?;
        }
        if let Some(l) = &ls.resp {
            serve_resp(tcp(l)?, wait.clone(), rx.clone());
        }
        Ok(Waiting { stop })
    }

    /// The start is done: no connection is accepted here from now on (each accept looks at
    /// the stop first), and those accepted meanwhile close once answered (gRPC's with a
    /// GOAWAY), so their clients come back to the server proper.
    pub(super) fn hand_over(self) {
        let _ = self.stop.send(true);
    }
}

/// gRPC health NOT_SERVING (both names), every door's calls UNAVAILABLE, and reflection (so
/// grpcurl's health check works as it does once serving), over TLS when the port speaks it.
async fn serve_grpc(
    l: &GrpcListener,
    wait: &StartWait,
    tls: Option<Arc<TlsState>>,
    rx: &watch::Receiver<bool>,
) -> io::Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in HEALTH_NAMES {
        (reporter.set_service_status(name, ServingStatus::NotServing)).await;
    }
    let (reflection_v1, reflection_v1alpha) = super::worker::reflection_services();
    let router = tonic::transport::Server::builder()
        .layer(NotYetLayer(wait.clone()))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    let end = stopped(rx.clone());
    let stop = rx.clone();
    match (l, tls) {
        (GrpcListener::Tcp(l), None) => {
            let l = UntilStop {
                inner: tcp(l)?,
                stop,
            };
            let incoming = futures_util::stream::unfold(l, |l| async move {
                let r = Accept::accept(&l).await;
                Some((r, l))
            });
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, end));
        }
        (GrpcListener::Tcp(l), Some(t)) => {
            let l = UntilStop {
                inner: tcp(l)?,
                stop,
            };
            tokio::spawn(router.serve_with_incoming_shutdown(tls::incoming(l, t), end));
        }
        (GrpcListener::Unix(l), None) => {
            let inner = tokio::net::UnixListener::from_std(l.try_clone()?)?;
            let l = UntilStop { inner, stop };
            let incoming = futures_util::stream::unfold(l, |l| async move {
                let r = Accept::accept(&l).await;
                Some((r, l))
            });
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, end));
        }
        (GrpcListener::Unix(l), Some(t)) => {
            let inner = tokio::net::UnixListener::from_std(l.try_clone()?)?;
            let l = UntilStop { inner, stop };
            tokio::spawn(router.serve_with_incoming_shutdown(tls::incoming(l, t), end));
        }
    }
    Ok(())
}

/// The RESP port: an error naming the wait, then the connection closes.
fn serve_resp(l: TcpListener, wait: StartWait, stop: watch::Receiver<bool>) {
    let l = UntilStop { inner: l, stop };
    tokio::spawn(async move {
        loop {
            let Ok(mut s) = Accept::accept(&l).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let msg = resp_error(&wait);
            tokio::spawn(async move {
                let _ = s.write_all(&msg).await;
                let _ = s.shutdown().await;
            });
        }
    });
}

/// A handle of its own on a bound socket, registered with this runtime.
fn tcp(l: &std::net::TcpListener) -> io::Result<TcpListener> {
    TcpListener::from_std(l.try_clone()?)
}

/// Completes once the start hands over (or the wait is dropped).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A listener that accepts until the stop and never after: the stop is looked at before each
/// accept, whenever the task is next polled.
struct UntilStop<L> {
    inner: L,
    stop: watch::Receiver<bool>,
}

impl<L: Accept + Sync> Accept for UntilStop<L> {
    type Io = L::Io;

    async fn accept(&self) -> io::Result<L::Io> {
        tokio::select! {
            biased;
            () = stopped(self.stop.clone()) => std::future::pending().await,
            r = self.inner.accept() => r,
        }
    }
}

impl axum::serve::Listener for UntilStop<TcpListener> {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            tokio::select! {
                biased;
                () = stopped(self.stop.clone()) => std::future::pending::<()>().await,
                r = self.inner.accept() => match r {
                    Ok(c) => return c,
                    // Out of file descriptors and the like: back off instead of spinning.
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                },
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}
