//! Redis as the shared store of many replicas: the limiter's store contract over Redis.

mod admin;
mod connect;
mod connect_error;
mod decode;
mod errors;
pub mod fleet;
mod lane;
mod packed;
mod plain;
mod probe;
mod scan;
mod scripts;
mod settings;
mod startup;

use std::sync::Arc;
use std::time::Duration;

use connect::{exec, Deployment};
use decode::Asked;
pub use errors::RedisErrors;
use lane::Lane;
use packed::Packed;
use probe::Refusals;
pub use settings::{RedisSettings, RedisTarget, RedisType, StartupRetry, TlsClient};
pub use startup::StartupRetries;

use crate::limiter::{DeleteFuture, Op, Params, Store, StoreError, StoreFuture, StoreOp};

/// Shared by the shards: connections and key layout.
///
/// Its methods are split across this module's files on purpose, each beside what it needs:
/// the store contract here, connecting in `connect.rs` and `startup.rs`, what the store is and
/// whether it runs scripts (and so which limits it can count) in `probe.rs`, the commands an op
/// becomes in `scripts/` (`holds.rs` and `first_hit.rs` for their scripts), look-ups and resets
/// in `admin.rs`, the key scan in `scan.rs`, RLQS's demand exchange in `fleet.rs`.
pub struct RedisStore {
    main: Deployment,
    per_second: Option<Deployment>,
    prefix: String,
    jitter_max_secs: u64,
    /// How long an RLQS demand exchange may take (not on the request path: a second at least).
    fleet_deadline: Duration,
    /// Round trips that failed or were too slow, per lane.
    errors: Arc<RedisErrors>,
    /// The deployments whose store refused turnstile's scripts at connect (`probe`): limits
    /// that need them are refused, and a fixed window's refund goes by `DECRBY` there.
    no_scripts: Refusals,
}

impl Store for RedisStore {
    /// One pipeline per deployment (per-second limits go to their own Redis when one is set).
    fn run(&self, lane: usize, batch: &[StoreOp<'_>], now: u64, deadline: Duration) -> StoreFuture {
        let mut lanes: [Option<Lane<'_>>; 2] = [None, None];
        let mut asked = Vec::with_capacity(batch.len());
        for (i, b) in batch.iter().enumerate() {
            let at = b.sync_at.unwrap_or(now);
            let in_full = b.sync_at.is_some() || (b.in_full && !b.refund);
            // A check or report of a limit with `reserve` goes by the holds' script.
            let held = match b.sync_at {
                None => self.hold_cmd(b.op, now, b.refund),
                Some(_) => None,
            };
            let holds =
                (b.op.reserve.counted()).filter(|_| matches!(held, Some(scripts::Cmd::Hold(_))));
            let c = match (held, b.sync_at) {
                (Some(c), _) => c,
                // More refunded than taken since the last sync: refunded in that window.
                (None, Some(at)) if b.refund => self.cmd(b.op, at, true),
                (None, Some(at)) => self.sync_only_cmd(b.op, at, now),
                (None, None) if in_full => self.sync_cmd(b.op, now, now),
                (None, None) => self.cmd(b.op, now, b.refund),
            };
            let to = usize::from(self.per_second.is_some() && c.per_second(&b.op.params));
            let to = lanes[to].get_or_insert_with(|| Lane::with_capacity(batch.len()));
            to.push(i, &b.op.key, c, b.sync_at.is_none() && !b.refund);
            asked.push(Asked {
                params: b.op.params,
                hits: b.op.hits,
                refund: b.refund,
                in_full,
                at,
                sent: now,
                holds,
                reserve: b.op.reserve,
            });
        }
        let [main, second] = lanes;
        let pick = |dep: Option<&Deployment>, l: Option<Lane<'_>>| {
            let l = l.filter(|l| !l.is_empty())?;
            let dep = dep?;
            let (cmds, then, answers) = l.pack();
            Some((dep.conn(lane), answers, then, cmds))
        };
        let lists = [
            pick(Some(&self.main), main),
            pick(self.per_second.as_ref(), second),
        ];
        let jitter = self.jitter_max_secs;
        Box::pin(async move {
            let fut = async {
                let mut out = vec![decode::Ints::new(); asked.len()];
                for (conn, answers, then, cmds) in lists.into_iter().flatten() {
                    let replies = exec(&conn, &cmds).await?;
                    // Keys this round trip created get their TTL before it answers (a key a
                    // refund's DECRBY made is deleted).
                    let mut follow = Packed::default();
                    for (i, (t, r)) in then.iter().zip(&replies).enumerate() {
                        t.follow_up(&cmds, i, r, jitter, &mut follow);
                    }
                    if !follow.is_empty() {
                        exec(&conn, &follow).await?;
                    }
                    answers.answer(replies, &mut out);
                }
                Ok(out)
            };
            let raw = within(deadline, fut).await?;
            Ok(asked.iter().zip(&raw).map(|(a, r)| a.decode(r)).collect())
        })
    }

    fn peek(&self, lane: usize, op: &Op, now: u64, deadline: Duration) -> StoreFuture {
        self.read_keys(lane, op, now, deadline)
    }

    fn delete(&self, lane: usize, op: &Op, now: u64, deadline: Duration) -> DeleteFuture {
        self.delete_keys(lane, op, now, deadline)
    }

    fn failed(&self, lane: usize) {
        self.errors.count(lane);
    }

    fn name(&self) -> &'static str {
        "Redis"
    }

    fn scan_first_hit(
        &self,
        prefix: &str,
        now: u64,
        cap: usize,
        deadline: Duration,
    ) -> crate::limiter::ScanFuture {
        self.scan_keys(prefix, now, cap, deadline)
    }
}

impl RedisStore {
    /// The deployment counting `p`'s keys: the per-second Redis for one-second windows, when
    /// one is set.
    fn deployment(&self, p: &Params) -> &Deployment {
        match &self.per_second {
            Some(d) if p.window_ms == 1000 => d,
            _ => &self.main,
        }
    }
}

/// `fut`'s answer, or an error once `deadline` has passed.
async fn within<T>(
    deadline: Duration,
    fut: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(deadline, fut).await {
        Ok(r) => r.map_err(StoreError),
        Err(_) => Err(StoreError(format!(
            "Redis did not answer within {deadline:?}"
        ))),
    }
}

#[cfg(test)]
impl RedisStore {
    /// A store with no connections, to test how ops become commands.
    pub(super) fn for_tests(prefix: &str) -> RedisStore {
        RedisStore {
            main: Deployment {
                conns: Vec::new(),
                home: None,
            },
            per_second: None,
            prefix: prefix.to_owned(),
            jitter_max_secs: 0,
            fleet_deadline: Duration::from_secs(1),
            errors: Arc::new(RedisErrors::new(1)),
            no_scripts: Refusals::default(),
        }
    }
}

/// A decision of `hits` on counter `key`, 10 a window of `window_ms`: how tests see ops become
/// commands.
#[cfg(test)]
pub(super) fn test_op(
    key: &str,
    algorithm: crate::config::Algorithm,
    window_ms: u64,
    hits: u64,
) -> Op {
    Op {
        hits,
        ..crate::limiter::test_op(key, algorithm, 10, window_ms)
    }
}
