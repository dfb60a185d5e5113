//! A request whose ops live on several shards: each shard decides its part, a part refused
//! refuses the request, and whatever the other parts consumed is refunded.

use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::key::shard_of;
use super::op::refuses;
use super::op::{Op, Outcome, Role};
use super::protocol::{Decide, Delivery, Hits, Msg, Reply, ReplyTo};
use super::{Decision, Engine, EngineError};

/// Where each op of the request went: (part, index in the part).
type Placed = SmallVec<[(usize, usize); 4]>;

impl Engine {
    /// Ops spread over several shards: each decides its part; a part that is refused refuses
    /// the request, and the parts that consumed are refunded.
    pub(super) async fn decide_spread(
        &self,
        ops: Vec<Op>,
        global_shadow: bool,
    ) -> Result<Decision, EngineError> {
        let (parts, placed) = self.split_by_shard(ops);
        let mut request = SpreadRequest {
            engine: self,
            parts,
            done: false,
        };
        let refused = request.decide(global_shadow).await?;
        // The overall verdict also counts joint ops (`quota_mode`), which no one shard can judge.
        let judged = request.parts.iter().flat_map(|p| {
            let r = p.reply.as_ref().expect("collected");
            p.ops
                .iter()
                .zip(r.outcomes.iter())
                .map(|(o, out)| (o.role, out.over))
        });
        let refused = refused || refuses(judged, global_shadow);
        if refused {
            request.refund_committed();
        }
        request.done = true;
        // After the refund: the answers say what is left without what was refunded.
        let mut decision = Decision {
            refused,
            ..Decision::default()
        };
        for (p, i) in placed {
            let reply = request.parts[p].reply.as_ref().expect("collected");
            decision.outcomes.push(reply.outcomes[i]);
            decision.waited_ns = decision.waited_ns.max(reply.waited_ns);
            decision.timed_out |= reply.timed_out();
        }
        Ok(decision)
    }

    /// The request's ops grouped by the shard owning their keys.
    fn split_by_shard(&self, ops: Vec<Op>) -> (SmallVec<[ShardPart; 4]>, Placed) {
        let n = self.shard_count();
        let mut parts: SmallVec<[ShardPart; 4]> = SmallVec::new();
        let mut placed = Placed::new();
        for op in ops {
            let s = shard_of(op.key.hash(), n);
            let p = match parts.iter().position(|p| p.shard == s) {
                Some(p) => p,
                None => {
                    parts.push(ShardPart {
                        shard: s,
                        ops: Vec::with_capacity(2),
                        rx: None,
                        reply: None,
                    });
                    parts.len() - 1
                }
            };
            placed.push((p, parts[p].ops.len()));
            parts[p].ops.push(op);
        }
        (parts, placed)
    }
}

struct ShardPart {
    shard: usize,
    ops: Vec<Op>,
    rx: Option<oneshot::Receiver<Reply>>,
    reply: Option<Reply>,
}

impl ShardPart {
    /// Whether the last answer refused a queued op of this part (so the part should wait).
    fn queued_over(&self) -> bool {
        self.reply.as_ref().is_some_and(|r| {
            self.ops
                .iter()
                .zip(r.outcomes.iter())
                .any(|(o, out)| o.queue.is_some() && (out.over || out.blocked))
        })
    }
}

/// The parts of a multi-shard request in flight. If it is dropped before it is done (the
/// caller went away, or a send failed), whatever any part consumed is refunded.
struct SpreadRequest<'e> {
    engine: &'e Engine,
    parts: SmallVec<[ShardPart; 4]>,
    done: bool,
}

