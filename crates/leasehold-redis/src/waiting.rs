//! Waiting across processes: this store's places in each key's waiter queue, and the one pub/sub
//! connection that tells this process when it is its turn.
//!
//! A release (the fair release script) publishes the next entry in line on the channel of the
//! process it belongs to, `<prefix>released:<lock key>:<store id>`: only that process hears it
//! (a channel per key woke every waiting process at every hand-over). By default an entry is a
//! process (the store's id), and the process named wakes all its waiters on the key. In strict FIFO mode an entry is
//! one waiting call (`<store id>#<n>`), and only that call's watch wakes. A message is a hint:
//! waiters always try the store again, and a lost message (the subscriber connection dropped, a
//! publish during a reconnect) only costs one poll interval, bounded by the holder's TTL left and
//! the manager's retry interval.
//!
//! The same connection carries the change subscriptions of readers of who holds a lock (see
//! [`crate::changes`]), remade with it after a reconnect or a failover.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use leasehold_core::{Acquire, OwnerToken, ReleaseWatch, WaiterId};
use redis::aio::PubSubSink;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::changes::Changes;

/// One blocking `lock()` call of this process on a key: its own wake-up, and (strict FIFO) its
/// own entry in the key's queue.
#[derive(Debug)]
struct Watcher {
    /// Woken with `notify_waiters`, never `notify_one`: a wake-up is never stored for a task
    /// that is not listening (it would fire, stale, on the waiter's next round).
    notify: Arc<Notify>,
    /// `<store id>#<n>`: the call's entry in strict FIFO mode.
    entry: String,
    /// Whether the call's last attempt left its own entry in the store's queue.
    queued: bool,
}

/// One key some task of this process waits on.
#[derive(Debug, Default)]
struct Watched {
    /// The live watches on the key (blocking `lock()` calls in this process).
    watchers: HashMap<WaiterId, Watcher>,
    /// Whether the last attempt under the process's entry (the store's id) left it queued.
    queued: bool,
    /// When the attempt that last renewed the process's place (its deadline in the queue) was
    /// sent; `None` while the process has no place.
    renewed: Option<Instant>,
    /// Whether this process's channel for the key is subscribed on the current connection.
    subscribed: bool,
    /// Since when nobody here waits on the key. Its subscription lingers (see [`LINGER`]): a
    /// key contended once is likely contended again, and the next wait then starts without a
    /// round trip.
    idle_since: Option<Instant>,
}

impl Watched {
    fn wake_all(&self) {
        for watcher in self.watchers.values() {
            watcher.notify.notify_waiters();
        }
    }
}

/// How long a key's subscription outlives its last waiter.
const LINGER: std::time::Duration = std::time::Duration::from_secs(30);

/// At most this many idle subscriptions are kept; beyond it the longest idle go first.
const MAX_IDLE: usize = 1024;

/// How often, at most, the idle subscriptions are looked over.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The pauses between attempts to remake a dropped subscriber connection (or a subscription a
/// node ended) while someone waits or observes.
pub(crate) const RECONNECT_PAUSES: [std::time::Duration; 4] = [
    std::time::Duration::from_millis(50),
    std::time::Duration::from_millis(200),
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(1),
];

/// How this process gives up an entry (its own id, or a waiting call's) in a key's queue.
pub(crate) type Leave = Arc<dyn Fn(String) + Send + Sync>;

/// The entry a blocking attempt holds in a key's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// A try: never queued (the empty id in the scripts).
    None,
    /// The process's entry (the store's id): the default, and in strict mode the fallback for an
    /// attempt whose wait this store does not know.
    Process,
    /// A waiting call's own entry (strict FIFO).
    Waiter(WaiterId, String),
}

/// How a store hears release announcements.
pub(crate) enum Subscriber {
    /// No client to subscribe with (a store made from a connection manager): waiters poll.
    None,
    /// One server: a pub/sub connection of its own (`SUBSCRIBE`).
    Node(Box<redis::Client>),
    /// Sentinel: a pub/sub connection to the master the store's data connection uses, moved
    /// when that one moves.
    Sentinel(Arc<crate::sentinel::SentinelLink>),
    /// A Redis Cluster: sharded subscriptions (`SSUBSCRIBE`) on the cluster connection, which
    /// sends each to the node serving the channel's slot and moves it when the slot moves; the
    /// messages arrive as RESP3 pushes (see [`deliver_pushes`]).
    Cluster(redis::cluster_async::ClusterConnection),
}

