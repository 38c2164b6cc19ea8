//! The cluster's members, one client each, and failing over between them.
//!
//! # Why not etcd-client's own balancing
//! `etcd_client::Client::connect` with several endpoints puts them all behind one tonic balanced
//! channel (tower's power-of-two-choices over lazily connected endpoints). A lazy endpoint whose
//! connection failed reports itself *ready* and keeps the connect error for the next request
//! (tonic's `Reconnect::poll_ready` stores it and returns `Ready`); a dead endpoint also carries
//! no load, so the balancer keeps picking it, and every request it picks fails with "connection
//! refused" — there is no retry on another endpoint. A paused member (SIGSTOP) is worse: the
//! connection stays up, and every request picked for it hangs until its timeout. Removing and
//! re-adding endpoints (`Client::remove_endpoint`) would need a health check of our own anyway,
//! and gives no control over which member a stream opens on.
//!
//! # What this does instead
//! One client per member (each a one-endpoint channel), and every request goes to the member that
//! last answered — *the preferred one*, whatever the endpoint order — and on to the next member
//! when that one fails:
//! - refused or never sent (connection refused, no connection in time), or refused before it was
//!   applied (the member has no leader, too many requests): tried on the next member, for every
//!   request;
//! - sent and no reply (a timeout, a connection lost mid-request, a leader change during a write):
//!   a read, a lease keep-alive or anything else that is safe to send twice is tried on the next
//!   member — and *hedged*: sent to the next member too when the first has not answered within a
//!   quarter of the timeout (see [`Members::run`]); a write is returned (`InDoubt`: the readback
//!   resolves it, on a live member).
//! - while the members elect a leader (every one refuses with "no leader"), the request is asked
//!   again, with a growing pause, for up to one timeout — or, for the check a store makes when
//!   it connects, until a longer deadline of the caller's ([`Members::run_until`]).
//!
//! A member that failed is *suspect* for a while: it is tried last, and streams (watches, the
//! waiter lease's keep-alive) that run on it are told to re-open on another member. Every failure
//! names the member (or members) that failed.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::deadlines::Deadlines;
use crate::error::{classify, Verdict};

/// How long a member that failed is tried last (unless every member failed since).
const SUSPECT_FOR: Duration = Duration::from_secs(5);

/// Whether a request may be sent again, to another member, after it was sent and got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// A write: only a request that surely was not applied goes to another member.
    Unsent,
    /// Reads, keep-alives, watches, owner-checked deletes of keys nobody else writes: sent again to
    /// another member after any failure of the member.
    Safe,
}

/// A request that failed on every member it was tried on (or with an answer of the cluster).
#[derive(Debug)]
pub(crate) struct Failed {
    /// The member that answered, or the members tried, each with why it failed (for messages).
    pub(crate) at: String,
    /// The last error.
    pub(crate) error: etcd_client::Error,
    /// No member could be reached (nothing was sent to any): no cluster answers at these
    /// endpoints, as opposed to one that answers without a leader.
    pub(crate) unreached: bool,
}

/// One member: its endpoint and its client, connected when first used.
struct Member {
    /// `host:port`, for messages.
    name: String,
    /// `http://host:port` or `https://host:port`.
    endpoint: String,
    /// Shared, not cloned, per request: a `Client` holds a client for every etcd service, and
    /// cloning them all (and dropping them) cost about 7 % of the client's instructions in an
    /// uncontended lock cycle; a request clones only the service client it uses.
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    /// When a request to it last failed; `None` once it answered again.
    failed_at: Mutex<Option<Instant>>,
}

/// The members of one cluster and which of them to ask first.
pub(crate) struct Members {
    members: Vec<Member>,
    /// The member that answered last: asked first.
    preferred: AtomicUsize,
    /// How long one attempt on one member may take.
    timeout: Duration,
    /// Bounds the reply of each attempt sent by [`round`](Self::round), without a timer each.
    deadlines: Deadlines,
    options: ConnectOptions,
    /// Bumped every time a member is found failing: streams check whether theirs is suspect.
    failures: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Members")
            .field(
                "members",
                &self.members.iter().map(|m| &m.name).collect::<Vec<_>>(),
            )
            .field("preferred", &self.preferred.load(Ordering::Relaxed))
            .finish()
    }
}

