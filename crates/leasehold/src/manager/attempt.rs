//! One attempt of an acquisition: the store's answer, reported to observers, and the undo of an
//! attempt that may have taken the lock for nobody (cancelled midway, or ended in doubt).

use tokio::time::Instant;

use crate::core::{Acquire, Attempt, Lease, LockEvent, LockMode, LockStore, OwnerToken, Result};
use crate::failover::may_have_applied;
use crate::handle::Handle;

use super::options::Plan;
use super::state::LockManager;

impl LockManager {
    /// After a refusal, when attempts of this wait ended in doubt: if the holder is one of them
    /// (its write landed after its undo was sent), releases it (owner-checked, that attempt's
    /// token) and says whether the caller should ask again at once. Exclusive holds only: a shared
    /// or permit record has many holders, and its in-doubt attempts are left to their undo.
    pub(super) async fn undo_late(&self, plan: &Plan, in_doubt: &mut Vec<OwnerToken>) -> bool {
        if plan.mode != LockMode::Exclusive {
            return false;
        }
        let handle = &plan.handle;
        let holder = match handle.store.inspect(&plan.key).await {
            Ok(Some(info)) => info.token,
            _ => return false,
        };
        let Some(at) = holder.and_then(|holder| in_doubt.iter().position(|t| *t == holder)) else {
            return false;
        };
        let token = in_doubt.swap_remove(at);
        let late =
            Lease::new(plan.key.clone(), token, plan.ttl, Instant::now()).with_mode(plan.mode);
        match handle.store.release(&late).await {
            Ok(released) => {
                tracing::info!(key = %plan.key, released,
                    "an attempt that ended in doubt had taken the lock after all; released it");
                true
            }
            Err(error) => {
                tracing::debug!(key = %plan.key, error = %error.chain(),
                    "could not release an attempt that landed late; its undo is still retrying");
                false
            }
        }
    }

    /// An attempt by a call that is not the head of the line (a try, or a first try). While it
    /// asked, local competition refused this process's waiters in memory; if it got nothing, or
    /// its caller stopped waiting midway, the line's head is woken to ask for itself (it would
    /// otherwise wait for a release or a word from the store that may never come).
    pub(super) async fn attempt_outside_line(
        &self,
        handle: &Handle,
        req: &Acquire,
    ) -> Result<Attempt> {
        let mut wake = WakeHead {
            handle,
            req,
            armed: true,
        };
        let result = self.attempt(handle, req).await;
        wake.armed = !matches!(result, Ok(Attempt::Granted(_)));
        result
    }

    pub(super) async fn attempt(&self, handle: &Handle, req: &Acquire) -> Result<Attempt> {
        let mut undo = Undo {
            handle,
            req,
            armed: true,
        };
        let result = handle.store.acquire(req).await;
        undo.armed = result.as_ref().is_err_and(may_have_applied);
        drop(undo);
        if let Ok(Attempt::Refused { .. }) = &result {
            handle.observers.emit(|| LockEvent::Contended {
                key: req.key.clone(),
            });
        }
        result
    }
}

/// Wakes the head of this process's line for the key when dropped armed: an attempt outside the
/// line that got nothing, or was cancelled midway (its future dropped during the request).
struct WakeHead<'a> {
    handle: &'a Handle,
    req: &'a Acquire,
    armed: bool,
}

impl Drop for WakeHead<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.handle.waiters.wake(&self.req.key);
        }
    }
}

/// Undoes an acquisition attempt that may have taken the lock for nobody: the caller stopped
/// waiting midway (its future was dropped, perhaps after the store applied the write), or the
/// attempt ended in doubt (reply lost, and the readback too, or the readback's retries ran out:
/// see `may_have_applied`). An owner-checked release of the attempt's own token is sent in the
/// background through the whole stack (retried while the store is down, see `crate::failover`),
/// as a task the lifecycle tracks: a no-op if the lock was not taken, and no other holder's lock
/// can be touched (every token is fresh per attempt). Network stores also undo their own cancelled requests; the
/// second release then finds nothing.
struct Undo<'a> {
    handle: &'a Handle,
    req: &'a Acquire,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let maybe_held = Lease::new(
            self.req.key.clone(),
            self.req.token.clone(),
            self.req.ttl,
            Instant::now(),
        )
        .with_mode(self.req.mode);
        self.handle
            .release_in_background(maybe_held, "an abandoned or in-doubt acquisition");
    }
}
