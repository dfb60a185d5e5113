//! envoyproxy/ratelimit's own tests (commit f2fb157), ported as black-box calls against
//! turnstile: the real server on port 0, real gRPC and HTTP clients, a real Redis, time as the
//! manual clock. Each case cites the Go test function and line it comes from.
//!
//! TALLY (placeholder)

#![allow(unreachable_pub)]

mod common;

mod reference {
    pub mod integration;
    pub mod service;
    pub mod support;
}
