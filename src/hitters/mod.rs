//! Heavy hitters per limit: which descriptor values take the most hits and the most refused
//! answers, in bounded memory whatever the number of distinct values.
//!
//! Each limit (a config node, by its stat key, as the per-limit stats bind them) has
//! [`STRIPES`] stripes, a value going to the stripe its hash picks, each behind its own lock so
//! that workers deciding different values rarely meet. A stripe keeps two windows of
//! [`WINDOW_SECS`] aligned to the epoch, the current one and the previous one; a reader sees
//! both summed, so the lists cover the last one to two minutes. A window holds two
//! space-saving tables (`sketch`) of `2 × top_n` slots: one ranked by hits, where every
//! decision is offered, and one ranked by refused hits, where only refusals take a slot.
//!
//! The hot path does not read the clock: [`TopTable::tick`] sets a coarse time in seconds (the
//! server ticks it every second, and every reader ticks it before reading), and a stripe turns
//! its windows over when it sees a new one.

mod sketch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use fnv::FnvHashMap;
use serde::Serialize;

use crate::config::{Config, Node};
use crate::descriptor::Entry;
pub use sketch::MAX_VALUE_BYTES;
use sketch::{Pieces, Slot, SpaceSaving};

/// Values listed per limit unless `TURNSTILE_TOP_N` says otherwise.
pub const DEFAULT_TOP_N: usize = 20;
/// Length of a window; the lists cover the current window and the previous one.
pub const WINDOW_SECS: u64 = 60;
/// Locks per limit.
pub const STRIPES: usize = 4;

/// Between a key and its value in a stored value: a control byte, not valid in the header
/// values descriptors are made of, so a stored value splits back into its entries.
const KEY_END: u8 = 0x1f;
/// Between two entries of a stored value.
const ENTRY_END: u8 = 0x1e;

/// A descriptor's entries as one value, hashed and compared without being joined.
struct EntriesValue<'a>(&'a [Entry<'a>]);

impl Pieces for EntriesValue<'_> {
    fn pieces(&self, f: &mut dyn FnMut(&[u8]) -> bool) {
        for (i, e) in self.0.iter().enumerate() {
            let go = (i == 0 || f(&[ENTRY_END]))
                && f(e.key.as_bytes())
                && f(&[KEY_END])
                && f(e.value.as_bytes());
            if !go {
                return;
            }
        }
    }
}

/// A stored value as `key=value` pairs joined by `, `, each value passed through `show` with
/// its entry's place in the descriptor; a value cut at [`MAX_VALUE_BYTES`] and shown otherwise
/// than as itself ends in `…`.
fn display(stored: &[u8], show: &dyn Fn(usize, &str) -> String) -> String {
    let text = String::from_utf8_lossy(stored);
    let entries: Vec<&str> = text.split(ENTRY_END as char).collect();
    let cut = stored.len() >= MAX_VALUE_BYTES;
    let mut out = String::with_capacity(text.len());
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let (key, value) = entry.split_once(KEY_END as char).unwrap_or((entry, ""));
        let shown = show(i, value);
        out.push_str(key);
        out.push('=');
        out.push_str(&shown);
        if cut && i + 1 == entries.len() && shown != value {
            out.push('…');
        }
    }
    out
}

/// The two tables of one window.
#[derive(Debug)]
struct Tables {
    hits: SpaceSaving,
    over: SpaceSaving,
}

impl Tables {
    fn new(cap: usize) -> Tables {
        Tables {
            hits: SpaceSaving::new(cap),
            over: SpaceSaving::new(cap),
        }
    }

    fn clear(&mut self) {
        self.hits.clear();
        self.over.clear();
    }
}

/// One stripe: the current window and the previous one.
#[derive(Debug)]
struct Stripe {
    /// The window `current` counts: [`WINDOW_SECS`] seconds from `from` (a multiple of it).
    from: u64,
    current: Tables,
    previous: Tables,
}

impl Stripe {
    /// Turns the windows over to the one holding `now_s` (a compare on the hot path; the
    /// division only once a window).
    fn turn(&mut self, now_s: u64) {
        if now_s >= self.from && now_s - self.from < WINDOW_SECS {
            return;
        }
        let from = now_s - now_s % WINDOW_SECS;
        if from == self.from + WINDOW_SECS {
            std::mem::swap(&mut self.current, &mut self.previous);
            self.current.clear();
        } else {
            self.current.clear();
            self.previous.clear();
        }
        self.from = from;
    }
}

