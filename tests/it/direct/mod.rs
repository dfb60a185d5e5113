//! The direct APIs, without Envoy: GoCC's HTTP `/rate`, ThrottleCrab's and redis-cell's over RESP
//! and HTTP.

mod rate_api;
mod rate_api_gocc;
mod transport;
