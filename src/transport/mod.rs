//! Thin adapters from the wire to the service: gRPC (`grpc`, with its per-call `layer`; `rlqs`,
//! the quota streams), HTTP
//! (`http`: health, `/json`, `/rate`, `/throttle`, debug and metrics) and ThrottleCrab's Redis
//! protocol (`resp`).

pub mod grpc;
pub mod http;
pub mod layer;
pub mod resp;
pub mod rlqs;
