//! Cancel-safe acquisition for network stores.

use std::future::Future;

use tokio::time::Instant;

use crate::acquire::Acquire;
use crate::attempt::Attempt;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::undo::UndoGuard;

/// Runs a network store's acquire request on its own task, so that the store's `acquire` is
/// cancel safe (see [`LockStore`](crate::LockStore)): if the caller stops waiting, the request
/// still completes, and a lock it acquired — or may have acquired, when the reply was lost — is
/// released again with `release` (owner-checked), instead of staying held under a token nobody
/// knows until its TTL.
///
/// `acquire` performs the request; `release` undoes it. Both run on the spawned task. Once the
/// caller stops waiting, the task's work is counted as undo work ([`crate::undo_finished`])
/// until it has undone the acquisition or found nothing to undo.
pub async fn acquire_detached<A, AF, R, RF>(
    req: &Acquire,
    acquire: A,
    release: R,
) -> Result<Attempt>
where
    A: FnOnce(Acquire) -> AF + Send + 'static,
    AF: Future<Output = Result<Attempt>> + Send + 'static,
    R: FnOnce(Lease) -> RF + Send + 'static,
    RF: Future<Output = Result<bool>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    // The caller's end, dropped unread, hands the task what it left (see `Left`).
    let (back_tx, back_rx) = tokio::sync::oneshot::channel::<Left>();
    let task_req = req.clone();
    tokio::spawn(async move {
        let result = acquire(task_req.clone()).await;
        let (maybe_held, _counted) = match tx.send(result) {
            Ok(()) => match back_rx.await {
                Ok(Left {
                    unread: Some(unread),
                    counted,
                }) => (unread, Some(counted)),
                _ => return, // read by the caller
            },
            Err(answer) => {
                // The caller left before the answer: its end has sent the count (or is about
                // to: it closed the channel first).
                let counted = back_rx.await.map(|left| left.counted);
                match answer {
                    Ok(Attempt::Granted(lease)) => (lease, counted.ok()),
                    Err(e) if e.is_in_doubt() => (maybe_held(&task_req), counted.ok()),
                    _ => return,
                }
            }
        };
        let key = maybe_held.key().clone();
        if let Err(error) = release(maybe_held).await {
            tracing::warn!(key = %key, error = %error.chain(),
                "could not undo an acquisition nobody waited for; it expires at its TTL");
        }
    });
    let mut receiving = Receiving {
        rx,
        back: Some(back_tx),
        req,
    };
    let answer = (&mut receiving.rx).await;
    receiving.back = None; // read: the task has nothing to undo
    answer.unwrap_or_else(|_| {
        Err(Error::internal(
            "the acquire task ended without an answer (runtime shutting down?)",
        ))
    })
}

/// Cancel safety on the caller's task, for a store whose connection applies requests in the
/// order they were sent (one multiplexed Redis connection per node): armed before the acquire
/// request is sent, disarmed once its answer is in. Dropped armed — the caller stopped waiting
/// before the answer — it sends `release` (owner-checked) for whatever the request may have
/// acquired, on a task of its own. Sent after the request on the same ordered connection, the
/// release undoes whatever the request did, so nothing is left under a token nobody knows — at no
/// cost unless the caller is cancelled, where [`acquire_detached`] spawns a task for every
/// request.
///
/// Where requests may overtake each other (separate streams, pooled connections, a reconnect in
/// between), an undo sent early could land before the acquisition it undoes: such a store either
/// gives a `release` that looks again for a while and releases what landed late (as Redis and
/// Aerospike do), or uses [`acquire_detached`].
///
/// A guard held across the request's `.await`, rather than a function wrapping the request's
/// future, so a store's acquire reads as the requests it makes, whatever it awaits between
/// them. `release` is called only when the guard is dropped armed, so it may borrow the store
/// and clone it only then: nothing is cloned for an acquire that gets its answer.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{Acquire, Attempt, LockKey, OwnerToken, UndoIfCancelled};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> leasehold_core::Result<()> {
/// let req = Acquire::new(LockKey::xdc("orders", "o-1")?, OwnerToken::generate(), Duration::from_secs(5));
/// let undo = UndoIfCancelled::arm(&req, |lease, counted| async move {
///     // The store's owner-checked release of `lease` goes here; a shutdown waits for it
///     // while `counted` lives.
///     let _ = (lease, counted);
///     Ok(true)
/// });
/// let answer: Attempt = Attempt::refused(); // the store's request, awaited here
/// undo.disarm(); // answered: nothing to undo
/// assert!(!answer.is_granted());
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard at once undoes the acquisition: hold it across the request"]
pub struct UndoIfCancelled<'a, R, RF>
where
    R: FnOnce(Lease, UndoGuard) -> RF,
    RF: Future<Output = Result<bool>> + Send + 'static,
{
    req: &'a Acquire,
    release: Option<R>,
}