impl Members {
    /// The members at `endpoints` (`http://host:port`), each reached with `options`; one attempt
    /// on one member may take `timeout`, of which waiting for a write's reply `reply_timeout`.
    pub(crate) fn new(
        endpoints: &[String],
        options: ConnectOptions,
        timeout: Duration,
        reply_timeout: Duration,
    ) -> Self {
        let members = endpoints
            .iter()
            .map(|endpoint| Member {
                name: endpoint
                    .split_once("://")
                    .map_or(endpoint.as_str(), |(_, host)| host)
                    .to_owned(),
                endpoint: endpoint.clone(),
                client: tokio::sync::Mutex::new(None),
                failed_at: Mutex::new(None),
            })
            .collect();
        Members {
            members,
            preferred: AtomicUsize::new(0),
            timeout,
            deadlines: Deadlines::new(reply_timeout),
            options,
            failures: tokio::sync::watch::Sender::new(0),
        }
    }

    /// `host:port` of member `i`.
    pub(crate) fn name(&self, i: usize) -> &str {
        self.members.get(i).map_or("", |m| m.name.as_str())
    }

    /// Sends a request built by `request` (from a member's client) to the preferred member, and
    /// on to the others as `retry` allows (see the module docs). Each attempt may take the
    /// member timeout.
    pub(crate) async fn run<T, F, Fut>(&self, retry: Retry, request: F) -> Result<T, Failed>
    where
        F: FnMut(&Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.run_at(retry, request).await.map(|(answer, _)| answer)
    }

