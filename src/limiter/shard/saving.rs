//! The shard's side of the durable counters, all of it: the page a save asks for
//! (`Msg::Save`), and a key's state read back at start. The rest of the shard calls here.
//!
//! Every entry of the table carries a changed bit (`table.rs`), set by whatever changes the
//! entry and cleared when a page lists it, so a save lists only what changed; the counters
//! keep the keys they evict before they expire once a save has asked, so those do not come
//! back at the next start. A page holds at most [`SAVE_PAGE`] keys, copied between two
//! decisions; the journal asks for the next one.

use super::counters::Counters;
use super::queues::Queues;
use crate::limiter::algorithm::State;
use crate::limiter::key::Key;
use crate::limiter::saved::{Save, Saved};

const NS_PER_SEC: u64 = 1_000_000_000;

/// Keys a page of a save holds at most: the shard copies this many between two decisions, and
/// the durable counters hold about this many per shard in memory while they write them.
pub(super) const SAVE_PAGE: usize = 32_768;

/// Answers `Msg::Save` with its page.
pub(super) fn answer(counters: &mut Counters, save: Save, now: u64) {
    let _ = save.reply.send(page(counters, save.all, save.from, now));
}

/// One page of a save, from table position `from` (0: a new save): the keys whose state
/// changed since they were last saved (every key when `all`), at most [`SAVE_PAGE`] of them;
/// the first page also lists the keys evicted since the last save (or, when there were more
/// than the shard may list, is a page of every key instead). Expired keys are left out. The
/// page says where the next one starts (`Saved::next`).
fn page(counters: &mut Counters, all: bool, from: usize, now: u64) -> Saved {
    let now_s = now / NS_PER_SEC;
    let mut saved = Saved::default();
    let mut all = all;
    if from == 0 {
        let (evicted, too_many) = counters.take_evicted();
        all |= too_many;
        if let Some(evicted) = evicted {
            if !all {
                saved = evicted;
            }
        }
    }
    saved.full = all;
    let table = counters.table_mut();
    saved.next = table.save(all, from, SAVE_PAGE, |key, e| {
        if u64::from(e.expires_s) > now_s {
            saved.push(key, Some(e.state), e.expires_s);
        }
    });
    saved
}

/// A key's state read back from the durable counters at start, unless it has expired
/// (`None`: the key was evicted; forget it).
pub(super) fn restore(
    counters: &mut Counters,
    key: &Key,
    state: Option<State>,
    expires_s: u32,
    now: u64,
    q: &Queues,
) {
    match state {
        Some(_) if u64::from(expires_s) <= now / NS_PER_SEC => {}
        Some(state) => counters.place(key, state, expires_s, now, q),
        None => counters.forget(key),
    }
}
