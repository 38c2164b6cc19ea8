//! Release notifications: how a store that can tell when a lock is released (Redis pub/sub, the
//! embedded store) wakes the waiters of this process, so they need not poll.

use std::fmt;
use std::sync::Arc;

use tokio::sync::Notify;

/// A waiter's registration for "the lock on this key may be free for you now", from
/// [`LockStore::watch`](crate::LockStore::watch).
///
/// Obtained *before* the first attempt and kept for the whole wait, so a release between a failed
/// attempt and the sleep is never missed: each round enables [`notify`](Self::notify)'s
/// `notified()` before attempting. A store without notifications returns [`ReleaseWatch::none`],
/// which never fires: the waiter then polls (shaped by
/// [`Error::retry_after`](crate::Error::retry_after)). A notification is a hint, never a promise:
/// the waiter always tries the store again, and a lost notification only costs a poll interval.
///
/// Dropping the watch ends the registration (the store may then unsubscribe, or take this
/// process out of its waiter queue).
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
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl ReleaseWatch {
    /// A watch that never fires: the store has no notifications (or could not subscribe).
    pub fn none() -> Self {
        ReleaseWatch {
            notify: Arc::new(Notify::new()),
            live: false,
            on_drop: None,
        }
    }

    /// A watch fired through `notify` (with `notify_waiters`); `on_drop` runs when it is dropped.
    pub fn new(notify: Arc<Notify>, on_drop: impl FnOnce() + Send + Sync + 'static) -> Self {
        ReleaseWatch {
            notify,
            live: true,
            on_drop: Some(Box::new(on_drop)),
        }
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
        if let Some(on_drop) = self.on_drop.take() {
            on_drop();
        }
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("live", &self.live)
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
}
