//! A scripted store: a test double of [`LockStore`] that answers each call as the test says and
//! records what it was asked (like `tower-test`'s mock service).
//!
//! A test queues one answer per expected call, per operation, in order; the store hands them out
//! as calls arrive and records every call ([`Call`]) for assertions afterwards. A call with no
//! answer queued is a test failure: it panics with the call, and is recorded so
//! [`ScriptedStore::verify`] fails too even when the panic happened in a spawned task.
//!
//! ```
//! use std::time::Duration;
//! use leasehold_core::{Acquire, ErrorKind, Error, LockKey, LockStore, OwnerToken};
//! use leasehold_testkit::scripted::{Op, ScriptedStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = ScriptedStore::new();
//! store.expect_acquire(Err(Error::in_doubt("reply lost")));
//! store.expect_inspect(Ok(None));
//! store.grant_acquire();
//!
//! let key = LockKey::xdc("c", "e").unwrap();
//! let req = Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(2));
//! assert_eq!(store.try_acquire(&req).await.unwrap_err().kind(), ErrorKind::InDoubt);
//! assert_eq!(store.inspect(&key).await.unwrap(), None);
//! assert_eq!(store.try_acquire(&req).await.unwrap().token(), &req.token);
//!
//! assert_eq!(store.ops(), [Op::Acquire, Op::Inspect, Op::Acquire]);
//! store.verify(); // every answer used, no unexpected call
//! # }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use leasehold_core::{
    Acquire, Attempt, Capabilities, Error, HolderId, Lease, LockInfo, LockKey, LockStore,
    OwnerToken, Result,
};
use tokio::time::Instant;

/// A store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`LockStore::acquire`].
    Acquire,
    /// [`LockStore::release`].
    Release,
    /// [`LockStore::extend`].
    Extend,
    /// [`LockStore::inspect`].
    Inspect,
    /// [`LockStore::list`].
    List,
    /// [`LockStore::shutdown`].
    Shutdown,
}

/// One recorded call: the operation and what it was asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Call {
    /// The operation.
    pub op: Op,
    /// The key (`None` for `list` and `shutdown`).
    pub key: Option<LockKey>,
    /// The owner token of the request or lease (`None` for `inspect`, `list`, `shutdown`).
    pub token: Option<OwnerToken>,
    /// The TTL asked for (`acquire`, `extend`).
    pub ttl: Option<Duration>,
    /// The holder of an acquisition request.
    pub holder: Option<HolderId>,
    /// The wait deadline of an acquisition request.
    pub deadline: Option<Instant>,
    /// The prefix of a `list`.
    pub prefix: Option<String>,
    /// Whether an answer was queued for this call (`false`: the call was unexpected).
    pub expected: bool,
}

impl Call {
    fn new(op: Op) -> Self {
        Call {
            op,
            key: None,
            token: None,
            ttl: None,
            holder: None,
            deadline: None,
            prefix: None,
            expected: true,
        }
    }
}

type Answer<A, T> = Box<dyn FnOnce(&A) -> BoxFuture<'static, Result<T>> + Send>;

#[derive(Default)]
struct Script {
    acquire: VecDeque<Answer<Acquire, Attempt>>,
    release: VecDeque<Answer<Lease, bool>>,
    extend: VecDeque<Answer<(Lease, Duration), Lease>>,
    inspect: VecDeque<Answer<LockKey, Option<LockInfo>>>,
    list: VecDeque<Answer<String, Vec<LockInfo>>>,
    shutdown: VecDeque<Answer<(), usize>>,
    calls: Vec<Call>,
}

/// A scripted [`LockStore`]: see the [module docs](self). Clones share the script and the record.
#[derive(Clone)]
pub struct ScriptedStore {
    script: Arc<Mutex<Script>>,
    capabilities: Capabilities,
    fence: Arc<AtomicU64>,
    /// `shutdown` answers `Ok(0)` without a queued answer.
    lenient_shutdown: bool,
}

impl fmt::Debug for ScriptedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let script = self.lock();
        f.debug_struct("ScriptedStore")
            .field("calls", &script.calls)
            .field("pending", &Self::pending_of(&script))
            .finish()
    }
}

