//! The shard decided in place by a caller on its own thread, and its round trips to a store.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::config::{Algorithm, QueueSpec};
use crate::limiter::algorithm::State;
use crate::limiter::clock::Clock;
use crate::limiter::op::{test_op, Op};
use crate::limiter::protocol::{Decide, Delivery, Hits, Msg, Reply, ReplyTo};
use crate::limiter::same_thread::SameThreadShard;
use crate::limiter::store::{
    DeleteFuture, FailureMode, Store, StoreError, StoreFuture, StoreOp, StorePolicy, StoreReply,
};

const T0: u64 = 1_700_000_000 * 1_000_000_000;

fn local(clock: Clock) -> (SameThreadShard, mpsc::Sender<Msg>) {
    let (tx, rx) = mpsc::channel(16);
    let budget = Arc::new(crate::limiter::queue_budget::QueueBudget::new(100));
    let shard = Shard::new(
        clock,
        budget,
        Arc::new(ShardStats::default()),
        Backing::Memory,
        1000,
    );
    (SameThreadShard::new(shard, rx), tx)
}

fn decide(limit: u32, window_ms: u64, queue: Option<QueueSpec>, reply: ReplyTo) -> Decide {
    Decide {
        ops: vec![Op {
            queue,
            ..test_op("d_k_v_", Algorithm::FixedWindow, limit, window_ms)
        }],
        whole: true,
        global_shadow: false,
        may_wait: true,
        reply,
    }
}

fn now(answer: Delivery) -> Reply {
    match answer {
        Delivery::Now(r) => r,
        Delivery::Later(_) => panic!("expected an answer in place"),
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

    let first = now(l.decide_in_place(decide(2, 60_000, None, ReplyTo::InPlace)));
    let earlier = reply_rx.try_recv().expect("the mailbox was handled first");
    assert_eq!(
        (earlier.outcomes[0].over, earlier.outcomes[0].remaining),
        (false, 1)
    );
    assert_eq!(
        (first.outcomes[0].over, first.outcomes[0].remaining),
        (false, 0)
    );
    assert!(first.committed());

    let refused = now(l.decide_in_place(decide(2, 60_000, None, ReplyTo::InPlace)));
    assert!(refused.outcomes[0].over && !refused.committed());
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
    assert!(now(l.decide_in_place(decide(1, 500, queue, ReplyTo::InPlace))).committed());
    let Delivery::Later(mut rx) = l.decide_in_place(decide(1, 500, queue, ReplyTo::InPlace)) else {
        panic!("over the limit with a queue: held");
    };
    assert!(l.poked, "the task must re-arm its timer for the new waiter");
    assert!(rx.try_recv().is_err(), "still waiting");

    manual.advance(Duration::from_millis(500));
    l.shard.tick();
    let admitted = rx.try_recv().expect("admitted when the window turned");
    assert!(admitted.committed() && !admitted.outcomes[0].over);
    assert!(admitted.waited_ns > 0);
}

/// A round trip held by the test: each op's hits, and where its answer goes.
type Held = (Vec<u64>, oneshot::Sender<Vec<StoreReply>>);

/// A store whose round trips end when the test says, in any order; it records what each one
/// carried.
#[derive(Default)]
struct HeldStore {
    sent: std::sync::Mutex<Vec<Held>>,
    /// The lane of each round trip the shard told the store had failed.
    failed: std::sync::Mutex<Vec<usize>>,
}

impl HeldStore {
    /// The hits of each round trip sent and not yet taken by the test.
    fn hits(&self) -> Vec<Vec<u64>> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.0.clone())
            .collect()
    }
}

impl Store for HeldStore {
    fn run(&self, _: usize, batch: &[StoreOp<'_>], _: u64, _: Duration) -> StoreFuture {
        let (tx, rx) = oneshot::channel();
        let hits = batch.iter().map(|o| o.op.hits).collect();
        self.sent.lock().unwrap().push((hits, tx));
        Box::pin(async move { rx.await.map_err(|_| StoreError("dropped".into())) })
    }

    /// An empty store: every key reads fresh.
    fn peek(&self, _: usize, op: &Op, now: u64, _: Duration) -> StoreFuture {
        let before = State::fresh(&op.params, now);
        Box::pin(async move {
            Ok(vec![StoreReply {
                before,
                allowed: None,
                holds: Default::default(),
            }])
        })
    }

    /// An empty store: nothing to delete.
    fn delete(&self, _: usize, _: &Op, _: u64, _: Duration) -> DeleteFuture {
        Box::pin(async { Ok(0) })
    }

    fn failed(&self, lane: usize) {
        self.failed.lock().unwrap().push(lane);
    }

    fn name(&self) -> &'static str {
        "the held store"
    }
}

