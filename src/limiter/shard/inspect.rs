//! What `/debug` shows of a shard's keys, and the direct API refusals counted for it.

use super::Shard;
use crate::limiter::key::KeyRef;
use crate::limiter::op::Op;
use crate::limiter::protocol::KeyInfo;

impl Shard {
    /// Every key (or those starting with `prefix`) with its state, sorted by key.
    pub(super) fn inspect(&self, prefix: Option<&str>) -> Vec<KeyInfo> {
        let now = self.clock.now();
        let mut out: Vec<KeyInfo> = self
            .table
            .iter()
            .filter(|(k, _)| prefix.is_none_or(|p| k.starts_with(p)))
            .map(|(k, e)| {
                let key = KeyRef::of(k);
                KeyInfo {
                    key: k.to_string(),
                    state: e.state,
                    denied: self.denied.get(&key).copied().unwrap_or((0, 0)),
                    waiting: self.queues.get(&key).map_or(0, |q| q.len()),
                    now,
                }
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// Counts direct API refusals, for `/debug`.
    pub(super) fn count_denied(&mut self, ops: &[Op], now: u64) {
        for op in ops.iter().filter(|o| o.grant.is_some()) {
            let w = now / op.params.window_ns();
            let e = self.denied.entry_ref(&op.key).or_insert((w, 0));
            if e.0 != w {
                *e = (w, 0);
            }
            e.1 += 1;
        }
    }
}