/// Hands the sharded pub/sub messages a cluster connection receives to `waiting`, until the
/// store is gone.
pub(crate) fn deliver_pushes(
    waiting: &Arc<Waiting>,
    mut pushes: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
) {
    let waiting = Arc::downgrade(waiting);
    tokio::spawn(async move {
        while let Some(push) = pushes.recv().await {
            let Some(waiting) = waiting.upgrade() else {
                return;
            };
            match push.kind {
                redis::PushKind::SMessage | redis::PushKind::Message => {
                    let mut data = push.data.into_iter();
                    let (Some(channel), Some(payload)) = (data.next(), data.next()) else {
                        continue;
                    };
                    let channel: Option<String> = redis::from_redis_value(channel).ok();
                    let payload: Option<String> = redis::from_redis_value(payload).ok();
                    if let Some(channel) = channel {
                        waiting.deliver(&channel, payload);
                    }
                }
                // The node ended a subscription itself: it gave up the channel's slot (a
                // failover made it a replica, or the slot migrated) and unsubscribed its
                // clients. The cluster client forgets such a subscription rather than moving
                // it, so it is made again, on the slot's master now.
                redis::PushKind::SUnsubscribe => {
                    let channel: Option<String> = push
                        .data
                        .into_iter()
                        .next()
                        .and_then(|c| redis::from_redis_value(c).ok());
                    if let Some(channel) = channel {
                        waiting.subscription_ended(&channel);
                    }
                }
                // A node's connection dropped: a message may have been lost with it, so whoever
                // waits asks the store again now (the cluster client resubscribes on its own).
                redis::PushKind::Disconnection => {
                    for watched in waiting.lock().values() {
                        watched.wake_all();
                    }
                    waiting.changes.wake_all(false);
                }
                _ => {}
            }
        }
    });
}

