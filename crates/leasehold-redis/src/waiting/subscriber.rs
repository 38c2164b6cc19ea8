//! The store's one subscriber connection: how it is made (one server, Sentinel, or sharded
//! subscriptions on a Redis Cluster), what is subscribed and unsubscribed on it, and how it is
//! made again — with every channel still wanted — after it drops, a Sentinel failover moves the
//! master, or a cluster node ends a subscription itself.
//!
//! Both kinds of subscription ride on it: this process's release channels (its places in the
//! waiter queues, see [`super::places`]) and the change channels of the keys it observes (see
//! [`super::changes`]).
//!
//! The connection's data ([`Subscriber`], and the sink and counters in [`Waiting`]) is defined in
//! [`super::state`]; this module is what is done with it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use redis::aio::PubSubSink;

use super::state::Waiting;

/// The pauses between attempts to remake a dropped subscriber connection (or a subscription a
/// node ended) while someone waits or observes.
pub(crate) const RECONNECT_PAUSES: [std::time::Duration; 4] = [
    std::time::Duration::from_millis(50),
    std::time::Duration::from_millis(200),
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(1),
];

// Defined with the rest of the waiting data (a `Waiting` holds one); named here too, where the
// store and its connectors look for it.
pub(crate) use super::state::Subscriber;

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
                // waits asks the store again now. A killed node ends no subscription itself, and
                // the cluster client moves its subscriptions only when something refreshes its
                // slot map, which the store's own traffic (sent to the nodes directly) never
                // does: every channel is subscribed again, as after a node ended it. A channel
                // still subscribed is subscribed once more, which changes nothing; one whose node
                // died meets the dead address, which makes the cluster client find the slot's new
                // master; and whoever waits is woken once it is subscribed there.
                redis::PushKind::Disconnection => {
                    // A channel not subscribed is being subscribed already.
                    let mut channels: Vec<String> = {
                        let watched = waiting.lock();
                        for entry in watched.values() {
                            entry.wake_all();
                        }
                        watched
                            .iter()
                            .filter(|(_, entry)| entry.subscribed)
                            .map(|(key, _)| waiting.own_channel(key))
                            .collect()
                    };
                    waiting.changes.wake_all(false);
                    channels.extend(waiting.changes.subscribed_channels());
                    for channel in channels {
                        waiting.subscription_ended(&channel);
                    }
                }
                _ => {}
            }
        }
    });
}

impl Waiting {
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
        self.subscribe_if(channel, || true).await.map(drop)
    }

    /// [`Self::subscribe`] if `wanted` says so once no unsubscription is being sent (which
    /// decides under the same order which channels end): a subscription sent again after a
    /// sweep ended the channel would outlive everyone who wanted it. `Ok(false)`: not wanted.
    pub(crate) async fn subscribe_if(
        self: &Arc<Self>,
        channel: String,
        wanted: impl FnOnce() -> bool,
    ) -> redis::RedisResult<bool> {
        let _order = self.order.read().await;
        if !wanted() {
            return Ok(false);
        }
        if let Subscriber::Cluster(cluster) = &self.subscriber {
            within(self.connect_timeout, cluster.clone().ssubscribe(channel)).await?;
            return Ok(true);
        }
        let sink = {
            let mut sink = self.sink.lock().await;
            if sink.is_none() {
                // Made now, with every key in the map subscribed: this one too.
                self.connected_sink(&mut sink).await?;
                return Ok(true);
            }
            sink.clone()
        };
        if let Some(mut sink) = sink {
            within(self.connect_timeout, sink.subscribe(channel)).await?;
        }
        Ok(true)
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
                let still_wanted = || waiting.lock().get(&lock_key).is_some_and(|w| !w.subscribed);
                match waiting
                    .subscribe_if(waiting.own_channel(&lock_key), still_wanted)
                    .await
                {
                    Ok(false) => return, // swept, or subscribed again by a new wait
                    Ok(true) => {
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
}

/// Resolves once the Sentinel link names a master other than the one the subscriber connection
/// was made to (never without Sentinel, or once the store is gone).
async fn master_moved(
    moved: &mut Option<(
        Arc<crate::sentinel::SentinelLink>,
        tokio::sync::watch::Receiver<crate::sentinel::Searched>,
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
