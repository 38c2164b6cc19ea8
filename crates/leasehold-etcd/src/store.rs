//! The etcd store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KvClient, LeaseClient, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse,
};
use leasehold_core::{
    acquire_detached, validate_ttl, Acquire, Capabilities, Error, ErrorKind, Lease, LockInfo,
    LockKey, LockStore, OwnerToken, ReleaseWatch, Result,
};
use tokio::time::Instant;

use crate::config::{lease_seconds, EtcdConfig};
use crate::error::{map, unexpected, Op};
use crate::waiting::{Place, Waiting};

/// A lock store on an etcd v3 cluster. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    kv: KvClient,
    lease: LeaseClient,
    config: EtcdConfig,
    /// `host:port,…`, for messages (never credentials).
    address: String,
    /// This store's place in waiter lines, its waiter lease and its watches.
    waiting: Arc<Waiting>,
}

impl EtcdStore {
    /// Validates `config` (before any I/O), connects, and checks the cluster answers.
    ///
    /// Bad configuration: [`ErrorKind::InvalidArgument`]. Cluster unreachable:
    /// [`ErrorKind::Connection`], naming the endpoints. Wrong credentials:
    /// [`ErrorKind::StoreSetup`].
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let address = config.address();
        let mut options = etcd_client::ConnectOptions::new()
            .with_timeout(config.response_timeout)
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(Duration::from_secs(10), config.response_timeout);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &config.tls {
            options = options.with_tls(tls_options(tls)?);
        }
        let connecting = etcd_client::Client::connect(config.endpoints.clone(), Some(options));
        let client =
            tokio::time::timeout(config.connect_timeout + config.response_timeout, connecting)
                .await
                .map_err(|_| {
                    Error::connection(format!(
                        "connecting to etcd at {address} timed out after {:?}",
                        config.connect_timeout + config.response_timeout
                    ))
                })?
                .map_err(|e| setup_or(map(Op::Connect, "", &address, e)))?;
        let mut kv = client.kv_client();
        // The client connects lazily: one read proves the cluster answers (and the credentials
        // work) before the store is handed out.
        kv.get(
            config.prefix.as_bytes(),
            Some(GetOptions::new().with_count_only().with_prefix()),
        )
        .await
        .map_err(|e| {
            tls_error(&address, &e).unwrap_or_else(|| setup_or(map(Op::Connect, "", &address, e)))
        })?;
        let waiting = Waiting::new(&config, &client);
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                kv,
                lease: client.lease_client(),
                config,
                address,
                waiting: Arc::new(waiting),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The etcd key of a lock record: `<prefix><lock key>`.
    pub fn lock_key(&self, key: &LockKey) -> String {
        format!("{}{}", self.inner.config.prefix, key.as_str())
    }

    /// The prefix of a lock's waiter keys: `<prefix><lock key>#waiter#` (a lock key never has a
    /// part after its entity, so no other lock's key starts with it).
    pub fn waiter_prefix(&self, key: &LockKey) -> String {
        waiter_prefix(&self.lock_key(key))
    }

    fn kv(&self) -> KvClient {
        self.inner.kv.clone()
    }

    fn err(&self, op: Op, key: &LockKey, e: etcd_client::Error) -> Error {
        map(op, key.as_str(), &self.inner.address, e)
    }

    /// Grants a lease of `ttl` (rounded up to whole seconds) for `key`.
    async fn grant(&self, key: &LockKey, ttl: Duration) -> Result<i64> {
        let secs = seconds(ttl)?;
        let mut lease = self.inner.lease.clone();
        lease
            .grant(secs, None)
            .await
            .map(|granted| granted.id())
            .map_err(|e| self.err(Op::Grant, key, e))
    }

    /// Revokes a lease in the background: its record is already gone or was never written, so
    /// nobody waits for this; if it fails, the lease expires at its TTL.
    fn revoke_later(&self, id: i64) {
        if id == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut lease = self.inner.lease.clone();
        runtime.spawn(async move {
            if let Err(error) = lease.revoke(id).await {
                tracing::debug!(lease = id, %error, "could not revoke a lease; it expires at its TTL");
            }
        });
    }

