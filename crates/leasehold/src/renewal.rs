//! Lease renewal: a background task that keeps a guard's lease alive and notices when it is lost.
//!
//! Short TTLs keep a crashed holder from blocking others for long (Bond recommends 2 s on fast
//! paths), but then a long job outlives its lease. Renewal is the answer Redisson (watchdog) and etcd
//! (session keep-alive) give: while the guard lives, extend the lease every `ttl / 3` (configurable),
//! owner-checked. If an extend says the lock is no longer ours, or the store cannot be reached
//! before the lease would expire, the guard is marked lost: `is_held()` turns false, `lost()`
//! resolves, and a [`LockEvent::Lost`] is emitted. The task ends when the guard is released or
//! dropped, or when the manager shuts down (the guard is then marked lost: nothing renews it any
//! more); it never outlives its guard.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::core::{Error, ErrorKind, Lease, LockEvent, LockStore};
use crate::handle::Handle;

/// Shortest pause between two renewal attempts after a failure.
const MIN_RETRY: Duration = Duration::from_millis(10);

/// The current lease of a guard and whether it is still held; shared by the guard and its renewal
/// task. One allocation per guard: the lease and the lost reason behind one mutex, and a `Notify`
/// for `lost()` waiters.
#[derive(Debug)]
pub(crate) struct LeaseState {
    current: Mutex<Current>,
    lost_signal: Notify,
}

#[derive(Debug)]
struct Current {
    lease: Lease,
    /// `None` while held; the reason once lost.
    lost: Option<String>,
}

impl LeaseState {
    pub(crate) fn new(lease: Lease) -> Arc<Self> {
        Arc::new(LeaseState {
            current: Mutex::new(Current { lease, lost: None }),
            lost_signal: Notify::new(),
        })
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn lease(&self) -> Lease {
        self.current().lease.clone()
    }

    pub(crate) fn set_lease(&self, lease: Lease) {
        self.current().lease = lease;
    }

    pub(crate) fn is_held(&self) -> bool {
        self.current().lost.is_none()
    }

    /// Marks the lease lost (first reason wins).
    pub(crate) fn mark_lost(&self, reason: String) {
        let first = {
            let mut current = self.current();
            let first = current.lost.is_none();
            if first {
                current.lost = Some(reason);
            }
            first
        };
        if first {
            self.lost_signal.notify_waiters();
        }
    }

    /// Resolves when the lease is marked lost, with an `ErrorKind::NotHeld` error saying why.
    pub(crate) async fn lost(&self) -> Error {
        loop {
            // Registered before the check, so a `mark_lost` in between is not missed.
            let signal = self.lost_signal.notified();
            tokio::pin!(signal);
            signal.as_mut().enable();
            {
                let current = self.current();
                if let Some(reason) = &current.lost {
                    return Error::not_held(format!("the lock was lost: {reason}"))
                        .with_key(current.lease.key().as_str());
                }
            }
            signal.await;
        }
    }
}

/// A running renewal task and the means to stop it.
#[derive(Debug)]
pub(crate) struct Renewer {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Renewer {
    /// Starts renewing `state`'s lease every `every` (default: a third of its TTL).
    pub(crate) fn start(
        handle: Arc<Handle>,
        state: Arc<LeaseState>,
        every: Option<Duration>,
        scenario: Arc<str>,
    ) -> Option<Self> {
        let (stop, stopped) = oneshot::channel();
        let key = state.lease().key().clone();
        // Tracked by the lifecycle, and ended by it: a shutdown waits for the task to finish.
        let Some(task) = handle.lifecycle.clone().spawn(crate::observe::in_scenario(
            scenario,
            renew(handle, state, every, stopped),
        )) else {
            tracing::warn!(%key, "no tokio runtime to renew on; the lease expires at its TTL");
            return None;
        };
        Some(Renewer {
            stop: Some(stop),
            task,
        })
    }

    /// Stops the task and waits for it, so the lease state is final (an extend in flight
    /// completes and is recorded).
    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        // `stop()` not called (guard dropped without a runtime): make sure the task ends.
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

async fn renew(
    handle: Arc<Handle>,
    state: Arc<LeaseState>,
    every: Option<Duration>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        let lease = state.lease();
        let interval = every.unwrap_or(lease.ttl() / 3);
        tokio::select! {
            _ = &mut stopped => return,
            _ = handle.lifecycle.closing() => {
                // The manager shut down (and, with graceful shutdown, released the lock): the
                // lease is no longer kept alive, so the holder must stop relying on it. Expected,
                // so no `Lost` event and no warning: a deploy is not an incident.
                tracing::debug!(key = %lease.key(), "renewal stopped: the lock manager shut down");
                state.mark_lost("the lock manager shut down; the lease is no longer renewed".to_string());
                return;
            }
            _ = tokio::time::sleep(interval) => {}
        }
        // Extend, retrying transient failures until the lease would have expired.
        loop {
            // The extend must answer before the lease runs out; after that the lock may already
            // be someone else's, so waiting longer would keep `is_held()` true on a lost lock.
            let mut extend = Box::pin({
                let (store, lease) = (handle.store.clone(), lease.clone());
                async move { store.extend(&lease, lease.ttl()).await }
            });
            let attempt = match tokio::time::timeout_at(lease.expires_at(), extend.as_mut()).await {
                Ok(answer) => answer,
                Err(_) => {
                    // Still in flight. If it lands, the lock would live on for a whole TTL under
                    // a guard already reported lost: it is released as soon as it answers.
                    let store = handle.store.clone();
                    // Tracked: a shutdown waits for this cleanup.
                    handle.lifecycle.spawn(async move {
                        if let Ok(renewed) = extend.await {
                            if let Err(error) = store.release(&renewed).await {
                                tracing::warn!(key = %renewed.key(), %error,
                                    "a renewal answered after its lease was given up and could \
                                     not be released; the lock expires at its TTL");
                            }
                        }
                    });
                    Err(
                        Error::in_doubt("no answer to the renewal before the lease expired")
                            .with_key(lease.key().as_str()),
                    )
                }
            };
            match attempt {
                Ok(renewed) => {
                    state.set_lease(renewed);
                    handle.observers.emit(|| LockEvent::Renewed {
                        key: lease.key().clone(),
                    });
                    break;
                }
                Err(error) if error.kind() == ErrorKind::NotHeld => {
                    lose(
                        &handle,
                        &state,
                        &lease,
                        format!("renewal found it no longer ours ({error})"),
                    );
                    return;
                }
                Err(error) => {
                    if Instant::now() >= lease.expires_at() {
                        lose(
                            &handle,
                            &state,
                            &lease,
                            format!("could not renew before the lease expired ({error})"),
                        );
                        return;
                    }
                    tracing::debug!(key = %lease.key(), %error, "renewal failed; retrying");
                    let pause = (interval / 4)
                        .max(MIN_RETRY)
                        .min(lease.remaining().max(MIN_RETRY));
                    tokio::select! {
                        _ = &mut stopped => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }
}

fn lose(handle: &Handle, state: &LeaseState, lease: &Lease, reason: String) {
    tracing::warn!(key = %lease.key(), %reason, "lock lost");
    handle.observers.emit(|| LockEvent::Lost {
        key: lease.key().clone(),
        reason: reason.clone(),
    });
    state.mark_lost(reason);
}