/// The heavy hitters of one limit. Its stripes are made on the first value counted: a config
/// of many limits, most never hit, holds a pointer for each of those.
#[derive(Debug)]
pub struct LimitTop {
    cap: usize,
    stripes: OnceLock<Box<[Mutex<Stripe>; STRIPES]>>,
}

/// What a limit no value was counted on yet shows: empty lists.
static NO_VALUES: LimitTop = LimitTop::new(0);

impl LimitTop {
    const fn new(cap: usize) -> LimitTop {
        LimitTop {
            cap,
            stripes: OnceLock::new(),
        }
    }

    /// The stripes, made now if no value was counted yet.
    fn stripes_made(&self) -> &[Mutex<Stripe>; STRIPES] {
        self.stripes.get_or_init(|| {
            Box::new(std::array::from_fn(|_| {
                Mutex::new(Stripe {
                    from: 0,
                    current: Tables::new(self.cap),
                    previous: Tables::new(self.cap),
                })
            }))
        })
    }

    /// The stripes, none before the first value counted.
    fn stripes(&self) -> &[Mutex<Stripe>] {
        self.stripes.get().map_or(&[], |s| &s[..])
    }

    fn record(&self, now_s: u64, key: &(impl Pieces + ?Sized), hits: u64, over: bool) {
        let h = sketch::hash(key);
        let stripe = &self.stripes_made()[(h >> 32) as usize % STRIPES];
        let mut s = stripe.lock().unwrap_or_else(|p| p.into_inner());
        s.turn(now_s);
        let t = &mut s.current;
        let over_hits = if over { hits } else { 0 };
        t.hits.offer(h, key, hits, over_hits, now_s);
        if over {
            t.over.offer(h, key, hits, hits, now_s);
        } else {
            t.over.bump(h, key, 0, hits, now_s);
        }
    }

    /// The top `n` values by refused hits (those with any) and by hits, over both windows.
    pub fn lists(&self, now_s: u64, n: usize) -> TopLists {
        let mut merged: FnvHashMap<Vec<u8>, TopValue> = FnvHashMap::default();
        for stripe in self.stripes() {
            let mut s = stripe.lock().unwrap_or_else(|p| p.into_inner());
            s.turn(now_s);
            for t in [&s.current, &s.previous] {
                for slot in t.hits.slots() {
                    merge(&mut merged, slot, Ranked::Hits);
                }
                for slot in t.over.slots() {
                    merge(&mut merged, slot, Ranked::Over);
                }
            }
        }
        let all: Vec<TopValue> = merged.into_values().collect();
        let mut by_over: Vec<TopValue> = all.iter().filter(|v| v.refused > 0).cloned().collect();
        by_over.sort_by(|a, b| (b.refused, b.hits, &a.value).cmp(&(a.refused, a.hits, &b.value)));
        by_over.truncate(n);
        let mut by_hits = all;
        by_hits.sort_by(|a, b| (b.hits, b.refused, &a.value).cmp(&(a.hits, a.refused, &b.value)));
        by_hits.truncate(n);
        TopLists {
            by_refused: by_over,
            by_hits,
        }
    }

    /// Bytes held, over every stripe, window and table.
    pub fn allocated_bytes(&self) -> usize {
        (self.stripes().iter())
            .map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                [&s.current, &s.previous]
                    .iter()
                    .map(|t| t.hits.allocated_bytes() + t.over.allocated_bytes())
                    .sum::<usize>()
            })
            .sum()
    }
}

#[derive(Clone, Copy)]
enum Ranked {
    Hits,
    Over,
}

