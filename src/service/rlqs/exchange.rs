//! Where replicas meet to split a limit over the fleet: each publishes the demands of its own
//! buckets of a limit and reads every other replica's. Redis is one such place
//! (`store::redis`); the hub only needs this contract.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// One other replica's demands of a limit (`None`: not known yet).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaDemands {
    pub replica: u64,
    /// One a bucket of the replica's, in the order its book splits them.
    pub demands: Vec<Option<f64>>,
}

/// What an exchange answers: the other replicas' demands, or why it could not.
pub type ExchangeFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<ReplicaDemands>, String>> + Send + 'a>>;

/// The fleet's meeting place for RLQS demands.
pub trait DemandExchange: Send + Sync {
    /// Publishes `demands` (empty: withdraws) of the limit with counter key `key` for
    /// `replica`, holding them for `hold` from `now_ms` (ms since the epoch); answers the other
    /// replicas' demands of it whose hold has not run out.
    fn exchange<'a>(
        &'a self,
        key: &'a str,
        replica: u64,
        demands: &'a [Option<f64>],
        now_ms: u64,
        hold: Duration,
    ) -> ExchangeFuture<'a>;
}