impl Default for ScriptedStore {
    fn default() -> Self {
        ScriptedStore::new()
    }
}

fn ready<T: Send + 'static>(result: Result<T>) -> BoxFuture<'static, Result<T>> {
    futures::future::ready(result).boxed()
}

impl ScriptedStore {
    /// A store with an empty script, declaring fencing and listing, whose `shutdown` answers
    /// `Ok(0)` unless an answer is queued.
    pub fn new() -> Self {
        ScriptedStore {
            script: Arc::default(),
            capabilities: Capabilities::ALL,
            fence: Arc::new(AtomicU64::new(0)),
            lenient_shutdown: true,
        }
    }

    /// Declares other capabilities.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Makes `shutdown` without a queued answer an unexpected call.
    pub fn strict_shutdown(mut self) -> Self {
        self.lenient_shutdown = false;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A lease for `req` as a store would grant it: acquired now, with the next fencing token of
    /// this store.
    pub fn lease_for(&self, req: &Acquire) -> Lease {
        let fence = self.fence.fetch_add(1, Ordering::Relaxed) + 1;
        Lease::new(req.key.clone(), req.token.clone(), req.ttl, Instant::now())
            .with_fencing_token(Some(fence))
    }

    /// Queues the answer to the next `acquire`.
    pub fn expect_acquire(&self, answer: Result<Attempt>) -> &Self {
        self.lock()
            .acquire
            .push_back(Box::new(move |_: &Acquire| ready(answer)));
        self
    }

    /// Queues a closure that answers the next `acquire` from the request.
    pub fn expect_acquire_with(
        &self,
        answer: impl FnOnce(&Acquire) -> Result<Attempt> + Send + 'static,
    ) -> &Self {
        self.lock()
            .acquire
            .push_back(Box::new(move |req: &Acquire| ready(answer(req))));
        self
    }

    /// Queues a grant of the next `acquire`: a lease for the request (see
    /// [`ScriptedStore::lease_for`]).
    pub fn grant_acquire(&self) -> &Self {
        let this = self.clone();
        self.expect_acquire_with(move |req| Ok(this.lease_for(req).into()))
    }

    /// Queues a refusal of the next `acquire` (the lock held by another owner), saying nothing
    /// about when to ask again.
    pub fn refuse_acquire(&self) -> &Self {
        self.expect_acquire(Ok(Attempt::refused()))
    }

    /// Queues an answer to the next `acquire` that is given only once `gate` completes: for
    /// tests of slow replies and cancellation.
    pub fn expect_acquire_after(
        &self,
        gate: impl Future<Output = ()> + Send + 'static,
        answer: impl FnOnce(&Acquire) -> Result<Attempt> + Send + 'static,
    ) -> &Self {
        self.lock()
            .acquire
            .push_back(Box::new(move |req: &Acquire| {
                let result = answer(req);
                async move {
                    gate.await;
                    result
                }
                .boxed()
            }));
        self
    }

    /// Queues the answer to the next `release`.
    pub fn expect_release(&self, answer: Result<bool>) -> &Self {
        self.lock()
            .release
            .push_back(Box::new(move |_: &Lease| ready(answer)));
        self
    }

    /// Queues a closure that answers the next `release` from the lease.
    pub fn expect_release_with(
        &self,
        answer: impl FnOnce(&Lease) -> Result<bool> + Send + 'static,
    ) -> &Self {
        self.lock()
            .release
            .push_back(Box::new(move |lease: &Lease| ready(answer(lease))));
        self
    }

    /// Queues an answer to the next `release` that is given only once `gate` completes: for
    /// tests of slow releases and cancellation.
    pub fn expect_release_after(
        &self,
        gate: impl Future<Output = ()> + Send + 'static,
        answer: Result<bool>,
    ) -> &Self {
        self.lock().release.push_back(Box::new(move |_: &Lease| {
            async move {
                gate.await;
                answer
            }
            .boxed()
        }));
        self
    }

    /// Queues an answer to the next `extend` that is given only once `gate` completes: for
    /// tests of slow extends and cancellation.
    pub fn expect_extend_after(
        &self,
        gate: impl Future<Output = ()> + Send + 'static,
        answer: impl FnOnce(&Lease, Duration) -> Result<Lease> + Send + 'static,
    ) -> &Self {
        self.lock()
            .extend
            .push_back(Box::new(move |(lease, ttl): &(Lease, Duration)| {
                let result = answer(lease, *ttl);
                async move {
                    gate.await;
                    result
                }
                .boxed()
            }));
        self
    }

    /// Queues the answer to the next `extend`.
    pub fn expect_extend(&self, answer: Result<Lease>) -> &Self {
        self.lock()
            .extend
            .push_back(Box::new(move |_: &(Lease, Duration)| ready(answer)));
        self
    }

    /// Queues a grant of the next `extend`: the lease renewed for the asked TTL from now.
    pub fn grant_extend(&self) -> &Self {
        self.lock()
            .extend
            .push_back(Box::new(move |(lease, ttl): &(Lease, Duration)| {
                ready(Ok(lease.renewed(*ttl, Instant::now())))
            }));
        self
    }

    /// Queues an answer to the next `inspect` that is given only once `gate` completes: for
    /// tests of slow readbacks and cancellation.
    pub fn expect_inspect_after(
        &self,
        gate: impl Future<Output = ()> + Send + 'static,
        answer: Result<Option<LockInfo>>,
    ) -> &Self {
        self.lock().inspect.push_back(Box::new(move |_: &LockKey| {
            async move {
                gate.await;
                answer
            }
            .boxed()
        }));
        self
    }

    /// Queues the answer to the next `inspect`.
    pub fn expect_inspect(&self, answer: Result<Option<LockInfo>>) -> &Self {
        self.lock()
            .inspect
            .push_back(Box::new(move |_: &LockKey| ready(answer)));
        self
    }

    /// Queues a closure that answers the next `inspect` from the key: for answers that depend
    /// on what earlier calls were asked (the token of an earlier request, say).
    pub fn expect_inspect_with(
        &self,
        answer: impl FnOnce(&LockKey) -> Result<Option<LockInfo>> + Send + 'static,
    ) -> &Self {
        self.lock()
            .inspect
            .push_back(Box::new(move |key: &LockKey| ready(answer(key))));
        self
    }

    /// Queues the answer to the next `list`.
    pub fn expect_list(&self, answer: Result<Vec<LockInfo>>) -> &Self {
        self.lock()
            .list
            .push_back(Box::new(move |_: &String| ready(answer)));
        self
    }

    /// Queues the answer to the next `shutdown`.
    pub fn expect_shutdown(&self, answer: Result<usize>) -> &Self {
        self.lock()
            .shutdown
            .push_back(Box::new(move |_: &()| ready(answer)));
        self
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The operations called so far, in order.
    pub fn ops(&self) -> Vec<Op> {
        self.lock().calls.iter().map(|c| c.op).collect()
    }

    /// How many calls of `op` were made.
    pub fn count(&self, op: Op) -> usize {
        self.lock().calls.iter().filter(|c| c.op == op).count()
    }

    fn pending_of(script: &Script) -> usize {
        script.acquire.len()
            + script.release.len()
            + script.extend.len()
            + script.inspect.len()
            + script.list.len()
            + script.shutdown.len()
    }

    /// How many queued answers were not used yet.
    pub fn pending(&self) -> usize {
        Self::pending_of(&self.lock())
    }

    /// Panics if a queued answer was not used or a call was unexpected.
    #[track_caller]
    pub fn verify(&self) {
        let script = self.lock();
        let unexpected: Vec<&Call> = script.calls.iter().filter(|c| !c.expected).collect();
        assert!(
            unexpected.is_empty(),
            "scripted store: unexpected calls {unexpected:#?}\nall calls: {:#?}",
            script.calls
        );
        let pending = Self::pending_of(&script);
        assert!(
            pending == 0,
            "scripted store: {pending} queued answer(s) never used; calls were {:#?}",
            script.calls
        );
    }

    /// Takes the next answer for `call`, recording it; panics (after recording) if none.
    fn answer<A, T>(
        &self,
        mut call: Call,
        args: &A,
        queue: impl FnOnce(&mut Script) -> Option<Answer<A, T>>,
    ) -> BoxFuture<'static, Result<T>> {
        let mut script = self.lock();
        let answer = queue(&mut script);
        call.expected = answer.is_some();
        script.calls.push(call.clone());
        drop(script);
        match answer {
            Some(answer) => answer(args),
            None => panic!("scripted store: unexpected call {call:#?}"),
        }
    }
}

impl LockStore for ScriptedStore {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn acquire(&self, req: &Acquire) -> impl Future<Output = Result<Attempt>> + Send {
        let mut call = Call::new(Op::Acquire);
        call.key = Some(req.key.clone());
        call.token = Some(req.token.clone());
        call.ttl = Some(req.ttl);
        call.holder = req.holder;
        call.deadline = req.deadline();
        self.answer(call, req, |s| s.acquire.pop_front())
    }

    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool>> + Send {
        let mut call = Call::new(Op::Release);
        call.key = Some(lease.key().clone());
        call.token = Some(lease.token().clone());
        self.answer(call, lease, |s| s.release.pop_front())
    }

