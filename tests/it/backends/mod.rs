//! Where counters live: every scenario on every backend, Redis specifics, local-first.

mod local_first;
mod redis;
mod redis_start;
mod scenarios;
mod windows;
