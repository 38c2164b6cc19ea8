//! The scenario of the lock operation in progress, for observers.

use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static SCENARIO: Arc<str>;
}

/// The scenario of the lock operation whose event is being observed: the manager runs every
/// acquisition, release and renewal of a lock with its scenario set, so an
/// [`Observer`](crate::Observer) (called inline) can label what it records. `None` outside a
/// lock operation.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use leasehold::{LockEvent, LockManager, LockOptions};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let sink = seen.clone();
/// let locks = LockManager::builder().client_id("app").farm_id("f1")
///     .observer(move |e: &LockEvent| {
///         let scenario = leasehold::observe::current_scenario();
///         sink.lock().unwrap().push((e.name(), scenario.map(|s| s.to_string())));
///     })
///     .build()?;
/// locks.try_lock_with("k", LockOptions::new().scenario("checkout")).await?.release().await?;
/// let seen = seen.lock().unwrap();
/// assert_eq!(seen[0], ("acquired", Some("checkout".to_owned())));
/// assert_eq!(seen[1], ("released", Some("checkout".to_owned())));
/// # Ok(()) }
/// ```
pub fn current_scenario() -> Option<Arc<str>> {
    SCENARIO.try_with(Arc::clone).ok()
}

/// Runs `fut` with `scenario` as the current scenario.
pub(crate) async fn in_scenario<F: Future>(scenario: Arc<str>, fut: F) -> F::Output {
    SCENARIO.scope(scenario, fut).await
}

/// `fut`, run later (on a task of its own: tasks do not inherit the scope) in the scenario
/// current now, if any.
pub(crate) fn keeping_scenario<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    let scenario = current_scenario();
    async move {
        match scenario {
            Some(scenario) => SCENARIO.scope(scenario, fut).await,
            None => fut.await,
        }
    }
}

/// Runs `f` with `scenario` as the current scenario (an event emitted outside the call's task).
pub(crate) fn with_scenario<R>(scenario: Arc<str>, f: impl FnOnce() -> R) -> R {
    SCENARIO.sync_scope(scenario, f)
}