    fn extend(&self, lease: &Lease, ttl: Duration) -> impl Future<Output = Result<Lease>> + Send {
        let mut call = Call::new(Op::Extend);
        call.key = Some(lease.key().clone());
        call.token = Some(lease.token().clone());
        call.ttl = Some(ttl);
        self.answer(call, &(lease.clone(), ttl), |s| s.extend.pop_front())
    }

    fn inspect(&self, key: &LockKey) -> impl Future<Output = Result<Option<LockInfo>>> + Send {
        let mut call = Call::new(Op::Inspect);
        call.key = Some(key.clone());
        self.answer(call, key, |s| s.inspect.pop_front())
    }

    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<LockInfo>>> + Send {
        let mut call = Call::new(Op::List);
        call.prefix = Some(prefix.to_owned());
        self.answer(call, &prefix.to_owned(), |s| s.list.pop_front())
    }

    fn shutdown(&self) -> impl Future<Output = Result<usize>> + Send {
        let lenient = self.lenient_shutdown;
        self.answer(Call::new(Op::Shutdown), &(), move |s| {
            s.shutdown.pop_front().or_else(|| {
                lenient.then(|| Box::new(|_: &()| ready(Ok(0usize))) as Answer<(), usize>)
            })
        })
    }
}

/// An error for scripts: [`Error::in_doubt`] with a fixed message, the usual "reply lost".
pub fn reply_lost() -> Error {
    Error::in_doubt("scripted: the reply was lost after the request was sent")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Acquire {
        Acquire::new(
            LockKey::xdc("c", "e").unwrap(),
            OwnerToken::generate(),
            Duration::from_secs(1),
        )
    }

    #[tokio::test]
    async fn answers_in_order_and_records() {
        let store = ScriptedStore::new();
        store.expect_acquire(Err(reply_lost())).grant_acquire();
        store.expect_release(Ok(true));
        let r = req();
        assert!(store.try_acquire(&r).await.unwrap_err().is_in_doubt());
        let lease = store.try_acquire(&r).await.unwrap();
        assert_eq!(lease.fencing_token(), Some(1));
        assert!(store.release(&lease).await.unwrap());
        assert_eq!(store.ops(), [Op::Acquire, Op::Acquire, Op::Release]);
        assert_eq!(store.calls()[0].ttl, Some(Duration::from_secs(1)));
        assert_eq!(store.calls()[2].token.as_ref(), Some(&r.token));
        store.verify();
    }

    #[tokio::test]
    async fn unexpected_call_fails_loudly_and_is_recorded() {
        let store = ScriptedStore::new();
        let s2 = store.clone();
        let joined = tokio::spawn(async move { s2.inspect(&req().key).await }).await;
        assert!(joined.is_err(), "the unexpected call panicked");
        assert_eq!(store.calls().len(), 1);
        assert!(!store.calls()[0].expected);
        let verified = std::panic::catch_unwind(|| store.verify());
        assert!(verified.is_err(), "verify reports the unexpected call");
    }

    #[tokio::test]
    async fn unused_answers_fail_verify() {
        let store = ScriptedStore::new();
        store.expect_inspect(Ok(None));
        assert_eq!(store.pending(), 1);
        assert!(std::panic::catch_unwind(|| store.verify()).is_err());
    }
}
