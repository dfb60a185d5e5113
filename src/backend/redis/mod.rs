//! Redis as the shared store of many replicas: the limiter's store contract over Redis.

mod admin;
mod connect;
mod decode;
pub mod fleet;
mod scripts;
mod settings;

use std::time::Duration;

use connect::{exec, Deployment};
use decode::Asked;
use scripts::Cmd;
pub use settings::{RedisSettings, RedisTarget, RedisType};

use crate::limiter::{DeleteFuture, Op, Params, Store, StoreError, StoreFuture, StoreOp};

/// Shared by the shards: connections and key layout.
pub struct RedisStore {
    main: Deployment,
    per_second: Option<Deployment>,
    prefix: String,
    jitter_max_secs: u64,
    /// How long an RLQS demand exchange may take (not on the request path: a second at least).
    fleet_deadline: Duration,
}

/// Commands with their place in the batch.
type Numbered = Vec<(usize, Cmd)>;

impl Store for RedisStore {
    /// One pipeline per deployment (per-second limits go to their own Redis when one is set).
    fn run(&self, lane: usize, batch: &[StoreOp<'_>], now: u64, deadline: Duration) -> StoreFuture {
        let (mut main, mut second): (Numbered, Numbered) = (Vec::new(), Vec::new());
        let mut asked = Vec::with_capacity(batch.len());
        for (i, b) in batch.iter().enumerate() {
            let at = b.sync_at.unwrap_or(now);
            let in_full = b.sync_at.is_some() || (b.in_full && !b.refund);
            let c = match b.sync_at {
                Some(at) => self.sync_cmd(b.op, at, now),
                None if in_full => self.sync_cmd(b.op, now, now),
                None => self.cmd(b.op, now, b.refund),
            };
            if self.per_second.is_some() && c.per_second(&b.op.params) {
                second.push((i, c));
            } else {
                main.push((i, c));
            }
            asked.push(Asked {
                params: b.op.params,
                hits: b.op.hits,
                refund: b.refund,
                in_full,
                at,
            });
        }
        let pick = |dep: Option<&Deployment>, list: Numbered| {
            let dep = dep.filter(|_| !list.is_empty())?;
            Some((dep.conn(lane), list))
        };
        let lists = [
            pick(Some(&self.main), main),
            pick(self.per_second.as_ref(), second),
        ];
        Box::pin(async move {
            let fut = async {
                let mut out = vec![decode::Ints::new(); asked.len()];
                for (conn, list) in lists.into_iter().flatten() {
                    let (at, cmds): (Vec<usize>, Vec<Cmd>) = list.into_iter().unzip();
                    let replies = exec(conn.clone(), &cmds).await?;
                    // Keys this round trip created get their TTL before it answers.
                    let expire: Vec<Cmd> = cmds
                        .iter()
                        .zip(&replies)
                        .filter_map(|(c, r)| c.expire_if_created(r))
                        .collect();
                    if !expire.is_empty() {
                        exec(conn, &expire).await?;
                    }
                    for (i, r) in at.into_iter().zip(replies) {
                        out[i] = r;
                    }
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
