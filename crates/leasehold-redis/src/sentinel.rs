//! The master Sentinel names, followed across failovers.
//!
//! The store keeps one connection to the master. It is made only to a node the sentinels name and
//! that answers `ROLE` as a master itself, and it is never remade to the same address behind the
//! sentinels' back: a killed master restarted by its supervisor comes back as an empty master
//! until the sentinels make it a replica, and a connection that silently reconnected to it would
//! write there. When the master stops serving (a `READONLY` or `MASTERDOWN` answer, a refused or
//! lost connection, a timeout) the connection is dropped and a search starts at once, in the
//! background: every sentinel is asked, the answer with the highest configuration epoch wins (a
//! sentinel that has not heard of the failover yet names the old master under an older epoch),
//! and the node named is connected to and asked its role; until one answers as a master the
//! search asks again after a short pause. Commands meanwhile wait for it, up to the connect
//! timeout. A command a node refused with `READONLY` was not applied, so it is sent once more to
//! the master found; one whose connection broke is not (its outcome is in doubt, and the caller's
//! readback decides).

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisResult, Value};
use tokio::time::Instant;

pub(crate) use access::SentinelAccess;
use master::Master;
pub(crate) use unfound::Refusal;
use unfound::Unfound;

mod access;
mod master;
mod unfound;

/// The pauses between searches for the master while none answers as one (the last repeats).
const SEARCH_PAUSES: [Duration; 5] = [
    Duration::from_millis(20),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(250),
];

/// Held by the search task: if it ends without finding a master, the link no longer counts it
/// as running.
struct SearchRuns(Option<Weak<SentinelLink>>);

impl Drop for SearchRuns {
    fn drop(&mut self) {
        if let Some(link) = self.0.take().and_then(|me| me.upgrade()) {
            link.state().searching = false;
        }
    }
}

/// What the link knows now.
struct State {
    /// The master in use; `None` from a failure until the search finds one.
    master: Option<Master>,
    /// Whether a search runs.
    searching: bool,
    /// Why the last search round found no master, naming the node or sentinel, for messages.
    problem: Option<Unfound>,
    /// The node of the latest failure, and when.
    failed: Option<(String, Instant)>,
    /// When the master in use was found.
    found_at: Option<Instant>,
    generation: u64,
    /// The node or sentinel that has refused the URL's credentials in every search round
    /// since a first refusal: a refusal is final only once it has lasted the connect timeout
    /// (see [`SentinelLink::search`]).
    refused: Option<Streak>,
}

/// Why connecting through the sentinels failed.
#[derive(Debug)]
pub(crate) enum Unconnected {
    /// A data node the sentinels named, or the sentinels, refused the URL's credentials or
    /// permissions: waiting does not mend it.
    Refused(Refusal),
    /// No master answered as one in time (or TLS failed): the error says why.
    Unreached(RedisError),
}

/// Refusals by one node or sentinel in consecutive search rounds.
struct Streak {
    /// `host:port` of the node, or `sentinel host:port`.
    at: String,
    /// The first round it refused, and the latest.
    since: Instant,
    latest: Instant,
}

/// How the latest search for the master ended: with a master (see
/// [`SentinelLink::master_address`]), or with the refusal kept here.
#[derive(Debug, Clone, Default)]
pub(crate) struct Searched {
    /// The refusal that ended the latest search, if one did (a master found since clears it).
    refused: Option<Refusal>,
}

/// The master the sentinels named last, and how to find it again.
pub(crate) struct SentinelLink {
    access: SentinelAccess,
    state: RwLock<State>,
    /// How each search ended, as it ends: the subscriber follows the masters found.
    found: tokio::sync::watch::Sender<Searched>,
    /// The link itself, for the search task it starts.
    me: Weak<SentinelLink>,
}

