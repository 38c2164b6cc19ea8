//! The etcd store.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{GetOptions, GetResponse, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use leasehold_core::{
    acquire_detached, validate_ttl, Acquire, Attempt, Capabilities, ChangeWatch, Error, Lease,
    LockInfo, LockKey, LockMode, LockStore, ReleaseWatch, Result,
};
use tokio::time::Instant;

use crate::changes::Changes;
use crate::config::{lease_seconds, EtcdConfig};
#[cfg(feature = "tls")]
use crate::connect::tls_options;
use crate::connect::{setup_or, tls_error};
use crate::error::{map, Op};
use crate::held::{HeldLease, HeldLeases};
use crate::layout::{holder_key, waiter_prefix};
use crate::members::{Failed, Members, Retry};
use crate::spares::{Fate, SpareLeases};
use crate::waiting::{Spare, Waiting};

/// A lock store on an etcd v3 cluster. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// One client per member, and failover between them.
    members: Arc<Members>,
    config: EtcdConfig,
    /// `host:port,…`, for messages (never credentials).
    address: String,
    /// This store's place in waiter lines, its waiter lease and its watches.
    waiting: Arc<Waiting>,
    /// The watches of readers of who holds a lock (one per observed lock).
    changes: Arc<Changes>,
    /// The etcd lease of each live hold: what a renewal keeps alive.
    held: HeldLeases,
    /// Leases of released holds, kept for the next acquisition of the same TTL.
    spares: SpareLeases,
}

