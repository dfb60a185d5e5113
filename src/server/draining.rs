//! Serving an HTTP router until the drain ends: the side thread's ports, and the main port on
//! every worker.

use std::future::Future;
use std::net::TcpListener as StdListener;
use std::time::Duration;

use tokio::sync::watch;

use super::http_conn;
use crate::transport::http::HttpBounds;

/// Completes once the server stops and every gRPC server has drained, or the grace has passed:
/// the HTTP ports answer until then (health 500), so a load balancer sees the drain.
pub(super) fn drain_end(
    mut stop: watch::Receiver<bool>,
    grpc_draining: &watch::Sender<usize>,
    grace: Duration,
) -> impl Future<Output = ()> + Send + 'static {
    let mut draining = grpc_draining.subscribe();
    async move {
        let _ = stop.wait_for(|s| *s).await;
        let _ = tokio::time::timeout(grace, draining.wait_for(|n| *n == 0)).await;
    }
}

/// Serves `router` within `bounds` until `end` completes.
pub(super) async fn serve_http(
    what: &'static str,
    listener: StdListener,
    router: axum::Router,
    bounds: HttpBounds,
    end: impl Future<Output = ()> + Send + 'static,
) {
    let listener =
        tokio::net::TcpListener::from_std(listener).expect("listener registers with the runtime");
    http_conn::serve(what, listener, router, bounds, end).await;
}
