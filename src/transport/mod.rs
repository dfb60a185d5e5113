//! Thin adapters from the wire to the service: gRPC (`grpc`, `ShouldRateLimit` with its per-call
//! layer, and `codec`, reading its request where it lies and writing its answer in one pass;
//! `rlqs`, the quota streams), HTTP
//! (`http`: health, `/json`, `/rate`, `/throttle`, debug and metrics) and the Redis protocol of
//! ThrottleCrab's `THROTTLE` and redis-cell's `CL.THROTTLE` (`resp`); what they all answer
//! while the start waits for Redis or the durable counters (`waiting`).

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