impl EtcdStore {
    /// Validates `config` (before any I/O), connects, and checks the cluster serves (any one
    /// member is enough: every request goes to a member that answers, whatever the endpoint
    /// order; see docs/ETCD.md, "Clusters"). A cluster that is reached but has no leader yet (an
    /// election, a quorum coming back) is waited for, up to
    /// [`EtcdConfig::leader_wait`].
    ///
    /// Bad configuration:
    /// [`ErrorKind::InvalidArgument`](leasehold_core::ErrorKind::InvalidArgument). Cluster
    /// unreachable, at once, or not serving by the end of the leader wait:
    /// [`ErrorKind::Connection`](leasehold_core::ErrorKind::Connection), naming the
    /// endpoints. Wrong credentials:
    /// [`ErrorKind::StoreSetup`](leasehold_core::ErrorKind::StoreSetup).
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let address = config.address();
        // No per-request timeout here: the members bound every request themselves (see
        // `crate::deadlines`), and the client's would set a timer per request.
        let mut options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(Duration::from_secs(10), config.response_timeout)
            // A member cut off from the others refuses at once ("no leader") instead of letting
            // a request wait for a leader it cannot reach; its watches are cancelled, and move.
            .with_require_leader(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &config.tls {
            options = options.with_tls(tls_options(tls)?);
        }
        // A member that does not answer in time fails its attempt and the next one is asked.
        let members = Arc::new(Members::new(
            &config.endpoints,
            options,
            config.connect_timeout.max(config.response_timeout),
            config.response_timeout,
        ));
        // One read proves the cluster serves (and the credentials work) before the store is
        // handed out; a cluster that is reached but has no leader yet is waited for.
        let prefix = config.prefix.clone();
        let started = Instant::now();
        members
            .run_until(started + config.leader_wait, |client| {
                let (prefix, mut kv) = (prefix.clone(), client.kv_client());
                async move {
                    kv.get(
                        prefix.as_bytes(),
                        Some(GetOptions::new().with_count_only().with_prefix()),
                    )
                    .await
                }
            })
            .await
            .map_err(|failed| connect_failed(&config, started, failed))?;
        let waiting = Waiting::new(&config, members.clone());
        let changes = Changes::new(&config, members.clone());
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                members,
                config,
                address,
                waiting: Arc::new(waiting),
                changes: Arc::new(changes),
                held: HeldLeases::default(),
                spares: SpareLeases::default(),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The etcd lease of each live hold of this store.
    pub(crate) fn held_leases(&self) -> &HeldLeases {
        &self.inner.held
    }

    /// This store's place in waiter lines, its waiter lease and its watches.
    pub(crate) fn waiting(&self) -> &Waiting {
        &self.inner.waiting
    }

    /// The etcd key of a lock record: `<prefix><lock key>`.
    pub fn lock_key(&self, key: &LockKey) -> String {
        [self.inner.config.prefix.as_str(), key.as_str()].concat()
    }

    /// The prefix of a lock's waiter keys: `<prefix><lock key>#waiter#` (a lock key never has a
    /// part after its entity, so no other lock's key starts with it).
    pub fn waiter_prefix(&self, key: &LockKey) -> String {
        waiter_prefix(&self.lock_key(key))
    }

    /// The cluster's members: every request goes through them (see [`crate::members`]).
    pub(crate) fn members(&self) -> &Members {
        &self.inner.members
    }

    /// Sends one transaction to a member that answers; `retry` says whether it may be sent again
    /// to another member after it was sent and got no reply (only if it writes nothing, or
    /// nothing that a second copy could change).
    ///
    /// `build` writes the transaction, once per attempt: the client takes it by value, and a
    /// clone per attempt of one built beforehand cost every request a copy of each key, value
    /// and compare (a lock's acquire transaction: about thirty allocations), where most requests
    /// are sent once.
    pub(crate) async fn txn(
        &self,
        retry: Retry,
        mut build: impl FnMut() -> Txn,
    ) -> std::result::Result<TxnResponse, Failed> {
        self.inner
            .members
            .run(retry, |client| {
                let (txn, mut kv) = (build(), client.kv_client());
                async move { kv.txn(txn).await }
            })
            .await
    }

    /// One read-only transaction of `N` range reads (served without a Raft write), answered in
    /// order.
    pub(crate) async fn read_ranges<const N: usize>(
        &self,
        key: &LockKey,
        op: Op,
        reads: [TxnOp; N],
    ) -> Result<[GetResponse; N]> {
        Ok(self.read_ranges_at(key, op, reads).await?.0)
    }

    /// [`read_ranges`](Self::read_ranges), with the revision the reads saw.
    pub(crate) async fn read_ranges_at<const N: usize>(
        &self,
        key: &LockKey,
        op: Op,
        reads: [TxnOp; N],
    ) -> Result<([GetResponse; N], i64)> {
        let response = self
            .txn(Retry::Safe, || Txn::new().and_then(reads.clone()))
            .await
            .map_err(|e| self.err(op, key, e))?;
        let revision = response.header().map_or(0, |h| h.revision());
        let gets: Vec<GetResponse> = response
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(get) => Some(get),
                _ => None,
            })
            .collect();
        let gets = gets.try_into().map_err(|_| {
            crate::error::unexpected(op, key.as_str(), "a read without all its ranges")
        })?;
        Ok((gets, revision))
    }

    /// Maps a failed request on `key` (see [`map`]), naming the member(s) that failed it.
    pub(crate) fn err(&self, op: Op, key: &LockKey, failed: Failed) -> Error {
        map(op, key.as_str(), &failed.at, failed.error)
    }

    /// The key a lease's hold lives in: the lock record (exclusive), or the holder's own key.
    pub(crate) fn hold_key(&self, lease: &Lease) -> String {
        let lock_key = self.lock_key(lease.key());
        match lease.mode() {
            LockMode::Exclusive => lock_key,
            mode => holder_key(&lock_key, mode, lease.token().as_str()),
        }
    }

    /// Grants a lease of `ttl` (rounded up to whole seconds) for `key`.
    pub(crate) async fn grant(&self, key: &LockKey, ttl: Duration) -> Result<i64> {
        let secs = seconds(ttl)?;
        // A grant whose reply was lost only leaves a lease nothing lives on, which lapses.
        self.inner
            .members
            .grant_lease(secs)
            .await
            .map_err(|e| self.err(Op::Grant, key, e))
    }

    /// Revokes a lease in the background: its record is already gone or was never written, so
    /// nobody waits for this; if it fails, the lease expires at its TTL.
    pub(crate) fn revoke_later(&self, id: i64) {
        if id != 0 {
            self.inner.members.revoke_lease_later(id);
        }
    }

    /// A spare lease for a hold of `ttl` (see [`crate::spares`]): one of the same whole seconds,
    /// at most a tenth of `ttl` old, out of the pool so no other attempt uses it. Spares found
    /// too old on the way are revoked in the background.
    pub(crate) fn take_spare_lease(&self, ttl: Duration) -> Option<Spare> {
        let seconds = lease_seconds(ttl)?;
        let (spare, stale) = self.inner.spares.take(seconds, ttl / 10, Instant::now());
        for id in stale {
            self.revoke_later(id);
        }
        spare
    }

    /// Keeps `spare`, a lease nothing lives on (its hold was deleted, or the attempt it was taken
    /// for wrote nothing), for the next acquisition of its TTL; one getting old is kept alive in
    /// the background (a keep-alive: no Raft write), one that cannot be kept is revoked.
    pub(crate) fn keep_spare_lease(&self, spare: Spare) {
        let (fate, pushed_out) = self.inner.spares.keep(spare, Instant::now());
        if let Some(id) = pushed_out {
            self.revoke_later(id);
        }
        match fate {
            Fate::Kept => {}
            Fate::Revoke => self.revoke_later(spare.id),
            Fate::Refresh | Fate::RefreshFirst => self.refresh_later(spare.id),
        }
    }

    /// Sends a keep-alive of spare `id` in the background, so that its TTL counts from now: it
    /// then stays young enough to carry a hold (see [`crate::spares::refresh_after`]). A spare
    /// the keep-alive cannot vouch for (gone, or no member answered) is not used again, and is
    /// revoked if it is still in the pool (one a hold took meanwhile is that hold's).
    fn refresh_later(&self, id: i64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if self.inner.spares.refresh_failed(id) {
                self.revoke_later(id);
            }
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            let sent_at = Instant::now();
            let kept_alive = store.inner.members.keep_lease_alive(id).await;
            match kept_alive {
                Ok(_stream) => store.inner.spares.refreshed(id, sent_at),
                Err(failed) => {
                    tracing::debug!(lease = id, at = %failed.at, error = %failed.error,
                        "could not keep a spare lease alive; not using it again");
                    if store.inner.spares.refresh_failed(id) {
                        store.revoke_later(id);
                    }
                }
            }
        });
    }
}