/// A shard on `store` with no local cache and a breaker that never opens.
fn with_store(clock: Clock, store: Arc<HeldStore>) -> Shard {
    on_lane(clock, store, 0)
}

/// As `with_store`, the shard using the store's connection `lane`.
fn on_lane(clock: Clock, store: Arc<HeldStore>, lane: usize) -> Shard {
    let policy = StorePolicy {
        deadline: Duration::from_secs(60),
        slow: Duration::from_secs(60),
        breaker_failures: 100,
        cooldown: Duration::from_secs(1),
        failure_mode: FailureMode::FailClosed,
        local_cache_bytes: 0,
        local_first: false,
        sync_interval: Duration::from_millis(100),
    };
    let budget = Arc::new(crate::limiter::queue_budget::QueueBudget::new(100));
    let stats = Arc::new(ShardStats::default());
    let r = Link::new(store, policy, lane, lane + 1, 1000, Arc::default());
    Shard::new(clock, budget, stats, Backing::Store(Box::new(r)), 1000)
}

/// Two round trips are out at once, not three; when the later one is back first, it waits,
/// and each message is judged on its own round trip's count, in the order they were sent.
#[tokio::test]
async fn round_trips_back_out_of_order_are_judged_in_the_order_sent() {
    let (clock, _) = Clock::manual(T0);
    let store = Arc::new(HeldStore::default());
    let mut shard = with_store(clock, store.clone());
    let mut done_rx = shard.take_done_rx().unwrap();
    let mut replies = Vec::new();
    for hits in [1, 2, 3] {
        let (tx, rx) = oneshot::channel();
        let mut d = decide(10, 60_000, None, ReplyTo::Caller(tx));
        d.ops[0].hits = hits;
        shard.decide_any(d);
        shard.tick();
        replies.push(rx);
    }
    assert_eq!(store.hits(), [vec![1], vec![2]], "two out; the third waits");

    // Redis counted the first call's 1 hit, then the second's 2: it answers the counts before.
    let p = decide(10, 60_000, None, ReplyTo::InPlace).ops[0].params;
    let before = |n| StoreReply {
        before: State::fresh(&p, T0).add(&p, T0, n),
        allowed: None,
        holds: Default::default(),
    };
    let mut held: Vec<_> = store.sent.lock().unwrap().drain(..).map(|s| s.1).collect();
    held.pop().unwrap().send(vec![before(1)]).unwrap();
    let second = done_rx.recv().await.unwrap();
    shard.store_done(second);
    assert!(
        replies[1].try_recv().is_err(),
        "the second waits for the first"
    );
    assert!(store.sent.lock().unwrap().is_empty(), "still two out");

    held.pop().unwrap().send(vec![before(0)]).unwrap();
    let first = done_rx.recv().await.unwrap();
    shard.store_done(first);
    let remaining = |r: Reply| (r.outcomes[0].over, r.outcomes[0].remaining);
    assert_eq!(remaining(replies[0].try_recv().unwrap()), (false, 9));
    assert_eq!(remaining(replies[1].try_recv().unwrap()), (false, 7));
    assert_eq!(
        store.hits(),
        [vec![3]],
        "the third went when the first two were judged"
    );
}

/// A round trip that fails is the store's error, counted by the store on the shard's lane; the
/// shard's own stats have no store error of their own to count.
#[tokio::test]
async fn a_failed_round_trip_is_counted_by_the_store_on_the_shards_lane() {
    let (clock, _) = Clock::manual(T0);
    let store = Arc::new(HeldStore::default());
    let mut shard = on_lane(clock, store.clone(), 3);
    let mut done_rx = shard.take_done_rx().unwrap();
    let (tx, rx) = oneshot::channel();
    shard.decide_any(decide(10, 60_000, None, ReplyTo::Caller(tx)));
    shard.tick();
    assert_eq!(store.hits(), [vec![1]]);
    assert!(store.failed.lock().unwrap().is_empty());

    // The store never answers: its round trip fails.
    store.sent.lock().unwrap().clear();
    let done = done_rx.recv().await.unwrap();
    shard.store_done(done);
    assert_eq!(*store.failed.lock().unwrap(), [3]);
    assert_eq!(
        rx.await.unwrap().hits,
        Hits::StoreFailed,
        "fail_closed: the caller is told the store failed"
    );
}

