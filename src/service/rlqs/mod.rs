//! Rate Limit Quota Service (RLQS): Envoys enforce quota assignments locally and report usage;
//! turnstile splits each limit among the Envoys that use it, max-min fairly by demand.
//!
//! `bucket` maps a reported bucket onto a limit of the config tree, `share` splits a limit,
//! `assign` turns a share into what Envoy 1.40 enforces, `book` keeps every stream's buckets and
//! decides what to send when (pure, time as a parameter), `hub` is the process-wide handle
//! the gRPC streams of every worker share, and `exchange` the contract of the place where
//! replicas meet to split limits over the fleet.

pub mod assign;
pub mod book;
pub mod bucket;
pub mod exchange;
pub mod hub;
pub mod share;
mod stats;

pub use book::{Book, BucketUsage, LimitView, Outbox, StreamId};
pub use bucket::refusals;
pub use exchange::{DemandExchange, ReplicaDemands};
pub use hub::RlqsHub;
pub use stats::{BucketShare, QuotaLimit, RlqsStats, MAX_SHARE_SERIES};