/// This store's waiting state: its waiter id and its subscriptions.
pub(crate) struct Waiting {
    /// This store's id in every waiter queue: one place in line per process (per store), so
    /// fairness is between processes and local competition orders the tasks inside one. Strict
    /// FIFO entries start with it.
    id: String,
    /// Numbers this store's watches for their strict FIFO entries.
    next_watch: AtomicU64,
    /// `<prefix>released:` — a lock's channel base is this plus the Redis lock key; a process's
    /// channel for the lock adds `:<store id>`.
    channel_prefix: String,
    /// How this process subscribes to its channels.
    subscriber: Subscriber,
    /// The keys this process waits on, and those whose subscription lingers after the last wait.
    watched: Mutex<HashMap<String, Watched>>,
    /// The subscriber connection's command side; `None` until first needed and after it dropped.
    sink: tokio::sync::Mutex<Option<PubSubSink>>,
    /// Counts the subscriber connections dropped: a subscription made on a connection that
    /// dropped meanwhile is not marked subscribed (it went with the connection).
    dropped: AtomicU64,
    /// Read by each subscription while it is sent, written by the sweep's unsubscription: a wait
    /// that starts on a key being swept subscribes after the unsubscription reached the server.
    order: tokio::sync::RwLock<()>,
    /// The keys this process observes for a change of holder, subscribed on the same
    /// connection (see [`crate::changes`]).
    changes: Changes,
    /// When the idle subscriptions were last looked over.
    swept: Mutex<Instant>,
    /// Whether a timer will sweep the idle subscriptions again ([`Waiting::sweep_later`]).
    sweep_scheduled: AtomicBool,
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
        subscriber: Subscriber,
        connect_timeout: std::time::Duration,
    ) -> Self {
        Waiting {
            // host/pid/uuid: unique per store instance, readable in the store.
            id: OwnerToken::generate().as_str().to_owned(),
            next_watch: AtomicU64::new(1),
            channel_prefix: format!("{prefix}released:"),
            subscriber,
            watched: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            dropped: AtomicU64::new(0),
            order: tokio::sync::RwLock::new(()),
            changes: Changes::new(prefix),
            swept: Mutex::new(Instant::now()),
            sweep_scheduled: AtomicBool::new(false),
            connect_timeout,
        }
    }

    /// This store's waiter id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The keys this process observes for a change of holder.
    pub(crate) fn changes(&self) -> &Changes {
        &self.changes
    }

    /// Whether this store has a way to subscribe at all.
    pub(crate) fn can_subscribe(&self) -> bool {
        !matches!(self.subscriber, Subscriber::None)
    }

    /// How many subscriber connections have dropped so far: a subscription sent while this
    /// moved may have gone with the connection.
    pub(crate) fn drops(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }

    /// The base of a lock's channels (the scripts' `KEYS` argument): each process listens on
    /// `<base>:<store id>`, where the scripts tell it that it is next in line.
    pub(crate) fn channel(&self, lock_key: &str) -> String {
        format!("{}{lock_key}", self.channel_prefix)
    }

    /// The channel this process hears a lock's turns on.
    fn own_channel(&self, lock_key: &str) -> String {
        format!("{}{lock_key}:{}", self.channel_prefix, self.id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether more than one task of this process waits on `lock_key` (the one asking, and others).
    pub(crate) fn others_wait(&self, lock_key: &str) -> bool {
        self.lock()
            .get(lock_key)
            .is_some_and(|w| w.watchers.len() > 1)
    }

    /// The entry `req` asks under: none for a try; in strict mode the waiting call's own entry
    /// when this store minted its wait ([`Acquire::waiter`]), else the process's.
    pub(crate) fn place(&self, lock_key: &str, req: &Acquire, strict: bool) -> Place {
        if req.deadline.is_none() {
            return Place::None;
        }
        if strict {
            if let Some(waiter) = req.waiter {
                if let Some(watcher) = self
                    .lock()
                    .get(lock_key)
                    .and_then(|w| w.watchers.get(&waiter))
                {
                    return Place::Waiter(waiter, watcher.entry.clone());
                }
            }
        }
        Place::Process
    }

    /// The id a place is queued under in the scripts (empty: never queued).
    pub(crate) fn entry<'a>(&'a self, place: &'a Place) -> &'a str {
        match place {
            Place::None => "",
            Place::Process => &self.id,
            Place::Waiter(_, entry) => entry,
        }
    }

    /// Whether the process's place in `lock_key`'s queue is due to be renewed: it has none on
    /// record, or the attempt that last renewed it was sent `every` ago or longer.
    pub(crate) fn place_due(&self, lock_key: &str, every: std::time::Duration) -> bool {
        self.lock()
            .get(lock_key)
            .and_then(|w| w.renewed)
            .is_none_or(|at| at.elapsed() >= every)
    }

    /// Records whether the last attempt under `place` left it in the key's queue, and for the
    /// process's place when that attempt (sent at `renewed`) renewed its deadline. Returns the
    /// entry to leave at once when a waiting call's attempt queued it after the call stopped
    /// waiting (its watch is gone, so nobody else would take it out).
    pub(crate) fn set_queued(
        &self,
        lock_key: &str,
        place: &Place,
        queued: bool,
        renewed: Option<Instant>,
    ) -> Option<String> {
        let mut watched = self.lock();
        let found = watched.get_mut(lock_key);
        match place {
            Place::None => None,
            Place::Process => {
                if let Some(watched) = found {
                    watched.queued = queued;
                    if !queued {
                        watched.renewed = None;
                    } else if renewed.is_some() {
                        watched.renewed = renewed;
                    }
                }
                None
            }
            Place::Waiter(waiter, entry) => match found.and_then(|w| w.watchers.get_mut(waiter)) {
                Some(watcher) => {
                    watcher.queued = queued;
                    None
                }
                None => queued.then(|| entry.clone()),
            },
        }
    }

    /// Registers a waiting call on `lock_key`; unless the key's subscription is still in place
    /// (others wait, or it lingers from an earlier wait), subscribes to this process's channel
    /// for the key, confirmed before this returns, so no release after it is missed.
    pub(crate) async fn watch(self: &Arc<Self>, lock_key: String, leave: Leave) -> ReleaseWatch {
        let notify = Arc::new(Notify::new());
        // The watch mints the wait's id; the registration follows under that id, before any
        // attempt of the wait can queue or be named.
        let watch = ReleaseWatch::new(notify.clone(), || {});
        let waiter = watch.waiter();
        let entry = format!(
            "{}#{}",
            self.id,
            self.next_watch.fetch_add(1, Ordering::Relaxed)
        );
        let subscribed = {
            let mut watched = self.lock();
            let watched = watched.entry(lock_key.clone()).or_default();
            watched.idle_since = None;
            watched.watchers.insert(
                waiter,
                Watcher {
                    notify,
                    entry,
                    queued: false,
                },
            );
            watched.subscribed
        };
        if !subscribed {
            let dropped = self.dropped.load(Ordering::SeqCst);
            match self.subscribe(self.own_channel(&lock_key)).await {
                // Marked under the map's lock, where a drop clears every mark: either the drop
                // came first and is seen here, or it clears this mark after.
                Ok(()) => {
                    let mut watched = self.lock();
                    if self.dropped.load(Ordering::SeqCst) == dropped {
                        if let Some(watched) = watched.get_mut(&lock_key) {
                            watched.subscribed = true;
                        }
                    }
                }
                Err(error) => tracing::debug!(key = %lock_key, %error,
                    "could not subscribe to release notifications; waiting by polling"),
            }
        }
        let waiting = self.clone();
        watch.also_on_drop(move || waiting.unwatch(lock_key, waiter, leave))
    }

    fn unwatch(self: &Arc<Self>, lock_key: String, waiter: WaiterId, leave: Leave) {
        let (own, process, last) = {
            let mut watched = self.lock();
            let Some(entry) = watched.get_mut(&lock_key) else {
                return;
            };
            let own = entry
                .watchers
                .remove(&waiter)
                .filter(|w| w.queued)
                .map(|w| w.entry);
            if entry.watchers.is_empty() {
                // The last waiter here: the process's place goes, its subscription lingers.
                let process = std::mem::take(&mut entry.queued);
                entry.renewed = None;
                entry.idle_since = Some(Instant::now());
                (own, process, true)
            } else {
                (own, false, false)
            }
        };
        // A waiting call that gave up leaves its own place at once (strict FIFO); the last
        // waiter of this process gives up the process's place (if the last attempt left one), so
        // the next in line need not wait out its timeout.
        if let Some(own) = own {
            leave(own);
        }
        if process {
            leave(self.id.clone());
        }
        if last {
            self.sweep();
            self.sweep_later();
        }
    }

    /// Sweeps again once the idle subscriptions have lingered, while any are left: a process
    /// that stops waiting altogether must not keep them subscribed for good. One timer at a time,
    /// holding the store weakly (a dropped store's timer ends).
    fn sweep_later(self: &Arc<Self>) {
        if self.sweep_scheduled.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweep_scheduled.store(false, Ordering::SeqCst);
            return;
        };
        let waiting = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(LINGER + SWEEP_EVERY).await;
                let Some(waiting) = waiting.upgrade() else {
                    return;
                };
                waiting.sweep();
                let idle_left = waiting.lock().values().any(|w| w.idle_since.is_some());
                if !idle_left {
                    waiting.sweep_scheduled.store(false, Ordering::SeqCst);
                    // A wait that ended meanwhile found the flag set and scheduled nothing.
                    if waiting.lock().values().any(|w| w.idle_since.is_some()) {
                        waiting.sweep_later();
                    }
                    return;
                }
            }
        });
    }

    /// Ends the subscriptions idle for [`LINGER`] or beyond the [`MAX_IDLE`] newest, at most
    /// once per [`SWEEP_EVERY`].
    fn sweep(self: &Arc<Self>) {
        let now = Instant::now();
        {
            let mut swept = self.swept.lock().unwrap_or_else(PoisonError::into_inner);
            if now.duration_since(*swept) < SWEEP_EVERY {
                return;
            }
            *swept = now;
        }
        let ended = {
            let mut watched = self.lock();
            let mut idle: Vec<(Instant, String)> = watched
                .iter()
                .filter_map(|(key, w)| w.idle_since.map(|at| (at, key.clone())))
                .collect();
            idle.sort_unstable();
            let over = idle.len().saturating_sub(MAX_IDLE);
            let ended: Vec<String> = idle
                .into_iter()
                .enumerate()
                .filter(|(i, (at, _))| *i < over || now.duration_since(*at) >= LINGER)
                .map(|(_, (_, key))| key)
                .collect();
            for key in &ended {
                watched.remove(key);
            }
            ended
        };
        if ended.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let waiting = self.clone();
        runtime.spawn(async move {
            // Only those still unwatched once the connection is this task's: a wait that started
            // on one of them since has subscribed it again, and keeps it.
            waiting
                .unsubscribe(|| {
                    let watched = waiting.lock();
                    ended
                        .iter()
                        .filter(|key| !watched.contains_key(*key))
                        .map(|key| waiting.own_channel(key))
                        .collect()
                })
                .await;
        });
    }

    /// Unsubscribes the channels `channels` names once the connection is this task's (no
    /// subscription is being sent): it decides then which are still unwanted.
    pub(crate) async fn unsubscribe(&self, channels: impl FnOnce() -> Vec<String>) {
        let _order = self.order.write().await;
        let sink = self.sink.lock().await.clone();
        let channels = channels();
        if channels.is_empty() {
            return;
        }
        // Bounded: every new wait's subscribe queues behind this write lock, so a node that
        // stopped answering must not hold it past the connect timeout (the channels then stay
        // subscribed, and a later sweep or a remade connection ends them).
        let result = match (&self.subscriber, sink) {
            (Subscriber::Cluster(cluster), _) => {
                let mut cluster = cluster.clone();
                within(self.connect_timeout, async move {
                    let mut result = Ok(());
                    // Sharded channels of different slots may live on different nodes: one each.
                    for channel in channels {
                        result = result.and(cluster.sunsubscribe(channel).await);
                    }
                    result
                })
                .await
            }
            (_, Some(mut sink)) => within(self.connect_timeout, sink.unsubscribe(channels)).await,
            (_, None) => Ok(()),
        };
        if let Err(error) = result {
            tracing::debug!(%error, "could not end unused subscriptions");
        }
    }

    /// Subscribes this process to `channel`, confirmed by the server; on one server or Sentinel,
    /// makes the subscriber connection first if there is none (with every channel wanted).
    pub(crate) async fn subscribe(self: &Arc<Self>, channel: String) -> redis::RedisResult<()> {
        let _order = self.order.read().await;
        if let Subscriber::Cluster(cluster) = &self.subscriber {
            return within(self.connect_timeout, cluster.clone().ssubscribe(channel)).await;
        }
        let sink = {
            let mut sink = self.sink.lock().await;
            if sink.is_none() {
                // Made now, with every key in the map subscribed: this one too.
                self.connected_sink(&mut sink).await?;
                return Ok(());
            }
            sink.clone()
        };
        let Some(mut sink) = sink else {
            return Ok(());
        };
        within(self.connect_timeout, sink.subscribe(channel)).await
    }

    /// The subscriber connection (`sink` is [`Self::sink`], locked), made if there is none, with
    /// every key in the map subscribed again on it.
    async fn connected_sink(
        self: &Arc<Self>,
        sink: &mut Option<PubSubSink>,
    ) -> redis::RedisResult<Option<PubSubSink>> {
        if let Some(sink) = &*sink {
            return Ok(Some(sink.clone()));
        }
        // With Sentinel, the master the link uses now (after a failover, the new one), and word
        // of every master it finds after it.
        let (client, mut moved) = match &self.subscriber {
            Subscriber::Node(client) => ((**client).clone(), None),
            Subscriber::Sentinel(link) => {
                let found = link.found();
                let (client, address) = link.master_client().await?;
                (client, Some((link.clone(), found, address)))
            }
            Subscriber::None | Subscriber::Cluster(_) => return Ok(None),
        };
        let pubsub = within(self.connect_timeout, client.get_async_pubsub()).await?;
        let (mut new_sink, stream) = pubsub.split();
        let keys: Vec<String> = self.lock().keys().cloned().collect();
        let observed = self.changes.channels();
        let mut channels: Vec<String> = keys.iter().map(|k| self.own_channel(k)).collect();
        channels.extend(observed.iter().map(|(_, channel)| channel.clone()));
        if !channels.is_empty() {
            within(self.connect_timeout, new_sink.subscribe(channels)).await?;
            let mut watched = self.lock();
            for key in &keys {
                if let Some(watched) = watched.get_mut(key) {
                    watched.subscribed = true;
                }
            }
            self.changes
                .mark_subscribed(observed.iter().map(|(key, _)| key.as_str()));
        }
        let waiting = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut stream = stream;
            loop {
                let message = tokio::select! {
                    message = stream.next() => message,
                    // The data connection moved to another master: releases are announced
                    // there now, so the subscriptions move too (the old node, demoted, may
                    // keep this connection open).
                    () = master_moved(&mut moved) => None,
                };
                let Some(message) = message else {
                    break;
                };
                let Some(waiting) = waiting.upgrade() else {
                    return;
                };
                waiting.deliver(message.get_channel_name(), message.get_payload().ok());
            }
            drop(stream);
            if let Some(waiting) = waiting.upgrade() {
                waiting.connection_dropped().await;
            }
        });
        *sink = Some(new_sink.clone());
        Ok(Some(new_sink))
    }

    /// The subscriber connection dropped (the server restarted, or a Sentinel failover: the
    /// sentinels disconnect the clients of a demoted master). Whoever waits is woken to ask the
    /// store at once (a message may have been lost), and while anyone waits the connection is
    /// made again — to the master the sentinels name now — with every channel, and the waiters
    /// woken once more, since a release may have gone unheard in between.
    fn connection_dropped(self: Arc<Self>) -> futures::future::BoxFuture<'static, ()> {
        // Boxed: remaking the connection spawns the task that calls this again when it drops.
        Box::pin(self.remake_connection())
    }

    async fn remake_connection(self: Arc<Self>) {
        {
            let mut sink = self.sink.lock().await;
            *sink = None;
            let mut watched = self.lock();
            self.dropped.fetch_add(1, Ordering::SeqCst);
            for watched in watched.values_mut() {
                watched.subscribed = false;
                watched.wake_all();
            }
            // The change subscriptions went with the connection too. Cleared after the count
            // moved: a watch confirmed on the old connection is either cleared here or sees the
            // count moved and leaves its mark unset.
            self.changes.wake_all(true);
        }
        let mut pauses = RECONNECT_PAUSES.iter().chain(std::iter::repeat(
            &RECONNECT_PAUSES[RECONNECT_PAUSES.len() - 1],
        ));
        loop {
            if self.lock().values().all(|w| w.watchers.is_empty()) && !self.changes.observed(None) {
                return; // nobody waits or observes: the next watch connects
            }
            let remade = {
                let mut sink = self.sink.lock().await;
                if sink.is_some() {
                    return; // a watch remade it already
                }
                self.connected_sink(&mut sink).await
            };
            match remade {
                Ok(_) => {
                    for watched in self.lock().values() {
                        watched.wake_all();
                    }
                    self.changes.wake_all(false);
                    return;
                }
                Err(error) => {
                    tracing::debug!(%error, "could not remake the release subscription; retrying");
                }
            }
            if let Some(pause) = pauses.next() {
                tokio::time::sleep(*pause).await;
            }
        }
    }

    /// The server ended the subscription to `channel` (a cluster node that gave up its slot). If
    /// the key is still watched (or lingers), whoever waits asks the store at once (a release may
    /// have gone unheard) and the channel is subscribed again, retrying while anyone waits. Our
    /// own unsubscriptions end keys already gone from the map, and are left alone.
    fn subscription_ended(self: &Arc<Self>, channel: &str) {
        if let Some(lock_key) = self.changes.lock_key_of(channel) {
            self.change_subscription_ended(lock_key);
            return;
        }
        let Some(lock_key) = self.lock_key_of_channel(channel) else {
            return;
        };
        {
            let mut watched = self.lock();
            let Some(entry) = watched.get_mut(lock_key) else {
                return;
            };
            entry.subscribed = false;
            entry.wake_all();
        }
        tracing::debug!(key = %lock_key, "a release subscription was ended by its node; subscribing again");
        let waiting = self.clone();
        let lock_key = lock_key.to_owned();
        tokio::spawn(async move {
            let mut pauses = RECONNECT_PAUSES.iter().chain(std::iter::repeat(
                &RECONNECT_PAUSES[RECONNECT_PAUSES.len() - 1],
            ));
            loop {
                let wanted = waiting.lock().get(&lock_key).is_some_and(|w| !w.subscribed);
                if !wanted {
                    return; // swept, or subscribed again by a new wait
                }
                match waiting.subscribe(waiting.own_channel(&lock_key)).await {
                    Ok(()) => {
                        if let Some(watched) = waiting.lock().get_mut(&lock_key) {
                            watched.subscribed = true;
                            // Announcements between the end and now went unheard.
                            watched.wake_all();
                        }
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(key = %lock_key, %error,
                            "could not subscribe to release notifications again; retrying");
                    }
                }
                if waiting
                    .lock()
                    .get(&lock_key)
                    .is_none_or(|w| w.watchers.is_empty())
                {
                    return; // nobody waits: the next wait subscribes
                }
                if let Some(pause) = pauses.next() {
                    tokio::time::sleep(*pause).await;
                }
            }
        });
    }

    /// The lock key of this process's own channel for it.
    fn lock_key_of_channel<'a>(&self, channel: &'a str) -> Option<&'a str> {
        channel
            .strip_prefix(&self.channel_prefix)
            .and_then(|rest| rest.strip_suffix(self.id.as_str()))
            .and_then(|rest| rest.strip_suffix(':'))
    }

    /// A release was announced on `channel` (this process's own for a lock), naming the next
    /// entry in line.
    fn deliver(&self, channel: &str, next: Option<String>) {
        if self.changes.deliver(channel) {
            return; // a change of holder, for readers
        }
        let Some(lock_key) = self.lock_key_of_channel(channel) else {
            return;
        };
        let Some(next) = next else {
            return;
        };
        let Some(rest) = next.strip_prefix(self.id.as_str()) else {
            return; // another process's turn
        };
        let watched = self.lock();
        let Some(watched) = watched.get(lock_key) else {
            return;
        };
        if rest.is_empty() {
            // The process's turn: every waiter of this process on the key. Which one asks is
            // local competition's call (the head of its line; the others wait in memory and
            // ignore this). Picking one here could pick a task that is not listening, and the
            // turn would be lost.
            watched.wake_all();
        } else if let Some(watcher) = watched.watchers.values().find(|w| w.entry == next) {
            // Strict FIFO: the one waiting call named (its own watch, so nobody else wakes).
            watcher.notify.notify_waiters();
        }
    }
}