impl SentinelLink {
    /// Finds the master through the sentinels and connects to it. The first round may meet a
    /// failover in progress, so it waits up to twice the connect timeout; and while the sentinels
    /// name a master that does not answer as one (down, restarting, or being failed over), up to
    /// the master wait in all. When no sentinel names one (none answers, or none monitors the
    /// name), waiting would only hide a wrong address: it fails after the first wait.
    pub(crate) async fn connect(access: SentinelAccess) -> Result<Arc<SentinelLink>, Unconnected> {
        let started = Instant::now();
        let first = access.connect_timeout.saturating_mul(2);
        let whole = access.master_wait.max(first);
        let link = Self::unconnected(access);
        let mut wait = first;
        let mut waited_on = false;
        loop {
            let Err(error) = link.master_within(wait).await else {
                return Ok(link);
            };
            if let Some(refusal) = link.found.borrow().refused.clone() {
                return Err(Unconnected::Refused(refusal));
            }
            let (unfound, refusing) = {
                let state = link.read();
                (state.problem.clone(), state.refused.is_some())
            };
            let left = whole.saturating_sub(started.elapsed());
            match unfound {
                // A named master that does not answer as one yet, or a refusal that has not
                // lasted long enough to be final (see `search`): waited for.
                Some(unfound) if (unfound.named || refusing) && !left.is_zero() => {
                    wait = left;
                    waited_on = true;
                }
                Some(unfound) if unfound.named && waited_on => {
                    return Err(Unconnected::Unreached(no_master(format!(
                        "the sentinels name a master {:?}, but it did not answer as one within \
                         {:?}: {unfound}; a failover takes the sentinels' \
                         down-after-milliseconds and more: raise RedisConfig::master_wait to \
                         wait longer",
                        link.access.spec.master,
                        started.elapsed()
                    ))))
                }
                _ => return Err(Unconnected::Unreached(error)),
            }
        }
    }

    /// A link with no master yet (the search has not started).
    fn unconnected(access: SentinelAccess) -> Arc<SentinelLink> {
        Arc::new_cyclic(|me| SentinelLink {
            access,
            state: RwLock::new(State {
                master: None,
                searching: false,
                problem: None,
                failed: None,
                found_at: None,
                generation: 0,
                refused: None,
            }),
            found: tokio::sync::watch::channel(Searched::default()).0,
            me: me.clone(),
        })
    }

    /// The master in use, if its connection has not dropped. The state's lock is released
    /// before this returns: nothing that takes it again (giving up a broken master, the search)
    /// may run while it is held, or the thread waits on itself and a runtime worker is gone.
    fn usable_master(&self) -> Option<Master> {
        let master = self.read().master.clone();
        master.filter(|m| !m.broken.load(Ordering::Acquire))
    }

