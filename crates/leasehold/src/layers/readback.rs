//! Readback (Bond 3.1, timeout-retry re-entry): resolve an in-doubt reply by reading the record
//! back, instead of failing the caller or retrying a write blindly.
//!
//! # What it guarantees
//! When the store says [`ErrorKind::InDoubt`] (the request was sent, the reply was lost), the layer
//! reads the record back with [`LockStore::inspect`]:
//!
//! | acquire in doubt, record… | outcome |
//! |---|---|
//! | ours (our token) | `Ok(lease)`: the write landed; the caller holds the lock instead of leaking it until its TTL |
//! | absent | the write did not land: the acquire is sent again, at most [`ReadbackConfig::retries`] times (default 1, Bond's recommendation) |
//! | another token | [`ErrorKind::LockUnavailable`] |
//! | readback fails | the original [`ErrorKind::InDoubt`], with the readback failure in the message |
//!
//! Retries keep the same owner token, so a first write that lands late is recognised: if a retry
//! answers `LockUnavailable`, the record is read back once more and, if it is ours, the lease is
//! returned. When the retries are used up the error is [`ErrorKind::RetriesExhausted`] with the
//! in-doubt error as its source.
//!
//! A release in doubt is read back too: record still ours → the release is sent again (bounded by
//! the same retry count); absent or owned by another → `Ok(true)` if the lease cannot have expired
//! yet (so our delete is what removed it), `Ok(false)` otherwise. Nothing is ever retried without a
//! readback first.
//!
//! The lease returned after a readback has `acquired_at` set to just before the *first* attempt
//! was sent: whichever attempt landed, the record cannot expire before that plus the TTL.
//!
//! # Where it belongs
//! Innermost, directly around the store: it must see the store's own errors, and every layer above
//! (unlock window, shutdown tracking, local competition) then sees only resolved outcomes.
//!
//! # Cost
//! Nothing on the normal path (one branch). On an in-doubt reply: one `inspect` round trip, plus
//! one more acquire per retry — Bond's "extra latency when a timeout occurs".
//!
//! # Residual risk
//! A write delayed in the network past the readback (readback says absent, no retry left, then the
//! write lands) leaves a record under a token nobody holds; it expires at its TTL. Keep TTLs short.
//!
//! # Events
//! [`LockEvent::RecoveredByReadback`] for every readback that resolved an outcome.

use std::time::Duration;

use tokio::time::Instant;

use crate::core::{
    Acquire, Capabilities, Error, ErrorKind, Layer, Lease, LockEvent, LockInfo, LockKey, LockStore,
    Observers, Result,
};

/// Default number of retries after a readback found the record absent (Bond: one retry).
pub const DEFAULT_READBACK_RETRIES: u32 = 1;

/// Configuration of the readback layer.
///
/// ```
/// use leasehold::layers::ReadbackConfig;
/// let config = ReadbackConfig::new().retries(2);
/// assert_eq!(config.retries, 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadbackConfig {
    /// How many times an in-doubt acquire (or release) is sent again after the readback showed it
    /// did not land. `0`: read back, never resend. Default [`DEFAULT_READBACK_RETRIES`].
    pub retries: u32,
}

impl Default for ReadbackConfig {
    fn default() -> Self {
        ReadbackConfig {
            retries: DEFAULT_READBACK_RETRIES,
        }
    }
}

impl ReadbackConfig {
    /// The default: one retry.
    pub fn new() -> Self {
        ReadbackConfig::default()
    }

    /// Sets the retry count.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }
}

/// Wraps a store in [`Readback`].
#[derive(Debug, Clone, Default)]
pub struct ReadbackLayer {
    config: ReadbackConfig,
    observers: Observers,
}

impl ReadbackLayer {
    /// A layer with `config` and no observers.
    pub fn new(config: ReadbackConfig) -> Self {
        ReadbackLayer {
            config,
            observers: Observers::default(),
        }
    }

    /// Reports events to `observers`.
    pub fn with_observers(mut self, observers: Observers) -> Self {
        self.observers = observers;
        self
    }
}

impl<S: LockStore> Layer<S> for ReadbackLayer {
    type Store = Readback<S>;

    fn layer(&self, inner: S) -> Readback<S> {
        Readback {
            inner,
            config: self.config,
            observers: self.observers.clone(),
        }
    }
}