    /// The acquire itself (see `try_acquire` for cancel safety): a lease, then one transaction;
    /// a blocking attempt that already has a place in line first reads whether it is its turn.
    async fn acquire_once(&self, req: &Acquire) -> Result<Lease> {
        let lock_key = self.lock_key(&req.key);
        let waiting = &self.inner.waiting;
        let fair = self.inner.config.fair;
        // A blocking attempt of a process that watches the key waits in line: its first attempt
        // is a plain try (free and nobody waiting), and joins the line if that fails.
        let blocking = fair && req.deadline.is_some() && waiting.is_watched(&lock_key);
        let place = if blocking {
            waiting.current_place(&lock_key)
        } else {
            None
        };
        if let Some(place) = &place {
            if !self.is_my_turn(&req.key, &lock_key, place).await? {
                return Err(Error::unavailable(&req.key));
            }
        }
        let join = match (&place, blocking) {
            (None, true) => match waiting.session().await {
                Ok(session) => Some((Waiting::waiter_key(&lock_key, session), session)),
                Err(error) => {
                    tracing::debug!(key = %req.key, %error,
                        "could not grant the waiter lease; waiting without a place in line");
                    None
                }
            },
            _ => None,
        };
        let sent_at = Instant::now();
        let lease_id = self.grant(&req.key, req.ttl).await?;
        let waiters = waiter_prefix(&lock_key);
        let mut when = vec![Compare::create_revision(
            lock_key.as_str(),
            CompareOp::Equal,
            0,
        )];
        let mut then = vec![TxnOp::put(
            lock_key.as_str(),
            req.token.as_str(),
            Some(PutOptions::new().with_lease(lease_id)),
        )];
        let mut otherwise = Vec::new();
        match &place {
            Some(place) => {
                // Ours is still in line, and every waiter key was created at or after ours.
                when.push(Compare::create_revision(
                    place.key.as_str(),
                    CompareOp::Equal,
                    place.revision,
                ));
                when.push(
                    Compare::create_revision(
                        waiters.as_str(),
                        CompareOp::Greater,
                        place.revision - 1,
                    )
                    .with_prefix(),
                );
                then.push(TxnOp::delete(place.key.as_str(), None));
            }
            None if fair => {
                // No waiter key at all (an empty range compares as create revision 0).
                when.push(
                    Compare::create_revision(waiters.as_str(), CompareOp::Equal, 0).with_prefix(),
                );
            }
            None => {}
        }
        if let Some((key, session)) = &join {
            otherwise.push(TxnOp::put(
                key.as_str(),
                waiting.id(),
                Some(PutOptions::new().with_lease(*session).with_prev_key()),
            ));
        }
        then.push(TxnOp::get(
            waiters.as_str(),
            Some(GetOptions::new().with_prefix().with_count_only()),
        ));
        let txn = Txn::new().when(when).and_then(then).or_else(otherwise);
        let response = match self.kv().txn(txn).await {
            Ok(response) => response,
            Err(e) => {
                let error = self.err(Op::Acquire, &req.key, e);
                if !error.is_in_doubt() {
                    self.revoke_later(lease_id);
                }
                // In doubt: the record may live on this lease; it expires at its TTL, or the
                // caller's release (or the readback layer) revokes it.
                return Err(error);
            }
        };
        let revision = response.header().map(|h| h.revision()).unwrap_or(0);
        let responses = response.op_responses();
        if !response.succeeded() {
            self.revoke_later(lease_id);
            if let (Some((key, _)), Some(TxnOpResponse::Put(put))) = (join, responses.first()) {
                // Joined the line: a key that existed keeps its create revision.
                let created = put.prev_key().map_or(revision, |p| p.create_revision());
                waiting.set_place(
                    &lock_key,
                    Place {
                        key,
                        revision: created,
                    },
                );
            }
            // With a place: the turn was lost between the read and the transaction; the next
            // attempt reads again (and rejoins if the waiter lease lapsed).
            return Err(Error::unavailable(&req.key));
        }
        if let Some(place) = &place {
            waiting.forget(&lock_key, place);
        }
        if revision <= 0 {
            return Err(unexpected(
                Op::Acquire,
                req.key.as_str(),
                "no revision in its header",
            ));
        }
        let others = match responses.last() {
            Some(TxnOpResponse::Get(g)) => g.count(),
            _ => 0,
        };
        Ok(
            Lease::new(req.key.clone(), req.token.clone(), req.ttl, sent_at)
                .with_fencing_token(u64::try_from(revision).ok())
                .with_contended(others > 0),
        )
    }

