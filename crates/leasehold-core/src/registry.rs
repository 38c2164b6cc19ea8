//! The notification registry a store keeps for the keys this process listens on: per key, one
//! wake-up every registration on the key shares, how many registrations there are, and what the
//! store keeps for the key while anyone listens (a subscription's state, a watch stream's task,
//! a place in a line).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// Keys this process listens on, each with a shared wake-up, a count of its registrations and
/// the store's state `S` for it. The entry lives from the first registration on a key to the
/// last one's [`unregister`](Self::unregister), which hands the state back for clean-up (a
/// subscription to end, a task to stop, a place to leave).
///
/// The wake-up is fired with `notify_waiters`, never `notify_one`: a wake-up is a hint for the
/// tasks listening now, never stored for one that is not (it re-reads before it listens again).
/// What the registry's closures run under is its one lock: keep them short, and never call the
/// registry (or anything that takes a lock another registry call holds) from inside them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use leasehold_core::NotifyRegistry;
///
/// // A store that counts the subscriptions it made, one per key.
/// let registry: NotifyRegistry<bool> = NotifyRegistry::new();
/// let (wakeup, subscribed) = registry.register("k", |_| false, |subscribed, _| *subscribed);
/// assert!(!subscribed, "first registration: the caller subscribes");
/// registry.with("k", |subscribed| *subscribed = true);
/// let (_, subscribed) = registry.register("k", |_| false, |subscribed, _| *subscribed);
/// assert!(subscribed, "the second one finds the subscription");
///
/// let woken = wakeup.notified();
/// tokio::pin!(woken);
/// woken.as_mut().enable();
/// assert!(registry.wake("k"));
/// woken.await;
///
/// assert_eq!(registry.unregister("k"), None, "one registration left");
/// assert_eq!(registry.unregister("k"), Some(true), "the last one gets the state back");
/// assert!(registry.is_empty());
/// # }
/// ```
pub struct NotifyRegistry<S> {
    entries: Mutex<HashMap<String, Entry<S>>>,
}

struct Entry<S> {
    wakeup: Arc<Notify>,
    registrations: usize,
    state: S,
}

impl<S> NotifyRegistry<S> {
    /// An empty registry.
    pub fn new() -> Self {
        NotifyRegistry {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry<S>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers one listener on `key`: the key's entry is made with `init` (given the new
    /// wake-up) if nobody listens on it yet; then `then` reads or updates the entry's state.
    /// Returns the key's wake-up and what `then` returned. Every registration is undone by one
    /// [`unregister`](Self::unregister).
    pub fn register<R>(
        &self,
        key: &str,
        init: impl FnOnce(&Arc<Notify>) -> S,
        then: impl FnOnce(&mut S, &Arc<Notify>) -> R,
    ) -> (Arc<Notify>, R) {
        let mut entries = self.lock();
        let entry = match entries.get_mut(key) {
            Some(entry) => entry,
            None => {
                let wakeup = Arc::new(Notify::new());
                let state = init(&wakeup);
                entries.entry(key.to_owned()).or_insert(Entry {
                    wakeup,
                    registrations: 0,
                    state,
                })
            }
        };
        entry.registrations += 1;
        let out = then(&mut entry.state, &entry.wakeup);
        (entry.wakeup.clone(), out)
    }

    /// Undoes one registration on `key`. The last one removes the key's entry and returns its
    /// state, for the store to clean up after; `None` while others listen (or if nobody did).
    pub fn unregister(&self, key: &str) -> Option<S> {
        let mut entries = self.lock();
        let entry = entries.get_mut(key)?;
        entry.registrations = entry.registrations.saturating_sub(1);
        if entry.registrations > 0 {
            return None;
        }
        entries.remove(key).map(|entry| entry.state)
    }

    /// Runs `f` on `key`'s state, if anyone listens on the key.
    pub fn with<R>(&self, key: &str, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        self.lock().get_mut(key).map(|entry| f(&mut entry.state))
    }

    /// Wakes every task listening on `key` now. Returns whether anyone is registered on it.
    pub fn wake(&self, key: &str) -> bool {
        match self.lock().get(key) {
            Some(entry) => {
                entry.wakeup.notify_waiters();
                true
            }
            None => false,
        }
    }

    /// Runs `f` on every key's state and wake-up (to update each, wake each, or both).
    pub fn for_each(&self, mut f: impl FnMut(&str, &mut S, &Notify)) {
        for (key, entry) in self.lock().iter_mut() {
            f(key, &mut entry.state, &entry.wakeup);
        }
    }

    /// How many registrations `key` has (0: nobody listens on it).
    pub fn registrations(&self, key: &str) -> usize {
        self.lock().get(key).map_or(0, |entry| entry.registrations)
    }

    /// Whether anyone listens on `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// How many keys are listened on.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no key is listened on.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl<S> Default for NotifyRegistry<S> {
    fn default() -> Self {
        NotifyRegistry::new()
    }
}

impl<S> fmt::Debug for NotifyRegistry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotifyRegistry")
            .field("keys", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_runs_once_per_entry_and_the_state_outlives_all_but_the_last_registration() {
        let registry: NotifyRegistry<u32> = NotifyRegistry::new();
        let mut made = 0;
        for _ in 0..3 {
            registry.register(
                "k",
                |_| {
                    made += 1;
                    7
                },
                |_, _| (),
            );
        }
        assert_eq!(made, 1);
        assert_eq!(registry.registrations("k"), 3);
        assert_eq!(registry.unregister("k"), None);
        assert_eq!(registry.unregister("k"), None);
        assert_eq!(registry.unregister("k"), Some(7));
        assert_eq!(registry.unregister("k"), None, "nothing left to undo");
        assert!(!registry.contains("k"));
        // A new first registration makes a new entry.
        registry.register("k", |_| 8, |_, _| ());
        assert_eq!(registry.with("k", |s| *s), Some(8));
    }

    #[test]
    fn every_registration_on_a_key_shares_one_wakeup() {
        let registry: NotifyRegistry<()> = NotifyRegistry::new();
        let (a, ()) = registry.register("k", |_| (), |_, _| ());
        let (b, ()) = registry.register("k", |_| (), |_, _| ());
        let (c, ()) = registry.register("other", |_| (), |_, _| ());
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(!registry.wake("nobody"));
    }

    #[test]
    fn for_each_reaches_every_key() {
        let registry: NotifyRegistry<bool> = NotifyRegistry::new();
        registry.register("a", |_| true, |_, _| ());
        registry.register("b", |_| true, |_, _| ());
        registry.for_each(|_, subscribed, _| *subscribed = false);
        assert_eq!(registry.with("a", |s| *s), Some(false));
        assert_eq!(registry.with("b", |s| *s), Some(false));
        assert_eq!(registry.len(), 2);
    }
}