/// Adds one slot's counts to the value's entry. The same value may sit in both windows (their
/// counts add up) and in both tables of a window (each table's own count is the better one for
/// its dimension; the other was counted only since the value took that slot).
fn merge(merged: &mut FnvHashMap<Vec<u8>, TopValue>, slot: &Slot, ranked: Ranked) {
    let v = merged
        .entry(slot.value.clone())
        .or_insert_with(|| TopValue {
            value: display(&slot.value, &|_, v| v.to_owned()),
            stored: slot.value.clone(),
            digest: None,
            hits: 0,
            refused: 0,
            hits_error: 0,
            refused_error: 0,
            first_seen: slot.first_s,
            last_seen: slot.last_s,
            parts: [[0; 2]; 2],
        });
    let part = match ranked {
        Ranked::Hits => &mut v.parts[0],
        Ranked::Over => &mut v.parts[1],
    };
    part[0] += slot.weight;
    part[1] += slot.other;
    match ranked {
        Ranked::Hits => v.hits_error += slot.error,
        Ranked::Over => v.refused_error += slot.error,
    }
    let [hits_table, over_table] = v.parts;
    v.hits = hits_table[0].max(over_table[1]);
    v.refused = over_table[0].max(hits_table[1]);
    v.first_seen = v.first_seen.min(slot.first_s);
    v.last_seen = v.last_seen.max(slot.last_s);
}

/// One value of a limit's lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopValue {
    /// The descriptor's entries, `key=value` joined by `, ` (cut at [`MAX_VALUE_BYTES`]).
    pub value: String,
    pub hits: u64,
    /// Hits of the calls this limit refused, whole: a report of 600 with 400 left counts 600
    /// here, where the Prometheus `over_limit` series counts the 200 past the limit.
    pub refused: u64,
    /// How much `hits` (`refused`) may be above the true count: space-saving's bound, 0
    /// while the value had its slot from the start of the window.
    pub hits_error: u64,
    pub refused_error: u64,
    /// Seconds since the Unix epoch (to the second) of the first and last hit seen in the
    /// windows listed.
    pub first_seen: u64,
    pub last_seen: u64,
    /// The value with each descriptor value as a keyed digest, where an answer shows both.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// [hits table: weight, other], [over table: weight, other], summed over windows.
    #[serde(skip)]
    parts: [[u64; 2]; 2],
    /// The value as the tables hold it.
    #[serde(skip)]
    stored: Vec<u8>,
}

impl TopValue {
    /// `value` with each descriptor value passed through `show` (a keyed digest, say) with its
    /// entry's place in the descriptor (its depth in the config's tree); the descriptor keys,
    /// which the config names, stay.
    pub fn show_values(&mut self, show: &dyn Fn(usize, &str) -> String) {
        self.value = display(&self.stored, show);
    }
}

/// A limit's two lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TopLists {
    pub by_refused: Vec<TopValue>,
    pub by_hits: Vec<TopValue>,
}

/// Every stat key's heavy hitters, bound to the configs as the per-limit stats are: a limit that keeps its stat key across a reload keeps its lists.
#[derive(Debug)]
pub struct TopTable {
    n: usize,
    /// Admitted hits are counted one call in `sample` (at random), weighing `sample` each;
    /// refused hits always.
    sample: u64,
    now_s: Arc<AtomicU64>,
    by_key: Arc<Mutex<ByKey>>,
}

/// The lists of the limits a value was counted on, by stat key.
type ByKey = FnvHashMap<Arc<str>, Arc<LimitTop>>;

impl Default for TopTable {
    fn default() -> TopTable {
        TopTable::new(DEFAULT_TOP_N)
    }
}

impl TopTable {
    /// Lists of `n` values per limit; 0 turns tracking off.
    pub fn new(n: usize) -> TopTable {
        TopTable {
            n,
            sample: DEFAULT_SAMPLE,
            now_s: Arc::new(AtomicU64::new(0)),
            by_key: Arc::new(Mutex::new(FnvHashMap::default())),
        }
    }

    pub fn top_n(&self) -> usize {
        self.n
    }

    /// Counts admitted hits one call in `sample` (1: every call).
    pub fn with_sample(mut self, sample: u64) -> TopTable {
        self.sample = sample.max(1);
        self
    }

    pub fn sample(&self) -> u64 {
        self.sample
    }

    /// Sets the coarse time the hot path stamps values with, from nanoseconds since the epoch.
    pub fn tick(&self, now_ns: u64) {
        self.now_s.store(now_ns / 1_000_000_000, Ordering::Relaxed);
    }

    /// The coarse time, in seconds since the epoch.
    pub fn now_s(&self) -> u64 {
        self.now_s.load(Ordering::Relaxed)
    }

