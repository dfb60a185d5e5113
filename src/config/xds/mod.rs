//! Config over xDS: envoyproxy/ratelimit's `RateLimitConfig` resources, as Envoy Gateway serves
//! them to its rate-limit service, turned into a [`Config`](super::Config) (the client that fetches them is
//! `source::xds`).
//!
//! One `RateLimitConfig` is one domain (one YAML file); every resource of a response together is
//! the whole config. Resources go through the same validation as YAML files
//! (the builder YAML files are read into), so a config is accepted or refused the same way whichever way it comes.
//! A valid response is applied and ACKed; an invalid one is NACKed with the validation error as
//! `error_detail`, and the last good config stays live. When the stream breaks the client
//! reconnects with exponential backoff and resubscribes with the last version it accepted;
//! meanwhile the server keeps answering from the last good config.

mod convert;

pub use convert::{config_from_protos, config_from_resources, decode_resource};

pub mod pb {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    include!(concat!(
        env!("OUT_DIR"),
        "/ratelimit.config.ratelimit.v3.rs"
    ));
}

/// The resource type this client subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// A resource wrapped with a TTL or cache control; it carries the real resource inside.
pub const WRAPPED_TYPE_URL: &str = "type.googleapis.com/envoy.service.discovery.v3.Resource";

#[cfg(test)]
mod tests;