    /// [`run`](Self::run), also saying which member answered (for a stream that stays on it).
    pub(crate) async fn run_at<T, F, Fut>(
        &self,
        retry: Retry,
        mut request: F,
    ) -> Result<(T, usize), Failed>
    where
        F: FnMut(&Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        if retry == Retry::Safe {
            return self
                .hedged(&mut request, Instant::now() + self.timeout)
                .await;
        }
        // While the members elect a leader they refuse ("no leader"): the round is tried again
        // for up to one member timeout, so an election costs a wait, not a failure.
        let started = Instant::now();
        let mut pause = Duration::from_millis(25);
        loop {
            match self.round(retry, &mut request).await {
                Err((failed, true)) if started.elapsed() + pause < self.timeout => {
                    tracing::debug!(at = %failed.at, "no etcd member has a leader; asking again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                outcome => return outcome.map_err(|(failed, _)| failed),
            }
        }
    }

    /// A request that is safe to send twice (a read), sent as [`run`](Self::run) sends it and
    /// sent again while the cluster is reached but does not serve — its members elect a leader,
    /// or have no quorum yet — until `until` (at least one member timeout). It fails at once
    /// with the cluster's answer (bad credentials, a bad request), and when no member can be
    /// reached at all: no cluster is listening there, and waiting would only hide a wrong
    /// address.
    ///
    /// An election can take longer than one member timeout (several seconds, on a busy
    /// machine or with etcd's default election timeout); a store connected while its cluster
    /// re-forms waits it out with this.
    pub(crate) async fn run_until<T, F, Fut>(
        &self,
        until: Instant,
        mut request: F,
    ) -> Result<T, Failed>
    where
        F: FnMut(&Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let pause = Duration::from_millis(100);
        let until = until.max(Instant::now() + self.timeout);
        loop {
            let deadline = (Instant::now() + self.timeout).min(until);
            match self.hedged(&mut request, deadline).await {
                Ok((answer, _)) => return Ok(answer),
                Err(failed)
                    if !failed.unreached
                        && classify(&failed.error) != Verdict::Answer
                        && Instant::now() + pause < until =>
                {
                    tracing::debug!(at = %failed.at,
                        "the etcd cluster is reached but does not serve yet; asking again");
                    tokio::time::sleep(pause).await;
                }
                Err(failed) => return Err(failed),
            }
        }
    }

    /// A request that is safe to send twice, hedged: sent to the preferred member, and if no
    /// answer came within a quarter of the member timeout (at most 500 ms), sent again to the
    /// next member (and so on, round the members, the earlier attempts still running); a failed
    /// attempt sends the next one at once. The first answer wins, for up to one member timeout
    /// in all, or until `deadline`.
    ///
    /// This is what keeps a renewal alive through a paused leader: a follower forwards a lease
    /// keep-alive to the leader, and a request it forwarded to a leader that stopped answering
    /// waits for its whole timeout, while the same request sent after the election goes to the
    /// new leader.
    async fn hedged<T, F, Fut>(
        &self,
        request: &mut F,
        deadline: Instant,
    ) -> Result<(T, usize), Failed>
    where
        F: FnMut(&Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = Instant::now();
        let hedge = (self.timeout / 4).clamp(Duration::from_millis(50), Duration::from_millis(500));
        let order = self.order();
        let n = order.len();
        if n == 0 {
            return Err(Failed {
                at: String::new(),
                error: etcd_client::Error::InvalidArgs("no etcd endpoint configured".to_owned()),
                unreached: true,
            });
        }
        // Attempts in flight: (id, member, when sent).
        let mut in_flight: Vec<(usize, usize, Instant)> = Vec::new();
        let mut connecting = FuturesUnordered::new();
        let mut running = FuturesUnordered::new();
        let mut launched = 0;
        let mut misses = Misses::new(self.members.len());
        let mut last = None;
        let mut failures = 0;
        let mut pause = Duration::from_millis(25);
        let connect = |id: usize, i: usize| async move { (id, i, self.client(i).await) };
        // The next attempt is sent at once when set, else when `timer` fires. Not a timer at
        // `now` for the first one: tokio's timers tick in whole milliseconds, so a timer that
        // is already due still fires only on the next tick — up to a millisecond added to every
        // read, keep-alive and lease grant (a third of a whole lock cycle on a fast disk).
        let mut launch_now = true;
        let timer = tokio::time::sleep_until(started + hedge);
        tokio::pin!(timer);
        loop {
            if in_flight.is_empty() && order.iter().all(|&i| misses.down[i]) {
                break; // every member is down (nothing was sent): no use waiting
            }
            if std::mem::take(&mut launch_now) && in_flight.len() < 2 * n {
                let i = order[launched % n];
                in_flight.push((launched, i, Instant::now()));
                connecting.push(connect(launched, i));
                launched += 1;
                timer.as_mut().reset(Instant::now() + hedge);
            }
            tokio::select! {
                () = &mut timer, if in_flight.len() < 2 * n => {
                    launch_now = true;
                    continue;
                }
                Some((id, i, client)) = connecting.next(), if !connecting.is_empty() => {
                    match client {
                        Ok(client) => {
                            let attempt = request(&client);
                            running.push(async move { (id, i, attempt.await) });
                            continue;
                        }
                        Err(error) => {
                            in_flight.retain(|(other, _, _)| *other != id);
                            last = Some(self.attempt_failed(i, error, &mut misses)?);
                        }
                    }
                }
                Some((id, i, outcome)) = running.next(), if !running.is_empty() => {
                    in_flight.retain(|(other, _, _)| *other != id);
                    match outcome {
                        Ok(answer) => {
                            self.answered(i);
                            // Who is still silent after a hedge's wait is slow or gone: its
                            // streams should move, and the next request not start with it.
                            let slow = Instant::now() - hedge;
                            for &(_, j, sent) in &in_flight {
                                if j != i && sent <= slow {
                                    self.failed(j);
                                }
                            }
                            return Ok((answer, i));
                        }
                        Err(error) => {
                            last = Some(self.attempt_failed(i, error, &mut misses)?);
                        }
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    misses.reached |= !running.is_empty(); // sent, and no reply yet
                    for &(_, j, _) in &in_flight {
                        self.failed(j);
                        misses.tried.push(format!("{} (no reply within {:?})", self.name(j), self.timeout));
                    }
                    last = Some(etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(
                        format!("no reply within {:?}", self.timeout),
                    )));
                    break;
                }
            }
            // A failed attempt: the next member at once, until each has failed once in this
            // call; then (an election, every member refusing) with a growing pause.
            failures += 1;
            let wait = if failures < n {
                Duration::ZERO
            } else {
                let wait = pause;
                pause = (pause * 2).min(Duration::from_millis(200));
                wait
            };
            if wait.is_zero() {
                launch_now = true;
            } else {
                timer.as_mut().reset(Instant::now() + wait);
            }
        }
        // Each member and failure once, in the order met (an election repeats them every round).
        let mut seen = std::collections::HashSet::new();
        misses.tried.retain(|failure| seen.insert(failure.clone()));
        Err(Failed {
            at: misses.tried.join(", "),
            error: last.unwrap_or_else(|| {
                etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded("no reply"))
            }),
            unreached: !misses.reached,
        })
    }

    /// An attempt on member `i` failed with `error`: the cluster's answer ends the request
    /// (`Err`); anything else is recorded in `misses` (the member down if it could not be sent
    /// to, else reached) and kept for the message.
    fn attempt_failed(
        &self,
        i: usize,
        error: etcd_client::Error,
        misses: &mut Misses,
    ) -> Result<etcd_client::Error, Failed> {
        let verdict = classify(&error);
        if verdict == Verdict::Answer {
            self.answered(i);
            return Err(Failed {
                at: self.name(i).to_owned(),
                error,
                unreached: false,
            });
        }
        self.failed(i);
        if verdict == Verdict::Unsent {
            misses.down[i] = true;
        } else {
            misses.reached = true;
        }
        tracing::debug!(member = self.name(i), %error, ?verdict,
            "an etcd member failed a request; asking another");
        misses
            .tried
            .push(format!("{} ({})", self.name(i), short(&error)));
        Ok(error)
    }

    /// One round over the members (see [`run_at`](Self::run_at)); a failure says whether some
    /// member refused for want of a leader and none had another problem than that or being down.
    async fn round<T, F, Fut>(
        &self,
        retry: Retry,
        request: &mut F,
    ) -> Result<(T, usize), (Failed, bool)>
    where
        F: FnMut(&Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tried = Vec::new();
        let mut last = None;
        let (mut refused, mut other) = (false, false);
        for i in self.order() {
            let member = &self.members[i];
            // Bounded by the store's ticker, not a timer per request (see `crate::deadlines`).
            let outcome = match self.connected(i).await {
                Ok(client) => match self.deadlines.bound(request(&client)).await {
                    Some(outcome) => outcome,
                    None => Err(etcd_client::Error::GRpcStatus(
                        tonic::Status::deadline_exceeded(format!(
                            "no reply within {:?}",
                            self.deadlines.timeout()
                        )),
                    )),
                },
                Err(error) => Err(error),
            };
            let error = match outcome {
                Ok(answer) => {
                    self.answered(i);
                    return Ok((answer, i));
                }
                Err(error) => error,
            };
            let verdict = classify(&error);
            match verdict {
                Verdict::Answer => {
                    // The cluster answered (a lease not found, a bad request): the member works.
                    self.answered(i);
                    let failed = Failed {
                        at: member.name.clone(),
                        error,
                        unreached: false,
                    };
                    return Err((failed, false));
                }
                Verdict::Unsent => self.failed(i),
                Verdict::Refused => {
                    refused |= is_no_leader(&error);
                    other |= !is_no_leader(&error);
                    self.failed(i);
                }
                Verdict::Lost => {
                    other = true;
                    self.failed(i);
                    if retry == Retry::Unsent {
                        let failed = Failed {
                            at: member.name.clone(),
                            error,
                            unreached: false,
                        };
                        return Err((failed, false));
                    }
                }
            }
            tracing::debug!(member = %member.name, %error, ?verdict,
                "an etcd member failed a request; trying the next one");
            tried.push(format!("{} ({})", member.name, short(&error)));
            last = Some(error);
        }
        let failed = Failed {
            at: tried.join(", "),
            error: last.unwrap_or_else(|| {
                etcd_client::Error::InvalidArgs("no etcd endpoint configured".to_owned())
            }),
            unreached: !refused && !other,
        };
        Err((failed, refused && !other))
    }

    /// The members in the order to try them: the preferred one and those after it, the suspect
    /// ones last (the longest-suspect first among them).
    fn order(&self) -> Vec<usize> {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed) % n.max(1);
        let now = Instant::now();
        let mut healthy = Vec::with_capacity(n);
        let mut suspect = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            match self.members[i].failed_since(now) {
                Some(at) => suspect.push((at, i)),
                None => healthy.push(i),
            }
        }
        suspect.sort_by_key(|(at, _)| *at);
        healthy.extend(suspect.into_iter().map(|(_, i)| i));
        healthy
    }

    /// Member `i` answered: it is asked first from now on.
    fn answered(&self, i: usize) {
        *self.members[i]
            .failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.preferred.store(i, Ordering::Relaxed);
    }

    /// Member `i` failed a request: it is suspect, and if it was preferred, the next member that
    /// is not becomes so.
    pub(crate) fn failed(&self, i: usize) {
        *self.members[i]
            .failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        if self.preferred.load(Ordering::Relaxed) == i {
            if let Some(&next) = self.order().first() {
                let _ =
                    self.preferred
                        .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        self.failures.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A stream on member `i` failed with `error`: the member is suspect if the error says it
    /// is down, cut off or slow (not when the cluster answered).
    pub(crate) fn failed_by(&self, i: usize, error: &etcd_client::Error) {
        if classify(error) != Verdict::Answer {
            self.failed(i);
        }
    }

    /// Whether member `i` failed a request lately (a stream on it should move).
    pub(crate) fn is_suspect(&self, i: usize) -> bool {
        self.members
            .get(i)
            .is_some_and(|m| m.failed_since(Instant::now()).is_some())
    }

    /// Changes whenever a member is found failing.
    pub(crate) fn failures(&self) -> tokio::sync::watch::Receiver<u64> {
        self.failures.subscribe()
    }

    /// How long one attempt on one member may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Member `i`'s client, as [`client`](Self::client), with connecting (the first use:
    /// with credentials it authenticates, a request of its own) bounded by the member timeout; a
    /// client already connected costs no timer.
    async fn connected(&self, i: usize) -> Result<Arc<Client>, etcd_client::Error> {
        if let Ok(client) = self.members[i].client.try_lock() {
            if let Some(client) = &*client {
                return Ok(client.clone());
            }
        }
        match tokio::time::timeout(self.timeout, self.client(i)).await {
            Ok(connected) => connected,
            Err(_) => Err(crate::error::not_connected_within(self.timeout)),
        }
    }

    /// Member `i`'s client, connected on first use (with credentials, connecting authenticates,
    /// so a member that is down at start is connected later, when it is asked).
    async fn client(&self, i: usize) -> Result<Arc<Client>, etcd_client::Error> {
        let member = &self.members[i];
        let mut client = member.client.lock().await;
        if let Some(client) = &*client {
            return Ok(client.clone());
        }
        // Boxed: connecting is rare, and its future is large; unboxed, every request's future
        // (and every move of it) would be that large too.
        let connect = Box::pin(Client::connect(
            [member.endpoint.as_str()],
            Some(self.options.clone()),
        ));
        let connected = Arc::new(connect.await?);
        *client = Some(connected.clone());
        Ok(connected)
    }
}

impl Member {
    /// When it failed, if that was less than [`SUSPECT_FOR`] before `now`.
    fn failed_since(&self, now: Instant) -> Option<Instant> {
        let failed_at = *self
            .failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        failed_at.filter(|at| now.saturating_duration_since(*at) < SUSPECT_FOR)
    }
}

/// A member refused because it has no leader (an election is under way, or it is cut off).
fn is_no_leader(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.message().contains("no leader"))
}

/// What a hedged request's failed attempts left behind, for its next step and its message.
struct Misses {
    /// Each member that could not be sent to (no use waiting for it again).
    down: Vec<bool>,
    /// Whether a member was reached: it refused, lost or never answered a request it was sent.
    /// Attempts still connecting when the deadline comes reached nobody.
    reached: bool,
    /// Each failed attempt: the member and why, in the order met.
    tried: Vec<String>,
}

impl Misses {
    fn new(members: usize) -> Self {
        Misses {
            down: vec![false; members],
            reached: false,
            tried: Vec::new(),
        }
    }
}

/// A failure in a few words, for the list of members tried.
fn short(error: &etcd_client::Error) -> String {
    let text = match error {
        etcd_client::Error::GRpcStatus(status) => status.message().to_owned(),
        // A transport error says "transport error"; its innermost cause says what happened.
        other => {
            let mut text = other.to_string();
            let mut cause = std::error::Error::source(other);
            while let Some(inner) = cause {
                text = inner.to_string();
                cause = inner.source();
            }
            text
        }
    };
    let text = text.lines().next().unwrap_or_default();
    let mut short: String = text.chars().take(80).collect();
    if short.is_empty() {
        short = "failed".to_owned();
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> Members {
        let endpoints: Vec<String> = (1..=3).map(|i| format!("http://10.0.0.{i}:2379")).collect();
        let second = Duration::from_secs(1);
        Members::new(&endpoints, ConnectOptions::new(), second, second)
    }

    #[test]
    fn the_member_that_answered_last_is_asked_first() {
        let members = members();
        assert_eq!(members.order(), [0, 1, 2]);
        assert_eq!(members.name(0), "10.0.0.1:2379");
        members.answered(2);
        assert_eq!(members.order(), [2, 0, 1]);
    }

    #[test]
    fn a_member_that_failed_is_asked_last_and_loses_its_place() {
        let members = members();
        let failures = members.failures();
        members.failed(0);
        assert!(members.is_suspect(0));
        assert!(failures.has_changed().unwrap(), "streams are told");
        assert_eq!(members.order(), [1, 2, 0]);
        members.failed(1);
        assert_eq!(
            members.order(),
            [2, 0, 1],
            "the one that failed first is tried first of the suspect ones"
        );
        members.answered(0);
        assert!(!members.is_suspect(0));
        assert_eq!(members.order(), [0, 2, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn suspicion_lapses() {
        let members = members();
        members.failed(1);
        assert!(members.is_suspect(1));
        tokio::time::advance(SUSPECT_FOR + Duration::from_millis(1)).await;
        assert!(!members.is_suspect(1));
        assert_eq!(members.order(), [0, 1, 2]);
    }

    #[test]
    fn a_failure_is_named_in_a_few_words() {
        let error = etcd_client::Error::IoError(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert!(
            short(&error).ends_with("connection refused"),
            "{}",
            short(&error)
        );
        let long = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("x".repeat(200)));
        assert_eq!(short(&long).len(), 80);
    }
}
