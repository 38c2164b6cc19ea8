//! Release notifications: how a store that can tell when a lock is released (Redis pub/sub, the
//! embedded store) wakes the waiters of this process, so they need not poll.

use std::fmt;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::acquire::WaiterId;

/// A waiter's registration for "the lock on this key may be free for you now", from
/// [`LockStore::watch`](crate::LockStore::watch).
///
/// Obtained *before* the first attempt and kept for the whole wait, so a release between a failed
/// attempt and the sleep is never missed: each round enables [`notify`](Self::notify)'s
/// `notified()` before attempting. A store without notifications returns [`ReleaseWatch::none`],
/// which never fires: the waiter then polls (shaped by the refusal's
/// [`retry_after`](crate::Attempt::retry_after)). A notification is a hint, never a promise:
/// the waiter always tries the store again, and a lost notification only costs a poll interval.
///
/// Dropping the watch ends the registration (the store may then unsubscribe, or take this
/// process out of its waiter queue; local competition stops offering released leases to it).
///
/// A store wakes *every* waiter of this process on the key (`notify_waiters`), never picks one:
/// which task of the process asks the store next is the manager's decision (the head of the
/// process's line for the key, in arrival order), and a wake-up given to a task that is not
/// listening would be lost.
///
/// Each watch carries a fresh [`WaiterId`]: the blocking acquisition it belongs to, which the
/// manager puts on every attempt ([`Acquire::waiter`](crate::Acquire::waiter)).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use leasehold_core::ReleaseWatch;
/// let notify = Arc::new(tokio::sync::Notify::new());
/// let watch = ReleaseWatch::new(notify.clone(), || {});
/// let woken = watch.notify().notified();
/// tokio::pin!(woken);
/// woken.as_mut().enable();   // registered before the attempt
/// notify.notify_waiters();    // the store saw a release
/// woken.await;
/// assert!(!ReleaseWatch::none().is_live());
/// # }
/// ```
pub struct ReleaseWatch {
    notify: Arc<Notify>,
    live: bool,
    waiter: WaiterId,
    on_drop: Vec<Box<dyn FnOnce() + Send + Sync>>,
}

impl ReleaseWatch {
    /// A watch that never fires: the store has no notifications (or could not subscribe).
    pub fn none() -> Self {
        ReleaseWatch {
            notify: Arc::new(Notify::new()),
            live: false,
            waiter: WaiterId::new(),
            on_drop: Vec::new(),
        }
    }

    /// A watch fired through `notify` (with `notify_waiters`); `on_drop` runs when it is dropped.
    pub fn new(notify: Arc<Notify>, on_drop: impl FnOnce() + Send + Sync + 'static) -> Self {
        ReleaseWatch {
            notify,
            live: true,
            waiter: WaiterId::new(),
            // Room for a layer's hook too (local competition's hand-off adds one), without a
            // regrowth.
            on_drop: {
                let mut hooks: Vec<Box<dyn FnOnce() + Send + Sync>> = Vec::with_capacity(2);
                hooks.push(Box::new(on_drop));
                hooks
            },
        }
    }

    /// The same watch, with `on_drop` run too when it is dropped (after the hooks it had): how a
    /// layer adds what it must undo when the waiter leaves.
    pub fn also_on_drop(mut self, on_drop: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.on_drop.push(Box::new(on_drop));
        self
    }

    /// The blocking acquisition this watch registers (fresh per watch).
    pub fn waiter(&self) -> WaiterId {
        self.waiter
    }

    /// What to wait on: enable `notify().notified()` before each attempt.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }

    /// Whether the store will notify at all (`false` for [`ReleaseWatch::none`]).
    pub fn is_live(&self) -> bool {
        self.live
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        for on_drop in self.on_drop.drain(..) {
            on_drop();
        }
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("live", &self.live)
            .field("waiter", &self.waiter)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn dropping_the_watch_runs_its_hook_once() {
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = dropped.clone();
        let watch = ReleaseWatch::new(Arc::new(Notify::new()), move || {
            assert!(!flag.swap(true, Ordering::SeqCst), "only once");
        });
        assert!(watch.is_live());
        drop(watch);
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[test]
    fn added_hooks_run_after_the_stores_and_the_waiter_is_kept() {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (first, second) = (order.clone(), order.clone());
        let watch = ReleaseWatch::new(Arc::new(Notify::new()), move || {
            first.lock().unwrap().push("store")
        });
        let waiter = watch.waiter();
        let watch = watch.also_on_drop(move || second.lock().unwrap().push("layer"));
        assert_eq!(watch.waiter(), waiter, "the same wait");
        assert_ne!(
            ReleaseWatch::none().waiter(),
            waiter,
            "every watch is a new waiter"
        );
        drop(watch);
        assert_eq!(*order.lock().unwrap(), ["store", "layer"]);
        let none = ReleaseWatch::none().also_on_drop({
            let order = order.clone();
            move || order.lock().unwrap().push("none")
        });
        assert!(!none.is_live(), "adding a hook keeps a silent watch silent");
        drop(none);
        assert_eq!(order.lock().unwrap().last(), Some(&"none"));
    }
}
