//! The Aerospike store.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aerospike::expressions::{eq, string_bin, string_val};
use aerospike::operations;
use aerospike::policy::{
    AdminPolicy, BasePolicy, CommitLevel, Expiration, QueryPolicy, RecordExistsAction,
};
use aerospike::{
    as_bin, Bins, Client, ClientPolicy, Key, PartitionFilter, ReadPolicy, Record, Replica,
    ResultCode, Statement, Value, WritePolicy,
};
use futures::StreamExt;
use leasehold_core::{
    acquire_detached, validate_ttl, Acquire, Capabilities, Error, ErrorKind, Lease, LockInfo,
    LockKey, LockLevel, LockStore, OwnerToken, Result,
};
use tokio::time::Instant;

use crate::config::AerospikeConfig;
use crate::error::{classify, map, Class};
use crate::layout::{fence_set, Layout, COUNTER_BIN, FENCE_BIN, TOKEN_BIN};

/// A lock store on an Aerospike namespace, record-compatible with the Java lock manager. Cheap to
/// clone.
#[derive(Clone)]
pub struct AerospikeStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Arc<Client>,
    owns_client: bool,
    config: AerospikeConfig,
    layout: Layout,
}

impl AerospikeStore {
    /// Validates `config` (before any I/O), connects, and checks that the namespace exists.
    ///
    /// Bad names or values: `InvalidArgument`. Cluster unreachable: `Connection`. Namespace
    /// missing: `StoreSetup`.
    pub async fn connect(config: AerospikeConfig) -> Result<Self> {
        config.validate()?;
        let mut policy = ClientPolicy {
            max_conns_per_node: config.max_conns_per_node,
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
        let client = Client::new(&policy, &hosts).await.map_err(|e| {
            if let Some(tls) = crate::error::tls_failure(&config.hosts, &e) {
                return tls;
            }
            if let Some(auth) =
                crate::error::auth_failure(&config.hosts, config.user.as_deref(), &e)
            {
                return auth;
            }
            Error::connection(format!(
                "cannot connect to the Aerospike cluster at {}",
                config.hosts
            ))
            .with_source(e)
        })?;
        Self::build(Arc::new(client), true, config).await
    }

    /// Uses a client you already have (TLS, custom policies). Its lifecycle stays yours:
    /// [`AerospikeStore::close`] does not close it.
    pub async fn with_client(client: Arc<Client>, config: AerospikeConfig) -> Result<Self> {
        config.validate()?;
        Self::build(client, false, config).await
    }

    async fn build(
        client: Arc<Client>,
        owns_client: bool,
        config: AerospikeConfig,
    ) -> Result<Self> {
        let layout = config.validate()?;
        let info = client
            .info(&AdminPolicy::default(), &["namespaces"])
            .await
            .map_err(|e| map("namespace check", "", &config.hosts, e))?;
        let namespaces = info.get("namespaces").cloned().unwrap_or_default();
        if !namespaces.split(';').any(|ns| ns == config.namespace) {
            return Err(Error::new(
                ErrorKind::StoreSetup,
                format!(
                    "namespace {:?} does not exist on the Aerospike cluster at {} (it has: {}); \
                     lock records need an existing namespace",
                    config.namespace, config.hosts, namespaces
                ),
            ));
        }
        Ok(AerospikeStore {
            inner: Arc::new(Inner {
                client,
                owns_client,
                config,
                layout,
            }),
        })
    }

    /// Closes the client if this store created it (the seed's `destroy()`); a client passed to
    /// [`AerospikeStore::with_client`] is left open unless `force` is set.
    pub async fn close(&self, force: bool) -> Result<()> {
        if self.inner.owns_client || force {
            self.inner
                .client
                .close()
                .await
                .map_err(|e| map("close", "", &self.inner.config.hosts, e))?;
        }
        Ok(())
    }

    /// The record layout (set and bin names).
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The Aerospike key of a lock: namespace, lock set, lock id (`<clientId>#<entityId>`).
    pub fn record_key(&self, key: &LockKey) -> Result<Key> {
        let set = self.inner.layout.lock_set(key)?;
        Key::new(
            self.inner.config.namespace.clone(),
            set,
            Value::from(key.lock_id()),
        )
        .map_err(|e| Error::invalid_argument("cannot build the record key").with_source(e))
    }

    fn fence_key(&self, key: &LockKey) -> Result<Key> {
        let set = fence_set(&self.inner.layout.lock_set(key)?);
        Key::new(
            self.inner.config.namespace.clone(),
            set,
            Value::from(key.lock_id()),
        )
        .map_err(|e| Error::invalid_argument("cannot build the fence key").with_source(e))
    }

    fn base(&self, retries: usize) -> BasePolicy {
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1);
        BasePolicy {
            socket_timeout: ms(self.inner.config.socket_timeout),
            total_timeout: ms(self.inner.config.total_timeout),
            max_retries: retries,
            sleep_between_retries: ms(self.inner.config.retry_delay),
            ..BasePolicy::default()
        }
    }

