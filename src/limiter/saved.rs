//! A save of the durable counters as the shards see it: what a shard is asked (`Save`, the
//! payload of `Msg::Save`) and the page it answers (`Saved`): the keys whose state changed
//! since it was last asked (or every key), and the keys it dropped before they expired
//! (evicted by a key flood), which must not come back at the next start. The shard's side is
//! `shard/saving.rs`; the bytes they become are `durable`'s.

use tokio::sync::oneshot;

use super::algorithm::State;

/// What `Msg::Save` asks a shard: a page of the states changed since they were last saved
/// (all of them with `all`), from table position `from` (0 to begin, then the last page's
/// [`Saved::next`]).
#[derive(Debug)]
pub(crate) struct Save {
    pub(crate) all: bool,
    pub(crate) from: usize,
    pub(crate) reply: oneshot::Sender<Saved>,
}

/// Keys with their states, back to back in one buffer (one allocation per save, not per key).
#[derive(Debug, Default)]
pub struct Saved {
    keys: String,
    records: Vec<SavedRecord>,
    /// Whether this is every key the shard holds (a full save) rather than what changed.
    pub full: bool,
    /// Where the shard's next page starts, when there is more to save.
    pub next: Option<usize>,
}

/// One key of a [`Saved`], but for its text.
#[derive(Debug)]
struct SavedRecord {
    /// Where the key ends in `keys`.
    end: usize,
    /// `None` for a key dropped.
    state: Option<State>,
    /// In whole seconds since the Unix epoch.
    expires_s: u32,
}

impl Saved {
    pub fn push(&mut self, key: &str, state: Option<State>, expires_s: u32) {
        self.keys.push_str(key);
        let end = self.keys.len();
        self.records.push(SavedRecord {
            end,
            state,
            expires_s,
        });
    }

    /// Every record in the order pushed: the key, its state (`None`: dropped), its expiry.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Option<State>, u32)> {
        let mut start = 0usize;
        self.records.iter().map(move |r| {
            let key = &self.keys[start..r.end];
            start = r.end;
            (key, r.state, r.expires_s)
        })
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}
