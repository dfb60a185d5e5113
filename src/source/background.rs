//! Building a config off the threads that answer calls. A config of a few hundred thousand
//! descriptors takes seconds of CPU to read and build; on a machine with few cores that time
//! would be taken from the workers, and calls would wait behind it. Each build runs on a thread
//! of its own at the lowest CPU priority (nice 19), so it gets what the workers leave: on an
//! idle machine it runs at full speed, under load it slows down instead of the calls.

use tokio::sync::oneshot;

/// The lowest priority a Linux thread can ask for without privileges.
const NICEST: i32 = 19;

/// The build thread's stack: the main thread's, on which the first config is built at start, so
/// a config nested as deep as the YAML reader allows loads on either.
const STACK: usize = 8 << 20;

/// Runs `build` on a new thread at the lowest CPU priority and waits for its result; `Err`
/// says why it did not finish (the thread could not be started, or `build` panicked).
pub async fn in_background<T, F>(build: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("turnstile-load".into())
        .stack_size(STACK)
        .spawn(move || {
            lower_own_priority();
            let _ = tx.send(build());
        })
        .map_err(|e| format!("cannot start a thread to build the config: {e}"))?;
    rx.await
        .map_err(|_| "the config's build stopped before it finished".to_owned())
}

/// Sets the calling thread's nice value (Linux keeps one per thread) to the lowest priority.
/// Best effort: where it is not allowed, the build runs at the priority it has.
fn lower_own_priority() {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), NICEST) {
        tracing::debug!(error = %e, "config build runs at normal priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_build_runs_on_a_thread_of_the_lowest_priority() {
        let (name, nice) = in_background(|| {
            let tid = rustix::thread::gettid();
            let nice = rustix::process::getpriority_process(Some(tid)).unwrap();
            (std::thread::current().name().map(str::to_owned), nice)
        })
        .await
        .unwrap();
        assert_eq!(name.as_deref(), Some("turnstile-load"));
        assert_eq!(nice, NICEST);
        // The caller's own thread keeps its priority.
        let own = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        assert!(own < NICEST, "the caller's thread was lowered too: {own}");
    }

    #[tokio::test]
    async fn a_build_that_panics_is_an_error_not_a_hang() {
        let r: Result<(), String> = in_background(|| panic!("boom")).await;
        assert_eq!(
            r.unwrap_err(),
            "the config's build stopped before it finished"
        );
    }
}