/// Reservations under any interleaving of checks, reports and time passing, on every
/// algorithm: a check is admitted only while what is used and held leaves room for its hold,
/// what is used and held passes the limit only by what reports used beyond the holds they
/// released, and holds are never released more often than they were made.
mod holds {
    use proptest::prelude::*;

    use super::*;
    use crate::limiter::op::{CountedHolds, Counting, Reservation};
    use crate::limiter::protocol::LookedUp;

    const LIMIT: u32 = 1000;
    const EACH: u32 = 300;

    #[derive(Debug, Clone)]
    enum Step {
        Check,
        Report(u64),
        Advance(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => Just(Step::Check),
            3 => (1u64..700).prop_map(Step::Report),
            1 => (1u64..400).prop_map(Step::Advance),
        ]
    }

    fn op(algorithm: Algorithm, hits: u64, reserve: Reservation) -> Op {
        Op {
            hits,
            reserve,
            counting: if hits == 0 {
                Counting::IfAdmitted
            } else {
                Counting::Usage
            },
            ..test_op("d_user_u_", algorithm, LIMIT, 86_400_000)
        }
    }

    fn message(op: Op) -> Decide {
        Decide {
            ops: vec![op],
            whole: true,
            global_shadow: false,
            may_wait: false,
            reply: ReplyTo::InPlace,
        }
    }

    fn look_up(shard: &mut Shard, algorithm: Algorithm) -> LookedUp {
        let (reply, mut rx) = oneshot::channel();
        let hold = Reservation::Counted(CountedHolds::Hold {
            hits: EACH,
            for_ms: 0,
            id: 0,
        });
        shard.handle(Msg::LookUp {
            op: op(algorithm, 0, hold),
            reply,
        });
        let peeking = rx.try_recv().expect("answered in place");
        peeking.here
    }

    proptest! {
        #[test]
        fn used_and_held_stay_within_the_limit_and_its_reports_excess(
            algorithm in prop_oneof![
                Just(Algorithm::FixedWindow),
                Just(Algorithm::SlidingWindow),
                Just(Algorithm::TokenBucket { burst: LIMIT }),
            ],
            steps in proptest::collection::vec(step(), 1..60),
        ) {
            let (clock, manual) = Clock::manual(T0);
            let stats = Arc::new(ShardStats::default());
            let budget = Arc::new(crate::limiter::queue_budget::QueueBudget::new(100));
            let mut shard = Shard::new(clock, budget, stats.clone(), Backing::Memory, 1000);
            let mut excess = 0u64;
            for (n, s) in steps.into_iter().enumerate() {
                let admitted = match s {
                    Step::Check => {
                        let hold = Reservation::Counted(CountedHolds::Hold { hits: EACH, for_ms: 600_000, id: n as u64 });
                        shard.decide_any(message(op(algorithm, 0, hold)));
                        Some(now(shard.take_answer()).committed())
                    }
                    Step::Report(r) => {
                        let released = stats.read().holds_reported;
                        let release = Reservation::Counted(CountedHolds::Release { hits: EACH });
                        shard.decide_any(message(op(algorithm, r, release)));
                        let _ = shard.take_answer();
                        let released = stats.read().holds_reported - released;
                        prop_assert!(released <= 1);
                        excess += r.saturating_sub(released * u64::from(EACH));
                        None
                    }
                    Step::Advance(secs) => {
                        manual.advance(Duration::from_secs(secs));
                        None
                    }
                };
                let found = look_up(&mut shard, algorithm);
                let p = op(algorithm, 0, Reservation::None).params;
                let total = found.state.used(&p, found.now) + found.held * u64::from(EACH);
                if admitted == Some(true) {
                    prop_assert!(total <= u64::from(LIMIT), "admitted at {total}");
                }
                prop_assert!(total <= u64::from(LIMIT) + excess, "{total} > {LIMIT} + {excess}");
                let c = stats.read();
                let ended = c.holds_reported + c.holds_expired + c.holds_withdrawn;
                prop_assert!(ended <= c.holds_made);
                prop_assert!(found.held <= c.holds_made - ended);
            }
        }
    }
}
