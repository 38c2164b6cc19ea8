//! Change announcements: how readers of who holds a lock (an election's observers, through
//! [`LockStore::watch_changes`](leasehold_core::LockStore::watch_changes)) hear that the lock on a
//! key changed hands, without taking a place in its waiter line.
//!
//! Every script that grants a hold (exclusive, fair, reader, semaphore permit) or releases one
//! publishes, in the same script, the token granted or released on the key's change channel
//! `<prefix>changed:<lock key>` (on a cluster with `SPUBLISH`: the channel carries the lock's hash
//! tag, so it stays on the lock's shard). An extend changes no holder and announces nothing.
//!
//! This process subscribes to a key's channel once, on the store's subscriber connection (see
//! [`super::subscriber`]), while any [`ChangeWatch`] on the key lives: the watches share one
//! wake-up, and the last one dropped unsubscribes at once (an observer watches for as long as it
//! observes, so there is no churn a lingering subscription would save). The connection's
//! machinery remakes the subscriptions after a reconnect or a failover, as it does for release
//! announcements.
//!
//! A message is a hint: a lost one (a dropped connection, a publish during a failover) only
//! delays a reader until its next timed read, and every dropped connection fires the watches, so
//! readers read again at once.
//!
//! The observed keys' data ([`Changes`] and each key's entry) is defined in [`super::state`];
//! this module is what is done with it.

use std::sync::Arc;

use leasehold_core::{ChangeWatch, NotifyRegistry};
use tokio::sync::Notify;

use super::state::{Changes, Waiting};
use super::subscriber::RECONNECT_PAUSES;

impl Changes {
    pub(crate) fn new(prefix: &str) -> Self {
        Changes {
            channel_prefix: format!("{prefix}changed:"),
            observed: NotifyRegistry::new(),
        }
    }

    /// The change channel of a lock (the scripts' `KEYS` argument): shares the Redis lock key's
    /// hash tag, so a cluster keeps it on the lock's shard.
    pub(crate) fn channel(&self, lock_key: &str) -> String {
        [self.channel_prefix.as_str(), lock_key].concat()
    }

    /// The Redis lock key of a change channel, if `channel` is one.
    pub(crate) fn lock_key_of<'a>(&self, channel: &'a str) -> Option<&'a str> {
        channel.strip_prefix(&self.channel_prefix)
    }

    /// Whether anyone here observes `lock_key` (`None`: any key).
    pub(crate) fn observed(&self, lock_key: Option<&str>) -> bool {
        match lock_key {
            Some(key) => self.observed.contains(key),
            None => !self.observed.is_empty(),
        }
    }

    /// The channels of every observed key, for a subscriber connection being made.
    pub(crate) fn channels(&self) -> Vec<(String, String)> {
        let mut channels = Vec::new();
        self.observed
            .for_each(|key, _, _| channels.push((key.to_owned(), self.channel(key))));
        channels
    }

    /// The channels of every observed key whose channel is subscribed now.
    pub(crate) fn subscribed_channels(&self) -> Vec<String> {
        let mut channels = Vec::new();
        self.observed.for_each(|key, subscribed, _| {
            if *subscribed {
                channels.push(self.channel(key));
            }
        });
        channels
    }

    /// Marks `lock_keys` subscribed (those still observed).
    pub(crate) fn mark_subscribed<'a>(&self, lock_keys: impl IntoIterator<Item = &'a str>) {
        for key in lock_keys {
            self.observed.with(key, |subscribed| *subscribed = true);
        }
    }

    /// Wakes every reader (a message may have been lost); with `unsubscribed`, the subscriptions
    /// went with the connection too.
    pub(crate) fn wake_all(&self, unsubscribed: bool) {
        self.observed.for_each(|_, subscribed, changed| {
            if unsubscribed {
                *subscribed = false;
            }
            changed.notify_waiters();
        });
    }

    /// A message on `channel`: wakes the key's readers. Returns whether it was a change channel.
    pub(crate) fn deliver(&self, channel: &str) -> bool {
        let Some(lock_key) = self.lock_key_of(channel) else {
            return false;
        };
        self.observed.wake(lock_key);
        true
    }

    /// Adds a watch on `lock_key`: its wake-up, and whether the key's channel is subscribed.
    fn register(&self, lock_key: &str) -> (Arc<Notify>, bool) {
        self.observed
            .register(lock_key, |_| false, |subscribed, _| *subscribed)
    }

    /// Removes a watch on `lock_key`. Returns whether it was the last one (the key is forgotten).
    fn unregister(&self, lock_key: &str) -> bool {
        self.observed.unregister(lock_key).is_some()
    }

    /// Marks `lock_key` unsubscribed and wakes its readers; whether anyone still observes it.
    fn ended(&self, lock_key: &str) -> bool {
        if self
            .observed
            .with(lock_key, |subscribed| *subscribed = false)
            .is_none()
        {
            return false;
        }
        self.observed.wake(lock_key)
    }

    /// Whether `lock_key` is observed and its channel not subscribed.
    fn wanted(&self, lock_key: &str) -> bool {
        self.observed
            .with(lock_key, |subscribed| !*subscribed)
            .unwrap_or(false)
    }
}

