//! The durable counters' journal (`TURNSTILE_STATE_DIR`) on a thread of its own: it saves what
//! changed once per interval, and at the stop saves once more, after the last answer and
//! before the shards stop, so a graceful stop loses nothing.

use std::thread::JoinHandle;

use super::worker::Stopping;
use super::{runtime, StartError};
use crate::durable::Journal;
use crate::limiter::Engine;

/// Starts the journal's thread, saving `engine`'s shards; it ends after the last save.
pub(super) fn spawn(
    mut journal: Journal,
    engine: Engine,
    stopping: Stopping,
) -> Result<JoinHandle<()>, StartError> {
    let rt = runtime()?;
    std::thread::Builder::new()
        .name("turnstile-journal".into())
        .spawn(move || {
            rt.block_on(async move {
                journal.run(&engine, stopping.stop.clone()).await;
                // Past the barrier every call is answered (the workers' and the admin ports'):
                // the last save loses nothing. The shards wait for it at `saved`.
                stopping.barrier.wait().await;
                journal.save(&engine).await;
                stopping.saved.wait().await;
            })
        })
        .map_err(StartError::Runtime)
}