    /// One read-only transaction (served by etcd without a Raft write): is the record absent and
    /// our waiter key first in line? A place whose key is gone (the waiter lease lapsed) is
    /// forgotten, so the next attempt joins the line again.
    async fn is_my_turn(&self, key: &LockKey, lock_key: &str, place: &Place) -> Result<bool> {
        let read = Txn::new().and_then([
            TxnOp::get(lock_key, Some(GetOptions::new().with_count_only())),
            TxnOp::get(
                waiter_prefix(lock_key),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1)
                        .with_keys_only(),
                ),
            ),
            TxnOp::get(
                place.key.as_str(),
                Some(GetOptions::new().with_count_only()),
            ),
        ]);
        let response = self
            .kv()
            .txn(read)
            .await
            .map_err(|e| self.err(Op::Inspect, key, e))?;
        let responses = response.op_responses();
        let (
            Some(TxnOpResponse::Get(record)),
            Some(TxnOpResponse::Get(head)),
            Some(TxnOpResponse::Get(mine)),
        ) = (responses.first(), responses.get(1), responses.get(2))
        else {
            return Err(unexpected(
                Op::Acquire,
                key.as_str(),
                "a read without its three ranges",
            ));
        };
        if mine.count() == 0 {
            self.inner.waiting.forget(lock_key, place);
            return Ok(false);
        }
        let first = head.kvs().first().map(|kv| kv.key());
        Ok(record.count() == 0 && first == Some(place.key.as_bytes()))
    }

    async fn release_once(&self, lease: &Lease) -> Result<bool> {
        let lock_key = self.lock_key(lease.key());
        let txn = Txn::new()
            .when([Compare::value(
                lock_key.as_str(),
                CompareOp::Equal,
                lease.token().as_str(),
            )])
            .and_then([TxnOp::delete(
                lock_key.as_str(),
                Some(DeleteOptions::new().with_prev_key()),
            )]);
        let response = self
            .kv()
            .txn(txn)
            .await
            .map_err(|e| self.err(Op::Release, lease.key(), e))?;
        if !response.succeeded() {
            return Ok(false);
        }
        if let Some(TxnOpResponse::Delete(deleted)) = response.op_responses().first() {
            if let Some(kv) = deleted.prev_kvs().first() {
                self.revoke_later(kv.lease());
            }
        }
        Ok(true)
    }

    /// Remaining TTL of a lease, `None` if it has none (0) or is gone.
    async fn lease_ttl(&self, key: &LockKey, id: i64) -> Result<Option<Duration>> {
        if id == 0 {
            return Ok(None);
        }
        let mut lease = self.inner.lease.clone();
        let ttl = lease
            .time_to_live(id, None)
            .await
            .map_err(|e| self.err(Op::Inspect, key, e))?
            .ttl();
        Ok(u64::try_from(ttl).ok().map(Duration::from_secs))
    }

    async fn info(&self, key: LockKey, kv: &etcd_client::KeyValue) -> Result<Option<LockInfo>> {
        let ttl = self.lease_ttl(&key, kv.lease()).await?;
        if kv.lease() != 0 && ttl.is_none() {
            return Ok(None); // expired between the read and the lease lookup
        }
        let token = String::from_utf8_lossy(kv.value()).into_owned();
        Ok(Some(
            LockInfo::new(key, Some(OwnerToken::from_string(token)))
                .with_ttl_remaining(ttl)
                .with_fencing_token(u64::try_from(kv.create_revision()).ok()),
        ))
    }
}

/// `<lock key>#waiter#`: the line of one lock.
pub(crate) fn waiter_prefix(lock_key: &str) -> String {
    format!("{lock_key}#waiter#")
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

/// A failed TLS handshake, said plainly: an untrusted certificate or a wrong host name is a setup
/// problem, not an unreachable cluster.
fn tls_error(address: &str, error: &etcd_client::Error) -> Option<Error> {
    let (failure, text) = leasehold_core::TlsFailure::classify(error)?;
    let hint = match failure {
        leasehold_core::TlsFailure::UntrustedCa => {
            "the server's certificate is not signed by a trusted CA: give the CA that signed it \
             (tls_ca_file / ?tls_ca=)"
        }
        leasehold_core::TlsFailure::WrongName => {
            "the server's certificate does not name the host in the URL: connect by a name the \
             certificate lists"
        }
        leasehold_core::TlsFailure::Handshake => {
            "the TLS handshake failed: check the CA, the client certificate and the host name"
        }
    };
    Some(Error::new(
        ErrorKind::StoreSetup,
        format!("TLS with etcd at {address} failed: {hint} ({text})"),
    ))
}

/// A failed connect whose cause says the credentials are wrong is a setup problem.
fn setup_or(error: Error) -> Error {
    let text = format!("{error}");
    if text.contains("authentication failed")
        || text.contains("invalid user ID or password")
        || text.contains("permission denied")
    {
        Error::new(
            ErrorKind::StoreSetup,
            format!("etcd refused the credentials: check the user and password ({text})"),
        )
    } else {
        error
    }
}

#[cfg(feature = "tls")]
fn tls_options(tls: &crate::config::TlsFiles) -> Result<etcd_client::TlsOptions> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            Error::invalid_argument(format!("cannot read the TLS {what} {}", path.display()))
                .with_source(e)
        })
    };
    let mut options = etcd_client::TlsOptions::new();
    if let Some(ca) = &tls.ca {
        options = options.ca_certificate(etcd_client::Certificate::from_pem(read(ca, "CA file")?));
    }
    if let Some((cert, key)) = &tls.client {
        options = options.identity(etcd_client::Identity::from_pem(
            read(cert, "client certificate")?,
            read(key, "client key")?,
        ));
    }
    Ok(options)
}

