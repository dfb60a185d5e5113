//! Where counters live: every scenario on every storage, Redis specifics, local-first, usage
//! while Redis is away, what the store is (and a store that runs no scripts).

mod local_first;
mod redis;
mod redis_start;
mod replay;
mod scenarios;
mod store_named;
mod store_sync;
mod windows;