impl SpreadRequest<'_> {
    /// Decides every part. Phase one: nothing waits, so descriptors that cannot wait decide
    /// first. Only when the request is refused for queued limits alone does phase two let those
    /// parts wait. Returns whether the request is refused.
    async fn decide(&mut self, global_shadow: bool) -> Result<bool, EngineError> {
        let all: SmallVec<[usize; 4]> = (0..self.parts.len()).collect();
        let mut refused = self.round(&all, global_shadow, false).await?;
        if refused && !global_shadow && self.only_queued_refused() {
            // Phase two: the parts over a queued limit wait (each shard admits its part in FIFO
            // order and consumes only then); phase three decides the rest once they are in, so
            // nothing is taken elsewhere while a part waits.
            self.refund_committed();
            let (waiting, rest): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) = all
                .iter()
                .copied()
                .partition(|&i| self.parts[i].queued_over());
            for &i in &waiting {
                self.parts[i].reply = None;
            }
            refused = self.round(&waiting, global_shadow, true).await?;
            if !refused {
                refused = self.round(&rest, global_shadow, false).await?;
            }
        }
        Ok(refused)
    }

    /// Sends every part in `which` and collects the answers. Returns whether a part refused.
    async fn round(
        &mut self,
        which: &[usize],
        global_shadow: bool,
        may_wait: bool,
    ) -> Result<bool, EngineError> {
        for &i in which {
            let part = &mut self.parts[i];
            part.reply = None;
            let d = Decide {
                ops: part.ops.clone(),
                whole: false,
                global_shadow,
                may_wait,
                reply: ReplyTo::InPlace,
            };
            // Usage counted in full counts once: a later round sends it as a check.
            for o in part.ops.iter_mut().filter(|o| o.counts_in_full()) {
                o.hits = 0;
            }
            match self.engine.submit(part.shard, d)? {
                Delivery::Now(reply) if reply.failed() => return Err(EngineError::Unavailable),
                Delivery::Now(reply) => part.reply = Some(reply),
                Delivery::Later(rx) => part.rx = Some(rx),
            }
        }
        self.collect(which).await
    }

    /// Whether every op that refused the request is a queued one (so waiting could help).
    fn only_queued_refused(&self) -> bool {
        let mut any_queued = false;
        for p in &self.parts {
            let Some(r) = &p.reply else { return false };
            for (op, out) in p.ops.iter().zip(r.outcomes.iter()) {
                if op.role == Role::Binding && (out.over || out.blocked) {
                    if op.queue.is_none() {
                        return false;
                    }
                    any_queued = true;
                }
            }
        }
        any_queued
    }

    /// Waits for every part of `which`; stops waiting as soon as one part refuses (the others
    /// are then cancelled: a queued part leaves its queue). Returns whether a part refused.
    async fn collect(&mut self, which: &[usize]) -> Result<bool, EngineError> {
        // Parts decided synchronously have answered already.
        let mut refused = which
            .iter()
            .any(|&i| self.parts[i].reply.as_ref().is_some_and(|r| !r.committed()));
        while !refused {
            let (i, reply) = {
                let futs: Vec<_> = self
                    .parts
                    .iter_mut()
                    .enumerate()
                    .filter(|(_, p)| p.rx.is_some())
                    .map(|(i, p)| {
                        let rx = p.rx.as_mut().expect("sent");
                        Box::pin(async move { (i, rx.await) })
                    })
                    .collect();
                if futs.is_empty() {
                    return Ok(false);
                }
                futures_util::future::select_all(futs).await.0
            };
            let reply = reply.map_err(|_| EngineError::Stopped)?;
            if reply.failed() {
                return Err(EngineError::Unavailable);
            }
            refused = !reply.committed();
            self.parts[i].rx = None;
            self.parts[i].reply = Some(reply);
        }
        // Parts with no queued op answer without waiting: take their answers.
        for p in self.parts.iter_mut() {
            if p.rx.is_some() && p.ops.iter().all(|o| o.queue.is_none()) {
                let rx = p.rx.take().expect("sent");
                p.reply = Some(rx.await.map_err(|_| EngineError::Stopped)?);
            }
        }
        self.cancel_rest();
        Ok(true)
    }

    /// After a refusal: parts that may be waiting in a queue are cancelled (they leave it and
    /// consume nothing); an answer already sent is taken, so it can be refunded. A cancelled part
    /// reports its queued ops as over (it was waiting because they were) and the rest as within.
    fn cancel_rest(&mut self) {
        for p in self.parts.iter_mut() {
            if let Some(mut rx) = p.rx.take() {
                rx.close();
                let answered = rx.try_recv().ok();
                if answered.is_none() {
                    for o in p.ops.iter().filter(|o| o.queue.is_some()) {
                        let _ = self
                            .engine
                            .send(p.shard, Msg::Cancelled { key: o.key.clone() });
                    }
                }
                p.reply = Some(answered.unwrap_or_else(|| {
                    Reply::refused(
                        p.ops
                            .iter()
                            .map(|o| Outcome {
                                over: o.queue.is_some(),
                                remaining: 0,
                                reset_ns: 0,
                                retry_ns: 0,
                                blocked: false,
                                released: false,
                                past: 0,
                            })
                            .collect(),
                        0,
                    )
                }));
            }
        }
    }

    /// Refunds what the parts consumed (usage counted in full stays counted); their
    /// answers then say what is left without it.
    fn refund_committed(&mut self) {
        for p in self.parts.iter_mut() {
            if p.reply.as_ref().is_some_and(|r| r.committed()) {
                let ops: Vec<Op> = p
                    .ops
                    .iter()
                    .zip(p.reply.as_ref().expect("checked").outcomes.iter())
                    .filter(|(o, out)| {
                        !o.refund && !o.counts_in_full() && !out.over && !out.blocked
                    })
                    .map(|(o, _)| o.clone())
                    .collect();
                if !ops.is_empty() {
                    let in_store = p.reply.as_ref().is_some_and(|r| r.hits == Hits::InStore);
                    // Best effort when the shard's queue is full: the window ends anyway.
                    let _ = self.engine.send(p.shard, Msg::Refund { ops, in_store });
                }
                if let Some(r) = p.reply.as_mut() {
                    r.hits = Hits::NotCounted;
                    super::shard::refund_in_outcomes(&p.ops, &mut r.outcomes);
                }
            }
        }
    }
}

impl Drop for SpreadRequest<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.cancel_rest();
            self.refund_committed();
        }
    }
}