impl LockStore for EtcdStore {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn capabilities(&self) -> Capabilities {
        // Read-write locks, semaphores and the lock trace are not on etcd yet (docs/ETCD.md).
        Capabilities::NONE
            .with_fencing(true)
            .with_listing(true)
            .with_notifications(true)
    }

    /// Watches the lock record and its waiter line for deletions (a release, a lease that
    /// expired, a waiter ahead that left) on one watch stream per key and process, created (and
    /// confirmed by etcd) before this returns. Dropping the last watch of the process on a key
    /// cancels the stream and takes the process's waiter key out of the line.
    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        self.inner.waiting.watch(self.lock_key(key)).await
    }

    /// A lease grant, then one transaction. Cancel safe: the requests run on their own task; if
    /// the caller stops waiting, the task finishes and releases (owner-checked) what it acquired,
    /// or what it may have acquired if the reply was lost.
    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        seconds(req.ttl)?;
        req.mode.validate()?;
        if req.mode.is_shared_record() {
            return Err(
                Error::unsupported("etcd", "read-write locks and semaphores")
                    .with_key(req.key.as_str()),
            );
        }
        let (acquirer, releaser) = (self.clone(), self.clone());
        acquire_detached(
            req,
            move |req| async move { acquirer.acquire_once(&req).await },
            move |lease| async move { releaser.release_once(&lease).await },
        )
        .await
    }

    /// One transaction: delete the record if its value is our token; the lease it lived on is
    /// revoked in the background.
    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.release_once(lease).await
    }

    /// A new lease of `ttl`, then one transaction that moves the record onto it if its value is
    /// still our token (the create revision, our fencing token, does not change); the old lease
    /// is revoked in the background. A keep-alive could only renew the lease's first TTL, and
    /// would not check the owner.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        seconds(ttl)?;
        let lock_key = self.lock_key(lease.key());
        let sent_at = Instant::now();
        let new_lease = self.grant(lease.key(), ttl).await?;
        let txn = Txn::new()
            .when([Compare::value(
                lock_key.as_str(),
                CompareOp::Equal,
                lease.token().as_str(),
            )])
            .and_then([TxnOp::put(
                lock_key.as_str(),
                lease.token().as_str(),
                Some(PutOptions::new().with_lease(new_lease).with_prev_key()),
            )]);
        let response = self
            .kv()
            .txn(txn)
            .await
            .map_err(|e| self.err(Op::Extend, lease.key(), e))?;
        if !response.succeeded() {
            self.revoke_later(new_lease);
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
        Ok(lease.renewed(ttl, sent_at))
    }

    /// A read of the record, then of its lease's remaining TTL.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let response = self
            .kv()
            .get(self.lock_key(key), None)
            .await
            .map_err(|e| self.err(Op::Inspect, key, e))?;
        match response.kvs().first() {
            Some(kv) => self.info(key.clone(), kv).await,
            None => Ok(None),
        }
    }

    /// One range read over `<prefix><filter>`, then the remaining TTL of every lease, concurrently.
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let store_prefix = &self.inner.config.prefix;
        let response = self
            .kv()
            .get(
                format!("{store_prefix}{prefix}"),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(|e| map(Op::List, prefix, &self.inner.address, e))?;
        let found = response.kvs().iter().filter_map(|kv| {
            let name = std::str::from_utf8(kv.key()).ok()?;
            let key = name.strip_prefix(store_prefix)?.parse::<LockKey>().ok()?;
            Some((key, kv))
        });
        let infos =
            futures::future::try_join_all(found.map(|(key, kv)| self.info(key, kv))).await?;
        let mut locks: Vec<LockInfo> = infos.into_iter().flatten().collect();
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(locks)
    }

    /// Revokes this store's waiter lease (its waiter keys leave every line at once).
    async fn shutdown(&self) -> Result<usize> {
        self.inner.waiting.close().await;
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn waiter_keys_never_parse_as_lock_keys() {
        let key = LockKey::dc("f", "c", "e").unwrap();
        let waiter = format!("{}1f", waiter_prefix(key.as_str()));
        assert!(waiter.parse::<LockKey>().is_err());
    }
}