    fn state(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The database the store uses.
    pub(crate) fn db(&self) -> i64 {
        self.access.spec.db
    }

    /// The node messages name: the one a command failed on since the master in use was found
    /// (or the latest failure, while there is none), else the master in use.
    pub(crate) fn address(&self) -> String {
        let state = self.read();
        if let Some((node, at)) = &state.failed {
            if state.master.is_none() || state.found_at.is_some_and(|found| *at >= found) {
                return match &state.problem {
                    Some(problem) if state.master.is_none() => {
                        format!("{node}; no master since: {problem}")
                    }
                    _ => node.clone(),
                };
            }
        }
        match (&state.master, &state.problem) {
            (Some(master), _) => master.address.clone(),
            (None, Some(problem)) => format!("no master yet: {problem}"),
            (None, None) => "no master yet".to_owned(),
        }
    }

    /// The address of the master in use, if there is one.
    pub(crate) fn master_address(&self) -> Option<String> {
        self.read().master.as_ref().map(|m| m.address.clone())
    }

    /// Tells of every search that ends (a master found, see [`Self::master_address`], or a
    /// refusal).
    pub(crate) fn found(&self) -> tokio::sync::watch::Receiver<Searched> {
        self.found.subscribe()
    }

    /// A client for the master in use (for the subscriber connection), found first if need be.
    pub(crate) async fn master_client(&self) -> RedisResult<(redis::Client, String)> {
        let master = self.master_within(self.access.connect_timeout).await?;
        Ok((master.client, master.address))
    }

    /// The master in use; if there is none, starts the search (unless it runs) and waits for it
    /// up to `wait`. A search that ends on a refusal of the URL's credentials or permissions
    /// (one that lasted the connect timeout, see [`Self::search`]) ends the wait at once with
    /// that refusal's error.
    async fn master_within(&self, wait: Duration) -> RedisResult<Master> {
        let mut found = self.found.subscribe();
        if let Some(master) = self.usable_master() {
            return Ok(master);
        }
        // A master whose connection dropped (its disconnection push may not have given it up
        // yet) is given up here. Not in an `if let` on the state's guard: that guard would live
        // through the block, and giving the master up takes the lock for writing — the thread
        // would wait on itself for good (a std lock), and every task after it on the link too,
        // until no runtime worker was left to fire a timeout.
        self.connection_dropped();
        self.search();
        let waited = tokio::time::timeout(wait, async {
            loop {
                if found.changed().await.is_err() {
                    return None;
                }
                if let Some(master) = self.usable_master() {
                    return Some(Ok(master));
                }
                let refused = found.borrow_and_update().refused.clone();
                if let Some(refusal) = refused {
                    return Some(Err(refusal.error));
                }
            }
        })
        .await;
        match waited {
            Ok(Some(found)) => found,
            _ => {
                let problem = self.read().problem.as_ref().map_or_else(
                    || "the sentinels have not answered yet".to_owned(),
                    ToString::to_string,
                );
                Err(no_master(format!(
                    "no master of {:?} answered as one within {wait:?}: {problem}",
                    self.access.spec.master
                )))
            }
        }
    }

    /// Starts the search for the master in the background, unless it runs.
    ///
    /// A round refused by the URL's credentials or permissions (a wrong password, an ACL) ends
    /// the search once the same node or sentinel has refused every round for the connect
    /// timeout: no failover mends a wrong password, so whoever waits fails then with the
    /// refusal, instead of at the end of its wait. Not at the first refusal: while a failover
    /// is under way the address named may briefly answer for another server.
    fn search(&self) {
        {
            let mut state = self.state();
            if state.searching || state.master.is_some() {
                return;
            }
            state.searching = true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to search from: the next command, on one, starts the search.
            self.state().searching = false;
            return;
        };
        let me = self.me.clone();
        runtime.spawn(async move {
            // A search that ends without a master (it panicked) lets the next command start
            // one again, rather than every command waiting its connect timeout on none.
            let mut runs = SearchRuns(Some(me.clone()));
            let mut pauses = SEARCH_PAUSES
                .iter()
                .chain(std::iter::repeat(&SEARCH_PAUSES[SEARCH_PAUSES.len() - 1]));
            loop {
                let Some(link) = me.upgrade() else {
                    return; // the store is gone
                };
                match master::find(&link.access, link.on_disconnect()).await {
                    Ok(master) => {
                        {
                            let mut state = link.state();
                            state.generation += 1;
                            let master = Master {
                                generation: state.generation,
                                ..master
                            };
                            tracing::info!(master = %master.address,
                                "following the master Redis Sentinel names");
                            state.master = Some(master);
                            state.found_at = Some(Instant::now());
                            state.searching = false;
                            state.problem = None;
                            state.refused = None;
                        }
                        runs.0 = None;
                        link.found.send_replace(Searched { refused: None });
                        return;
                    }
                    Err(mut problem) => {
                        let refusal = problem.refused.take();
                        let settled = {
                            let mut state = link.state();
                            let settled = link.refusal_settled(&mut state, refusal);
                            state.problem = Some(problem.clone());
                            if settled.is_some() {
                                state.searching = false;
                            }
                            settled
                        };
                        if let Some(refusal) = settled {
                            tracing::warn!(%problem,
                                "Redis Sentinel: the URL's credentials or permissions are refused");
                            runs.0 = None;
                            link.found
                                .send_modify(|searched| searched.refused = Some(refusal));
                            return;
                        }
                        tracing::debug!(%problem, "no Redis Sentinel master answers as one yet");
                    }
                }
                drop(link);
                if let Some(pause) = pauses.next() {
                    tokio::time::sleep(*pause).await;
                }
            }
        });
    }

    /// Keeps count of a round's `refusal` (`None`: the round was not refused); returns it once
    /// the same node or sentinel has refused every round for the connect timeout. A streak
    /// whose latest refusal is older than that (the search stopped, and starts again long
    /// after) starts over.
    fn refusal_settled(&self, state: &mut State, refusal: Option<Refusal>) -> Option<Refusal> {
        let Some(refusal) = refusal else {
            state.refused = None;
            return None;
        };
        let now = Instant::now();
        let window = self.access.connect_timeout;
        match &mut state.refused {
            Some(streak) if streak.at == refusal.at && now - streak.latest <= window => {
                streak.latest = now;
            }
            _ => {
                state.refused = Some(Streak {
                    at: refusal.at.clone(),
                    since: now,
                    latest: now,
                });
            }
        }
        let lasted = state
            .refused
            .as_ref()
            .is_some_and(|s| now - s.since >= window);
        lasted.then_some(refusal)
    }

    /// What a master's connection runs when it drops: the link, if still there, gives the master
    /// up and the search starts.
    fn on_disconnect(&self) -> impl Fn() + Send + Sync + 'static {
        let me = self.me.clone();
        move || {
            if let Some(link) = me.upgrade() {
                link.connection_dropped();
            }
        }
    }

