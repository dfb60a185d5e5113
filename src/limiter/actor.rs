//! The shard's task: batches of mail, the store's round trips, queue events and the sweep.

use std::cell::RefCell;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use super::same_thread::SameThreadShard;

/// What woke the shard's task.
enum Woke {
    /// Messages arrived (in the buffer); 0 means every sender is gone.
    Mail(usize),
    /// A synchronous caller changed when the shard must next wake.
    Poked,
}

/// The actor loop: batches of messages, then due queue events and the expiry sweep. The shard
/// is borrowed only between awaits, so callers on this thread can use it meanwhile.
pub(crate) async fn run(cell: Rc<RefCell<SameThreadShard>>) {
    let mut buf = Vec::with_capacity(64);
    let (mut changes, mut done_rx) = {
        let mut l = cell.borrow_mut();
        let changes = l.shard.clock().changes();
        let done_rx = l.shard.take_done_rx();
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
                let delay = wake_at.saturating_sub(l.shard.clock().now());
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
            Some(done) = async { done_rx.as_mut().expect("store mode").recv().await }, if done_rx.is_some() => {
                cell.borrow_mut().shard.store_done(done);
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