/// Revokes the lease a plain try chose for its hold when the caller stops waiting before the
/// answer (see `EtcdStore::acquire`): etcd applies the revoke and the acquire transaction in
/// some order, and either deletes the hold or refuses to put it.
struct RevokeOnDrop<'a> {
    store: &'a EtcdStore,
    /// The lease the hold goes on, once chosen (0 before: a lease granted after the caller left
    /// carries nothing and lapses).
    lease: AtomicI64,
    /// Cleared once the answer is in.
    armed: bool,
}

impl Drop for RevokeOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.store.revoke_later(self.lease.load(Ordering::SeqCst));
        }
    }
}

/// Whole lease seconds for `ttl`, or `InvalidArgument` when etcd cannot hold it.
fn seconds(ttl: Duration) -> Result<i64> {
    validate_ttl(ttl)?;
    lease_seconds(ttl).ok_or_else(|| {
        Error::invalid_argument(format!(
            "lock TTL {ttl:?} cannot be an etcd lease (whole seconds up to i64::MAX)"
        ))
    })
}

impl LockStore for EtcdStore {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        // The lock trace is not on etcd yet (docs/ETCD.md).
        Capabilities::NONE
            .with_fencing(true)
            .with_listing(true)
            .with_notifications(true)
            .with_shared_modes(true)
    }

    /// Watches the lock record and its waiter line for deletions (a release, a lease that
    /// expired, a waiter ahead that left) on one watch stream per key and process, created (and
    /// confirmed by etcd) before this returns. Dropping the last watch of the process on a key
    /// cancels the stream and takes the process's waiter key out of the line.
    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        self.inner.waiting.watch(self.lock_key(key)).await
    }

    /// Watches the lock record and its reader and permit keys (not the waiter line, nor writers'
    /// markers) on one watch stream per key and process, shared by every change watch of the
    /// process on the key and confirmed by etcd before this returns: fired when a hold is created
    /// (a grant) or deleted (a release, a revoke, an expiry), not when its holder renews or moves
    /// it to another lease. Writes nothing (no waiter key, no lease). Dropping the last change
    /// watch of the process on a key cancels the stream; a watch that cannot be created within the
    /// connect and response timeouts gives [`ChangeWatch::none`].
    async fn watch_changes(&self, key: &LockKey) -> ChangeWatch {
        self.inner.changes.watch(self.lock_key(key)).await
    }

    /// One transaction, on a spare lease of an earlier hold of this store (or on a new one, a
    /// lease grant first, when there is none young enough; see `spares`); a permit first counts
    /// the taken ones (see `shared`).
    ///
    /// Cancel safe. A plain try (no deadline: `try_lock`, and the first try of a `lock()`) runs
    /// on the caller's task, and if the caller stops waiting before the answer, the lease the hold
    /// was put on is revoked: whichever of the two etcd applies first, the hold ends (the revoke
    /// deletes it, or the transaction is refused for want of its lease), so nothing is left held
    /// for nobody and no task is spawned unless the caller is cancelled. An attempt that waits may
    /// also join the line or leave a writer's marker, which no lease revoke undoes: it runs on its
    /// own task, which finishes and releases (owner-checked) what it acquired, or what it may have
    /// acquired if the reply was lost.
    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        req.validate()?;
        seconds(req.ttl)?;
        if req.wait.is_none() {
            let undo = RevokeOnDrop {
                store: self,
                lease: AtomicI64::new(0),
                armed: true,
            };
            let answer = self.acquire_once(req, &undo.lease).await;
            // Answered: an in-doubt answer is the caller's to resolve (readback, or its undo).
            let mut undo = undo;
            undo.armed = false;
            return answer;
        }
        let (acquirer, releaser) = (self.clone(), self.clone());
        acquire_detached(
            req,
            move |req| async move { acquirer.acquire_once(&req, &AtomicI64::new(0)).await },
            move |lease| async move { releaser.release_once(&lease).await },
        )
        .await
    }

    /// One transaction: delete the hold (the record, or a reader's or permit's own key) if its
    /// value is our token; the lease it lived on, empty now, is kept as a spare for the next
    /// acquisition of the same TTL (see `spares`).
    ///
    /// A delete whose reply was lost (its member went down, paused or lost its leader under it)
    /// is sent once more, to another member: owner-checked, it deletes nothing that is not ours.
    /// If that one finds the hold gone while our lease cannot have expired yet, the first delete
    /// is what removed it (`Ok(true)`), as the readback layer concludes. If it fails too, the
    /// first error (`InDoubt`) is returned.
    async fn release(&self, lease: &Lease) -> Result<bool> {
        match self.release_once(lease).await {
            Err(error) if error.is_in_doubt() => match self.release_once(lease).await {
                Ok(true) => Ok(true),
                Ok(false) => Ok(Instant::now() < lease.expires_at()),
                Err(again) => {
                    tracing::debug!(key = %lease.key(), error = %again,
                        "a release in doubt could not be sent again");
                    Err(error)
                }
            },
            other => other,
        }
    }

    /// For the TTL the hold's lease was granted with (a renewal): a keep-alive of that lease, then
    /// a read-only check that the hold is still our token on it (see `renew`). For another TTL:
    /// a new lease of `ttl`, then one transaction that moves the hold (the record, or a reader's
    /// or permit's own key) onto it if its value is still our token (the create revision, our
    /// fencing token, does not change); the old lease is revoked in the background.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let secs = seconds(ttl)?;
        if let Some(held) = self.inner.held.get(lease.token()) {
            if held.seconds == secs {
                if let Some(renewed) = self.renew_by_keep_alive(lease, ttl, held).await? {
                    return Ok(renewed);
                }
            }
        }
        let hold_key = self.hold_key(lease);
        let sent_at = Instant::now();
        let new_lease = self.grant(lease.key(), ttl).await?;
        let move_hold = || {
            let put = TxnOp::put(
                hold_key.as_str(),
                lease.token().as_str(),
                Some(PutOptions::new().with_lease(new_lease).with_prev_key()),
            );
            Self::if_ours(&hold_key, lease, put)
        };
        let response = match self.txn(Retry::Unsent, move_hold).await {
            Ok(response) => response,
            Err(e) => {
                // In doubt, the hold may be on either lease: forget which, so the next renewal
                // goes straight to the move (deciding by the token).
                self.inner.held.remove(lease.token());
                return Err(self.err(Op::Extend, lease.key(), e));
            }
        };
        if !response.succeeded() {
            self.revoke_later(new_lease);
            self.inner.held.remove(lease.token());
            return Err(Error::not_held(
                "the lease expired or was taken by another owner before it could be extended",
            )
            .with_key(lease.key().as_str()));
        }
        if let Some(TxnOpResponse::Put(put)) = response.op_responses().first() {
            if let Some(old) = put.prev_key() {
                if old.lease() != new_lease {
                    self.revoke_later(old.lease());
                }
            }
        }
        self.inner
            .held
            .insert(lease.token(), HeldLease::new(new_lease, secs, sent_at));
        Ok(lease.renewed(ttl, sent_at))
    }

    /// One read-only transaction (the record, every reader or permit holder, whether a writer
    /// waits), then the remaining TTL of each lease, concurrently.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inspect_lock(key).await
    }

    /// One range read over `<prefix><filter>`, then the remaining TTL of every lease, concurrently.
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.list_locks(prefix).await
    }

    /// Revokes this store's waiter lease (its waiter keys leave every line at once) and its spare
    /// leases.
    ///
    /// The spares are revoked together, within one response timeout: a shutdown while etcd is
    /// unreachable must not wait for each of them in turn, and a spare not revoked carries no
    /// hold (it lapses at its TTL).
    async fn shutdown(&self) -> Result<usize> {
        self.inner.waiting.close().await;
        let revokes = self.inner.spares.close().into_iter().map(|id| async move {
            if let Err(failed) = self.inner.members.revoke_lease(id).await {
                tracing::debug!(lease = id, at = %failed.at, error = %failed.error,
                    "could not revoke a spare lease; it lapses at its TTL");
            }
        });
        let budget = self.config().response_timeout;
        if tokio::time::timeout(budget, futures::future::join_all(revokes))
            .await
            .is_err()
        {
            tracing::debug!(
                ?budget,
                "spare leases not all revoked in time; they lapse at their TTL"
            );
        }
        Ok(0)
    }
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("address", &self.inner.address)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// Why [`EtcdStore::connect`] failed, from its check read that failed.
fn connect_failed(config: &EtcdConfig, started: Instant, failed: Failed) -> Error {
    let failed_error = match tls_error(&failed.at, failed.error) {
        Ok(tls) => return tls,
        Err(error) => error,
    };
    let unreached = failed.unreached;
    let error = setup_or(map(Op::Connect, "", &failed.at, failed_error));
    if unreached || error.kind() != leasehold_core::ErrorKind::Connection {
        return error;
    }
    // Reached, and still not serving once the wait ran out: say so, and what to look at.
    let waited = Duration::from_millis(started.elapsed().as_millis().try_into().unwrap_or(0));
    Error::connection(format!(
        "the etcd cluster at {} was reached but did not serve for {waited:?} (no leader: an \
         election that does not end, or no quorum; or members that do not answer); check its \
         members' health (`etcdctl endpoint status`), or wait longer with \
         EtcdConfig::leader_wait",
        config.address()
    ))
    .with_operation(leasehold_core::Operation::Connect)
    .with_source(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::ErrorKind;

    #[test]
    fn ttls_etcd_cannot_hold_are_invalid() {
        assert_eq!(seconds(Duration::from_millis(1500)).unwrap(), 2);
        assert_eq!(
            seconds(Duration::ZERO).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            seconds(Duration::from_secs(365 * 86_400))
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );
    }
}