/// A store whose in-doubt replies are resolved by reading the record back (see the
/// [module docs](self)).
#[derive(Debug, Clone)]
pub struct Readback<S> {
    inner: S,
    config: ReadbackConfig,
    observers: Observers,
}

/// What a readback found.
enum Found {
    Ours(LockInfo),
    Absent,
    Other,
}

impl<S: LockStore> Readback<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, config: ReadbackConfig) -> Self {
        ReadbackLayer::new(config).layer(inner)
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store.
    pub fn into_inner(self) -> S {
        self.inner
    }

    async fn read_back(
        &self,
        key: &LockKey,
        token: &crate::core::OwnerToken,
        operation: &'static str,
        in_doubt: Error,
    ) -> Result<Found> {
        match self.inner.inspect(key).await {
            Ok(found) => {
                let found = match found {
                    Some(info) if info.is_owned_by(token) => Found::Ours(info),
                    Some(_) => Found::Other,
                    None => Found::Absent,
                };
                self.observers.emit(|| LockEvent::RecoveredByReadback {
                    key: key.clone(),
                    operation,
                    held: matches!(found, Found::Ours(_)),
                });
                Ok(found)
            }
            Err(readback) => Err(Error::in_doubt(format!(
                "the {operation} reply was lost and reading the record back failed too \
                 ({readback}); the outcome is unknown"
            ))
            .with_key(key.as_str())
            .with_source(in_doubt)),
        }
    }

    fn exhausted(&self, key: &LockKey, operation: &str, last: Error) -> Error {
        Error::new(
            ErrorKind::RetriesExhausted,
            format!(
                "the {operation} reply was lost {} time(s); each readback showed it had not \
                 applied",
                self.config.retries + 1
            ),
        )
        .with_key(key.as_str())
        .with_source(last)
    }

    fn recovered(req: &Acquire, info: &LockInfo, first_sent: Instant) -> Lease {
        Lease::new(req.key.clone(), req.token.clone(), req.ttl, first_sent)
            .with_fencing_token(info.fencing_token)
    }
}

