//! The stores: where counters live when they are shared by replicas (Redis), each behind the
//! store contract (`limiter::Store`).

pub mod redis;
