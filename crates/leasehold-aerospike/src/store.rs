//! The Aerospike store.

use std::fmt;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use aerospike::expressions::{eq, string_bin, string_val};
use aerospike::policy::{AdminPolicy, BasePolicy, CommitLevel};
use aerospike::{Client, ClientPolicy, Key, ReadPolicy, Replica, Value, WritePolicy};
use leasehold_core::{
    validate_ttl, Acquire, Attempt, Capabilities, Error, ErrorKind, HistoryEntry, Lease, LockInfo,
    LockKey, LockStore, Operation, OwnerToken, ReleaseWatch, Result, TraceConfig,
};
use tokio::time::Instant;

use crate::config::AerospikeConfig;
use crate::error::{classify, failed, map, place, transient_reason, Cause, Class};
use crate::layout::{Layout, Record, TOKEN_BIN};
use crate::refused;
use crate::retry::Backoff;
use crate::waiting::Waiting;

/// A lock store on an Aerospike namespace, record-compatible with the Java lock manager. Cheap to
/// clone.
#[derive(Clone)]
pub struct AerospikeStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Arc<Client>,
    owns_client: bool,
    pub(crate) config: AerospikeConfig,
    /// The seed hosts, `"h1:3000,h2:3000"`, for messages.
    pub(crate) seeds: String,
    pub(crate) layout: Layout,
    /// Fair waiting: this store's place in lines, and its waiters' schedules.
    pub(crate) waiting: Arc<Waiting>,
    /// The acquisition time (`uat`, epoch ms) of this store's latest create: the next is later.
    pub(crate) last_uat: AtomicI64,
}

/// Connections the client keeps open per node (see `connect`).
const MIN_CONNS_PER_NODE: usize = 2;

/// How often an exclusive acquisition removes a shared record nobody holds and creates again
/// before it calls the key contended.
pub(crate) const MAX_TAKEOVERS: u32 = 2;

impl AerospikeStore {
    /// Validates `config` (before any I/O), connects, and checks that the namespace exists.
    ///
    /// Connecting waits for a usable cluster within the connect timeout
    /// ([`AerospikeConfig::connect_timeout`]): every seed is tried, and tried again with backoff
    /// while none answers or the partition table has not formed (a node lost, a cluster
    /// re-forming), until the client's partition map has the namespace. Keys whose partition
    /// has no master yet then fail with a temporary error until the cluster has re-formed.
    ///
    /// Bad names or values, a bad host list: `InvalidArgument`. No usable cluster within the
    /// connect timeout: `Connection`, naming every seed and what each answered. Namespace
    /// missing, TLS or login refused: `StoreSetup`.
    pub async fn connect(config: AerospikeConfig) -> Result<Self> {
        config.validate()?;
        Self::open(config).await.map_err(failed(Operation::Connect))
    }

