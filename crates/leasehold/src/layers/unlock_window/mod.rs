//! Unlock window (Bond 3.2, unlock thread isolation): send a release only while the lease can
//! still be ours.
//!
//! # What it guarantees
//! A release is sent to the store only while `now <= acquired_at + ttl - margin`, where
//! `acquired_at` is the instant just before the acquire (or the last successful extend) was sent.
//! Past that point the record may already have expired in the store and been taken by another
//! holder; the release is then *skipped*: it returns `Ok(false)` (not held), a
//! [`LockEvent::ReleaseSkipped`] with [`SkipReason::WindowClosed`] (saying how late it was) is
//! emitted, and a `debug` log line says why.
//!
//! Owner-checked release already keeps a stale token from deleting another holder's record on the
//! stores leasehold ships; the window adds protection for stores (or other clients sharing the
//! store) whose delete is not owner-checked, and for a clock-rate difference between this process
//! and the store smaller than the margin. It also turns a late release into a visible event.
//!
//! # Where it belongs
//! Below shutdown tracking and above readback: every real release — a guard's, and the one sent at
//! shutdown — passes through it, and a skipped release never reaches the readback layer.
//!
//! # Cost
//! One clock read per release; no I/O.
//!
//! # Configuration
//! [`UnlockWindowLayer::margin`], default 150 ms (Bond's value). Choose more than the worst
//! clock-rate drift over a TTL plus the store's expiry granularity.

use std::time::Duration;

use tokio::time::Instant;

use crate::core::{
    instant_after, HistoryEntry, HistoryEvent, Layer, Lease, LockEvent, LockStore, Observers,
    Result, SkipReason,
};

use super::wiring::{WiredLayer, Wiring};

/// Default safety margin before a lease's expiry after which a release is skipped (Bond: 150 ms).
pub const DEFAULT_UNLOCK_MARGIN: Duration = Duration::from_millis(150);

/// The unlock-window layer: its configuration, and the [`Layer`] that wraps a store in
/// [`UnlockWindow`].
///
/// ```
/// use std::time::Duration;
/// use leasehold::layers::UnlockWindowLayer;
/// let layer = UnlockWindowLayer::new().margin(Duration::from_millis(300));
/// assert_eq!(layer.margin, Duration::from_millis(300));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnlockWindowLayer {
    /// How long before the lease's expiry the window closes. Default [`DEFAULT_UNLOCK_MARGIN`].
    pub margin: Duration,
}

impl Default for UnlockWindowLayer {
    fn default() -> Self {
        UnlockWindowLayer {
            margin: DEFAULT_UNLOCK_MARGIN,
        }
    }
}

impl UnlockWindowLayer {
    /// The default: a 150 ms margin.
    pub fn new() -> Self {
        UnlockWindowLayer::default()
    }

    /// Sets the margin.
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }
}

impl<S: LockStore> Layer<S> for UnlockWindowLayer {
    type Store = UnlockWindow<S>;

    fn layer(&self, inner: S) -> UnlockWindow<S> {
        self.layer_wired(inner, &Wiring::default())
    }
}

impl<S: LockStore> WiredLayer<S> for UnlockWindowLayer {
    fn layer_wired(&self, inner: S, wiring: &Wiring) -> UnlockWindow<S> {
        UnlockWindow {
            inner,
            margin: self.margin,
            observers: wiring.observers().clone(),
        }
    }
}

/// A store that skips releases outside the unlock window (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct UnlockWindow<S> {
    inner: S,
    margin: Duration,
    observers: Observers,
}

impl<S> UnlockWindow<S> {
    /// The last instant at which a release of `lease` is still sent.
    pub fn window_closes_at(&self, lease: &Lease) -> Instant {
        // Saturating: a lease is a public type, and any TTL can be put in one.
        instant_after(lease.acquired_at(), lease.ttl().saturating_sub(self.margin))
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: LockStore> crate::core::LayeredStore for UnlockWindow<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let closes_at = self.window_closes_at(lease);
        let now = Instant::now();
        if now > closes_at {
            let reason = SkipReason::WindowClosed {
                late_by: now - closes_at,
            };
            tracing::debug!(key = %lease.key(), %reason,
                "release skipped: the lease may have expired and been taken by another holder");
            self.observers.emit(|| LockEvent::ReleaseSkipped {
                key: lease.key().clone(),
                reason,
            });
            if let Some(trace) = lease.trace() {
                // No store operation to join: the history gets its own write, best effort.
                let entry =
                    HistoryEntry::new(HistoryEvent::Skipped, lease.token(), reason.to_string());
                if let Err(error) = self.inner.append_history(lease.key(), trace, &entry).await {
                    tracing::debug!(key = %lease.key(), error = %error.chain(), "could not record the skipped release in the lock history");
                }
            }
            return Ok(false);
        }
        self.inner.release(lease).await
    }
}

#[cfg(test)]
mod tests;