    /// A write policy with no client-side retries: a write is never re-sent blindly (leasehold
    /// retries only what was surely not applied, see `with_retries`). Always to the master: a
    /// lock write never moves to a replica.
    fn write_policy(&self, commit_level: CommitLevel) -> WritePolicy {
        let mut base_policy = self.base(0);
        base_policy.replica = Replica::Master;
        WritePolicy {
            base_policy,
            commit_level,
            ..WritePolicy::default()
        }
    }

    fn owned_by(&self, token: &OwnerToken, commit_level: CommitLevel) -> WritePolicy {
        let mut policy = self.write_policy(commit_level);
        policy.base_policy.filter_expression = Some(eq(
            string_bin(TOKEN_BIN.to_owned()),
            string_val(token.as_str().to_owned()),
        ));
        policy
    }

    fn address(&self) -> &str {
        &self.inner.config.hosts
    }

    /// Runs `op` up to the configured attempts while its error says nothing was sent (the seed's
    /// 5 × 80 ms); anything else — success, a server answer, an in-doubt outcome — returns at once.
    async fn with_retries<T, F, Fut>(
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
    async fn retrying<T, F, Fut>(
        &self,
        what: &str,
        key: &LockKey,
        retry_in_doubt: bool,
        mut op: F,
    ) -> Result<T, aerospike::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, aerospike::Error>>,
    {
        let attempts = self.inner.config.retries.max(1);
        let mut attempt = 1;
        loop {
            match op().await {
                Err(e)
                    if attempt < attempts
                        && (classify(&e) == Class::NotSent
                            || (retry_in_doubt && classify(&e) == Class::InDoubt)) =>
                {
                    tracing::debug!(key = %key, what, attempt, error = %e, "retrying");
                    attempt += 1;
                    tokio::time::sleep(self.inner.config.retry_delay).await;
                }
                other => return other,
            }
        }
    }

    fn exhausted_or(&self, what: &str, key: &LockKey, e: aerospike::Error) -> Error {
        let fence = what.starts_with("fence");
        let retried = classify(&e) == Class::NotSent || (fence && classify(&e) == Class::InDoubt);
        if retried && self.inner.config.retries > 1 {
            Error::new(
                ErrorKind::RetriesExhausted,
                format!(
                    "{what} could not reach Aerospike at {} in {} attempts",
                    self.address(),
                    self.inner.config.retries
                ),
            )
            .with_key(key.as_str())
            .with_source(e)
        } else {
            map(what, key.as_str(), self.address(), e)
        }
    }

    async fn next_fence(&self, key: &LockKey) -> Result<u64> {
        let fence_key = self.fence_key(key)?;
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.expiration = Expiration::Never;
        let ops = [
            operations::add(&as_bin!(COUNTER_BIN, 1)),
            operations::get_bin(COUNTER_BIN),
        ];
        let record = self
            .retrying("fence", key, true, || {
                self.inner.client.operate(&policy, &fence_key, &ops)
            })
            .await
            .map_err(|e| self.exhausted_or("fence increment", key, e))?;
        // Two operations on one bin answer with both results (add: nil, get: the new value).
        let value = match record.bins.get(COUNTER_BIN) {
            Some(Value::MultiResult(results)) => results.last(),
            other => other,
        };
        match value {
            Some(Value::Int(n)) if *n > 0 => Ok(*n as u64),
            other => Err(
                Error::internal(format!("fence counter read back as {other:?}"))
                    .with_key(key.as_str()),
            ),
        }
    }

    /// The lock record's create-only write (owner token, the Java manager's bins, expiration =
    /// TTL), retried only while nothing was sent.
    async fn create(&self, req: &Acquire, record_key: &Key) -> Result<(), aerospike::Error> {
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.record_exists_action = RecordExistsAction::CreateOnly;
        policy.expiration = Expiration::Seconds(ttl_seconds(req.ttl));
        policy.send_key = self.inner.config.send_key;
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let layout = &self.inner.layout;
        let bins = [
            as_bin!(layout.data_bin(), 1),
            as_bin!(layout.uat_bin(), now_ms),
            as_bin!(TOKEN_BIN, req.token.as_str()),
        ];
        self.with_retries("acquire", &req.key, || {
            self.inner.client.put(&policy, record_key, &bins)
        })
        .await
    }

    async fn acquire_once(&self, req: &Acquire) -> Result<Lease> {
        if self.inner.config.fencing {
            return self.acquire_fenced(req).await;
        }
        // Unfenced: the Java manager's cycle, one create-only write.
        let record_key = self.record_key(&req.key)?;
        let sent_at = Instant::now();
        match self.create(req, &record_key).await {
            Ok(()) => Ok(Lease::new(
                req.key.clone(),
                req.token.clone(),
                req.ttl,
                sent_at,
            )),
            Err(e) => match classify(&e) {
                Class::Server(ResultCode::KeyExistsError | ResultCode::GenerationError) => {
                    Err(Error::unavailable(&req.key))
                }
                _ => Err(self.exhausted_or("acquire", &req.key, e)),
            },
        }
    }

    /// Fencing in hold order: (1) create-only the lock record with the owner token, (2) increment
    /// the key's fence counter, (3) write the counter's value into the lock record, filtered on the
    /// owner token and update-only. The increment happens while the record is ours, and the
    /// filtered write proves it still was afterwards, so a holder's token is taken inside its own
    /// hold: tokens grow in the order of the holds. An acquisition that loses the record between
    /// the steps fails and leaves nothing of ours held.
    ///
    /// Never reports `InDoubt`: a lost create reply is resolved here by reading the record back,
    /// because a lease recovered elsewhere from the record alone could lack its fencing token.
    async fn acquire_fenced(&self, req: &Acquire) -> Result<Lease> {
        let record_key = self.record_key(&req.key)?;
        let sent_at = Instant::now();
        // Step 1: the create. A lost reply is read back; if the record is absent the create did
        // not apply (or applied and already expired), so sending it again is a fresh attempt.
        let mut attempt = 1;
        loop {
            let Err(e) = self.create(req, &record_key).await else {
                break;
            };
            match classify(&e) {
                Class::Server(ResultCode::KeyExistsError | ResultCode::GenerationError) => {
                    return Err(Error::unavailable(&req.key));
                }
                Class::InDoubt => match self.resolve_create(req, &record_key, e).await {
                    Ok(()) => break,
                    Err(e)
                        if e.kind() == ErrorKind::Connection
                            && attempt < self.inner.config.retries =>
                    {
                        tracing::debug!(key = %req.key, attempt, error = %e, "create again");
                        attempt += 1;
                        tokio::time::sleep(self.inner.config.retry_delay).await;
                    }
                    Err(e) => return Err(e),
                },
                _ => return Err(self.exhausted_or("acquire", &req.key, e)),
            }
        }
        // Step 2: the increment, while the record is ours.
        let fence = match self.next_fence(&req.key).await {
            Ok(fence) => fence,
            Err(e) => return Err(self.abandon(req, "fence increment", e).await),
        };
        // Step 3: the token into our record — only if it is still ours.
        let mut policy = self.owned_by(&req.token, self.inner.config.commit_levels.acquire);
        policy.record_exists_action = RecordExistsAction::UpdateOnly;
        policy.expiration = Expiration::DontUpdate;
        let bins = [as_bin!(FENCE_BIN, fence as i64)];
        // Writing the same value twice under the same filter is harmless: retried in doubt too.
        let written = self
            .retrying("fence write", &req.key, true, || {
                self.inner.client.put(&policy, &record_key, &bins)
            })
            .await;
        match written {
            Ok(()) => Ok(
                Lease::new(req.key.clone(), req.token.clone(), req.ttl, sent_at)
                    .with_fencing_token(Some(fence)),
            ),
            Err(e) => match classify(&e) {
                Class::Server(ResultCode::FilteredOut | ResultCode::KeyNotFoundError) => {
                    Err(Error::new(
                        ErrorKind::LockUnavailable,
                        format!(
                            "the lock record expired (or was broken) before its fencing token \
                             could be written, after {} ms: nothing of ours is held; try again, \
                             with a TTL longer than three round trips",
                            sent_at.elapsed().as_millis()
                        ),
                    )
                    .with_key(req.key.as_str())
                    .with_source(e))
                }
                _ => {
                    let error = self.exhausted_or("fence write", &req.key, e);
                    Err(self.abandon(req, "fence write", error).await)
                }
            },
        }
    }

    /// The create's reply was lost: read the record back to learn whether it landed. Ours: go on
    /// (`Ok`). Anyone else's: `LockUnavailable`. Absent: nothing is held, `Connection`.
    async fn resolve_create(
        &self,
        req: &Acquire,
        record_key: &Key,
        lost: aerospike::Error,
    ) -> Result<()> {
        // From the master, whatever the read replica policy: a replica may not have the create yet.
        let mut base_policy = self.base(0);
        base_policy.replica = Replica::Master;
        let policy = ReadPolicy { base_policy };
        let bins = Bins::Some(vec![TOKEN_BIN.to_owned()]);
        // A read is harmless to repeat: retried whatever happened to it.
        let read = self
            .retrying("acquire readback", &req.key, true, || {
                self.inner.client.get(&policy, record_key, bins.clone())
            })
            .await;
        match read {
            Ok(record) => match record.bins.get(TOKEN_BIN) {
                Some(Value::String(t)) if t == req.token.as_str() => Ok(()),
                _ => Err(Error::unavailable(&req.key)),
            },
            Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => {
                Err(Error::connection(format!(
                    "the acquire reply from Aerospike at {} was lost and the record is absent: \
                     the create did not apply (or applied and already expired); nothing is held",
                    self.address()
                ))
                .with_key(req.key.as_str())
                .with_source(lost))
            }
            Err(e) => {
                let error = Error::new(
                    ErrorKind::RetriesExhausted,
                    format!(
                        "the acquire reply from Aerospike at {} was lost and reading the record \
                         back failed too",
                        self.address()
                    ),
                )
                .with_key(req.key.as_str())
                .with_source(e);
                Err(self.abandon(req, "acquire", error).await)
            }
        }
    }

    /// Gives up an acquisition whose create may have landed: deletes our record (owner-filtered,
    /// best effort) and returns an error that is never `InDoubt`, so that no layer recovers a
    /// lease without its fencing token from the record.
    async fn abandon(&self, req: &Acquire, step: &str, error: Error) -> Error {
        let lease = Lease::new(req.key.clone(), req.token.clone(), req.ttl, Instant::now());
        let cleanup = match self.release_once(&lease).await {
            Ok(_) => "the lock record was deleted again: nothing is held".to_owned(),
            Err(e) => format!(
                "deleting the lock record failed too ({e}): it blocks the key until its TTL \
                 ({} s) runs out, and is never used",
                ttl_seconds(req.ttl)
            ),
        };
        tracing::warn!(key = %req.key, step, error = %error, "fenced acquisition abandoned");
        let kind = match error.kind() {
            ErrorKind::InDoubt => ErrorKind::RetriesExhausted,
            kind => kind,
        };
        Error::new(
            kind,
            format!("fenced acquisition abandoned at its {step}; {cleanup}"),
        )
        .with_key(req.key.as_str())
        .with_source(error)
    }

    async fn release_once(&self, lease: &Lease) -> Result<bool> {
        let record_key = self.record_key(lease.key())?;
        let policy = self.owned_by(lease.token(), self.inner.config.commit_levels.release);
        let result = self
            .with_retries("release", lease.key(), || {
                self.inner.client.delete(&policy, &record_key)
            })
            .await;
        match result {
            Ok(existed) => Ok(existed),
            Err(e) => match classify(&e) {
                Class::Server(ResultCode::FilteredOut | ResultCode::KeyNotFoundError) => Ok(false),
                _ => Err(self.exhausted_or("release", lease.key(), e)),
            },
        }
    }

    fn info(&self, key: LockKey, record: &Record) -> LockInfo {
        let token = match record.bins.get(TOKEN_BIN) {
            Some(Value::String(t)) => Some(OwnerToken::from_string(t.as_str())),
            _ => None,
        };
        let uat = match record.bins.get(self.inner.layout.uat_bin()) {
            Some(Value::Int(ms)) if *ms > 0 => Some(UNIX_EPOCH + Duration::from_millis(*ms as u64)),
            _ => None,
        };
        let fence = match record.bins.get(FENCE_BIN) {
            Some(Value::Int(f)) if *f > 0 => Some(*f as u64),
            _ => None,
        };
        LockInfo::new(key, token)
            .with_ttl_remaining(record.time_to_live())
            .with_acquired_at(uat)
            .with_fencing_token(fence)
    }
}

/// Aerospike expiration is in whole seconds, and 0 means "namespace default" (possibly never):
/// round up, never down to 0. (`validate_ttl` already refused a zero TTL.)
fn ttl_seconds(ttl: Duration) -> u32 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
}

