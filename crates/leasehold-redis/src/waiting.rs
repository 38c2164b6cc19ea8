//! Waiting across processes: this store's place in each key's waiter queue, and the one pub/sub
//! connection that tells this process when it is its turn.
//!
//! A release (the fair release script) publishes the id of the next process in line on the key's
//! channel; every process waiting on the key is subscribed, and only the one named wakes its
//! waiters. A message is a hint: waiters always try the store again, and a lost message (the
//! subscriber connection dropped, a publish during a reconnect) only costs one poll interval,
//! bounded by the holder's TTL left and the manager's retry interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use leasehold_core::{OwnerToken, ReleaseWatch};
use redis::aio::PubSubSink;
use tokio::sync::Notify;

/// One key some task of this process waits on.
#[derive(Debug)]
struct Watched {
    notify: Arc<Notify>,
    /// Live watches on the key (blocking `lock()` calls in this process).
    watchers: usize,
    /// Whether this process's last attempt on the key left it in the store's queue.
    queued: bool,
}

/// How this process gives up its place in a key's queue: called when the last watcher of a
/// queued key goes away.
pub(crate) type Leave = Arc<dyn Fn() + Send + Sync>;

/// This store's waiting state: its waiter id and its subscriptions.
pub(crate) struct Waiting {
    /// This store's id in every waiter queue: one place in line per process (per store), so
    /// fairness is between processes and local competition orders the tasks inside one.
    id: String,
    /// `<prefix>released:` — a lock's channel is this plus the Redis lock key.
    channel_prefix: String,
    /// `None` when the store was built from a connection manager (no client to subscribe with):
    /// waiters then poll.
    client: Option<redis::Client>,
    watched: Mutex<HashMap<String, Watched>>,
    /// The subscriber connection's command side; `None` until first needed and after it dropped.
    sink: tokio::sync::Mutex<Option<PubSubSink>>,
    connect_timeout: std::time::Duration,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("id", &self.id)
            .field("watched", &self.lock().len())
            .finish()
    }
}

impl Waiting {
    pub(crate) fn new(
        prefix: &str,
        client: Option<redis::Client>,
        connect_timeout: std::time::Duration,
    ) -> Self {
        Waiting {
            // host/pid/uuid: unique per store instance, readable in the store.
            id: OwnerToken::generate().as_str().to_owned(),
            channel_prefix: format!("{prefix}released:"),
            client,
            watched: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            connect_timeout,
        }
    }

    /// This store's waiter id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The channel a lock's releases are announced on.
    pub(crate) fn channel(&self, lock_key: &str) -> String {
        format!("{}{lock_key}", self.channel_prefix)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether more than one task of this process waits on `lock_key` (the one asking, and others).
    pub(crate) fn others_wait(&self, lock_key: &str) -> bool {
        self.lock().get(lock_key).is_some_and(|w| w.watchers > 1)
    }

    /// Records whether the last attempt on `lock_key` left this process queued.
    pub(crate) fn set_queued(&self, lock_key: &str, queued: bool) {
        if let Some(watched) = self.lock().get_mut(lock_key) {
            watched.queued = queued;
        }
    }

    /// Registers a waiter on `lock_key`; the first one subscribes to the key's channel (the
    /// subscription is confirmed before this returns, so no release after it is missed).
    pub(crate) async fn watch(self: &Arc<Self>, lock_key: String, leave: Leave) -> ReleaseWatch {
        let (notify, first) = {
            let mut watched = self.lock();
            let entry = watched.entry(lock_key.clone()).or_insert_with(|| Watched {
                notify: Arc::new(Notify::new()),
                watchers: 0,
                queued: false,
            });
            entry.watchers += 1;
            (entry.notify.clone(), entry.watchers == 1)
        };
        if first {
            if let Err(error) = self.subscribe(&lock_key).await {
                tracing::debug!(key = %lock_key, %error,
                    "could not subscribe to release notifications; waiting by polling");
            }
        }
        let (waiting, key) = (self.clone(), lock_key);
        ReleaseWatch::new(notify, move || waiting.unwatch(key, leave))
    }

    fn unwatch(self: &Arc<Self>, lock_key: String, leave: Leave) {
        let queued = {
            let mut watched = self.lock();
            let Some(entry) = watched.get_mut(&lock_key) else {
                return;
            };
            entry.watchers -= 1;
            if entry.watchers > 0 {
                return;
            }
            watched.remove(&lock_key).is_some_and(|w| w.queued)
        };
        // The last waiter of this process is gone: stop listening, and give up the place in line
        // (if the last attempt left one) so the next process need not wait out its timeout.
        if queued {
            leave();
        }
        let waiting = self.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let sink = waiting.sink.lock().await.clone();
                if let Some(mut sink) = sink {
                    let _ = sink.unsubscribe(waiting.channel(&lock_key)).await;
                }
            });
        }
    }

    async fn subscribe(self: &Arc<Self>, lock_key: &str) -> redis::RedisResult<()> {
        let Some(mut sink) = self.connected_sink().await? else {
            return Ok(());
        };
        tokio::time::timeout(self.connect_timeout, sink.subscribe(self.channel(lock_key)))
            .await
            .map_err(|_| {
                redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
            })?
    }

    /// The subscriber connection, made (and every watched key subscribed again) if there is none.
    async fn connected_sink(self: &Arc<Self>) -> redis::RedisResult<Option<PubSubSink>> {
        let Some(client) = &self.client else {
            return Ok(None);
        };
        let mut sink = self.sink.lock().await;
        if let Some(sink) = &*sink {
            return Ok(Some(sink.clone()));
        }
        let pubsub = tokio::time::timeout(self.connect_timeout, client.get_async_pubsub())
            .await
            .map_err(|_| {
                redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
            })??;
        let (mut new_sink, stream) = pubsub.split();
        let channels: Vec<String> = self.lock().keys().map(|k| self.channel(k)).collect();
        if !channels.is_empty() {
            new_sink.subscribe(channels).await?;
        }
        let waiting = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut stream = stream;
            while let Some(message) = stream.next().await {
                let Some(waiting) = waiting.upgrade() else {
                    return;
                };
                waiting.deliver(message.get_channel_name(), message.get_payload().ok());
            }
            // The connection dropped: the next new watch reconnects; until then waiters poll.
            if let Some(waiting) = waiting.upgrade() {
                *waiting.sink.lock().await = None;
                // Whoever waits now must not sleep out a whole poll interval for a message that
                // cannot come: wake them to ask the store again.
                for watched in waiting.lock().values() {
                    watched.notify.notify_waiters();
                }
            }
        });
        *sink = Some(new_sink.clone());
        Ok(Some(new_sink))
    }

    /// A release was announced on `channel`, naming the next process in line.
    fn deliver(&self, channel: &str, next: Option<String>) {
        let Some(lock_key) = channel.strip_prefix(&self.channel_prefix) else {
            return;
        };
        if next.as_deref() != Some(self.id.as_str()) {
            return; // another process's turn
        }
        if let Some(watched) = self.lock().get(lock_key) {
            // Every waiter of this process on the key: which one asks is local competition's
            // call (the head of its line; the others wait in memory and ignore this). Picking
            // one here could pick a task that is not listening, and the turn would be lost.
            watched.notify.notify_waiters();
        }
    }
}
