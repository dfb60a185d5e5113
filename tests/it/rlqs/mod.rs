//! RLQS (`envoy.service.rate_limit_quota.v3`): the stream in-process, and real Envoys sharing
//! limits through it.

mod envoy;
mod stream;
