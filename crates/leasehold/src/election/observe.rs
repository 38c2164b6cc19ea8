//! Who leads an election, as a stream of changes, read by polling the election lock.

use std::time::{Duration, SystemTime};

use futures::Stream;

use crate::core::{LockInfo, OwnerToken, Result};
use crate::LockManager;

/// How often [`LockManager::observe`] reads the election lock.
pub const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_millis(250);

/// Who leads an election: read from the election lock's record.
///
/// The host and process id come from the owner token leasehold writes
/// (`<host>/<pid>/<uuid>/<ms>`); a record written by something else has them `None`. The lock
/// record carries nothing else, so a value of the leader's own (an address to reach it) is not
/// part of it: publish it where the term fences it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The owner token of the leader's election lock: unique per leadership.
    pub token: OwnerToken,
    /// The leader's host name.
    pub host: Option<String>,
    /// The leader's process id.
    pub pid: Option<u32>,
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
    /// every change seen, in order. Reads the election lock every
    /// [`DEFAULT_OBSERVE_INTERVAL`] (see [`observe_every`](Self::observe_every)).
    pub fn observe(&self, name: &str) -> impl Stream<Item = Result<Option<Leader>>> + Send + '_ {
        self.observe_every(name, DEFAULT_OBSERVE_INTERVAL)
    }

    /// [`observe`](Self::observe), reading every `interval`.
    ///
    /// A change is a different leadership (another owner token) or none. Changes are seen in the
    /// order they happened, and terms grow along the stream; a leadership that begins and ends
    /// within one interval can be missed (the stream then goes straight to the next one). The
    /// stream polls rather than following store notifications: the stores' notifications are
    /// tied to waiting for the lock, and an observer must never take a place in the waiter line.
    /// A failed read is yielded as an error and the stream goes on reading.
    pub fn observe_every(
        &self,
        name: &str,
        interval: Duration,
    ) -> impl Stream<Item = Result<Option<Leader>>> + Send + '_ {
        let name = name.to_owned();
        let interval = interval.max(Duration::from_millis(1));
        // State: the last leader yielded (`Some(None)`: nobody; `None`: nothing yielded yet), and
        // whether to read at once.
        futures::stream::unfold((None::<Option<OwnerToken>>, true), move |(last, first)| {
            let name = name.clone();
            async move {
                if !first {
                    tokio::time::sleep(interval).await;
                }
                loop {
                    match self.leader(&name).await {
                        Ok(leader) => {
                            let now = leader.as_ref().map(|l| l.token.clone());
                            if last.as_ref() != Some(&now) {
                                return Some((Ok(leader), (Some(now), false)));
                            }
                        }
                        Err(error) => return Some((Err(error), (last, false))),
                    }
                    tokio::time::sleep(interval).await;
                }
            }
        })
    }
}
