//! End to end through a real Envoy's `envoy.filters.http.ratelimit`: answers, headers, queues.

mod access_log;
mod e2e;
mod queue;
mod retry_after;
