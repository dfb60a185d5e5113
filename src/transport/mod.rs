//! Thin adapters from the wire to a door's service, a door's in a file of its name: gRPC
//! (`grpc`, the RLS port's `ShouldRateLimit` with the per-call layer every gRPC door goes
//! through, and `codec`, reading its request where it lies and writing its answer in one pass;
//! `limitador`, Kuadrant's service and Limitador's answers; `rlqs`, the quota streams), HTTP
//! (`http`: every door's endpoints, health, debug and metrics), the Redis protocol of
//! ThrottleCrab's `THROTTLE` and redis-cell's `CL.THROTTLE` (`throttle`); what every port
//! answers while the start waits for Redis or the durable counters (`waiting`).

pub mod codec;
pub mod grpc;
pub mod http;
pub mod limitador;
pub mod rlqs;
pub mod throttle;
pub mod waiting;

use std::future::Future;
use std::pin::Pin;

/// What a hand-written tonic service's call returns (`grpc.rs`, `limitador.rs`).
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