impl Waiting {
    /// Registers a reader of `lock_key`'s holder; unless the key's channel is subscribed already
    /// (another watch on it lives), subscribes to it, confirmed before this returns, so no grant
    /// or release after it is missed. A store that cannot subscribe (made from a connection
    /// manager) or a subscription that fails gives [`ChangeWatch::none`]: the reader polls.
    ///
    /// Cancel safe: the watch exists before the subscription is sent, so a caller that stops
    /// waiting drops it, and with it the registration.
    pub(crate) async fn watch_changes(self: &Arc<Self>, lock_key: String) -> ChangeWatch {
        if !self.can_subscribe() {
            return ChangeWatch::none();
        }
        let changes = self.changes();
        let (changed, subscribed) = changes.register(&lock_key);
        let waiting = self.clone();
        let key = lock_key.clone();
        let watch = ChangeWatch::new(changed, move || waiting.unwatch_changes(&key));
        if subscribed {
            return watch;
        }
        let dropped = self.drops();
        match self.subscribe(changes.channel(&lock_key)).await {
            Ok(()) => {
                // A connection dropped meanwhile took the subscription with it; its remake
                // subscribes every observed key, this one too.
                if self.drops() == dropped {
                    changes.mark_subscribed([lock_key.as_str()]);
                }
                watch
            }
            Err(error) => {
                tracing::debug!(key = %lock_key, %error,
                    "could not subscribe to change announcements; the reader polls");
                drop(watch);
                ChangeWatch::none()
            }
        }
    }

    /// A watch on `lock_key` was dropped: the last one ends the key's subscription, in the
    /// background (a watch is dropped in synchronous code).
    fn unwatch_changes(self: &Arc<Self>, lock_key: &str) {
        if !self.changes().unregister(lock_key) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to send it from: the channel stays subscribed, and its messages,
            // for a key nobody observes, are ignored until the connection goes.
            return;
        };
        let waiting = self.clone();
        let lock_key = lock_key.to_owned();
        runtime.spawn(async move {
            let changes = waiting.changes();
            // Decided once the connection is this task's: a watch that started on the key since
            // keeps its subscription.
            waiting
                .unsubscribe(|| {
                    if changes.observed(Some(&lock_key)) {
                        Vec::new()
                    } else {
                        vec![changes.channel(&lock_key)]
                    }
                })
                .await;
        });
    }

    /// The server ended the subscription to `lock_key`'s change channel (a cluster node that
    /// gave up its slot): its readers read again at once, and the channel is subscribed again
    /// (on the slot's new master), retrying while anyone observes the key.
    pub(crate) fn change_subscription_ended(self: &Arc<Self>, lock_key: &str) {
        if !self.changes().ended(lock_key) {
            return; // our own unsubscription
        }
        tracing::debug!(key = %lock_key, "a change subscription was ended by its node; subscribing again");
        let waiting = self.clone();
        let lock_key = lock_key.to_owned();
        tokio::spawn(async move {
            let changes = waiting.changes();
            let mut pauses = RECONNECT_PAUSES.iter().chain(std::iter::repeat(
                &RECONNECT_PAUSES[RECONNECT_PAUSES.len() - 1],
            ));
            while changes.wanted(&lock_key) {
                let channel = changes.channel(&lock_key);
                match waiting
                    .subscribe_if(channel, || changes.wanted(&lock_key))
                    .await
                {
                    Ok(false) => return, // no longer observed: a sweep ended it
                    Ok(true) => {
                        changes.mark_subscribed([lock_key.as_str()]);
                        // Announcements between the end and now went unheard.
                        changes.deliver(&changes.channel(&lock_key));
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(key = %lock_key, %error,
                            "could not subscribe to change announcements again; retrying");
                    }
                }
                if let Some(pause) = pauses.next() {
                    tokio::time::sleep(*pause).await;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    const LOCK: &str = "p:DC#f#k";

    #[test]
    fn a_change_channel_names_its_lock_and_no_release_channel_is_one() {
        let changes = Changes::new("p:");
        let channel = changes.channel(LOCK);
        assert_eq!(channel, "p:changed:p:DC#f#k");
        assert_eq!(changes.lock_key_of(&channel), Some(LOCK));
        assert_eq!(changes.lock_key_of("p:released:p:DC#f#k:store"), None);
        assert!(
            !changes.deliver("p:released:p:DC#f#k:store"),
            "left to the release announcements"
        );
    }

    #[test]
    fn watches_on_a_key_share_one_wake_up_and_the_last_one_forgets_the_key() {
        let changes = Changes::new("p:");
        let (a, subscribed) = changes.register(LOCK);
        assert!(!subscribed, "the first watch subscribes");
        changes.mark_subscribed([LOCK]);
        let (b, subscribed) = changes.register(LOCK);
        assert!(subscribed, "the second finds it subscribed");
        assert!(Arc::ptr_eq(&a, &b));

        let mut woken = Box::pin(a.notified());
        woken.as_mut().enable();
        assert!(changes.deliver(&changes.channel(LOCK)));
        assert!(woken.now_or_never().is_some(), "a change wakes the readers");

        assert!(!changes.unregister(LOCK), "one watch is left");
        assert!(changes.observed(Some(LOCK)));
        assert!(changes.unregister(LOCK), "the last one");
        assert!(!changes.observed(None));
        assert!(!changes.unregister(LOCK), "nothing left to end");
    }

    #[test]
    fn a_lost_connection_wakes_every_reader_and_marks_its_channel_unsubscribed() {
        let changes = Changes::new("p:");
        let (changed, _) = changes.register(LOCK);
        changes.mark_subscribed([LOCK]);
        let mut woken = Box::pin(changed.notified());
        woken.as_mut().enable();
        changes.wake_all(true);
        assert!(woken.now_or_never().is_some());
        assert!(changes.wanted(LOCK), "to be subscribed again");
    }
}
