//! What the store's waiting holds, and nothing it does: [`Waiting`] and the types of its fields
//! (this process's places in the waiter queues, the keys it observes, how it subscribes).
//!
//! The data lives in this one leaf so that every other waiting module can import it without
//! being imported back: each of [`super::places`], [`super::changes`] and [`super::subscriber`]
//! adds the behaviour of its job to these types (`impl` blocks), and [`super`] the message
//! routing. This module imports none of them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use leasehold_core::{NotifyRegistry, WaiterId};
use redis::aio::PubSubSink;
use tokio::sync::Notify;
use tokio::time::Instant;

/// This store's waiting state: its waiter id and its subscriptions.
pub(crate) struct Waiting {
    /// This store's id in every waiter queue: one place in line per process (per store), so
    /// fairness is between processes and local competition orders the tasks inside one. Strict
    /// FIFO entries start with it.
    pub(super) id: String,
    /// Numbers this store's watches for their strict FIFO entries.
    pub(super) next_watch: AtomicU64,
    /// `<prefix>released:` — a lock's channel base is this plus the Redis lock key; a process's
    /// channel for the lock adds `:<store id>`.
    pub(super) channel_prefix: String,
    /// How this process subscribes to its channels.
    pub(super) subscriber: Subscriber,
    /// The keys this process waits on, and those whose subscription lingers after the last wait.
    pub(super) watched: Mutex<HashMap<String, Watched>>,
    /// The subscriber connection's command side; `None` until first needed and after it dropped.
    pub(super) sink: tokio::sync::Mutex<Option<PubSubSink>>,
    /// Counts the subscriber connections dropped: a subscription made on a connection that
    /// dropped meanwhile is not marked subscribed (it went with the connection).
    pub(super) dropped: AtomicU64,
    /// Read by each subscription while it is sent, written by the sweep's unsubscription: a wait
    /// that starts on a key being swept subscribes after the unsubscription reached the server.
    pub(super) order: tokio::sync::RwLock<()>,
    /// The keys this process observes for a change of holder, subscribed on the same
    /// connection (see [`super::changes`]).
    pub(super) changes: Changes,
    /// When the idle subscriptions were last looked over.
    pub(super) swept: Mutex<Instant>,
    /// Whether a timer will sweep the idle subscriptions again ([`Waiting::sweep_later`]).
    pub(super) sweep_scheduled: AtomicBool,
    pub(super) connect_timeout: std::time::Duration,
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
    /// messages arrive as RESP3 pushes (see
    /// [`deliver_pushes`](super::subscriber::deliver_pushes)).
    Cluster(redis::cluster_async::ClusterConnection),
}

/// One blocking `lock()` call of this process on a key: its own wake-up, and (strict FIFO) its
/// own entry in the key's queue.
#[derive(Debug)]
pub(super) struct Watcher {
    /// Woken with `notify_waiters`, never `notify_one`: a wake-up is never stored for a task
    /// that is not listening (it would fire, stale, on the waiter's next round).
    pub(super) notify: Arc<Notify>,
    /// `<store id>#<n>`: the call's entry in strict FIFO mode.
    pub(super) entry: String,
    /// Whether the call's last attempt left its own entry in the store's queue.
    pub(super) queued: bool,
}

/// One key some task of this process waits on.
#[derive(Debug, Default)]
pub(super) struct Watched {
    /// The live watches on the key (blocking `lock()` calls in this process).
    pub(super) watchers: HashMap<WaiterId, Watcher>,
    /// Whether the last attempt under the process's entry (the store's id) left it queued.
    pub(super) queued: bool,
    /// Whether that attempt was a grant after which the process kept its place (others were in
    /// line): the place outlives the last waiter for a moment (see [`Parked`]).
    pub(super) kept: bool,
    /// The process's kept place while no task of this process waits on the key: set by the last
    /// waiter's leaving, cleared by the next registration, so never set while anyone waits.
    pub(super) parked: Option<Parked>,
    /// Whether the process's turn was announced since its last attempt: a waiter that
    /// registers just then (and may have missed the wake-up) asks at once.
    pub(super) turn_given: bool,
    /// When a blocking attempt of this process was last granted the key (under the process's
    /// place): a process that waits for the key again soon after is a loop on a hot key. A place
    /// kept by that grant is kept until `KEEP` after it (see [`super::places`]).
    pub(super) last_grant: Option<Instant>,
    /// The process's place being given up (its leave script in flight): the process's next
    /// attempt waits for it, or the leave could land after that attempt joined the line again
    /// and take the new place out.
    pub(super) leaving: Option<Leaving>,
    /// When the attempt that last renewed the process's place (its deadline in the queue) was
    /// sent; `None` while the process has no place.
    pub(super) renewed: Option<Instant>,
    /// Whether this process's channel for the key is subscribed on the current connection.
    pub(super) subscribed: bool,
    /// Since when nobody here waits on the key. Its subscription lingers (see `LINGER` in
    /// [`super::places`]): a key contended once is likely contended again, and the next wait then
    /// starts without a round trip.
    pub(super) idle_since: Option<Instant>,
}

/// How this process gives up an entry (its own id, or a waiting call's) in a key's queue: in
/// the background, on the task returned (`None` without a runtime: the place lapses).
pub(crate) type Leave = Arc<dyn Fn(String) -> Option<tokio::task::JoinHandle<()>> + Send + Sync>;

/// A leave script in flight, awaited by whoever needs it done.
pub(crate) type Leaving = futures::future::Shared<futures::future::BoxFuture<'static, ()>>;

/// A place the process kept after a grant, while nobody here waits on the key: given up when
/// its turn comes with still nobody waiting, or after a while (`KEEP` in `places`).
pub(super) struct Parked {
    /// The grant that kept it: the place is given up `KEEP` after it, however often a wait
    /// came and went since.
    pub(super) since: Instant,
    /// How to give it up.
    pub(super) leave: Leave,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked")
            .field("since", &self.since)
            .finish()
    }
}

/// The keys this process observes, and their channels.
#[derive(Debug)]
pub(crate) struct Changes {
    /// `<prefix>changed:` — a lock's change channel is this plus the Redis lock key.
    pub(super) channel_prefix: String,
    /// By Redis lock key, each with the wake-up its watches share (fired with
    /// `notify_waiters`: a hint is never stored for a reader that is not listening, it reads
    /// again before it listens) and whether the key's channel is subscribed on the current
    /// connection. The last watch dropped ends the subscription.
    pub(super) observed: NotifyRegistry<bool>,
}
