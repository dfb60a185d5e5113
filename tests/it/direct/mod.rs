//! The direct APIs, without Envoy: GoCC's HTTP `/rate`, ThrottleCrab's and redis-cell's over RESP
//! and HTTP.

mod gocc;
mod gocc_compat;
mod throttle;