    /// The connection to the master in use dropped: it is given up and the search starts.
    fn connection_dropped(&self) {
        // The master given up is dropped after the lock is released: nothing of its connection
        // runs under the state's lock.
        let dropped = {
            let mut state = self.state();
            match state.master.take() {
                Some(master) if master.broken.load(Ordering::Acquire) => {
                    state.failed = Some((master.address.clone(), Instant::now()));
                    Some(master)
                }
                other => {
                    state.master = other;
                    None
                }
            }
        };
        if let Some(master) = dropped {
            let address = &master.address;
            tracing::warn!(master = %address,
                "the connection to the Redis Sentinel master dropped; asking the sentinels");
            self.search();
        }
    }

    /// `master` answered `result`: if that means it may no longer be the master (a refusal
    /// only a replica gives, a refused, lost or timed-out connection), it is given up (if still
    /// in use) and the search starts. Returns whether it was.
    fn check(&self, master: &Master, result: &RedisResult<Value>) -> bool {
        let why = match result {
            Err(error) if master_moved(error) => error.to_string(),
            Ok(Value::ServerError(error))
                if not_master(error.code())
                    || crate::error::demoted(Some(error.code()), error.details()) =>
            {
                format!("{} {}", error.code(), error.details().unwrap_or_default())
            }
            _ => return false,
        };
        {
            let mut state = self.state();
            state.failed = Some((master.address.clone(), Instant::now()));
            if state
                .master
                .as_ref()
                .is_some_and(|m| m.generation == master.generation)
            {
                tracing::warn!(master = %master.address, error = %why,
                    "the Redis Sentinel master stopped serving; asking the sentinels");
                state.master = None;
            }
        }
        self.search();
        true
    }

    /// `cmd` on the master. If the master refused it without running it (`READONLY`: a demoted
    /// master), it goes once more to the master the sentinels name now.
    pub(crate) async fn request(&self, cmd: &Cmd) -> RedisResult<Value> {
        let master = self.master_within(self.access.connect_timeout).await?;
        let result = master.connection.clone().req_packed_command(cmd).await;
        // A server's refusal comes back as a value, not an error.
        let refused = matches!(&result, Ok(Value::ServerError(e)) if not_master(e.code()));
        if !self.check(&master, &result) || !refused {
            return result;
        }
        let Ok(next) = self.master_within(self.access.connect_timeout).await else {
            return result;
        };
        let retried = next.connection.clone().req_packed_command(cmd).await;
        self.check(&next, &retried);
        retried
    }

