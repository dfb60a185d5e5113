//! One shard actor: owns the state and the wait queues of the keys that hash to it.
//!
//! The shard lives on one thread and is used by one caller at a time (its task, or a caller on
//! the same thread deciding synchronously, see [`Local`]), so the table needs no lock. A request
//! reaches the shard as one message holding all of its ops for this shard; the shard decides them
//! together, so a request whose ops all live here is decided atomically. A message that must wait
//! parks in the FIFO of the key it waits for and is answered later through its reply channel.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot};

use super::algorithm::{Eval, State};
use super::{Clock, Op, Outcome, Outcomes, Reply, Role};
use crate::descriptor::key_hash;

mod remote;
mod table;
pub(crate) use remote::Remote;
pub use remote::{BREAKER_CLOSED, BREAKER_HALF_OPEN, BREAKER_OPEN};
use table::{to_secs_ceil, Table};

/// What callers send a shard.
#[derive(Debug)]
pub(crate) enum Msg {
    Decide(Decide),
    /// Gives back what a request consumed here when another shard refused it; `true` when it
    /// was counted in Redis.
    Undo(Vec<Op>, bool),
    /// Lists keys for `/debug`: every key, or the ones starting with the prefix.
    Inspect {
        prefix: Option<String>,
        reply: oneshot::Sender<Vec<KeyInfo>>,
    },
    /// Shutdown: answer every waiter now (admitting them or not) and stop queueing newcomers.
    Drain {
        admit: bool,
    },
    /// A caller waiting on this key went away: drop it from the queue now.
    Cancelled {
        key: String,
        hash: u64,
    },
    /// Direct API: give back the hit admitted under `id`; answers whether it was found.
    Release {
        key: String,
        hash: u64,
        id: u64,
        reply: oneshot::Sender<bool>,
    },
}

#[derive(Debug)]
pub(crate) struct Decide {
    pub(crate) ops: Vec<Op>,
    /// All ops of the request are in this message, so the shard can decide the request alone.
    pub(crate) whole: bool,
    pub(crate) global_shadow: bool,
    /// Whether an over-limit queued op may wait; when false it is refused like any other.
    pub(crate) may_wait: bool,
    pub(crate) reply: ReplyTo,
}

/// Where a message's answer goes.
#[derive(Debug)]
pub(crate) enum ReplyTo {
    /// A caller on another thread, or one that is waiting.
    Caller(oneshot::Sender<Reply>),
    /// A caller on this thread, deciding synchronously: the answer is left in the shard for it.
    /// A message that must be held (in a queue, or for Redis) gets a channel first.
    Here,
}

impl ReplyTo {
    /// Whether the caller went away.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            ReplyTo::Caller(tx) => tx.is_closed(),
            ReplyTo::Here => false,
        }
    }
}

/// A synchronous caller's answer: now, or on a channel when its message was held.
#[derive(Debug)]
pub(crate) enum Answer {
    Now(Reply),
    Later(oneshot::Receiver<Reply>),
}

/// A key's state as `/debug` shows it; the caller knows the limit, so it interprets the state.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    pub key: String,
    pub state: State,
    /// Direct API refusals: (window index, count in that window).
    pub denied: (u64, u64),
    pub waiting: usize,
    /// The shard's time when it answered.
    pub now: u64,
}

/// A hit admitted through the direct API, so `DELETE /rate/{key}/{id}` can give it back.
struct Grant {
    key: Box<str>,
    window: u64,
    params: super::Params,
}

/// Grants remembered per shard; past this, admitted hits cannot be released (the window
/// still ends, so nothing is lost but the early release).
const MAX_GRANTS: usize = 100_000;

/// Counters the shard keeps for metrics; read without locks.
#[derive(Debug, Default)]
pub struct ShardStats {
    pub keys: AtomicU64,
    pub waiting: AtomicU64,
    pub queued: AtomicU64,
    pub admitted_after_wait: AtomicU64,
    pub timed_out: AtomicU64,
    pub cancelled: AtomicU64,
    pub queue_full: AtomicU64,
    pub wait_ns_total: AtomicU64,
    /// Keys dropped before their window ended because the shard held its cap.
    pub evictions: AtomicU64,
    /// Redis mode: the breaker (`BREAKER_CLOSED`, `BREAKER_OPEN`, `BREAKER_HALF_OPEN`).
    pub breaker: AtomicU64,
    pub redis_errors: AtomicU64,
    /// Decisions made without Redis while its breaker was open.
    pub fallback_decisions: AtomicU64,
    /// Refusals answered from the local over-limit cache, without a round trip.
    pub local_cache_hits: AtomicU64,
}

struct Waiter {
    msg: Decide,
    /// Which op of `msg` waits for this key.
    op: usize,
    enqueued: u64,
    deadline: u64,
}

/// (op index, next state, the key's position in the table if it has one) of the ops of a
/// message that fit, to store if the message is admitted.
type Scratch = SmallVec<[(usize, State, Option<usize>); 2]>;