    /// [`connect`](Self::connect) once the configuration is checked.
    async fn open(config: AerospikeConfig) -> Result<Self> {
        let deadline = Instant::now() + config.connect_timeout;
        let mut policy = ClientPolicy {
            max_conns_per_node: config.max_conns_per_node,
            // A lock holder's requests overlap: the line's update after a grant runs in the
            // background while the holder goes on (to its release, often). With one pooled
            // connection the second request finds the pool empty and waits for a connection to
            // open (measured on the fixture: 2.6 ms, against 0.15 ms a request), which the next
            // process in line then waits out too. Two are kept open per node.
            min_conns_per_node: MIN_CONNS_PER_NODE.min(config.max_conns_per_node),
            timeout: u32::try_from(config.total_timeout.as_millis()).unwrap_or(u32::MAX),
            ..ClientPolicy::default()
        };
        if let Some(rate) = config.max_error_rate {
            policy.max_error_rate = rate;
        }
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            policy.auth_mode =
                aerospike::policy::AuthMode::Internal(user.clone(), password.clone());
        }
        let hosts = config.client_hosts()?;
        #[cfg(feature = "tls")]
        if config.tls.enabled() {
            policy.tls_policy = Some(crate::tls::policy(&config.tls)?);
        }
        let seeds = config.hosts_shown();
        let mut backoff = Backoff::until(&config, deadline);
        let client = loop {
            let e = match Client::new(&policy, &hosts).await {
                Ok(client) => break client,
                Err(e) => e,
            };
            let setup = crate::error::tls_failure(&seeds, &e)
                .or_else(|| crate::error::auth_failure(&seeds, config.user.as_deref(), &e));
            if let Some(setup) = setup {
                return Err(setup.with_source(Cause(e)));
            }
            let transient = matches!(classify(&e), Class::NotSent | Class::InDoubt);
            if transient {
                tracing::debug!(hosts = %seeds, attempt = backoff.made(), error = %e, "no usable Aerospike cluster yet");
            }
            if !transient || !backoff.wait().await {
                return Err(Error::connection(format!(
                    "cannot connect to the Aerospike cluster at {seeds}: no usable cluster after \
                     {} attempt(s) in {} ms (every seed was tried; the cause says what each \
                     answered)",
                    backoff.made(),
                    backoff.elapsed().as_millis()
                ))
                .with_source(Cause(e)));
            }
        };
        Self::build(Arc::new(client), true, config, deadline).await
    }

    /// Uses a client you already have (TLS, custom policies). Its lifecycle stays yours:
    /// [`AerospikeStore::close`] does not close it.
    pub async fn with_client(client: Arc<Client>, config: AerospikeConfig) -> Result<Self> {
        config.validate()?;
        let deadline = Instant::now() + config.connect_timeout;
        Self::build(client, false, config, deadline)
            .await
            .map_err(failed(Operation::Connect))
    }

    /// Checks the namespace (asking again on transient failures until `deadline`), waits until
    /// the client's partition map has it, and builds the store.
    async fn build(
        client: Arc<Client>,
        owns_client: bool,
        config: AerospikeConfig,
        deadline: Instant,
    ) -> Result<Self> {
        let layout = config.validate()?;
        let seeds = config.hosts_shown();
        let mut backoff = Backoff::until(&config, deadline);
        let info = loop {
            match client.info(&AdminPolicy::default(), &["namespaces"]).await {
                Ok(info) => break info,
                Err(e) if classify(&e) == Class::NotSent && backoff.wait().await => {
                    tracing::debug!(hosts = %seeds, error = %e, "namespace check again");
                }
                Err(e) => return Err(map("namespace check", "", &seeds, e)),
            }
        };
        let namespaces = info.get("namespaces").cloned().unwrap_or_default();
        if !namespaces.split(';').any(|ns| ns == config.namespace) {
            return Err(Error::new(
                ErrorKind::StoreSetup,
                format!(
                    "namespace {:?} does not exist on the Aerospike cluster at {} (it has: {}); \
                     lock records need an existing namespace",
                    config.namespace, seeds, namespaces
                ),
            ));
        }
        // The client routes a key only once its partition map has the namespace (a cluster
        // re-forming can answer info before that).
        while client.is_strong_consistency(&config.namespace).is_none() {
            if Instant::now() >= deadline {
                return Err(Error::connection(format!(
                    "the Aerospike cluster at {seeds} has namespace {:?} but no partition map for \
                     it within the connect timeout ({} ms): the cluster is still forming",
                    config.namespace,
                    config.connect_timeout.as_millis()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50).min(deadline - Instant::now())).await;
        }
        Ok(AerospikeStore {
            inner: Arc::new(Inner {
                client,
                owns_client,
                seeds,
                config,
                layout,
                waiting: Arc::new(Waiting::new()),
                last_uat: AtomicI64::new(0),
            }),
        })
    }

    /// Closes the client if this store created it (the seed's `destroy()`); a client passed to
    /// [`AerospikeStore::with_client`] is left open unless `force` is set.
    pub async fn close(&self, force: bool) -> Result<()> {
        if self.inner.owns_client || force {
            self.inner.client.close().await.map_err(|e| {
                map("close", "", self.address(), e).with_operation(Operation::Shutdown)
            })?;
        }
        Ok(())
    }

    /// The record layout (set and bin names).
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The Aerospike key of a lock: namespace, lock set, lock id (`<clientId>#<entityId>`).
    pub fn record_key(&self, key: &LockKey) -> Result<Key> {
        self.key_of(key, Record::Lock)
    }

    /// The Aerospike key of one of a lock's records: namespace, the record's set, lock id.
    pub(crate) fn key_of(&self, key: &LockKey, record: Record) -> Result<Key> {
        let set = self.inner.layout.set_of(key, record)?;
        Key::new(
            self.inner.config.namespace.clone(),
            set,
            Value::from(key.lock_id()),
        )
        .map_err(|e| {
            Error::invalid_argument(format!("cannot build the {} key", record.name()))
                .with_source(e)
        })
    }

    pub(crate) fn base(&self, retries: usize) -> BasePolicy {
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1);
        BasePolicy {
            socket_timeout: ms(self.inner.config.socket_timeout),
            total_timeout: ms(self.inner.config.total_timeout),
            max_retries: retries,
            sleep_between_retries: ms(self.inner.config.retry_delay),
            ..BasePolicy::default()
        }
    }

    /// A read from the key's master, whatever the read replica policy, with no client-side
    /// retries: what decides a lock step must see the latest write (a replica may not have it
    /// yet).
    pub(crate) fn master_read_policy(&self) -> ReadPolicy {
        let mut base_policy = self.base(0);
        base_policy.replica = Replica::Master;
        ReadPolicy { base_policy }
    }

    /// A write policy with no client-side retries: a write is never re-sent blindly (leasehold
    /// retries only what was surely not applied, see `with_retries`). Always to the master: a
    /// lock write never moves to a replica.
    pub(crate) fn write_policy(&self, commit_level: CommitLevel) -> WritePolicy {
        let mut base_policy = self.base(0);
        base_policy.replica = Replica::Master;
        WritePolicy {
            base_policy,
            commit_level,
            ..WritePolicy::default()
        }
    }

    pub(crate) fn owned_by(&self, token: &OwnerToken, commit_level: CommitLevel) -> WritePolicy {
        let mut policy = self.write_policy(commit_level);
        policy.base_policy.filter_expression = Some(eq(
            string_bin(TOKEN_BIN.to_owned()),
            string_val(token.as_str().to_owned()),
        ));
        policy
    }

    /// The seed hosts, for messages about failures no node is known for.
    pub(crate) fn address(&self) -> &str {
        &self.inner.seeds
    }

    /// Runs `op` up to the configured attempts while its error says nothing was applied and the
    /// cluster may serve it in a moment (the seed's 5 × 80 ms); anything else — success, a server
    /// answer, an in-doubt outcome — returns at once.
    pub(crate) async fn with_retries<T, F, Fut>(
        &self,
        what: &str,
        key: &LockKey,
        op: F,
    ) -> Result<T, aerospike::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, aerospike::Error>>,
    {
        self.retrying(what, key, false, op).await
    }

    /// [`Self::with_retries`], optionally also retrying in-doubt outcomes — only for operations
    /// where applying twice is harmless, like the fence increment (a gap in the counter).
    pub(crate) async fn retrying<T, F, Fut>(
        &self,
        what: &str,
        key: &LockKey,
        retry_in_doubt: bool,
        op: F,
    ) -> Result<T, aerospike::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, aerospike::Error>>,
    {
        let mut backoff = Backoff::attempts(&self.inner.config);
        self.retry_with(&mut backoff, what, key, retry_in_doubt, op)
            .await
            .0
    }

    /// Runs `op` while its error is transient and `backoff` allows another attempt; returns the
    /// last outcome and whether an attempt's reply was lost on the way (in doubt).
    pub(crate) async fn retry_with<T, F, Fut>(
        &self,
        backoff: &mut Backoff,
        what: &str,
        key: &LockKey,
        retry_in_doubt: bool,
        mut op: F,
    ) -> (Result<T, aerospike::Error>, bool)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, aerospike::Error>>,
    {
        let mut doubted = false;
        loop {
            match op().await {
                Err(e)
                    if classify(&e) == Class::NotSent
                        || (retry_in_doubt && classify(&e) == Class::InDoubt) =>
                {
                    doubted |= classify(&e) == Class::InDoubt;
                    let attempt = backoff.made();
                    if !backoff.wait().await {
                        return (Err(e), doubted);
                    }
                    tracing::debug!(key = %key, what, attempt, error = %e, "retrying");
                }
                other => return (other, doubted),
            }
        }
    }

    pub(crate) fn exhausted_or(&self, what: &str, key: &LockKey, e: aerospike::Error) -> Error {
        let fence = what.starts_with("fence");
        let retried = classify(&e) == Class::NotSent || (fence && classify(&e) == Class::InDoubt);
        if retried && self.inner.config.retries > 1 {
            let attempts = self.inner.config.retries;
            self.exhausted(what, key, e, &format!("in {attempts} attempts"))
        } else {
            map(what, key.as_str(), self.address(), e)
        }
    }

    /// The error of a write retried within `backoff` until its budget ran out: in doubt when the
    /// last attempt was, or when an earlier one (`doubted`) lost its reply and may have been
    /// applied (the readback decides); otherwise `RetriesExhausted`, saying how many attempts in
    /// how long.
    pub(crate) fn retries_ended(
        &self,
        what: &str,
        key: &LockKey,
        e: aerospike::Error,
        backoff: &Backoff,
        doubted: bool,
    ) -> Error {
        if classify(&e) == Class::InDoubt {
            map(what, key.as_str(), self.address(), e)
        } else if doubted {
            Error::in_doubt(format!(
                "{what} was sent to {} and an attempt's reply was lost, so it may have been \
                 applied; the attempts after it failed too ({}): {}",
                place(self.address(), &e),
                backoff.spent(),
                transient_reason(&e)
            ))
            .with_key(key.as_str())
            .with_source(Cause(e))
        } else {
            self.exhausted(what, key, e, &format!("({})", backoff.spent()))
        }
    }

    /// `RetriesExhausted`: `what` kept failing at the node the client last tried (`after` says
    /// how long or how often).
    pub(crate) fn exhausted(
        &self,
        what: &str,
        key: &LockKey,
        e: aerospike::Error,
        after: &str,
    ) -> Error {
        Error::new(
            ErrorKind::RetriesExhausted,
            format!(
                "{what} failed at {} {after}: {}",
                place(self.address(), &e),
                transient_reason(&e)
            ),
        )
        .with_key(key.as_str())
        .with_source(Cause(e))
    }

    /// The time budget of a release or an extension that starts now.
    pub(crate) fn budget(&self, until: Option<Instant>) -> Backoff {
        let deadline = Instant::now() + self.inner.config.retry_budget;
        let deadline = until.map_or(deadline, |until| until.min(deadline));
        Backoff::until(&self.inner.config, deadline)
    }

    /// This store's id in waiter lines (one per store instance).
    pub fn waiter_id(&self) -> &str {
        self.inner.waiting.id()
    }

    pub(crate) async fn acquire_once(&self, req: &Acquire) -> Result<Attempt> {
        refused::answer(if req.mode.is_shared_record() {
            self.acquire_shared(req).await
        } else if self.inner.config.fair {
            self.acquire_fair(req).await
        } else {
            self.acquire_record(req, None).await.map(|(lease, _)| lease)
        })
    }
}

