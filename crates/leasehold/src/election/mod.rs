//! Leader election on any store, built on the manager's locks: one exclusive lock per election,
//! renewed while its holder leads.
//!
//! - [`LockManager::campaign`] waits until this candidate leads and returns a [`Leadership`]
//!   guard: its [`term`](Leadership::term) is the lock's fencing token (greater for every new
//!   leader from another process; see `term` for hand-off within one), [`lost`](Leadership::lost) resolves when leadership is lost, and
//!   [`resign`](Leadership::resign) or dropping it hands leadership over at once (an
//!   owner-checked release). The manager's [`shutdown`](LockManager::shutdown) resigns too, since
//!   it releases the locks still held, so a rolling restart hands leadership over immediately.
//! - [`LockManager::observe`] is a stream of who leads: host, process id, since when, and term.
//! - [`LockManager::lead`] runs a future while this candidate leads, cancels it when leadership
//!   is lost, and campaigns again (Curator's `LeaderSelector`).
//!
//! # The guarantee
//! A candidate that loses its lease never believes it leads. [`Leadership::is_leader`] turns
//! `false`, and [`Leadership::lost`] resolves, at the first of: a renewal finding the lock taken
//! or gone (it learns at its next renewal, every third of the TTL by default), or the lease's
//! local expiry passing without a successful renewal (the store unreachable, or this process
//! paused): the local expiry is measured from just before each acquire or renewal request was
//! sent, so it never comes after the store's. What it rests on: the store's own lease expiry
//! (a broken or expired lock is free in the store) and a monotonic clock in this process that
//! does not run slower than the store's by more than the lease's margin.
//!
//! That is not enough for writes that leave the process: a leader may be paused (GC, SIGSTOP,
//! a slow disk) after checking `is_leader` and before its write lands. Pass the
//! [term](Leadership::term) with every write and let the resource reject a term lower than the
//! highest it has seen (see `docs/FENCING.md`): the new leader's term is always greater.
//!
//! The election's lock is the manager's lock on the entity `election/<name>`, so any tool that
//! inspects locks (and `leasehold inspect`) sees who leads.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::core::{Error, ErrorKind, Lease, LockKey, OwnerToken, Result};
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::manager::{LockManager, LockOptions};

mod lead;
mod observe;

pub use observe::{Leader, DEFAULT_OBSERVE_INTERVAL, NOTIFIED_BACKSTOP};

/// The examples of `docs/ELECTIONS.md`, compiled as doc tests so they never go stale.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/ELECTIONS.md")]
pub struct ElectionsDoctests;

/// How long one wait of [`LockManager::campaign`] lasts before it simply waits again: a campaign
/// has no deadline, and a wait is bounded by the store's maximum TTL.
const CAMPAIGN_WAIT: Duration = Duration::from_secs(3600);

/// The pause before a campaign tries again after a store error it can ride out.
const CAMPAIGN_RETRY: Duration = Duration::from_secs(1);

/// Leadership of one election, held while this guard lives: dropping it, or
/// [`resign`](Self::resign), gives leadership up at once.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::{LockManager, LockOptions};
/// let locks = LockManager::builder().client_id("billing").farm_id("f1").build()?;
/// let leadership = locks
///     .campaign_with("invoicer", LockOptions::new().ttl(Duration::from_secs(10)))
///     .await?;
/// assert!(leadership.is_leader());
/// let term = leadership.term().expect("the embedded store fences");
/// // ... write with `term`, so a deposed leader's late writes are rejected ...
/// # let _ = term;
/// tokio::select! {
///     _ = async { /* the leader's work */ } => {}
///     lost = leadership.lost() => eprintln!("no longer leading: {lost}"),
/// }
/// assert!(leadership.resign().await?);
/// # Ok(()) }
/// ```
#[must_use = "if unused, leadership is given up immediately"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    name: Arc<str>,
}

impl Leadership {
    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The term of this leadership: the election lock's fencing token, greater than every
    /// earlier leader's. `None` on a store without fencing tokens
    /// ([`Capabilities::fencing`](crate::Capabilities::fencing)). With local competition's
    /// hand-off on, a leadership passed to another candidate of the same process keeps the
    /// lease, so both share one term: campaign for one election once per process (or leave
    /// hand-off off) where terms must differ.
    pub fn term(&self) -> Option<u64> {
        self.guard.fencing_token()
    }

    /// The election lock's lease (key, owner token, fencing token), as last renewed.
    pub fn lease(&self) -> Lease {
        self.guard.lease()
    }

    /// The owner token this candidate leads under (what [`LockManager::observe`] reports).
    pub fn token(&self) -> &OwnerToken {
        self.guard.token()
    }

    /// Whether this candidate still leads as far as it can know: `false` once renewal found the
    /// lock taken or gone, or once the lease's local expiry has passed without a renewal (even if
    /// the renewal task has not run yet, as after a pause of the process).
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when leadership is lost, with an [`ErrorKind::NotHeld`] error saying why: renewal
    /// found the lock taken or gone, the store stayed unreachable until the lease expired, the
    /// lease's local expiry passed without a renewal, or the manager shut down. Never resolves
    /// while this candidate leads.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn lost(&self) -> Error {
        loop {
            let expires_at = self.guard.lease().expires_at();
            tokio::select! {
                biased;
                error = self.guard.lost() => return error,
                () = tokio::time::sleep_until(expires_at) => {
                    // A renewal may have moved the expiry meanwhile: only a lease still past its
                    // expiry is lost.
                    if !self.guard.is_held() {
                        return Error::not_held(format!(
                            "leadership of `{}` lapsed: its lease expired before it could be \
                             renewed",
                            self.name
                        ))
                        .with_key(self.guard.key().as_str());
                    }
                }
            }
        }
    }

    /// Gives leadership up now: an owner-checked release of the election lock, so another
    /// candidate can lead at once. `Ok(true)`: this candidate still led and no longer does;
    /// `Ok(false)`: it had already lost leadership.
    pub async fn resign(self) -> Result<bool> {
        self.guard.release().await
    }
}