/// A message evaluated against the table, nothing committed yet.
struct Evaluated {
    outcomes: Outcomes,
    scratch: Scratch,
    verdict: Verdict,
}

enum Verdict {
    Admit,
    Refuse,
    /// Wait in the queue of op `n`'s key.
    Wait(usize),
}

pub(crate) struct Shard {
    table: Table,
    /// FIFO wait queues, by key. A key with waiters keeps its entry in `table`: the sweep and
    /// evictions pass it by.
    queues: fnv::FnvHashMap<Box<str>, VecDeque<Waiter>>,
    clock: Clock,
    /// Times at which some key's queue must be looked at again (head's deadline or retry time).
    events: BinaryHeap<Reverse<(u64, Box<str>)>>,
    waiters: usize,
    max_waiters: usize,
    next_sweep: u64,
    sweep_every: u64,
    draining: Option<bool>,
    stats: Arc<ShardStats>,
    grants: fnv::FnvHashMap<u64, Grant>,
    /// Direct API refusals per key in the current window: (window index, count).
    denied: fnv::FnvHashMap<Box<str>, (u64, u64)>,
    /// Redis mode; `None` keeps every counter in `table`.
    remote: Option<Remote>,
    /// Keys this shard may hold; past it, keys are evicted (see `make_room`).
    max_keys: usize,
    /// Keys refused in their current window (by hash, until the window ends): never evicted, so
    /// an attacker flooding new keys cannot make the shard forget who is over the limit.
    refused: fnv::FnvHashMap<u64, u64>,
    /// The answer to a synchronous caller's message ([`ReplyTo::Here`]).
    answered: Option<Reply>,
    /// Where a synchronous caller whose message was held waits for its answer.
    held: Option<oneshot::Receiver<Reply>>,
}

const NS_PER_SEC: u64 = 1_000_000_000;

/// A shard with its mailbox, shared by the shard's task and by callers on the same thread.
///
/// The task and those callers take turns on one thread, never at once: a caller on the shard's
/// own thread decides synchronously (mailbox first, so earlier messages keep their order, then
/// its own message) instead of paying a message, a task switch and a wake-up. Callers on other
/// threads send messages that the task handles.
pub(crate) struct Local {
    pub(crate) shard: Shard,
    rx: mpsc::Receiver<Msg>,
    /// Set by a synchronous caller whose message moved the shard's next wake-up earlier.
    poked: bool,
    task: Option<Waker>,
}

impl Local {
    pub(crate) fn new(shard: Shard, rx: mpsc::Receiver<Msg>) -> Local {
        Local {
            shard,
            rx,
            poked: false,
            task: None,
        }
    }

    /// Handles `msg` now, on the caller's thread, after whatever the mailbox already holds.
    pub(crate) fn handle_here(&mut self, msg: Msg) {
        self.here(|shard| shard.handle(msg));
    }

    /// Decides `d` (sent with [`ReplyTo::Here`]) now, on the caller's thread, after whatever the
    /// mailbox already holds; returns its answer, or the channel it will come on if it is held.
    pub(crate) fn decide_here(&mut self, d: Decide) -> Answer {
        self.here(|shard| shard.decide_any(d));
        match (self.shard.answered.take(), self.shard.held.take()) {
            (Some(reply), _) => Answer::Now(reply),
            (None, Some(rx)) => Answer::Later(rx),
            // Every path answers or holds a message; were one to do neither, the caller sees the
            // shard as stopped rather than waiting forever.
            (None, None) => Answer::Later(oneshot::channel().1),
        }
    }

    fn here(&mut self, f: impl FnOnce(&mut Shard)) {
        let before = self.shard.next_wake();
        while let Ok(m) = self.rx.try_recv() {
            self.shard.handle(m);
        }
        f(&mut self.shard);
        if self.shard.next_wake() < before {
            // A new queue event: the task must arm its timer for it.
            self.poked = true;
            if let Some(w) = &self.task {
                w.wake_by_ref();
            }
        }
    }
}

/// What woke the shard's task.
enum Woke {
    /// Messages arrived (in the buffer); 0 means every sender is gone.
    Mail(usize),
    /// A synchronous caller changed when the shard must next wake.
    Poked,
}

