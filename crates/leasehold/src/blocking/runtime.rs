//! The runtime a blocking manager owns, and what its manager and guards share.

use std::future::Future;
use std::time::Duration;

use crate::core::{Error, Result};
use crate::LockManagerBuilder;

/// The name of the runtime's worker thread.
const THREAD_NAME: &str = "leasehold-blocking";
/// How long dropping the last handle waits for the runtime's blocking threads.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// What a manager and its guards share: the async manager and the runtime it runs on.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) manager: crate::LockManager,
    pub(super) handle: tokio::runtime::Handle,
    /// Kept for its `Drop`, after the manager's: the runtime stops last.
    _runtime: OwnedRuntime,
}

impl Shared {
    /// Starts a runtime of one worker thread, runs `make` on it and builds the manager there.
    pub(super) fn start<F, Fut>(make: F) -> Result<Self>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<LockManagerBuilder>>,
    {
        not_in_async()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(THREAD_NAME)
            .enable_all()
            .build()
            .map_err(|e| {
                Error::internal("could not start the blocking lock manager's runtime")
                    .with_source(e)
            })?;
        let handle = runtime.handle().clone();
        // Dropped without panicking if connecting fails.
        let runtime = OwnedRuntime(Some(runtime));
        let manager = handle.block_on(async move { make().await?.build() })?;
        Ok(Shared {
            manager,
            handle,
            _runtime: runtime,
        })
    }

    /// Runs `work` to completion on the calling thread, the runtime driving its background tasks.
    pub(super) fn block_on<F: Future>(&self, work: F) -> Result<F::Output> {
        not_in_async()?;
        Ok(self.handle.block_on(work))
    }

    /// Drops `value` inside the runtime's context, so whatever its `Drop` spawns (a background
    /// release) runs on the manager's runtime, from any thread.
    pub(super) fn drop_inside<T>(&self, value: T) {
        let _runtime = self.handle.enter();
        drop(value);
    }
}

impl Drop for Shared {
    /// Shuts the manager down, so releases of dropped guards finish before the runtime stops.
    ///
    /// Dropped inside async code, where this thread may not block, the shutdown and the runtime
    /// move to a thread of their own: the releases it waits for still run, instead of being cut
    /// off with the runtime (their locks would stay until their TTL).
    fn drop(&mut self) {
        if not_in_async().is_ok() {
            shut_down(&self.handle, &self.manager);
            return;
        }
        // Moved in its wrapper: should the thread not start, the closure's drop here stops the
        // runtime in the background instead of panicking in async code.
        let runtime = OwnedRuntime(self._runtime.0.take());
        let (handle, manager) = (self.handle.clone(), self.manager.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("{THREAD_NAME}-shutdown"))
            .spawn(move || {
                shut_down(&handle, &manager);
                drop(runtime); // off async code: waits for its blocking threads
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start a thread to shut the blocking lock manager \
                down; releases still in flight are cut off and their locks expire at their TTL");
        }
    }
}

/// The manager's shutdown on the runtime, from a thread that may block.
fn shut_down(handle: &tokio::runtime::Handle, manager: &crate::LockManager) {
    if let Err(error) = handle.block_on(manager.shutdown()) {
        tracing::warn!(error = %error.chain(), "shutting the blocking lock manager down failed");
    }
}

/// The runtime, shut down without panicking wherever the last handle is dropped.
#[derive(Debug)]
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            if not_in_async().is_ok() {
                runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
            } else {
                runtime.shutdown_background();
            }
        }
    }
}

/// The error of a blocking call made where a tokio runtime is current.
pub(super) fn not_in_async() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::invalid_argument(
            "the blocking API cannot be called from async code: use leasehold::LockManager",
        ));
    }
    Ok(())
}
