//! Where counters live when not only in this process: Redis, shared by replicas.

pub mod redis;
