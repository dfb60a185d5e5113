//! envoyproxy/ratelimit's own tests (commit f2fb157), ported as black-box calls against
//! turnstile: the real server on port 0, real gRPC and HTTP clients, a real Redis, time as the
//! manual clock. Each case cites the Go test function and line it comes from.
//!
//! Tally (counted by hand from the runs on branch `reference`, before the src fixes merge):
//! - test binaries' tests: 54 (integration 18, service 24, config 12); Go test functions or
//!   subtests they port: integration 17 (+1 turnstile-default variant), service 25 (+4 cases of
//!   src/service TestRatelimitToMetadata), config 36 (13 load errors, 7 DetailedMetric, 9
//!   ValueToMetric, 8 ShareThreshold, 7 WildcardStatsBehavior counted as cases within tests).
//! - passing: 38 tests (integration 14, service 19, config 5).
//! - asserting a documented difference (and passing): 6 (turnstile-default counting,
//!   ExtraTags, empty domain/descriptors, cache error, initial load error, no statsd names).
//! - failing, waiting for the src fixes: 11 (service 5, config 6).
//! - failing on a difference not in README: 5 (integration local cache with
//!   STOP_..=false x4; config shadow_mode over_limit).
//! - internal, not ported: TestServiceTracer, TestRedisTracer (span names), the freecache gauges
//!   (`localcache.*`), `FullKey == Stats.Key` (a struct field), hand-bumped unlimited stats.
//! - not ported (time): test/redis/fixed_cache_impl_test.go, test/limiter/base_limiter_test.go;
//!   (infrastructure) memcache (not offered), Redis TLS/cluster/sentinel, mTLS, xDS variants.

#![allow(unreachable_pub)]

mod common;

mod reference {
    pub mod config;
    pub mod integration;
    pub mod service;
    pub mod support;
}