/// The entity whose lock is election `name`'s: `election/<name>` (see
/// [`LockManager::election_key`] for its key). No I/O, no validation.
///
/// ```
/// assert_eq!(leasehold::election::entity("invoicer"), "election/invoicer");
/// ```
pub fn entity(name: &str) -> String {
    format!("election/{name}")
}

impl LockManager {
    /// The lock key of election `name`: the entity `election/<name>` at the manager's default
    /// level. No I/O.
    pub fn election_key(&self, name: &str) -> Result<LockKey> {
        self.key(&entity(name))
    }

    /// Campaigns in election `name` until this candidate leads, as long as that takes, with the
    /// manager's default TTL (see [`campaign_with`](Self::campaign_with) for a shorter one, which
    /// hands leadership over faster when a leader dies without resigning).
    ///
    /// Store outages are ridden out (logged, then tried again); the campaign ends with an error
    /// only when the manager shuts down ([`ErrorKind::ShutDown`]) or on an error that waiting
    /// cannot cure (an invalid name, a try-only scenario).
    ///
    /// Every campaign is its own candidate: two campaigns in one process (or one task) compete
    /// like two processes, never re-entering each other's leadership.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::LockManager::builder().client_id("billing").farm_id("f1").build()?;
    /// let leader = locks.campaign("invoicer").await?;
    /// let other = locks.clone();
    /// let candidate = tokio::spawn(async move { other.campaign("invoicer").await.map(|l| l.term()) });
    /// leader.resign().await?; // the candidate leads at once, with a greater term
    /// assert_eq!(candidate.await.unwrap()?, Some(2));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Dropping the future stops the campaign; no leadership is left held.
    pub async fn campaign(&self, name: &str) -> Result<Leadership> {
        loop {
            let opts = LockOptions::new().wait(CAMPAIGN_WAIT);
            match self.campaign_with(name, opts).await {
                Ok(leadership) => return Ok(leadership),
                Err(error) if error.kind() == ErrorKind::Timeout => {}
                Err(error) if error.is_temporary() && !self.is_shut_down() => {
                    tracing::warn!(election = name, error = %error.chain(),
                        "campaign: the store is unreachable; trying again");
                    tokio::time::sleep(CAMPAIGN_RETRY).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// [`campaign`](Self::campaign) with per-call options: `ttl` is how long a leader that dies
    /// without resigning keeps leadership, `wait` how long this campaign waits (then
    /// [`ErrorKind::Timeout`]; the manager's default wait if not given), `renew_every` how often
    /// the leader renews, `label` what observers see of this candidate once it leads (an address
    /// to reach it). The lease is always renewed, the lock is always exclusive, and every
    /// campaign is its own holder; other options (mode, holder, `hold_at_least`) are replaced.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use leasehold::{LockManager, LockOptions};
    /// let locks = LockManager::builder().client_id("billing").farm_id("f1").build()?;
    /// let me = LockOptions::new().label("http://10.0.0.7:8080");
    /// let leadership = locks.campaign_with("invoicer", me).await?;
    /// let leader = locks.leader("invoicer").await?.expect("someone leads");
    /// assert_eq!(leader.label.as_deref(), Some("http://10.0.0.7:8080"));
    /// assert_eq!(leader.term, leadership.term());
    /// # Ok(()) }
    /// ```
    pub async fn campaign_with(&self, name: &str, opts: LockOptions) -> Result<Leadership> {
        let key = self.election_key(name)?;
        let opts = opts
            .renew(true)
            .mode(crate::core::LockMode::Exclusive)
            .holder(Holder::new())
            .without_hold_at_least()
            .announced();
        let guard = self.lock_with(key, opts).await?;
        Ok(Leadership {
            guard,
            name: name.into(),
        })
    }

    /// Runs `work` while this candidate leads election `name`, again and again (Curator's
    /// `LeaderSelector` with auto-requeue): campaigns; once leading, runs `work` with the election
    /// lock's lease (its fencing token is the term); when `work` returns, resigns and campaigns
    /// again; when leadership is lost first, cancels `work` (drops its future) and campaigns
    /// again.
    ///
    /// Returns `Ok(())` when the manager shuts down, or the error that ended a campaign (see
    /// [`campaign`](Self::campaign)). Drop the future to stop leading (leadership is given up).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    /// let locks = leasehold::LockManager::builder().client_id("billing").farm_id("f1").build()?;
    /// let stopper = locks.clone();
    /// tokio::spawn(async move {
    ///     tokio::time::sleep(Duration::from_millis(50)).await;
    ///     stopper.shutdown().await // resigns, and `lead` returns
    /// });
    /// locks
    ///     .lead("invoicer", |lease| async move {
    ///         println!("leading with term {:?}", lease.fencing_token());
    ///         std::future::pending::<()>().await; // work until leadership is lost
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn lead<F, Fut>(&self, name: &str, work: F) -> Result<()>
    where
        F: FnMut(Lease) -> Fut,
        Fut: Future<Output = ()>,
    {
        lead::lead(self, name, work).await
    }
}