impl<S: LockStore> LockStore for Readback<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        let first_sent = Instant::now();
        let mut retries_left = self.config.retries;
        let mut was_in_doubt = false;
        loop {
            match self.inner.try_acquire(req).await {
                Ok(lease) => return Ok(lease),
                Err(error) if error.is_in_doubt() => {
                    match self
                        .read_back(&req.key, &req.token, "acquire", error.clone_shallow())
                        .await?
                    {
                        Found::Ours(info) => return Ok(Self::recovered(req, &info, first_sent)),
                        Found::Other => return Err(Error::unavailable(&req.key)),
                        Found::Absent if retries_left == 0 => {
                            return Err(self.exhausted(&req.key, "acquire", error))
                        }
                        Found::Absent => {
                            retries_left -= 1;
                            was_in_doubt = true;
                        }
                    }
                }
                Err(error) if error.is_unavailable() && was_in_doubt => {
                    // An earlier attempt's write may have landed late, under our token.
                    return match self.inner.inspect(&req.key).await {
                        Ok(Some(info)) if info.is_owned_by(&req.token) => {
                            self.observers.emit(|| LockEvent::RecoveredByReadback {
                                key: req.key.clone(),
                                operation: "acquire",
                                held: true,
                            });
                            Ok(Self::recovered(req, &info, first_sent))
                        }
                        _ => Err(error),
                    };
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let mut retries_left = self.config.retries;
        let mut was_in_doubt = false;
        // Gone or someone else's after one of our deletes was in doubt: if our lease cannot have
        // expired yet, that delete is what removed it.
        let removed_by_us = || Ok(Instant::now() < lease.expires_at());
        loop {
            match self.inner.release(lease).await {
                Err(error) if error.is_in_doubt() => {
                    match self
                        .read_back(lease.key(), lease.token(), "release", error.clone_shallow())
                        .await?
                    {
                        Found::Ours(_) if retries_left == 0 => {
                            return Err(self.exhausted(lease.key(), "release", error))
                        }
                        Found::Ours(_) => {
                            retries_left -= 1;
                            was_in_doubt = true;
                        }
                        Found::Absent | Found::Other => return removed_by_us(),
                    }
                }
                // The retry found nothing: the earlier delete landed late.
                Ok(false) if was_in_doubt => return removed_by_us(),
                other => return other,
            }
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.inner.extend(lease, ttl).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.list(prefix).await
    }

    async fn shutdown(&self) -> Result<usize> {
        self.inner.shutdown().await
    }
}

/// `Error` is not `Clone` (its source is a boxed error): a copy of kind, message and key.
trait CloneShallow {
    fn clone_shallow(&self) -> Error;
}

impl CloneShallow for Error {
    fn clone_shallow(&self) -> Error {
        let copy = Error::new(self.kind(), self.message());
        match self.key() {
            Some(key) => copy.with_key(key),
            None => copy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::test_support::{events, key, req};
    use leasehold_testkit::scripted::{reply_lost, Op, ScriptedStore};

    use crate::core::{LockInfo, OwnerToken};

    fn readback(scripted: &ScriptedStore, retries: u32) -> (Readback<ScriptedStore>, events::Seen) {
        let (observers, seen) = events::capture();
        let store = ReadbackLayer::new(ReadbackConfig::new().retries(retries))
            .with_observers(observers)
            .layer(scripted.clone());
        (store, seen)
    }

    fn held_by(token: &OwnerToken) -> Result<Option<LockInfo>> {
        Ok(Some(
            LockInfo::new(key("a"), Some(token.clone())).with_fencing_token(Some(9)),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn plain_success_and_plain_errors_pass_through() {
        let scripted = ScriptedStore::new();
        scripted
            .grant_acquire()
            .expect_acquire(Err(Error::unavailable(&key("a"))))
            .expect_acquire(Err(Error::connection("refused")));
        let (store, seen) = readback(&scripted, 1);
        assert!(store.try_acquire(&req("a", 1000)).await.is_ok());
        assert!(store
            .try_acquire(&req("a", 1000))
            .await
            .unwrap_err()
            .is_unavailable());
        let err = store.try_acquire(&req("a", 1000)).await.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Connection,
            "never retried: nothing was applied"
        );
        assert_eq!(scripted.count(Op::Inspect), 0);
        assert!(seen.names().is_empty());
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn in_doubt_acquire_that_landed_is_ours() {
        let scripted = ScriptedStore::new();
        let r = req("a", 2000);
        scripted
            .expect_acquire(Err(reply_lost()))
            .expect_inspect(held_by(&r.token));
        let (store, seen) = readback(&scripted, 1);
        let started = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        let lease = store.try_acquire(&r).await.unwrap();
        assert_eq!(lease.token(), &r.token);
        assert_eq!(lease.fencing_token(), Some(9));
        assert!(lease.acquired_at() >= started && lease.acquired_at() <= Instant::now());
        assert_eq!(
            scripted.ops(),
            [Op::TryAcquire, Op::Inspect],
            "no second write"
        );
        assert_eq!(seen.names(), ["recovered_by_readback"]);
        assert!(matches!(
            seen.all()[0],
            LockEvent::RecoveredByReadback {
                held: true,
                operation: "acquire",
                ..
            }
        ));
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn in_doubt_acquire_that_did_not_land_is_retried_once() {
        let scripted = ScriptedStore::new();
        let r = req("a", 2000);
        scripted
            .expect_acquire(Err(reply_lost()))
            .expect_inspect(Ok(None))
            .grant_acquire();
        let (store, seen) = readback(&scripted, 1);
        let lease = store.try_acquire(&r).await.unwrap();
        assert_eq!(lease.token(), &r.token);
        let calls = scripted.calls();
        assert_eq!(
            scripted.ops(),
            [Op::TryAcquire, Op::Inspect, Op::TryAcquire]
        );
        assert_eq!(calls[0].token, calls[2].token, "the retry keeps the token");
        assert_eq!(seen.names(), ["recovered_by_readback"]);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_bounded() {
        let scripted = ScriptedStore::new();
        scripted
            .expect_acquire(Err(reply_lost()))
            .expect_inspect(Ok(None))
            .expect_acquire(Err(reply_lost()))
            .expect_inspect(Ok(None));
        let (store, _) = readback(&scripted, 1);
        let err = store.try_acquire(&req("a", 2000)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RetriesExhausted);
        assert!(std::error::Error::source(&err).is_some());
        assert_eq!(scripted.count(Op::TryAcquire), 2);
        scripted.verify();

        let scripted = ScriptedStore::new();
        scripted
            .expect_acquire(Err(reply_lost()))
            .expect_inspect(Ok(None));
        let (store, _) = readback(&scripted, 0);
        let err = store.try_acquire(&req("a", 2000)).await.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::RetriesExhausted,
            "0 retries: read back, never resend"
        );
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn in_doubt_acquire_held_by_another_is_unavailable() {
        let scripted = ScriptedStore::new();
        scripted
            .expect_acquire(Err(reply_lost()))
            .expect_inspect(held_by(&OwnerToken::generate()));
        let (store, seen) = readback(&scripted, 1);
        let err = store.try_acquire(&req("a", 2000)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LockUnavailable);
        assert!(matches!(
            seen.all()[0],
            LockEvent::RecoveredByReadback { held: false, .. }
        ));
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn failed_readback_keeps_the_doubt() {
        let scripted = ScriptedStore::new();
        scripted
            .expect_acquire(Err(reply_lost()))
            .expect_inspect(Err(Error::connection("down")));
        let (store, seen) = readback(&scripted, 1);
        let err = store.try_acquire(&req("a", 2000)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InDoubt);
        assert!(
            err.message().contains("reading the record back failed"),
            "{err}"
        );
        assert_eq!(scripted.count(Op::TryAcquire), 1, "no blind retry");
        assert!(seen.names().is_empty());
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn late_landing_first_write_is_recognised() {
        let scripted = ScriptedStore::new();
        let r = req("a", 2000);
        scripted
            .expect_acquire(Err(reply_lost()))
            .expect_inspect(Ok(None))
            .expect_acquire(Err(Error::unavailable(&key("a"))))
            .expect_inspect(held_by(&r.token));
        let (store, _) = readback(&scripted, 1);
        let lease = store.try_acquire(&r).await.unwrap();
        assert_eq!(lease.token(), &r.token);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn in_doubt_release_is_read_back() {
        let scripted = ScriptedStore::new();
        let r = req("a", 2000);
        let lease = scripted.lease_for(&r);
        // Landed: the record is gone while our lease was still live.
        scripted
            .expect_release(Err(reply_lost()))
            .expect_inspect(Ok(None));
        // Did not land: still ours, sent again after the readback.
        scripted
            .expect_release(Err(reply_lost()))
            .expect_inspect(held_by(&r.token))
            .expect_release(Ok(true));
        // Readback failed.
        scripted
            .expect_release(Err(reply_lost()))
            .expect_inspect(Err(Error::connection("down")));
        let (store, seen) = readback(&scripted, 1);
        assert!(store.release(&lease).await.unwrap());
        assert!(store.release(&lease).await.unwrap());
        assert_eq!(
            store.release(&lease).await.unwrap_err().kind(),
            ErrorKind::InDoubt
        );
        assert_eq!(seen.names().len(), 2);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn in_doubt_release_of_an_expired_lease_is_not_held() {
        let scripted = ScriptedStore::new();
        let lease = scripted.lease_for(&req("a", 100));
        tokio::time::advance(Duration::from_millis(200)).await;
        scripted
            .expect_release(Err(reply_lost()))
            .expect_inspect(held_by(&OwnerToken::generate()));
        let (store, _) = readback(&scripted, 1);
        assert!(!store.release(&lease).await.unwrap());
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn a_retried_release_finding_the_late_first_delete_reports_released() {
        let scripted = ScriptedStore::new();
        let r = req("a", 2000);
        let lease = scripted.lease_for(&r);
        scripted
            .expect_release(Err(reply_lost()))
            .expect_inspect(held_by(&r.token))
            .expect_release(Ok(false));
        let (store, _) = readback(&scripted, 1);
        assert!(
            store.release(&lease).await.unwrap(),
            "our first delete removed it"
        );
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn release_retries_are_bounded() {
        let scripted = ScriptedStore::new();
        let r = req("a", 2000);
        let lease = scripted.lease_for(&r);
        scripted
            .expect_release(Err(reply_lost()))
            .expect_inspect(held_by(&r.token));
        let (store, _) = readback(&scripted, 0);
        let err = store.release(&lease).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RetriesExhausted);
        scripted.verify();
    }
}