    /// A pipeline on the master (not sent again on a refusal: part of it may have run).
    pub(crate) async fn request_pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let master = self.master_within(self.access.connect_timeout).await?;
        let result = master
            .connection
            .clone()
            .req_packed_commands(pipeline, offset, count)
            .await;
        let first_refusal = match &result {
            Ok(values) => values
                .iter()
                .find(|v| matches!(v, Value::ServerError(e) if not_master(e.code())))
                .cloned()
                .map(Ok),
            Err(error) => Some(Err(error.clone())),
        };
        if let Some(refusal) = first_refusal {
            self.check(&master, &refusal);
        }
        result
    }
}

/// Answers after which the node in use may no longer be the master.
fn master_moved(error: &RedisError) -> bool {
    error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_io_error()
        || error.is_timeout()
        || error.code().is_some_and(not_master)
        || crate::error::demoted(error.code(), error.detail())
}

/// Refusals only a node that is not the master gives, without running the command.
fn not_master(code: &str) -> bool {
    matches!(code, "READONLY" | "MASTERDOWN")
}

/// No master to send to: nothing was sent (a refusal, for the error mapping).
fn no_master(message: String) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        message,
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::sync::atomic::AtomicBool;

    use leasehold_testkit::redis::{free_port, RedisServer};
    use redis::ProtocolVersion;

    use super::*;
    use crate::topology::SentinelSpec;

    /// A link whose only sentinel does not run: a search finds no master.
    fn link_without_sentinels() -> Arc<SentinelLink> {
        SentinelLink::unconnected(SentinelAccess {
            spec: SentinelSpec {
                sentinels: vec![("127.0.0.1".to_owned(), free_port().unwrap())],
                master: "mymaster".to_owned(),
                db: 0,
                tls: false,
                username: None,
                password: None,
                sentinel_username: None,
                sentinel_password: None,
            },
            #[cfg(feature = "tls")]
            certificates: None,
            connect_timeout: Duration::from_millis(200),
            response_timeout: Duration::from_millis(200),
            master_wait: Duration::from_secs(1),
        })
    }

    /// The window this closes: the master's disconnection push marks its connection broken, and
    /// before the push gives the master up a command asks for the master. The command used to
    /// give it up itself while still holding the state's read guard (an `if let` on it), so its
    /// thread waited on itself for good — and with it every later user of the link and, once the
    /// runtime's workers were all caught, every timeout: the Sentinel waiting test hung at 0 %
    /// CPU with no client on the new master.
    #[test]
    fn a_command_that_finds_the_master_broken_gives_it_up_and_fails_within_its_wait() {
        let server = RedisServer::start().expect("start redis-server");
        let port = server.port();
        let (done, finished) = std::sync::mpsc::channel();
        // Its own thread and runtime: a thread caught on the lock is left behind, not the test.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let outcome = runtime.block_on(async {
                let link = link_without_sentinels();
                let client = link
                    .access
                    .node_client("127.0.0.1", port, ProtocolVersion::RESP2)
                    .unwrap();
                let connection = client.get_multiplexed_async_connection().await.unwrap();
                let address = format!("127.0.0.1:{port}");
                link.state().master = Some(Master {
                    connection,
                    broken: Arc::new(AtomicBool::new(true)),
                    client,
                    address: address.clone(),
                    generation: 1,
                });
                let wait = Duration::from_millis(300);
                let started = Instant::now();
                let outcome = link.master_within(wait).await.map(|m| m.address);
                let state = link.read();
                (
                    outcome.map_err(|e| e.to_string()),
                    started.elapsed(),
                    state.master.is_none(),
                    state.failed.as_ref().map(|(node, _)| node.clone()),
                    address,
                )
            });
            let _ = done.send(outcome);
        });
        let (outcome, took, given_up, failed, address) = finished
            .recv_timeout(Duration::from_secs(30))
            .expect("asking for a broken master returned within its wait (no self-deadlock)");
        let error = outcome.expect_err("no sentinel runs: no master to give");
        assert!(error.contains("no master"), "{error}");
        assert!(
            took < Duration::from_secs(5),
            "bounded by its wait: {took:?}"
        );
        assert!(given_up, "the broken master was given up");
        assert_eq!(failed, Some(address), "and named as the node that failed");
        drop(server);
    }
}