/// Resolves once the Sentinel link names a master other than the one the subscriber connection
/// was made to (never without Sentinel, or once the store is gone).
async fn master_moved(
    moved: &mut Option<(
        Arc<crate::sentinel::SentinelLink>,
        tokio::sync::watch::Receiver<u64>,
        String,
    )>,
) {
    let Some((link, found, subscribed_to)) = moved else {
        return std::future::pending().await;
    };
    loop {
        if found.changed().await.is_err() {
            return std::future::pending().await;
        }
        if link
            .master_address()
            .is_some_and(|address| address != *subscribed_to)
        {
            return;
        }
    }
}

/// `request`, failed as a timeout if it takes longer than `limit`.
async fn within<T>(
    limit: std::time::Duration,
    request: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::time::timeout(limit, request)
        .await
        .map_err(|_| redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))?
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;
    use leasehold_core::LockKey;

    use super::*;

    const LOCK: &str = "p:DC#f#k";

    fn waiting() -> Arc<Waiting> {
        Arc::new(Waiting::new("p:", Subscriber::None, Duration::from_secs(1)))
    }

    fn recorder() -> (Leave, Arc<Mutex<Vec<String>>>) {
        let left = Arc::new(Mutex::new(Vec::new()));
        let record = left.clone();
        (
            Arc::new(move |entry| record.lock().unwrap().push(entry)),
            left,
        )
    }

    fn blocking(waiter: Option<WaiterId>) -> Acquire {
        Acquire::new(
            LockKey::dc("f", "c", "k").unwrap(),
            OwnerToken::generate(),
            Duration::from_secs(1),
        )
        .with_deadline(Some(tokio::time::Instant::now() + Duration::from_secs(60)))
        .with_waiter(waiter)
    }

    fn entry_of(waiting: &Waiting, watch: &ReleaseWatch) -> String {
        match waiting.place(LOCK, &blocking(Some(watch.waiter())), true) {
            Place::Waiter(_, entry) => entry,
            other => panic!("a watched wait has its own entry, not {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_is_due_for_renewal_only_once_its_period_passed_or_it_was_left() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let _watch = waiting.watch(LOCK.to_owned(), leave).await;
        let every = Duration::from_millis(1250);
        assert!(waiting.place_due(LOCK, every), "no place on record");

        waiting.set_queued(LOCK, &Place::Process, true, Some(Instant::now()));
        assert!(!waiting.place_due(LOCK, every), "just renewed");
        tokio::time::advance(Duration::from_millis(1000)).await;
        waiting.set_queued(LOCK, &Place::Process, true, None);
        assert!(
            !waiting.place_due(LOCK, every),
            "an attempt that kept the place without renewing it moves nothing"
        );
        tokio::time::advance(Duration::from_millis(250)).await;
        assert!(waiting.place_due(LOCK, every), "a quarter of the timeout");

        waiting.set_queued(LOCK, &Place::Process, true, Some(Instant::now()));
        waiting.set_queued(LOCK, &Place::Process, false, None);
        assert!(
            waiting.place_due(LOCK, every),
            "a place given up is renewed when the process goes in line again"
        );
        assert!(
            waiting.place_due("p:DC#f#other", every),
            "a key nobody here waits on"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_subscriptions_end_after_lingering_even_when_nobody_waits_again() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let watch = waiting.watch(LOCK.to_owned(), leave).await;
        drop(watch);
        assert!(waiting.lock().contains_key(LOCK), "lingers while idle");
        // No wait starts or ends again: only the timer can end it.
        tokio::time::sleep(LINGER + SWEEP_EVERY * 3).await;
        assert!(!waiting.lock().contains_key(LOCK), "ended after lingering");
        assert!(
            !waiting.sweep_scheduled.load(Ordering::SeqCst),
            "and its timer with it"
        );
    }

    #[tokio::test]
    async fn only_the_named_waiter_wakes_and_the_process_id_wakes_every_waiter() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave.clone()).await;
        let b = waiting.watch(LOCK.to_owned(), leave).await;
        let (entry_a, entry_b) = (entry_of(&waiting, &a), entry_of(&waiting, &b));
        assert_ne!(entry_a, entry_b);
        assert!(entry_a.starts_with(&format!("{}#", waiting.id())));
        let channel = waiting.own_channel(LOCK);

        let (mut woken_a, mut woken_b) = (
            Box::pin(a.notify().notified()),
            Box::pin(b.notify().notified()),
        );
        woken_a.as_mut().enable();
        woken_b.as_mut().enable();
        waiting.deliver(&channel, Some(entry_b.clone()));
        assert!(woken_b.as_mut().now_or_never().is_some(), "b was named");
        assert!(woken_a.as_mut().now_or_never().is_none(), "a was not");

        waiting.deliver(&channel, Some(format!("other-process#{entry_a}")));
        waiting.deliver(&channel, Some("other-process".to_owned()));
        assert!(woken_a.as_mut().now_or_never().is_none(), "not ours");

        let mut woken_b = Box::pin(b.notify().notified());
        woken_b.as_mut().enable();
        waiting.deliver(&channel, Some(waiting.id().to_owned()));
        assert!(
            woken_a.now_or_never().is_some(),
            "the process's turn wakes a"
        );
        assert!(woken_b.now_or_never().is_some(), "and b");
    }

    #[tokio::test]
    async fn a_turn_is_heard_only_on_this_processs_own_channel() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave).await;
        let mut woken = Box::pin(a.notify().notified());
        woken.as_mut().enable();
        // The key's bare channel and another process's channel of the key are not ours.
        waiting.deliver(&waiting.channel(LOCK), Some(waiting.id().to_owned()));
        waiting.deliver(
            &format!("{}:other-process", waiting.channel(LOCK)),
            Some(waiting.id().to_owned()),
        );
        assert!(woken.as_mut().now_or_never().is_none());
        waiting.deliver(&waiting.own_channel(LOCK), Some(waiting.id().to_owned()));
        assert!(woken.now_or_never().is_some(), "our own channel wakes us");
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscription_outlives_its_last_waiter_until_it_was_idle_for_the_linger() {
        let waiting = waiting();
        let (leave, _) = recorder();
        drop(waiting.watch(LOCK.to_owned(), leave.clone()).await);
        let kept = |key: &str| waiting.lock().get(key).is_some_and(|w| w.subscribed);
        assert!(kept(LOCK), "idle, still subscribed");

        // Waited on again within the linger: the same subscription, idle no more.
        tokio::time::advance(LINGER / 2).await;
        drop(waiting.watch(LOCK.to_owned(), leave.clone()).await);
        tokio::time::advance(LINGER / 2 + SWEEP_EVERY).await;
        drop(
            waiting
                .watch("p:DC#f#other".to_owned(), leave.clone())
                .await,
        );
        assert!(kept(LOCK), "idle for half the linger only");

        tokio::time::advance(LINGER).await;
        drop(waiting.watch("p:DC#f#third".to_owned(), leave).await);
        assert!(!kept(LOCK), "idle past the linger: swept");
        assert!(!kept("p:DC#f#other"), "so was this one");
        assert!(kept("p:DC#f#third"), "just left");
    }

    #[tokio::test]
    async fn a_wake_up_is_never_stored_for_a_waiter_not_listening() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave).await;
        waiting.deliver(&waiting.own_channel(LOCK), Some(entry_of(&waiting, &a)));
        assert!(
            a.notify().notified().now_or_never().is_none(),
            "a turn given while nobody listened is not kept for a later round"
        );
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_its_own_place_and_the_last_leaves_the_process() {
        let waiting = waiting();
        let (leave, left) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave.clone()).await;
        let b = waiting.watch(LOCK.to_owned(), leave).await;
        let entry_a = entry_of(&waiting, &a);
        let place_a = Place::Waiter(a.waiter(), entry_a.clone());
        assert_eq!(waiting.set_queued(LOCK, &place_a, true, None), None);
        assert_eq!(waiting.set_queued(LOCK, &Place::Process, true, None), None);
        drop(a);
        assert_eq!(
            *left.lock().unwrap(),
            std::slice::from_ref(&entry_a),
            "a's place, at once"
        );
        drop(b);
        assert_eq!(
            *left.lock().unwrap(),
            [entry_a.clone(), waiting.id().to_owned()],
            "the process's place with its last waiter (b was never queued on its own)"
        );
        assert_eq!(
            waiting.set_queued(LOCK, &place_a, true, None),
            Some(entry_a),
            "an attempt that queued after its wait ended is taken out by the caller"
        );
        assert_eq!(waiting.set_queued(LOCK, &place_a, false, None), None);
    }

    #[tokio::test]
    async fn tries_never_queue_and_unknown_waits_fall_back_to_the_process_place() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave).await;
        let try_lock = blocking(Some(a.waiter())).with_deadline(None);
        assert_eq!(waiting.place(LOCK, &try_lock, true), Place::None);
        assert_eq!(waiting.place(LOCK, &blocking(None), true), Place::Process);
        assert_eq!(
            waiting.place(LOCK, &blocking(Some(WaiterId::new())), true),
            Place::Process,
            "a wait this store did not mint"
        );
        assert_eq!(
            waiting.place(LOCK, &blocking(Some(a.waiter())), false),
            Place::Process,
            "default mode: one place per process"
        );
        assert_eq!(waiting.entry(&Place::None), "");
        assert_eq!(waiting.entry(&Place::Process), waiting.id());
    }
}
