//! The shard decided in place by a caller on its own thread.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::config::{Algorithm, QueueSpec};
use crate::descriptor::key_hash;
use crate::limiter::{Op, Params, Role};

const T0: u64 = 1_700_000_000 * NS_PER_SEC;

fn local(clock: Clock) -> (SameThreadShard, mpsc::Sender<Msg>) {
    let (tx, rx) = mpsc::channel(16);
    let budget = Arc::new(crate::limiter::waiters::WaiterBudget::new(100));
    let shard = Shard::new(clock, budget, Arc::new(ShardStats::default()), None, 1000);
    (SameThreadShard::new(shard, rx), tx)
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
            local_first: None,
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
    let Answer::Later(mut rx) = l.decide_in_place(decide(1, 500, queue, ReplyTo::InPlace)) else {
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