/// The actor loop: batches of messages, then due queue events and the expiry sweep. The shard
/// is borrowed only between awaits, so callers on this thread can use it meanwhile.
pub(crate) async fn run(cell: Rc<RefCell<Local>>) {
    let mut buf = Vec::with_capacity(64);
    let (mut changes, mut done_rx) = {
        let mut l = cell.borrow_mut();
        let changes = l.shard.clock.changes();
        let done_rx = l.shard.remote.as_mut().and_then(|r| r.done_rx.take());
        (changes, done_rx)
    };
    let timer = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(timer);
    let mut armed_for = u64::MAX;
    loop {
        let mut clock_gone = false;
        let manual = changes.is_some();
        {
            let l = cell.borrow();
            let wake_at = l.shard.next_wake();
            if !manual && wake_at != armed_for {
                let delay = wake_at.saturating_sub(l.shard.clock.now());
                timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + Duration::from_nanos(delay));
                armed_for = wake_at;
            }
        }
        let mail = std::future::poll_fn(|cx| {
            let mut l = cell.borrow_mut();
            if std::mem::take(&mut l.poked) {
                return Poll::Ready(Woke::Poked);
            }
            let l = &mut *l;
            match l.rx.poll_recv_many(cx, &mut buf, 64) {
                Poll::Ready(n) => Poll::Ready(Woke::Mail(n)),
                Poll::Pending => {
                    if !l.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        l.task = Some(cx.waker().clone());
                    }
                    Poll::Pending
                }
            }
        });
        tokio::select! {
            biased;
            woke = mail => match woke {
                Woke::Mail(0) => {
                    cell.borrow_mut().shard.drain(false);
                    return;
                }
                Woke::Mail(_) => {
                    let mut l = cell.borrow_mut();
                    for msg in buf.drain(..) {
                        l.shard.handle(msg);
                    }
                }
                Woke::Poked => {}
            },
            Some(done) = async { done_rx.as_mut().expect("remote mode").recv().await }, if done_rx.is_some() => {
                cell.borrow_mut().shard.remote_done(done);
            }
            _ = &mut timer, if !manual => { armed_for = u64::MAX; }
            r = async { changes.as_mut().expect("manual clock").changed().await }, if manual => {
                clock_gone = r.is_err();
            }
        }
        if clock_gone {
            changes = None;
        }
        cell.borrow_mut().shard.tick();
    }
}

/// Where the hits of an admitted message are counted.
enum Commit {
    /// In the shard's table: these next states, stored when the message is admitted.
    Memory(Scratch),
    /// Already in Redis: these ops (by index) were counted, and are given back unless admitted.
    Remote(SmallVec<[usize; 2]>),
}

/// What the message as a whole does, from each op's evaluation and whether a queue blocks it.
fn judge(d: &Decide, evals: &[(Eval, bool)]) -> (Outcomes, Verdict) {
    let mut outcomes: Outcomes = SmallVec::with_capacity(evals.len());
    let mut refuse = false;
    let mut wait: Option<usize> = None;
    let mut quota_any = false;
    let mut quota_all_over = true;
    for (i, (op, (e, blocked))) in d.ops.iter().zip(evals).enumerate() {
        let over = e.over || *blocked;
        outcomes.push(Outcome {
            over: e.over,
            remaining: e.remaining,
            reset_ns: e.reset_ns,
            retry_ns: e.retry_ns,
            blocked: *blocked,
        });
        match op.role {
            Role::Binding if over && !d.global_shadow => {
                if d.may_wait && op.queue.is_some() && e.retry_ns != u64::MAX {
                    wait.get_or_insert(i);
                } else {
                    refuse = true;
                }
            }
            Role::Quota => {
                quota_any = true;
                quota_all_over &= e.over;
            }
            _ => {}
        }
    }
    if d.whole && quota_any && quota_all_over && !d.global_shadow {
        refuse = true;
    }
    let verdict = if refuse {
        Verdict::Refuse
    } else if let Some(i) = wait {
        Verdict::Wait(i)
    } else {
        Verdict::Admit
    };
    (outcomes, verdict)
}

impl Shard {
    pub(crate) fn new(
        clock: Clock,
        max_waiters: usize,
        stats: Arc<ShardStats>,
        remote: Option<Remote>,
        max_keys: usize,
    ) -> Shard {
        let now = clock.now();
        Shard {
            table: Table::default(),
            queues: Default::default(),
            clock,
            events: BinaryHeap::new(),
            waiters: 0,
            max_waiters,
            next_sweep: now + NS_PER_SEC,
            sweep_every: NS_PER_SEC,
            draining: None,
            stats,
            grants: Default::default(),
            denied: Default::default(),
            remote,
            max_keys: max_keys.max(16),
            refused: Default::default(),
            answered: None,
            held: None,
        }
    }

    /// When the shard must next look at its queues or sweep.
    pub(crate) fn next_wake(&self) -> u64 {
        let ev = self.events.peek().map(|Reverse((t, _))| *t);
        ev.unwrap_or(u64::MAX).min(self.next_sweep)
    }

    /// After messages: due queue events and, once a second, the expiry sweep.
    fn tick(&mut self) {
        let now = self.clock.now();
        self.run_events(now);
        if now >= self.next_sweep {
            self.sweep(now);
        }
    }