impl LockStore for AerospikeStore {
    fn name(&self) -> &'static str {
        "aerospike"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
            .with_fencing(self.inner.config.fencing)
            .with_listing(true)
    }

    /// Create-only write with expiration = TTL rounded up to whole seconds; with fencing, then the
    /// fence counter's increment and an owner-filtered write of its value into the record (3
    /// round trips, tokens in hold order). Cancel safe: the requests run on their own task, and an
    /// acquisition nobody receives is released again (owner-checked).
    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        validate_ttl(req.ttl)?;
        req.mode.validate()?;
        if req.mode.is_shared_record() {
            return Err(
                Error::unsupported("aerospike", "read-write locks and semaphores")
                    .with_key(req.key.as_str()),
            );
        }
        self.record_key(&req.key)?;
        let (acquirer, releaser) = (self.clone(), self.clone());
        acquire_detached(
            req,
            move |req| async move { acquirer.acquire_once(&req).await },
            move |lease| async move { releaser.release_once(&lease).await },
        )
        .await
    }

    /// One round trip: a delete with a filter expression `lh_token == token`.
    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.release_once(lease).await
    }

    /// One round trip: a touch with the same filter and the new expiration.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        validate_ttl(ttl)?;
        let record_key = self.record_key(lease.key())?;
        let mut policy = self.owned_by(lease.token(), self.inner.config.commit_levels.extend);
        policy.expiration = Expiration::Seconds(ttl_seconds(ttl));
        let sent_at = Instant::now();
        let result = self
            .with_retries("extend", lease.key(), || {
                self.inner.client.touch(&policy, &record_key)
            })
            .await;
        match result {
            Ok(()) => Ok(lease.renewed(ttl, sent_at)),
            Err(e) => match classify(&e) {
                Class::Server(ResultCode::FilteredOut | ResultCode::KeyNotFoundError) => {
                    Err(Error::not_held(
                        "the lease expired or was taken by another owner before it could be extended",
                    )
                    .with_key(lease.key().as_str()))
                }
                _ => Err(self.exhausted_or("extend", lease.key(), e)),
            },
        }
    }

    /// One round trip: the lock record's bins and TTL, read from the node the configured read
    /// replica policy picks (`AerospikeConfig::read_replica`).
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let record_key = self.record_key(key)?;
        let mut base_policy = self.base(self.inner.config.retries.saturating_sub(1) as usize);
        base_policy.replica = self.inner.config.read_replica;
        let policy = ReadPolicy { base_policy };
        match self.inner.client.get(&policy, &record_key, Bins::All).await {
            Ok(record) => Ok(Some(self.info(key.clone(), &record))),
            Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => Ok(None),
            Err(e) => Err(map("inspect", key.as_str(), self.address(), e)),
        }
    }

    /// Scans this farm's DC set and the XDC set. Records written without a user key (the Java
    /// manager sends only the digest) cannot be named and are left out.
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let mut locks = Vec::new();
        for (level, set) in self.inner.layout.listed_sets() {
            let policy = QueryPolicy::default();
            let statement = Statement::new(self.inner.config.namespace.clone(), set, Bins::All);
            let records = self
                .inner
                .client
                .query(&policy, PartitionFilter::all(), statement)
                .await
                .map_err(|e| map("list", prefix, self.address(), e))?;
            let mut stream = Arc::clone(&records).into_stream();
            while let Some(record) = stream.next().await {
                let record = record.map_err(|e| map("list", prefix, self.address(), e))?;
                let Some(lock_id) = record
                    .key
                    .as_ref()
                    .and_then(|k| k.user_key())
                    .and_then(|v| match v {
                        Value::String(s) => Some(s.clone()),
                        _ => None,
                    })
                else {
                    continue;
                };
                let storage = match level {
                    LockLevel::Dc => format!("DC#{}#{lock_id}", self.inner.layout.farm_id()),
                    LockLevel::Xdc => format!("XDC#{lock_id}"),
                };
                if !storage.starts_with(prefix) {
                    continue;
                }
                if let Ok(key) = storage.parse::<LockKey>() {
                    locks.push(self.info(key, &record));
                }
            }
        }
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(locks)
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