    /// The lists of every node of `config` that has limits: a stat key seen before keeps its
    /// lists. A limit's lists are made when its first value is counted: most limits of a large
    /// config are never hit. The lists of stat keys no config has any more stay until
    /// [`TopTable::drop_unbound`].
    pub fn bind(&self, config: &Config) -> BoundTop {
        if self.n == 0 {
            return BoundTop::default();
        }
        let by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let by_node: Box<[OnceLock<Arc<LimitTop>>]> =
            (0..config.node_count()).map(|_| OnceLock::new()).collect();
        config.for_each_node(&mut |node| {
            if node.limits.is_empty() {
                return;
            }
            if let Some(top) = by_key.get(&*node.stat_key) {
                let _ = by_node[node.index].set(Arc::clone(top));
            }
        });
        BoundTop {
            by_node,
            by_key: Arc::clone(&self.by_key),
            cap: 2 * self.n,
            now_s: self.now_s.clone(),
            sample: self.sample,
        }
    }

    /// Drops the lists of the stat keys no bound config has any more: once a reload has freed
    /// the config it replaced, those of the limits it removed.
    pub fn drop_unbound(&self) {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        by_key.retain(|_, top| Arc::strong_count(top) > 1);
    }
}

/// Admitted hits are counted one call in this many by default (`TURNSTILE_TOP_SAMPLE`).
pub const DEFAULT_SAMPLE: u64 = 8;

/// True one call in `n`, at random: a per-thread xorshift, no shared state on the hot path.
fn sampled(n: u64) -> bool {
    thread_local! {
        static STATE: std::cell::Cell<u64> = std::cell::Cell::new({
            // A distinct odd seed per thread.
            let t = std::thread::current().id();
            let mut h = fnv::FnvHasher::default();
            std::hash::Hash::hash(&t, &mut h);
            std::hash::Hasher::finish(&h) | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x % n == 0
    })
}

/// The lists of one config's nodes, by [`Node::index`]: what the hot path counts into.
#[derive(Debug, Default)]
pub struct BoundTop {
    /// Empty until a value is counted on the node (or its stat key had lists already).
    by_node: Box<[OnceLock<Arc<LimitTop>>]>,
    /// The table's lists by stat key, where a limit's first value files the lists it makes.
    by_key: Arc<Mutex<ByKey>>,
    /// Slots of a table made here.
    cap: usize,
    now_s: Arc<AtomicU64>,
    sample: u64,
}

impl BoundTop {
    /// Counts what one descriptor counted on `node`: `entries` are the descriptor's, `over` says
    /// it was refused. Checks that consume nothing (`hits` 0) are not counted.
    /// Counts `hits` of `entries` on `node`'s lists: every call when `exact` (refusals, usage
    /// counted in full), otherwise one call in the sample.
    pub fn record(&self, node: &Node, entries: &[Entry<'_>], hits: u64, over: bool, exact: bool) {
        if hits == 0 {
            return;
        }
        if let Some(cell) = self
            .by_node
            .get(node.index)
            .filter(|_| !node.limits.is_empty())
        {
            // Admitted calls are many and cheap to estimate: one in `sample`, weighing
            // `sample`. Refusals, the question "who is limited" is about, all count.
            let hits = if exact || self.sample <= 1 {
                hits
            } else if sampled(self.sample) {
                hits.saturating_mul(self.sample)
            } else {
                return;
            };
            let now_s = self.now_s.load(Ordering::Relaxed);
            let top = cell.get_or_init(|| self.file(node));
            top.record(now_s, &EntriesValue(entries), hits, over);
        }
    }

    /// The lists of `node`'s stat key, made and filed in the table if it has none yet (a
    /// config bound before may have filed them since this one was bound).
    fn file(&self, node: &Node) -> Arc<LimitTop> {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let top = (by_key.entry(Arc::clone(&node.stat_key)))
            .or_insert_with(|| Arc::new(LimitTop::new(self.cap)));
        Arc::clone(top)
    }

    /// The lists of `node`, if it has limits and tracking is on.
    pub fn of(&self, node: &Node) -> Option<&LimitTop> {
        let cell = self.by_node.get(node.index)?;
        if node.limits.is_empty() {
            return None;
        }
        Some(cell.get().map_or(&NO_VALUES, |top| &**top))
    }
}

#[cfg(test)]
mod tests;
