//! envoyproxy/ratelimit's test/limiter/base_limiter_test.go (commit f2fb157).
