//! Wake-ups for tasks of this process waiting on a key: a release wakes them at once instead of
//! leaving them to their backoff sleep.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::core::LockKey;
use crate::KeyMap;

/// Key → `Notify` for the tasks currently waiting on that key. Entries exist only while someone
/// waits.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    map: KeyMap<Arc<Notify>>,
}

impl Waiters {
    /// Registers interest in `key` until the returned subscription is dropped.
    pub(crate) fn subscribe<'a>(&'a self, key: &LockKey) -> Subscription<'a> {
        let notify = self.map.entry(key.clone()).or_default().clone();
        Subscription {
            waiters: self,
            key: key.clone(),
            notify: Some(notify),
        }
    }

    /// Wakes every task waiting on `key`.
    pub(crate) fn wake(&self, key: &LockKey) {
        if let Some(notify) = self.map.get(key) {
            notify.notify_waiters();
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// One task's interest in a key.
#[derive(Debug)]
pub(crate) struct Subscription<'a> {
    waiters: &'a Waiters,
    key: LockKey,
    notify: Option<Arc<Notify>>,
}

impl Subscription<'_> {
    pub(crate) fn notify(&self) -> &Notify {
        self.notify.as_deref().expect("present until drop")
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        drop(self.notify.take());
        // The map's own reference is the last one: nobody waits any more.
        self.waiters
            .map
            .remove_if(&self.key, |_, notify| Arc::strong_count(notify) == 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn entries_live_only_while_someone_waits() {
        let waiters = Waiters::default();
        let key = LockKey::xdc("c", "e").unwrap();
        let a = waiters.subscribe(&key);
        let b = waiters.subscribe(&key);
        assert_eq!(waiters.len(), 1);
        drop(a);
        assert_eq!(waiters.len(), 1, "b still waits");
        drop(b);
        assert_eq!(waiters.len(), 0, "cancelled waiters leave nothing behind");
    }

    #[tokio::test]
    async fn wake_reaches_an_enabled_waiter() {
        let waiters = Waiters::default();
        let key = LockKey::xdc("c", "e").unwrap();
        let sub = waiters.subscribe(&key);
        let woken = sub.notify().notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        waiters.wake(&key);
        tokio::time::timeout(std::time::Duration::from_secs(5), woken)
            .await
            .expect("woken");
    }
}