impl<'a, R, RF> UndoIfCancelled<'a, R, RF>
where
    R: FnOnce(Lease, UndoGuard) -> RF,
    RF: Future<Output = Result<bool>> + Send + 'static,
{
    /// Arms the guard for `req`: dropped before [`disarm`](Self::disarm), it runs `release` on
    /// what `req` may have acquired (its lock under its token, in its mode), in the background,
    /// with an [`UndoGuard`] counting it from the drop: `release` drops it once its first
    /// attempt is done, so a shutdown waits for that much ([`crate::undo_finished`]).
    pub fn arm(req: &'a Acquire, release: R) -> Self {
        UndoIfCancelled {
            req,
            release: Some(release),
        }
    }

    /// The request was answered: nothing to undo (an in-doubt answer is the caller's to
    /// resolve).
    pub fn disarm(mut self) {
        self.release = None;
    }
}

impl<R, RF> std::fmt::Debug for UndoIfCancelled<'_, R, RF>
where
    R: FnOnce(Lease, UndoGuard) -> RF,
    RF: Future<Output = Result<bool>> + Send + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UndoIfCancelled")
            .field("key", &self.req.key)
            .field("armed", &self.release.is_some())
            .finish()
    }
}

impl<R, RF> Drop for UndoIfCancelled<'_, R, RF>
where
    R: FnOnce(Lease, UndoGuard) -> RF,
    RF: Future<Output = Result<bool>> + Send + 'static,
{
    fn drop(&mut self) {
        let Some(release) = self.release.take() else {
            return;
        };
        let key = self.req.key.clone();
        // Counted from here, the caller's task: a shutdown it goes on to call waits for the
        // part of the undo the store holds the guard for.
        let undo = release(maybe_held(self.req), crate::undo::undo_started());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = undo.await {
                        tracing::warn!(key = %key, error = %error.chain(),
                            "could not undo an acquisition nobody waited for; it expires at its TTL");
                    }
                });
            }
            Err(_) => tracing::warn!(key = %key,
                "an acquisition was abandoned outside a runtime and cannot be undone; \
                 it expires at its TTL"),
        }
    }
}

/// What an in-doubt acquisition may hold: the request's lock under its token, from now.
fn maybe_held(req: &Acquire) -> Lease {
    Lease::granted(req, Instant::now())
}

/// What a caller that stopped waiting leaves its detached acquisition's task: an answer already
/// there that it never read (a grant, or a doubt: to undo), and the count of the task's undo
/// work, started on the caller's task so that a shutdown it goes on to call waits for it.
struct Left {
    unread: Option<Lease>,
    counted: UndoGuard,
}

