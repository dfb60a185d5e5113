//! Thin adapters from the wire to the service: gRPC (`grpc`, with its per-call `layer` and the
//! answer's one-pass encoder, `codec`; `rlqs`,
//! the quota streams), HTTP
//! (`http`: health, `/json`, `/rate`, `/throttle`, debug and metrics) and the Redis protocol of
//! ThrottleCrab's `THROTTLE` and redis-cell's `CL.THROTTLE` (`resp`).

pub mod codec;
pub mod grpc;
pub mod http;
pub mod layer;
pub mod resp;
pub mod rlqs;
