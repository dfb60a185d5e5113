//! Hostile clients and inputs: request limits, key floods, overload, SIGTERM under load, and
//! the fuzzers' findings replayed.

mod key_flood;
mod limits;
mod overload;
mod regressions;
mod shutdown;