/// Aerospike expiration is in whole seconds, and 0 means "namespace default" (possibly never):
/// round up, never down to 0. (`validate_ttl` already refused a zero TTL.)
pub(crate) fn ttl_seconds(ttl: Duration) -> u32 {
    u32::try_from(leasehold_core::ttl_seconds(ttl)).unwrap_or(u32::MAX)
}

impl LockStore for AerospikeStore {
    fn name(&self) -> &'static str {
        "aerospike"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
            .with_fencing(self.inner.config.fencing)
            .with_listing(true)
            .with_shared_modes(true)
            .with_history(true)
    }

    /// One read of the key's history record (module `trace`), newest first.
    async fn history(&self, key: &LockKey) -> Result<Vec<HistoryEntry>> {
        self.read_history(key)
            .await
            .map_err(failed(Operation::History))
    }

    /// One `operate` on the key's history record: insert, trim, expiration.
    async fn append_history(
        &self,
        key: &LockKey,
        trace: &TraceConfig,
        entry: &HistoryEntry,
    ) -> Result<()> {
        self.write_trace(key, trace, entry).await
    }

    /// Exclusive: create-only write with expiration = TTL rounded up to whole seconds (the Java
    /// manager's request: 1 round trip). Fenced, the fence record's generation is read in the
    /// same request and the token taken with one generation-checked increment (2 round trips,
    /// tokens in hold order; 3 more when that check cannot decide, module `fencing`). Fair (the
    /// default): a try reads the key's waiter line in the same request and gives the record
    /// back if another process waits ahead (nothing more while nobody waits, module
    /// `acquire`); a blocking attempt joins the line first and only the head tries, and leaves
    /// the line once granted (modules `queue`, `waiting`). A create refused by an existing record
    /// reads it once to tell a held lock from a shared record (see docs/AEROSPIKE.md). Readers
    /// and permits: one filtered `operate` when admitted (module `shared`). Traced: one more
    /// round trip for the history entry (module `trace`). Cancel safe: the requests run on the
    /// caller's task, and an acquisition the caller drops before its answer is released again,
    /// owner-checked, in the background (module `cancel`).
    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        req.validate()?;
        // The key's sets, checked before any I/O (what building its record keys can refuse),
        // without naming them: the request builds the keys it sends.
        self.inner.layout.check_key(&req.key)?;
        self.acquire_undone_if_cancelled(req)
            .await
            .map_err(failed(Operation::Acquire))
    }

    /// With fair waiting (the default): registers the waiter with this process's schedule for the
    /// key, which wakes the process's waiters when the line says their turn is near (Aerospike
    /// cannot notify: this is polling, timed by the line). When the last waiter of this process
    /// goes away without the lock, the process leaves the key's line. Without: no watch.
    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        if !self.inner.config.fair {
            return ReleaseWatch::none();
        }
        self.watch_line(key)
    }

    /// Exclusive: one round trip, a delete with a filter expression `lh_token == token`. Readers
    /// and permits: one `operate` removing the holder's entry, and a filtered delete of the
    /// record when it was the last live holder. Traced: one more round trip.
    ///
    /// A node lost or a cluster re-forming is waited out within the retry budget
    /// ([`AerospikeConfig::retry_budget`]); a delete whose reply was lost is settled by reading
    /// the record back (gone: `Ok(true)`), never sent again blindly. Budget spent:
    /// `RetriesExhausted`, or `InDoubt` if a delete may have landed.
    async fn release(&self, lease: &Lease) -> Result<bool> {
        let result = self.release_once(lease).await;
        self.trace_release(lease, result)
            .await
            .map_err(failed(Operation::Release))
    }

    /// Exclusive: one round trip, a touch with the same filter and the new expiration. Readers
    /// and permits: one filtered `operate` (two when the record must keep a longer TTL). Traced:
    /// one more round trip when the lease was lost.
    ///
    /// Transient failures and lost replies are sent again (harmless twice) within the retry
    /// budget, never past the lease's end.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        validate_ttl(ttl)?;
        let result = self.extend_once(lease, ttl).await;
        self.trace_extend(lease, result)
            .await
            .map_err(failed(Operation::Extend))
    }

    /// One round trip: the lock record's bins and TTL (every live holder of a shared record),
    /// read from the node the configured read replica policy picks
    /// (`AerospikeConfig::read_replica`).
    ///
    /// Fenced: the fence record is read in the same request (a batch), since a holder's token is
    /// in its lock record only when it took it with the verified steps; otherwise it is the
    /// fence counter, when the fence record names the holder as its owner.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inspect_record(key)
            .await
            .map_err(failed(Operation::Inspect))
    }

    /// Scans this farm's DC set and the XDC set. Records written without a user key (the Java
    /// manager sends only the digest) cannot be named and are left out.
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.list_records(prefix)
            .await
            .map_err(failed(Operation::List))
    }
}

impl fmt::Debug for AerospikeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AerospikeStore")
            .field("config", &self.inner.config)
            .field("owns_client", &self.inner.owns_client)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds_never_to_zero() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(999)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(90)), 90);
    }
}
