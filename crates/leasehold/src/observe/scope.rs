//! The scenario of the lock operation in progress, for observers.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static SCENARIO: Arc<str>;
}

std::thread_local! {
    /// The scenario of an event emitted outside its operation's task ([`with_scenario`]): a
    /// std thread local, whose `try_with` never panics, even while the thread's locals are
    /// being destroyed (where a task-local scope cannot be entered).
    static EMITTING_IN: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
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
    EMITTING_IN
        .try_with(|emitting| emitting.borrow().clone())
        .ok()
        .flatten()
        .or_else(|| SCENARIO.try_with(Arc::clone).ok())
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
            Some(scenario) => in_scenario(scenario, fut).await,
            None => fut.await,
        }
    }
}

/// Runs `f` with `scenario` as the current scenario (an event emitted outside the call's task,
/// on any thread). Where the thread's locals are gone, `f` runs without it.
pub(crate) fn with_scenario<R>(scenario: Arc<str>, f: impl FnOnce() -> R) -> R {
    /// Puts the scenario before back, also when `f` panics.
    struct Restore(Option<Arc<str>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            let _ = EMITTING_IN.try_with(|emitting| *emitting.borrow_mut() = before);
        }
    }
    let Ok(before) = EMITTING_IN.try_with(|emitting| emitting.replace(Some(scenario))) else {
        return f();
    };
    let _restore = Restore(before);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_outside_a_task_carries_its_scenario_and_restores_the_one_before() {
        assert_eq!(current_scenario(), None);
        with_scenario("a".into(), || {
            assert_eq!(current_scenario().as_deref(), Some("a"));
            with_scenario("b".into(), || {
                assert_eq!(current_scenario().as_deref(), Some("b"));
            });
            assert_eq!(current_scenario().as_deref(), Some("a"));
        });
        assert_eq!(current_scenario(), None);
        // A thread with no runtime at all.
        let seen = std::thread::spawn(|| with_scenario("c".into(), current_scenario))
            .join()
            .unwrap();
        assert_eq!(seen.as_deref(), Some("c"));
        // A panic inside still puts the one before back.
        let _ = std::panic::catch_unwind(|| with_scenario("d".into(), || panic!("observer")));
        assert_eq!(current_scenario(), None);
    }

    #[tokio::test]
    async fn an_event_outside_its_task_wins_over_the_task_it_is_emitted_from() {
        in_scenario("task".into(), async {
            assert_eq!(current_scenario().as_deref(), Some("task"));
            with_scenario("guard".into(), || {
                assert_eq!(current_scenario().as_deref(), Some("guard"));
            });
            assert_eq!(current_scenario().as_deref(), Some("task"));
        })
        .await;
    }
}
