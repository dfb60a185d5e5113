//! Shards whose tasks run on this thread, so callers here decide synchronously, in place.

use std::cell::RefCell;
use std::rc::Rc;
use std::task::Waker;

use tokio::sync::mpsc;

use super::protocol::{Decide, Delivery, Msg};
use super::shard::Shard;

/// A shard with its mailbox, shared by the shard's task and by callers on the same thread.
///
/// The task and those callers take turns on one thread, never at once: a caller on the shard's
/// own thread decides synchronously (mailbox first, so earlier messages keep their order, then
/// its own message) instead of paying a message, a task switch and a wake-up. Callers on other
/// threads send messages that the task handles.
pub(crate) struct SameThreadShard {
    pub(crate) shard: Shard,
    pub(super) rx: mpsc::Receiver<Msg>,
    /// Set by a synchronous caller whose message moved the shard's next wake-up earlier.
    pub(super) poked: bool,
    pub(super) task: Option<Waker>,
}

impl SameThreadShard {
    pub(crate) fn new(shard: Shard, rx: mpsc::Receiver<Msg>) -> SameThreadShard {
        SameThreadShard {
            shard,
            rx,
            poked: false,
            task: None,
        }
    }

    /// Handles `msg` now, on the caller's thread, after whatever the mailbox already holds.
    pub(crate) fn handle_in_place(&mut self, msg: Msg) {
        self.after_mailbox(|shard| shard.handle(msg));
    }

    /// Decides `d` (sent with [`ReplyTo::InPlace`](super::protocol::ReplyTo::InPlace)) now, on the caller's thread, after whatever the
    /// mailbox already holds; returns its answer, or the channel it will come on if it is held.
    #[inline]
    pub(crate) fn decide_in_place(&mut self, d: Decide) -> Delivery {
        self.after_mailbox(|shard| shard.decide_any(d));
        self.shard.take_answer()
    }

    fn after_mailbox(&mut self, f: impl FnOnce(&mut Shard)) {
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

/// A shard whose task runs on this thread.
struct ThreadShard {
    /// The engine's id.
    engine: u64,
    /// The shard's index in its engine.
    index: usize,
    cell: Rc<RefCell<SameThreadShard>>,
}

thread_local! {
    /// The shards whose tasks run on this thread, so callers here can decide synchronously.
    static SHARDS_ON_THIS_THREAD: RefCell<Vec<ThreadShard>> = const { RefCell::new(Vec::new()) };
}

/// A shard listed in `SHARDS_ON_THIS_THREAD` while its task lives (until this is dropped).
pub(crate) struct OnThisThread {
    engine: u64,
    index: usize,
}

impl OnThisThread {
    pub(crate) fn new(
        engine: u64,
        index: usize,
        cell: Rc<RefCell<SameThreadShard>>,
    ) -> OnThisThread {
        let shard = ThreadShard {
            engine,
            index,
            cell,
        };
        SHARDS_ON_THIS_THREAD.with(|h| h.borrow_mut().push(shard));
        OnThisThread { engine, index }
    }
}

impl Drop for OnThisThread {
    fn drop(&mut self) {
        // The thread may be exiting, with its locals gone already.
        let _ = SHARDS_ON_THIS_THREAD.try_with(|h| {
            h.borrow_mut()
                .retain(|s| (s.engine, s.index) != (self.engine, self.index))
        });
    }
}

/// Shard `index` of engine `engine`, if its task runs on this thread.
pub(crate) fn find_on_this_thread(
    engine: u64,
    index: usize,
) -> Option<Rc<RefCell<SameThreadShard>>> {
    SHARDS_ON_THIS_THREAD
        .try_with(|h| {
            h.borrow()
                .iter()
                .find(|s| s.engine == engine && s.index == index)
                .map(|s| s.cell.clone())
        })
        .ok()
        .flatten()
}