/// The caller's end of a detached acquisition. Dropped unread, it closes the channel (an answer
/// still to come is then undone by the task) and hands back an answer already there.
struct Receiving<'a> {
    rx: tokio::sync::oneshot::Receiver<Result<Attempt>>,
    back: Option<tokio::sync::oneshot::Sender<Left>>,
    req: &'a Acquire,
}

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        let Some(back) = self.back.take() else {
            return;
        };
        self.rx.close();
        let unread = match self.rx.try_recv() {
            Ok(Ok(Attempt::Granted(lease))) => Some(lease),
            Ok(Err(e)) if e.is_in_doubt() => Some(maybe_held(self.req)),
            Ok(_) => return, // refused, or failed for sure: nothing to undo
            Err(_) => None,  // no answer yet: the task undoes what comes
        };
        let _ = back.send(Left {
            unread,
            counted: crate::undo::undo_started(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LockKey, OwnerToken};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn req() -> Acquire {
        Acquire::new(
            LockKey::xdc("c", "e").unwrap(),
            OwnerToken::generate(),
            Duration::from_secs(5),
        )
    }

    #[tokio::test]
    async fn a_received_lease_is_kept() {
        let released = Arc::new(AtomicBool::new(false));
        let r = released.clone();
        let lease = acquire_detached(
            &req(),
            |req| async move { Ok(Lease::new(req.key, req.token, req.ttl, Instant::now()).into()) },
            move |_| async move {
                r.store(true, Ordering::SeqCst);
                Ok(true)
            },
        )
        .await
        .unwrap()
        .into_lease(&req().key)
        .unwrap();
        assert_eq!(lease.ttl(), Duration::from_secs(5));
        tokio::task::yield_now().await;
        assert!(!released.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn an_abandoned_acquisition_is_released_and_waited_for() {
        let (released_tx, mut released_rx) = tokio::sync::oneshot::channel();
        let req = req();
        let fut = acquire_detached(
            &req,
            |req| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(Error::in_doubt("reply lost").with_key(req.key.as_str()))
            },
            move |lease| async move {
                let _ = released_tx.send(lease.token().clone());
                Ok(true)
            },
        );
        // The caller gives up before the reply: counted from then, a shutdown's wait ends only
        // once the task has undone what the reply left in doubt.
        assert!(tokio::time::timeout(Duration::from_millis(5), fut)
            .await
            .is_err());
        tokio::time::timeout(Duration::from_secs(5), crate::undo::undo_finished())
            .await
            .expect("the undo ends");
        let token = released_rx
            .try_recv()
            .expect("the in-doubt acquisition was undone before the wait ended");
        assert!(token.pid().is_some());
    }

    #[tokio::test]
    async fn an_answer_sent_but_never_read_is_released() {
        let (released_tx, released_rx) = tokio::sync::oneshot::channel();
        let req = req();
        let mut fut = Box::pin(acquire_detached(
            &req,
            |req| async move { Ok(Lease::new(req.key, req.token, req.ttl, Instant::now()).into()) },
            move |lease| async move {
                let _ = released_tx.send(lease.token().clone());
                Ok(true)
            },
        ));
        // Polled once (the task is spawned), then the task runs and sends its answer; the caller
        // drops the future without polling it again.
        assert!(futures::poll!(fut.as_mut()).is_pending());
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        drop(fut);
        let token = tokio::time::timeout(Duration::from_secs(5), released_rx)
            .await
            .expect("the unread lease was released")
            .unwrap();
        assert_eq!(&token, &req.token);
    }

    #[tokio::test]
    async fn an_answered_acquisition_on_the_callers_task_is_never_undone() {
        let released = Arc::new(AtomicBool::new(false));
        let req = req().with_mode(crate::mode::LockMode::Shared);
        // An acquire request answered (granted, then refused): the guard is disarmed after it.
        let request = |answer: Attempt| {
            let r = released.clone();
            async {
                let undo = UndoIfCancelled::arm(&req, move |_, _| async move {
                    r.store(true, Ordering::SeqCst);
                    Ok(true)
                });
                tokio::task::yield_now().await; // the request's round trip
                undo.disarm();
                answer
            }
        };
        let granted = Lease::new(req.key.clone(), req.token.clone(), req.ttl, Instant::now());
        let lease = request(granted.into()).await.into_lease(&req.key).unwrap();
        assert_eq!(lease.token(), &req.token);
        assert!(!request(Attempt::refused()).await.is_granted());
        tokio::task::yield_now().await;
        assert!(!released.load(Ordering::SeqCst), "nothing to undo");
    }

    #[tokio::test]
    async fn an_abandoned_acquisition_is_released_in_its_mode_and_waited_for() {
        let (released_tx, mut released_rx) = tokio::sync::oneshot::channel();
        let req = req().with_mode(crate::mode::LockMode::Shared);
        let fut = async {
            let undo = UndoIfCancelled::arm(&req, move |lease, counted| async move {
                tokio::time::sleep(Duration::from_millis(50)).await; // the release's round trip
                let _ = released_tx.send((lease.token().clone(), lease.mode()));
                drop(counted);
                Ok(true)
            });
            tokio::time::sleep(Duration::from_secs(60)).await;
            undo.disarm();
        };
        assert!(tokio::time::timeout(Duration::from_millis(5), fut)
            .await
            .is_err());
        // Counted from the drop: a shutdown's wait ends only once the release was made.
        tokio::time::timeout(Duration::from_secs(5), crate::undo::undo_finished())
            .await
            .expect("the undo ends");
        let (token, mode) = released_rx
            .try_recv()
            .expect("the abandoned acquisition was undone before the wait ended");
        assert_eq!(token, req.token);
        assert_eq!(mode, crate::mode::LockMode::Shared);
    }
}
