//! Readback (Bond 3.1, timeout-retry re-entry): resolve an in-doubt reply by reading the record
//! back, instead of failing the caller or retrying a write blindly.
//!
//! # What it guarantees
//! When the store says [`ErrorKind::InDoubt`] (the request was sent, the reply was lost), the layer
//! reads the record back with [`LockStore::inspect`]:
//!
//! | acquire in doubt, record… | outcome |
//! |---|---|
//! | ours (our token) | granted: the write landed; the caller holds the lock instead of leaking it until its TTL |
//! | absent | the write did not land: the acquire is sent again, at most [`ReadbackLayer::retries`] times (default 1, Bond's recommendation) |
//! | another token | refused ([`Attempt::Refused`]) |
//! | readback fails | the original [`ErrorKind::InDoubt`], with the readback failure in the message |
//!
//! Retries keep the same owner token, so a first write that lands late is recognised: if a retry
//! is refused, the record is read back once more and, if it is ours, the lease is
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

use tokio::time::Instant;

use crate::core::{
    Acquire, Attempt, Error, ErrorKind, Layer, Lease, LockEvent, LockInfo, LockKey, LockStore,
    Observers, Result,
};

use super::wiring::{WiredLayer, Wiring};

/// Default number of retries after a readback found the record absent (Bond: one retry).
pub const DEFAULT_READBACK_RETRIES: u32 = 1;

/// The most retries a manager accepts ([`ReadbackLayer::retries`]); more is refused with
/// `InvalidArgument` when the manager is built, or the scenario file loaded.
pub const MAX_READBACK_RETRIES: u32 = 10;

/// The readback layer: its configuration, and the [`Layer`] that wraps a store in [`Readback`].
///
/// ```
/// use leasehold::layers::ReadbackLayer;
/// let layer = ReadbackLayer::new().retries(2);
/// assert_eq!(layer.retries, 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadbackLayer {
    /// How many times an in-doubt acquire (or release) is sent again after the readback showed it
    /// did not land. `0`: read back, never resend. Default [`DEFAULT_READBACK_RETRIES`], at most
    /// [`MAX_READBACK_RETRIES`].
    pub retries: u32,
}

impl Default for ReadbackLayer {
    fn default() -> Self {
        ReadbackLayer {
            retries: DEFAULT_READBACK_RETRIES,
        }
    }
}

impl ReadbackLayer {
    /// The default: one retry.
    pub fn new() -> Self {
        ReadbackLayer::default()
    }

    /// Sets the retry count (at most [`MAX_READBACK_RETRIES`]: the manager's builder refuses
    /// more).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }
}

impl<S: LockStore> Layer<S> for ReadbackLayer {
    type Store = Readback<S>;

    fn layer(&self, inner: S) -> Readback<S> {
        self.layer_wired(inner, &Wiring::default())
    }
}

impl<S: LockStore> WiredLayer<S> for ReadbackLayer {
    fn layer_wired(&self, inner: S, wiring: &Wiring) -> Readback<S> {
        Readback {
            inner,
            retries: self.retries,
            observers: wiring.observers().clone(),
        }
    }
}

/// A store whose in-doubt replies are resolved by reading the record back (see the
/// [module docs](self)).
#[derive(Debug, Clone)]
pub struct Readback<S> {
    inner: S,
    retries: u32,
    observers: Observers,
}

/// What a readback found.
enum Found {
    Ours(LockInfo),
    Absent,
    Other,
}

impl<S: LockStore> Readback<S> {
    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Reads the record back after `operation`'s reply was lost: whose it is now. A failed read
    /// is the readback's own error; [`unresolved`](Self::unresolved) makes the caller's.
    async fn read_back(
        &self,
        key: &LockKey,
        token: &crate::core::OwnerToken,
        operation: &'static str,
    ) -> Result<Found> {
        let found = match self.inner.inspect(key).await? {
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

    /// In doubt still: `operation`'s reply was lost (`in_doubt`, kept whole as the cause) and
    /// reading the record back failed too (`readback`, said in the message).
    fn unresolved(key: &LockKey, operation: &str, readback: Error, in_doubt: Error) -> Error {
        Error::in_doubt(format!(
            "the {operation} reply was lost and reading the record back failed too \
             ({readback}); the outcome is unknown"
        ))
        .with_key(key.as_str())
        .with_source(in_doubt)
    }

    fn exhausted(&self, key: &LockKey, operation: &str, last: Error) -> Error {
        Error::new(
            ErrorKind::RetriesExhausted,
            format!(
                "the {operation} reply was lost {} time(s); each readback showed it had not \
                 applied",
                self.retries.saturating_add(1)
            ),
        )
        .with_key(key.as_str())
        .with_source(last)
    }

    fn recovered(req: &Acquire, info: &LockInfo, first_sent: Instant) -> Lease {
        Lease::granted(req, first_sent).with_fencing_token(if req.mode.is_shared_record() {
            None
        } else {
            info.fencing_token
        })
    }
}

impl<S: LockStore> crate::core::LayeredStore for Readback<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        let first_sent = Instant::now();
        let mut retries_left = self.retries;
        let mut was_in_doubt = false;
        loop {
            match self.inner.acquire(req).await {
                Ok(refused @ Attempt::Refused { .. }) if was_in_doubt => {
                    // An earlier attempt's write may have landed late, under our token.
                    return match self.inner.inspect(&req.key).await {
                        Ok(Some(info)) if info.is_owned_by(&req.token) => {
                            self.observers.emit(|| LockEvent::RecoveredByReadback {
                                key: req.key.clone(),
                                operation: "acquire",
                                held: true,
                            });
                            Ok(Attempt::Granted(Self::recovered(req, &info, first_sent)))
                        }
                        _ => Ok(refused),
                    };
                }
                Ok(attempt) => return Ok(attempt),
                Err(error) if error.is_in_doubt() => {
                    let found = match self.read_back(&req.key, &req.token, "acquire").await {
                        Ok(found) => found,
                        Err(readback) => {
                            return Err(Self::unresolved(&req.key, "acquire", readback, error))
                        }
                    };
                    match found {
                        Found::Ours(info) => {
                            return Ok(Attempt::Granted(Self::recovered(req, &info, first_sent)))
                        }
                        // Held by others: for an exclusive hold that is a refusal; readers
                        // and permit holders are many at once, so for them it only says the
                        // write did not apply, as if absent.
                        Found::Other if !req.mode.is_shared_record() => {
                            return Ok(Attempt::refused())
                        }
                        Found::Absent | Found::Other if retries_left == 0 => {
                            return Err(self.exhausted(&req.key, "acquire", error))
                        }
                        Found::Absent | Found::Other => {
                            retries_left -= 1;
                            was_in_doubt = true;
                        }
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let mut retries_left = self.retries;
        let mut was_in_doubt = false;
        // Gone or someone else's after one of our deletes was in doubt: if our lease cannot have
        // expired yet, that delete is what removed it.
        let removed_by_us = || Ok(Instant::now() < lease.expires_at());
        loop {
            match self.inner.release(lease).await {
                Err(error) if error.is_in_doubt() => {
                    let found = match self.read_back(lease.key(), lease.token(), "release").await {
                        Ok(found) => found,
                        Err(readback) => {
                            return Err(Self::unresolved(lease.key(), "release", readback, error))
                        }
                    };
                    match found {
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
}

#[cfg(test)]
mod tests;