    pub(crate) fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Decide(d) => self.decide_any(d),
            Msg::Undo(ops, true) => self.undo_remote_ops(&ops),
            Msg::Undo(ops, false) => {
                let now = self.clock.now();
                for op in &ops {
                    self.give_back(op, now);
                }
            }
            Msg::Inspect { prefix, reply } => {
                let now = self.clock.now();
                let mut out: Vec<KeyInfo> = self
                    .table
                    .iter()
                    .filter(|(k, _)| prefix.as_deref().is_none_or(|p| k.starts_with(p)))
                    .map(|(k, e)| KeyInfo {
                        key: k.to_string(),
                        state: e.state,
                        denied: self.denied.get(k).copied().unwrap_or((0, 0)),
                        waiting: self.queues.get(k).map_or(0, |q| q.len()),
                        now,
                    })
                    .collect();
                out.sort_by(|a, b| a.key.cmp(&b.key));
                let _ = reply.send(out);
            }
            Msg::Drain { admit } => self.drain(admit),
            Msg::Cancelled { key, hash } => self.purge_cancelled(&key, hash),
            Msg::Release {
                key,
                hash,
                id,
                reply,
            } => {
                let now = self.clock.now();
                let found = match self.grants.get(&id) {
                    Some(g) if g.key.as_ref() == key => g.window == now / g.params.window_ns(),
                    _ => false,
                };
                if let Some(g) = self.grants.remove(&id).filter(|_| found) {
                    let op = Op {
                        key,
                        hash,
                        params: g.params,
                        hits: 1,
                        refund: true,
                        role: Role::Binding,
                        queue: None,
                        grant: None,
                    };
                    self.give_back(&op, now);
                }
                let _ = reply.send(found);
            }
        }
    }

    fn decide_any(&mut self, d: Decide) {
        if self.remote.is_some() {
            self.decide_remote(d)
        } else {
            self.decide(d)
        }
    }

    fn decide(&mut self, d: Decide) {
        let now = self.clock.now();
        // Refunds first: capacity given back goes to the head of the queue before anyone else.
        for op in d.ops.iter().filter(|o| o.refund) {
            self.give_back(op, now);
        }
        // Waiters of these keys go before this newcomer.
        for i in 0..d.ops.len() {
            if d.ops[i].queue.is_some() && self.has_waiters(&d.ops[i]) {
                let key = d.ops[i].key.clone();
                self.service_queue(&key, d.ops[i].hash, now);
            }
        }
        self.settle(d, now, None, None);
    }

    /// Evaluates a message (a newcomer, or a waiter taken off the head of `head_of`'s queue) and
    /// answers it, commits it, or parks it.
    fn settle(&mut self, d: Decide, now: u64, head_of: Option<usize>, since: Option<(u64, u64)>) {
        let Evaluated {
            outcomes,
            scratch,
            verdict,
        } = self.evaluate(&d, now, head_of);
        self.conclude(d, outcomes, verdict, Commit::Memory(scratch), now, since);
    }

    /// Acts on a verdict: commits and answers, answers a refusal, or parks the message in a
    /// queue. What was already counted (in Redis) is given back unless the message is admitted.
    fn conclude(
        &mut self,
        d: Decide,
        mut outcomes: Outcomes,
        verdict: Verdict,
        commit: Commit,
        now: u64,
        since: Option<(u64, u64)>,
    ) {
        let verdict = match verdict {
            Verdict::Wait(_) if self.draining.is_some() => Verdict::Refuse,
            v => v,
        };
        if !matches!(verdict, Verdict::Admit) {
            if let Commit::Remote(done) = &commit {
                self.remote_undo(&d.ops, done);
            }
        }
        match verdict {
            Verdict::Admit => {
                if let Commit::Memory(scratch) = &commit {
                    self.commit(&d.ops, scratch, now);
                }
                let waited = since.map_or(0, |(enq, _)| now.saturating_sub(enq));
                let reply = Reply {
                    outcomes,
                    committed: true,
                    waited_ns: waited,
                    timed_out: false,
                    failed: false,
                    remote: matches!(commit, Commit::Remote(_)),
                };
                if since.is_some() {
                    self.stats
                        .admitted_after_wait
                        .fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .wait_ns_total
                        .fetch_add(waited, Ordering::Relaxed);
                }
                if !self.answer(d.reply, reply) {
                    // The caller left between our decision and the answer: consume nothing.
                    match &commit {
                        Commit::Memory(_) => {
                            for op in d.ops.iter().filter(|o| !o.refund) {
                                self.give_back(op, now);
                            }
                        }
                        Commit::Remote(done) => self.remote_undo(&d.ops, done),
                    }
                }
            }
            Verdict::Refuse => {
                self.count_denied(&d.ops, now);
                self.protect(&d.ops, &outcomes, now);
                self.answer(
                    d.reply,
                    Reply::refused(
                        outcomes,
                        since.map_or(0, |(enq, _)| now.saturating_sub(enq)),
                    ),
                );
            }
            Verdict::Wait(i) => {
                let op = &d.ops[i];
                let spec = op.queue.expect("waiting op has a queue");
                let (enqueued, deadline) =
                    since.unwrap_or((now, now.saturating_add(spec.max_wait.as_nanos() as u64)));
                let is_new = since.is_none();
                if is_new && !self.room_to_wait(op, now, deadline) {
                    self.stats.queue_full.fetch_add(1, Ordering::Relaxed);
                    self.count_denied(&d.ops, now);
                    self.protect(&d.ops, &outcomes, now);
                    for o in outcomes.iter_mut() {
                        if o.blocked {
                            o.over = true;
                            o.remaining = 0;
                        }
                    }
                    self.answer(d.reply, Reply::refused(outcomes, 0));
                    return;
                }
                let key: Box<str> = op.key.as_str().into();
                let hash = op.hash;
                let params = op.params;
                let mut d = d;
                self.hold(&mut d);
                self.slot(&key, hash, params, now);
                let q = self.queues.entry(key.clone()).or_default();
                let was_empty = q.is_empty();
                q.push_back(Waiter {
                    msg: d,
                    op: i,
                    enqueued,
                    deadline,
                });
                if is_new {
                    self.waiters += 1;
                    self.stats
                        .waiting
                        .store(self.waiters as u64, Ordering::Relaxed);
                    self.stats.queued.fetch_add(1, Ordering::Relaxed);
                }
                if was_empty {
                    let retry = outcomes[i].retry_ns;
                    self.events
                        .push(Reverse((deadline.min(now.saturating_add(retry)), key)));
                }
            }
        }
    }

    /// Delivers a message's answer; false when its caller went away.
    pub(super) fn answer(&mut self, to: ReplyTo, reply: Reply) -> bool {
        match to {
            ReplyTo::Caller(tx) => tx.send(reply).is_ok(),
            ReplyTo::Here => {
                self.answered = Some(reply);
                true
            }
        }
    }

    /// A message about to be held (in a queue, or for Redis): a synchronous caller gets a
    /// channel to wait on.
    pub(super) fn hold(&mut self, d: &mut Decide) {
        if matches!(d.reply, ReplyTo::Here) {
            let (tx, rx) = oneshot::channel();
            d.reply = ReplyTo::Caller(tx);
            self.held = Some(rx);
        }
    }

    /// Whether a newcomer may join the queue of `op`'s key: there is room in it and in the
    /// shard, and it can be admitted before `deadline` at all (predicted from the window and the
    /// hits already waiting ahead of it).
    fn room_to_wait(&mut self, op: &Op, now: u64, deadline: u64) -> bool {
        let spec = op.queue.expect("queued op");
        if self.waiters >= self.max_waiters {
            return false;
        }
        let (ahead_len, ahead_hits, state) = match self.find(&op.key, op.hash) {
            None => (0, 0, State::fresh(&op.params, now)),
            Some(e) => {
                let mut len = 0;
                let mut hits = 0u64;
                if let Some(q) = self.queues.get(op.key.as_str()) {
                    for w in q.iter().filter(|w| !w.msg.reply.is_closed()) {
                        len += 1;
                        hits += w.msg.ops[w.op].hits;
                    }
                }
                let s = if e.state.fits(&op.params) {
                    e.state
                } else {
                    State::fresh(&op.params, now)
                };
                (len, hits, s)
            }
        };
        if ahead_len >= spec.max_waiting as usize {
            return false;
        }
        match state.min_wait(&op.params, now, ahead_hits + op.hits) {
            Some(w) => now.saturating_add(w) <= deadline,
            None => false,
        }
    }

    /// Evaluates every op against the table (and against earlier ops of the same message on the
    /// same key), and decides what the message as a whole should do.
    fn evaluate(&mut self, d: &Decide, now: u64, head_of: Option<usize>) -> Evaluated {
        let mut evals: SmallVec<[(Eval, bool); 2]> = SmallVec::with_capacity(d.ops.len());
        // Ops that fit, in order; later ops on one key see earlier ones.
        let mut scratch = Scratch::new();
        for (i, op) in d.ops.iter().enumerate() {
            let earlier = scratch
                .iter()
                .rev()
                .find(|(j, ..)| d.ops[*j].hash == op.hash && d.ops[*j].key == op.key)
                .map(|&(_, s, at)| (Some(s), at));
            let (base, at) = earlier.unwrap_or_else(|| {
                let at = self.table.find(&op.key, op.hash);
                let state = at
                    .map(|at| self.table.get(at).state)
                    .filter(|s| s.fits(&op.params));
                (state, at)
            });
            let base = base.unwrap_or_else(|| State::fresh(&op.params, now));
            let hits = if op.refund { 0 } else { op.hits };
            let e: Eval = base.eval(&op.params, now, hits);
            let blocked = self.is_blocked(op, i, head_of);
            if !(e.over || blocked || op.refund) {
                scratch.push((i, e.next, at));
            }
            evals.push((e, blocked));
        }
        let (outcomes, verdict) = judge(d, &evals);
        Evaluated {
            outcomes,
            scratch,
            verdict,
        }
    }

    /// A newcomer does not pass the waiters of a queued key, even if capacity is free.
    fn is_blocked(&self, op: &Op, i: usize, head_of: Option<usize>) -> bool {
        op.queue.is_some() && head_of != Some(i) && !op.refund && self.has_waiters(op)
    }

    /// Stores the next states of an admitted message: first into the entries found when it was
    /// evaluated, then new keys (whose insertion may evict others and move entries).
    fn commit(&mut self, ops: &[Op], scratch: &Scratch, now: u64) {
        for &(i, state, at) in scratch {
            let op = &ops[i];
            if let Some(at) = at {
                let e = self.table.get_mut(at);
                e.state = state;
                e.expires_s = to_secs_ceil(state.expires_at(&op.params, now));
            }
            if let Some(id) = op.grant {
                if self.grants.len() < MAX_GRANTS {
                    self.grants.insert(
                        id,
                        Grant {
                            key: op.key.as_str().into(),
                            window: now / op.params.window_ns(),
                            params: op.params,
                        },
                    );
                }
            }
        }
        for &(i, state, _) in scratch.iter().filter(|(.., at)| at.is_none()) {
            let op = &ops[i];
            if let Some(at) = self.slot(&op.key, op.hash, op.params, now) {
                let e = self.table.get_mut(at);
                e.state = state;
                e.expires_s = to_secs_ceil(state.expires_at(&op.params, now));
            }
        }
    }

    /// Counts direct API refusals, for `/debug`.
    fn count_denied(&mut self, ops: &[Op], now: u64) {
        for op in ops.iter().filter(|o| o.grant.is_some()) {
            let w = now / op.params.window_ns();
            let e = self.denied.entry(op.key.as_str().into()).or_insert((w, 0));
            if e.0 != w {
                *e = (w, 0);
            }
            e.1 += 1;
        }
    }

    /// Returns `op.hits` to its key and lets the queue head take them.
    fn give_back(&mut self, op: &Op, now: u64) {
        let hash = op.hash;
        let Some(at) = self.table.find(&op.key, hash) else {
            return;
        };
        let e = self.table.get_mut(at);
        if e.state.fits(&op.params) {
            e.state.refund(&op.params, now, op.hits);
        }
        if !self.queues.is_empty() && self.queues.contains_key(op.key.as_str()) {
            let key = op.key.clone();
            self.service_queue(&key, hash, now);
        }
    }

    /// Answers what can be answered at the head of `key`'s queue: cancelled and timed-out
    /// waiters leave, waiters that fit are admitted in arrival order.
    fn service_queue(&mut self, key: &str, hash: u64, now: u64) {
        loop {
            let Some(q) = self.queues.get_mut(key) else {
                return;
            };
            let Some(w) = q.pop_front() else {
                self.queues.remove(key);
                return;
            };
            if w.msg.reply.is_closed() {
                self.left_queue();
                self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if let Some(admit) = self.draining {
                self.left_queue();
                self.answer_drained(w, admit, now);
                continue;
            }
            if now >= w.deadline {
                self.left_queue();
                self.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                self.time_out(w, now);
                continue;
            }
            if self.remote_ready() {
                // Redis decides the head; newcomers queue behind it meanwhile.
                self.remote_head(w, key, hash);
                return;
            }
            let Evaluated {
                outcomes, verdict, ..
            } = self.evaluate(&w.msg, now, Some(w.op));
            match verdict {
                Verdict::Wait(i) if i == w.op => {
                    // Still the head, still waiting: look again when it may fit or must give up.
                    let at = w.deadline.min(now.saturating_add(outcomes[i].retry_ns));
                    self.queues.entry(key.into()).or_default().push_front(w);
                    self.events.push(Reverse((at, key.into())));
                    return;
                }
                Verdict::Wait(_) => {
                    // Its own key has room now, but another queued key of the request has not:
                    // it moves on to wait there.
                    let since = Some((w.enqueued, w.deadline));
                    self.settle(w.msg, now, None, since);
                }
                Verdict::Admit | Verdict::Refuse => {
                    self.left_queue();
                    let since = Some((w.enqueued, w.deadline));
                    self.settle(w.msg, now, Some(w.op), since);
                }
            }
        }
    }

    /// Removes waiters whose callers went away, wherever they are in the queue.
    fn purge_cancelled(&mut self, key: &str, hash: u64) {
        let Some(q) = self.queues.get_mut(key) else {
            return;
        };
        let before = q.len();
        q.retain(|w| !w.msg.reply.is_closed());
        let gone = before - q.len();
        if q.is_empty() {
            self.queues.remove(key);
        }
        for _ in 0..gone {
            self.left_queue();
        }
        self.stats
            .cancelled
            .fetch_add(gone as u64, Ordering::Relaxed);
        // The new head may fit now.
        let now = self.clock.now();
        self.service_queue(key, hash, now);
    }

    fn left_queue(&mut self) {
        self.waiters = self.waiters.saturating_sub(1);
        self.stats
            .waiting
            .store(self.waiters as u64, Ordering::Relaxed);
    }

    fn time_out(&mut self, w: Waiter, now: u64) {
        self.count_denied(&w.msg.ops, now);
        let mut outcomes = self.evaluate(&w.msg, now, Some(w.op)).outcomes;
        for o in outcomes.iter_mut() {
            if o.blocked || o.over {
                o.over = true;
                o.remaining = 0;
            }
        }
        // The op it waited for is reported over, whatever its count says now.
        outcomes[w.op].over = true;
        outcomes[w.op].remaining = 0;
        self.answer(
            w.msg.reply,
            Reply {
                outcomes,
                committed: false,
                waited_ns: now.saturating_sub(w.enqueued),
                timed_out: true,
                failed: false,
                remote: false,
            },
        );
    }

    fn answer_drained(&mut self, w: Waiter, admit: bool, now: u64) {
        let Evaluated {
            mut outcomes,
            scratch,
            ..
        } = self.evaluate(&w.msg, now, Some(w.op));
        if admit {
            self.commit(&w.msg.ops, &scratch, now);
            for o in outcomes.iter_mut() {
                o.over = false;
                o.blocked = false;
            }
        } else {
            outcomes[w.op].over = true;
            outcomes[w.op].remaining = 0;
        }
        self.answer(
            w.msg.reply,
            Reply {
                outcomes,
                committed: admit,
                waited_ns: now.saturating_sub(w.enqueued),
                timed_out: false,
                failed: false,
                remote: false,
            },
        );
    }

    fn run_events(&mut self, now: u64) {
        while let Some(Reverse((t, _))) = self.events.peek() {
            if *t > now {
                break;
            }
            let Reverse((_, key)) = self.events.pop().expect("peeked");
            let hash = key_hash(&key);
            self.service_queue(&key, hash, now);
        }
    }

    fn drain(&mut self, admit: bool) {
        self.draining = Some(admit);
        let now = self.clock.now();
        let keys: Vec<(Box<str>, u64)> = self
            .queues
            .keys()
            .map(|k| (k.clone(), key_hash(k)))
            .collect();
        for (k, h) in keys {
            self.service_queue(&k, h, now);
        }
    }

    /// Drops keys whose state no longer matters, so memory follows the active keys.
    fn sweep(&mut self, now: u64) {
        self.drop_expired(now);
        self.refused.retain(|_, until| *until > now);
        self.grants
            .retain(|_, g| g.window >= now / g.params.window_ns());
        let table = &self.table;
        self.denied
            .retain(|k, _| table.find(k, key_hash(k)).is_some());
        self.stats
            .keys
            .store(self.table.len() as u64, Ordering::Relaxed);
        self.next_sweep = now + self.sweep_every;
    }

    /// Remembers keys refused for being over their limit, until their window ends. Keys that no
    /// state could ever admit (`requests_per_unit: 0`, hits above the limit) need no memory.
    fn protect(&mut self, ops: &[Op], outcomes: &[Outcome], now: u64) {
        for (op, o) in ops.iter().zip(outcomes) {
            if o.over
                && !o.blocked
                && o.retry_ns != u64::MAX
                && self.refused.len() < self.max_keys / 10
            {
                self.refused.insert(op.hash, now.saturating_add(o.reset_ns));
            }
        }
    }

    /// Key flood defence, run when the shard holds `max_keys` and a new key arrives. Expired keys
    /// go first; if that frees less than a tenth of the cap, the keys whose state expires soonest
    /// are evicted until a tenth is free. Never evicted: keys with waiters, and keys refused in
    /// their current window (so no one over the limit is forgotten early). Evicting a key that
    /// is under its limit restarts its count, so it may admit up to its limit again in that
    /// window: a bounded error, counted in `evictions`. Runs once per tenth of the cap of new
    /// keys, so its cost per key is constant.
    fn make_room(&mut self, now: u64) {
        self.drop_expired(now);
        self.refused.retain(|_, until| *until > now);
        let target = self.max_keys - self.max_keys / 10;
        if self.table.len() > target {
            let (refused, queues) = (&self.refused, &self.queues);
            let mut candidates: Vec<(u32, u64)> = self
                .table
                .iter()
                .filter(|(k, _)| !queues.contains_key(*k))
                .map(|(k, e)| (e.expires_s, key_hash(k)))
                .filter(|(_, h)| !refused.contains_key(h))
                .collect();
            let n = (self.table.len() - target).min(candidates.len());
            if n > 0 {
                candidates.select_nth_unstable(n - 1);
                let victims: fnv::FnvHashSet<u64> = candidates[..n].iter().map(|c| c.1).collect();
                let queues = &self.queues;
                self.table
                    .retain(|k, _| queues.contains_key(k) || !victims.contains(&key_hash(k)));
                self.stats.evictions.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        self.stats
            .keys
            .store(self.table.len() as u64, Ordering::Relaxed);
    }

    /// Drops the entries whose state has expired, except those of keys with waiters.
    fn drop_expired(&mut self, now: u64) {
        let now_s = now / 1_000_000_000;
        let queues = &self.queues;
        self.table
            .retain(|k, e| u64::from(e.expires_s) > now_s || queues.contains_key(k));
    }

    fn has_waiters(&self, op: &Op) -> bool {
        self.queues
            .get(op.key.as_str())
            .is_some_and(|q| !q.is_empty())
            || self
                .remote
                .as_ref()
                .is_some_and(|r| r.heads.contains(op.key.as_str()))
    }

    fn find(&self, key: &str, hash: u64) -> Option<&table::Entry> {
        self.table.find(key, hash).map(|at| self.table.get(at))
    }

    /// The position of `key`'s entry, made (fresh) if it has none; at the key cap, room is made
    /// first. `None` only if no room can be made (every key has waiters or was refused).
    fn slot(&mut self, key: &str, hash: u64, params: super::Params, now: u64) -> Option<usize> {
        if let Some(at) = self.table.find(key, hash) {
            return Some(at);
        }
        if self.table.len() >= self.max_keys {
            self.make_room(now);
        }
        let state = State::fresh(&params, now);
        let expires = to_secs_ceil(state.expires_at(&params, now));
        let at = match self.table.insert(key, hash, state, expires) {
            Some(at) => at,
            None => {
                // The key arena is full (4 GiB): evict, as at the key cap, and try again.
                self.make_room(now);
                self.table.insert(key, hash, state, expires)?
            }
        };
        self.stats.keys.fetch_add(1, Ordering::Relaxed);
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::{mpsc, oneshot};

    use super::*;
    use crate::config::{Algorithm, QueueSpec};
    use crate::limiter::Params;

    const T0: u64 = 1_700_000_000 * NS_PER_SEC;

    fn local(clock: Clock) -> (Local, mpsc::Sender<Msg>) {
        let (tx, rx) = mpsc::channel(16);
        let shard = Shard::new(clock, 100, Arc::new(ShardStats::default()), None, 1000);
        (Local::new(shard, rx), tx)
    }

    fn decide(limit: u32, window_ms: u64, queue: Option<QueueSpec>, reply: ReplyTo) -> Decide {
        Decide {
            ops: vec![Op {
                key: "d_k_v_".into(),
                hash: key_hash("d_k_v_"),
                params: Params {
                    requests_per_unit: limit,
                    window_ms,
                    algorithm: Algorithm::FixedWindow,
                },
                hits: 1,
                refund: false,
                role: Role::Binding,
                queue,
                grant: None,
            }],
            whole: true,
            global_shadow: false,
            may_wait: true,
            reply,
        }
    }

    fn now(answer: Answer) -> Reply {
        match answer {
            Answer::Now(r) => r,
            Answer::Later(_) => panic!("expected an answer in place"),
        }
    }

    /// A caller on the shard's thread is answered in place, after what the mailbox already held:
    /// a message sent earlier is counted first, and its sender gets its answer.
    #[test]
    fn a_synchronous_decide_follows_the_mailbox_and_is_answered_in_place() {
        let (clock, _) = Clock::manual(T0);
        let (mut l, tx) = local(clock);
        let (reply_tx, mut reply_rx) = oneshot::channel();
        tx.try_send(Msg::Decide(decide(
            2,
            60_000,
            None,
            ReplyTo::Caller(reply_tx),
        )))
        .expect("room in the mailbox");

        let first = now(l.decide_here(decide(2, 60_000, None, ReplyTo::Here)));
        let earlier = reply_rx.try_recv().expect("the mailbox was handled first");
        assert_eq!(
            (earlier.outcomes[0].over, earlier.outcomes[0].remaining),
            (false, 1)
        );
        assert_eq!(
            (first.outcomes[0].over, first.outcomes[0].remaining),
            (false, 0)
        );
        assert!(first.committed);

        let refused = now(l.decide_here(decide(2, 60_000, None, ReplyTo::Here)));
        assert!(refused.outcomes[0].over && !refused.committed);
    }

    /// A synchronous caller that must wait gets a channel, and the shard's task is told to arm
    /// its timer (the wait ends before the next sweep would wake it); when the window turns,
    /// the waiter is admitted through that channel.
    #[test]
    fn a_synchronous_decide_that_waits_gets_a_channel() {
        let (clock, manual) = Clock::manual(T0);
        let (mut l, _tx) = local(clock);
        let queue = Some(QueueSpec {
            max_waiting: 4,
            max_wait: Duration::from_secs(10),
        });
        assert!(now(l.decide_here(decide(1, 500, queue, ReplyTo::Here))).committed);
        let Answer::Later(mut rx) = l.decide_here(decide(1, 500, queue, ReplyTo::Here)) else {
            panic!("over the limit with a queue: held");
        };
        assert!(l.poked, "the task must re-arm its timer for the new waiter");
        assert!(rx.try_recv().is_err(), "still waiting");

        manual.advance(Duration::from_millis(500));
        l.shard.tick();
        let admitted = rx.try_recv().expect("admitted when the window turned");
        assert!(admitted.committed && !admitted.outcomes[0].over);
        assert!(admitted.waited_ns > 0);
    }
}
