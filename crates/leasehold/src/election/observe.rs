//! Who leads an election, as a stream of changes: read from the election lock when the store
//! announces a change, or every so often where it announces none.

use std::time::{Duration, SystemTime};

use futures::Stream;

use crate::core::{ChangeWatch, ErrorKind, LockInfo, LockStore, OwnerToken, Result};
use crate::manager::LockManager;

/// How often [`LockManager::observe`] reads the election lock.
pub const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_millis(250);

/// Who leads an election: read from the election lock's record.
///
/// The host, process id and label come from the owner token leasehold writes
/// (`<host>/<pid>/<uuid>/<ms>#<label>`); a record written by something else has them `None`.
/// A candidate gives its label (an address to reach it) with
/// [`LockOptions::label`](crate::LockOptions::label) on
/// [`campaign_with`](crate::LockManager::campaign_with): it is written with the grant, so it
/// always belongs to the leader it is read with.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The owner token of the leader's election lock: unique per leadership.
    pub token: OwnerToken,
    /// The leader's host name.
    pub host: Option<String>,
    /// The leader's process id.
    pub pid: Option<u32>,
    /// The leader's label (see [`LockOptions::label`](crate::LockOptions::label)), if it gave
    /// one.
    pub label: Option<String>,
    /// When it became leader (its acquisition time, as recorded in the store or the token).
    pub since: Option<SystemTime>,
    /// Its term: the election lock's fencing token, where the store keeps one.
    pub term: Option<u64>,
    /// Time left on its lease when read.
    pub ttl_remaining: Option<Duration>,
}

impl Leader {
    fn from_info(info: LockInfo) -> Option<Leader> {
        let token = info.token?;
        Some(Leader {
            host: token.host().map(str::to_owned),
            pid: token.pid(),
            label: token.label().map(str::to_owned),
            since: info.acquired_at,
            term: info.fencing_token,
            ttl_remaining: info.ttl_remaining,
            token,
        })
    }
}

impl LockManager {
    /// Who leads election `name`, or `None` when nobody does. One read of the election lock.
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>> {
        let key = self.election_key(name)?;
        Ok(self.inspect(key).await?.and_then(Leader::from_info))
    }

    /// A stream of leader changes of election `name`: first who leads now (`None`: nobody), then
    /// every change seen, in order (see [`observe_every`](Self::observe_every)).
    ///
    /// On a store with change notifications ([`LockStore::watch_changes`]: Redis, etcd, the
    /// embedded store) a change is seen as it happens; on the others the election lock is read
    /// every [`DEFAULT_OBSERVE_INTERVAL`].
    ///
    /// [`LockStore::watch_changes`]: crate::LockStore::watch_changes
    pub fn observe(&self, name: &str) -> impl Stream<Item = Result<Option<Leader>>> + Send + '_ {
        self.observe_every(name, DEFAULT_OBSERVE_INTERVAL)
    }

    /// [`observe`](Self::observe), reading every `interval` on a store without change
    /// notifications.
    ///
    /// A change is a different leadership (another owner token) or none. Changes are seen in the
    /// order they happened, and terms grow along the stream; a leadership that begins and ends
    /// between two reads can be missed (the stream then goes straight to the next one).
    ///
    /// Where the store announces grants and releases, the stream reads when one is announced, when
    /// the lease it last saw runs out (a leader that died without resigning: not every store
    /// announces an expiry), and every [`NOTIFIED_BACKSTOP`] or `interval`, whichever is longer,
    /// in case an announcement was lost (a subscription dropped in a failover). An observer never
    /// takes a place in the election's waiter line. A failed read is yielded as an error and the
    /// stream goes on reading (after `interval`), except for an invalid election name, after which
    /// it ends.
    pub fn observe_every(
        &self,
        name: &str,
        interval: Duration,
    ) -> impl Stream<Item = Result<Option<Leader>>> + Send + '_ {
        let interval = interval.max(Duration::from_millis(1));
        let state = Observing {
            name: name.to_owned(),
            last: None,
            changes: None,
            failed: false,
        };
        futures::stream::unfold(Some(state), move |state| async move {
            let mut state = state?;
            let item = state.next_change(self, interval).await;
            state.failed = item.is_err();
            // Bad input fails every read alike: the stream ends after saying so.
            let end = matches!(&item, Err(e) if e.kind() == ErrorKind::InvalidArgument);
            Some((item, (!end).then_some(state)))
        })
    }
}

/// The longest an observer following a store's change announcements goes without reading, in
/// case an announcement was lost.
pub const NOTIFIED_BACKSTOP: Duration = Duration::from_secs(2);

/// A little past a lease's expiry: when an observer reads again after the lease it saw ran out,
/// so the store has surely let it go.
const PAST_EXPIRY: Duration = Duration::from_millis(5);

/// One observer's state between the items of its stream.
struct Observing {
    name: String,
    /// The last leader yielded (`Some(None)`: nobody; `None`: nothing yielded yet).
    last: Option<Option<OwnerToken>>,
    /// The store's change announcements for the election lock, subscribed before the first read
    /// so that a change during it is not missed.
    changes: Option<ChangeWatch>,
    /// Whether the last item was a failed read: the next read waits a while first.
    failed: bool,
}

impl Observing {
    /// Reads until the leader differs from the last one yielded (or a read fails), and returns
    /// what to yield. Reads at once, then whenever a change is announced or the wait runs out.
    async fn next_change(
        &mut self,
        locks: &LockManager,
        interval: Duration,
    ) -> Result<Option<Leader>> {
        let changes = match &mut self.changes {
            Some(changes) => changes,
            None => {
                let key = locks.election_key(&self.name)?;
                self.changes.insert(locks.store().watch_changes(&key).await)
            }
        };
        let quiet = if changes.is_live() {
            interval.max(NOTIFIED_BACKSTOP)
        } else {
            interval
        };
        if self.failed {
            tokio::time::sleep(interval).await;
        }
        loop {
            // Enabled before the read: an announcement during the read ends the wait after it.
            let announced = changes.notify().notified();
            tokio::pin!(announced);
            announced.as_mut().enable();
            let leader = locks.leader(&self.name).await?;
            let token = leader.as_ref().map(|l| l.token.clone());
            if self.last.as_ref() != Some(&token) {
                self.last = Some(token);
                return Ok(leader);
            }
            let mut wait = quiet;
            if let (true, Some(left)) = (
                changes.is_live(),
                leader.as_ref().and_then(|l| l.ttl_remaining),
            ) {
                // Not every store announces an expiry: read again once the lease seen lapses.
                wait = wait.min(left + PAST_EXPIRY);
            }
            tokio::select! {
                () = &mut announced => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}
