//! Change notifications: how a store that can tell when a lock changes hands (etcd's watch, the
//! embedded store, Redis pub/sub) wakes the observers of this process, so they need not poll.

use std::fmt;
use std::sync::Arc;

use tokio::sync::Notify;

/// An observer's registration for "the lock on this key may have changed hands", from
/// [`LockStore::watch_changes`](crate::LockStore::watch_changes).
///
/// Unlike a [`ReleaseWatch`](crate::ReleaseWatch), it never waits for the lock: it takes no place
/// in any waiter line and is fired on grants as well as releases. It exists for readers of who
/// holds a lock (an election's observers): enable [`notify`](Self::notify)'s `notified()` before
/// each read, and read again when it fires. A notification is a hint, never a promise: a store
/// may fire when nothing changed, and a lost notification (a dropped subscription) is only
/// noticed at the reader's next timed read, so readers keep reading now and then even with a live
/// watch. A lock that lapses at its TTL is announced only by stores whose records expire with an
/// event (etcd); readers read again when the lease they saw runs out. Redis announces only the
/// locks taken with [`Acquire::announce`](crate::Acquire::announce) (an election's).
///
/// Dropping the watch ends the registration (the store may then unsubscribe).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use leasehold_core::ChangeWatch;
/// let notify = Arc::new(tokio::sync::Notify::new());
/// let watch = ChangeWatch::new(notify.clone(), || {});
/// let changed = watch.notify().notified();
/// tokio::pin!(changed);
/// changed.as_mut().enable(); // registered before the read
/// notify.notify_waiters();   // the store saw a grant or a release
/// changed.await;
/// assert!(!ChangeWatch::none().is_live());
/// # }
/// ```
pub struct ChangeWatch {
    notify: Arc<Notify>,
    live: bool,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl ChangeWatch {
    /// A watch that never fires: the store has no change notifications (or could not subscribe).
    pub fn none() -> Self {
        ChangeWatch {
            notify: Arc::new(Notify::new()),
            live: false,
            on_drop: None,
        }
    }

    /// A watch fired through `notify` (with `notify_waiters`); `on_drop` runs when it is dropped.
    pub fn new(notify: Arc<Notify>, on_drop: impl FnOnce() + Send + Sync + 'static) -> Self {
        ChangeWatch {
            notify,
            live: true,
            on_drop: Some(Box::new(on_drop)),
        }
    }

    /// What to wait on: enable `notify().notified()` before each read.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }

    /// Whether the store will notify at all (`false` for [`ChangeWatch::none`]).
    pub fn is_live(&self) -> bool {
        self.live
    }
}

impl Drop for ChangeWatch {
    fn drop(&mut self) {
        if let Some(on_drop) = self.on_drop.take() {
            on_drop();
        }
    }
}

impl fmt::Debug for ChangeWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeWatch")
            .field("live", &self.live)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn dropping_the_watch_runs_its_hook_once_and_none_has_no_hook() {
        let drops = Arc::new(AtomicUsize::new(0));
        let counter = drops.clone();
        let watch = ChangeWatch::new(Arc::new(Notify::new()), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        assert!(watch.is_live());
        drop(watch);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        let none = ChangeWatch::none();
        assert!(!none.is_live());
        drop(none);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
