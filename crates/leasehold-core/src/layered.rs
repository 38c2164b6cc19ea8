//! Forwarding by default: a layer's store names its inner store and writes only the operations
//! its scenario changes (opendal's `LayeredAccess`, for lock stores).

use std::future::Future;
use std::time::Duration;

use crate::acquire::{Acquire, HolderId};
use crate::attempt::Attempt;
use crate::change_watch::ChangeWatch;
use crate::error::Result;
use crate::history::{HistoryEntry, TraceConfig};
use crate::key::LockKey;
use crate::lease::{Lease, LockInfo};
use crate::store::{Capabilities, LockStore};
use crate::watch::ReleaseWatch;

/// A store that wraps another and forwards every operation to it unless it overrides that
/// operation.
///
/// Every type that implements `LayeredStore` is a [`LockStore`] (a blanket impl forwards to the
/// methods below), so a layer that changes only releases writes [`inner`](Self::inner) and
/// [`release`](Self::release), and a new store operation added to the trait reaches every layer
/// without a line written in any of them.
///
/// The contract of each operation is [`LockStore`]'s: an override must keep it (a layer may make
/// an operation stricter, never report a lock as held that is not).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use leasehold_core::{Lease, LayeredStore, LockStore, Result};
///
/// /// Counts releases; everything else passes through untouched.
/// #[derive(Debug)]
/// struct CountReleases<S> { inner: S, releases: AtomicU64 }
///
/// impl<S: LockStore> LayeredStore for CountReleases<S> {
///     type Inner = S;
///     fn inner(&self) -> &S { &self.inner }
///     async fn release(&self, lease: &Lease) -> Result<bool> {
///         self.releases.fetch_add(1, Ordering::Relaxed);
///         self.inner.release(lease).await
///     }
/// }
/// # fn is_store<T: LockStore>() {}
/// # is_store::<CountReleases<leasehold_core::BoxStore>>();
/// ```
pub trait LayeredStore: Send + Sync + 'static {
    /// The wrapped store.
    type Inner: LockStore;

    /// The wrapped store, where every operation not overridden goes.
    fn inner(&self) -> &Self::Inner;

    /// See [`LockStore::name`]. Forwards: a layer is named after the store it wraps.
    fn name(&self) -> &'static str {
        self.inner().name()
    }

    /// See [`LockStore::capabilities`]. Forwards.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// See [`LockStore::acquire`]. Forwards.
    fn acquire(&self, req: &Acquire) -> impl Future<Output = Result<Attempt>> + Send {
        self.inner().acquire(req)
    }

    /// See [`LockStore::release`]. Forwards.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool>> + Send {
        self.inner().release(lease)
    }

    /// See [`LockStore::extend`]. Forwards.
    fn extend(&self, lease: &Lease, ttl: Duration) -> impl Future<Output = Result<Lease>> + Send {
        self.inner().extend(lease, ttl)
    }

    /// See [`LockStore::inspect`]. Forwards.
    fn inspect(&self, key: &LockKey) -> impl Future<Output = Result<Option<LockInfo>>> + Send {
        self.inner().inspect(key)
    }

    /// See [`LockStore::list`]. Forwards.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<LockInfo>>> + Send {
        self.inner().list(prefix)
    }

    /// See [`LockStore::watch`]. Forwards.
    fn watch(&self, key: &LockKey) -> impl Future<Output = ReleaseWatch> + Send {
        self.inner().watch(key)
    }

    /// See [`LockStore::is_held_by`]. Forwards.
    fn is_held_by(&self, key: &LockKey, holder: HolderId) -> bool {
        self.inner().is_held_by(key, holder)
    }

    /// See [`LockStore::is_held_here`]. Forwards.
    fn is_held_here(&self, key: &LockKey) -> bool {
        self.inner().is_held_here(key)
    }

    /// See [`LockStore::is_in_line_here`]. Forwards.
    fn is_in_line_here(&self, key: &LockKey) -> bool {
        self.inner().is_in_line_here(key)
    }

    /// See [`LockStore::watch_changes`]. Forwards.
    fn watch_changes(&self, key: &LockKey) -> impl Future<Output = ChangeWatch> + Send {
        self.inner().watch_changes(key)
    }

    /// See [`LockStore::shutdown`]. Forwards, so the layers below shut down too.
    fn shutdown(&self) -> impl Future<Output = Result<usize>> + Send {
        self.inner().shutdown()
    }

    /// See [`LockStore::history`]. Forwards.
    fn history(&self, key: &LockKey) -> impl Future<Output = Result<Vec<HistoryEntry>>> + Send {
        self.inner().history(key)
    }

    /// See [`LockStore::append_history`]. Forwards.
    fn append_history(
        &self,
        key: &LockKey,
        trace: &TraceConfig,
        entry: &HistoryEntry,
    ) -> impl Future<Output = Result<()>> + Send {
        self.inner().append_history(key, trace, entry)
    }
}

impl<L: LayeredStore> LockStore for L {
    fn name(&self) -> &'static str {
        LayeredStore::name(self)
    }
    fn capabilities(&self) -> Capabilities {
        LayeredStore::capabilities(self)
    }
    fn acquire(&self, req: &Acquire) -> impl Future<Output = Result<Attempt>> + Send {
        LayeredStore::acquire(self, req)
    }
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool>> + Send {
        LayeredStore::release(self, lease)
    }
    fn extend(&self, lease: &Lease, ttl: Duration) -> impl Future<Output = Result<Lease>> + Send {
        LayeredStore::extend(self, lease, ttl)
    }
    fn inspect(&self, key: &LockKey) -> impl Future<Output = Result<Option<LockInfo>>> + Send {
        LayeredStore::inspect(self, key)
    }
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<LockInfo>>> + Send {
        LayeredStore::list(self, prefix)
    }
    fn watch(&self, key: &LockKey) -> impl Future<Output = ReleaseWatch> + Send {
        LayeredStore::watch(self, key)
    }
    fn watch_changes(&self, key: &LockKey) -> impl Future<Output = ChangeWatch> + Send {
        LayeredStore::watch_changes(self, key)
    }
    fn is_held_by(&self, key: &LockKey, holder: HolderId) -> bool {
        LayeredStore::is_held_by(self, key, holder)
    }
    fn is_held_here(&self, key: &LockKey) -> bool {
        LayeredStore::is_held_here(self, key)
    }
    fn is_in_line_here(&self, key: &LockKey) -> bool {
        LayeredStore::is_in_line_here(self, key)
    }
    fn shutdown(&self) -> impl Future<Output = Result<usize>> + Send {
        LayeredStore::shutdown(self)
    }
    fn history(&self, key: &LockKey) -> impl Future<Output = Result<Vec<HistoryEntry>>> + Send {
        LayeredStore::history(self, key)
    }
    fn append_history(
        &self,
        key: &LockKey,
        trace: &TraceConfig,
        entry: &HistoryEntry,
    ) -> impl Future<Output = Result<()>> + Send {
        LayeredStore::append_history(self, key, trace, entry)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;
    use crate::{Error, OwnerToken};

    /// A store that records which operations reached it.
    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<&'static str>>);

    impl Recorder {
        fn seen(&self) -> Vec<&'static str> {
            self.0.lock().unwrap().clone()
        }
        fn record(&self, op: &'static str) {
            self.0.lock().unwrap().push(op);
        }
    }

    impl LockStore for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::ALL
        }
        async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
            self.record("acquire");
            Ok(Lease::new(
                req.key.clone(),
                req.token.clone(),
                req.ttl,
                tokio::time::Instant::now(),
            )
            .into())
        }
        async fn release(&self, _: &Lease) -> Result<bool> {
            self.record("release");
            Ok(true)
        }
        async fn extend(&self, lease: &Lease, _: Duration) -> Result<Lease> {
            self.record("extend");
            Ok(lease.clone())
        }
        async fn inspect(&self, _: &LockKey) -> Result<Option<LockInfo>> {
            self.record("inspect");
            Ok(None)
        }
        async fn list(&self, _: &str) -> Result<Vec<LockInfo>> {
            self.record("list");
            Ok(Vec::new())
        }
        async fn shutdown(&self) -> Result<usize> {
            self.record("shutdown");
            Ok(3)
        }
    }

    /// Overrides nothing.
    #[derive(Debug)]
    struct PassThrough(Recorder);

    impl LayeredStore for PassThrough {
        type Inner = Recorder;
        fn inner(&self) -> &Recorder {
            &self.0
        }
    }

    /// Overrides release only: refuses it, counting.
    #[derive(Debug)]
    struct RefuseRelease(Recorder, AtomicUsize);

    impl LayeredStore for RefuseRelease {
        type Inner = Recorder;
        fn inner(&self) -> &Recorder {
            &self.0
        }
        async fn release(&self, _: &Lease) -> Result<bool> {
            self.1.fetch_add(1, Ordering::Relaxed);
            Err(Error::unsupported("refuse", "release"))
        }
    }

    fn req() -> Acquire {
        Acquire::new(
            LockKey::xdc("c", "e").unwrap(),
            OwnerToken::generate(),
            Duration::from_secs(1),
        )
    }

    #[tokio::test]
    async fn every_operation_forwards_unless_overridden() {
        let store = PassThrough(Recorder::default());
        assert_eq!(LockStore::name(&store), "recorder");
        assert_eq!(LockStore::capabilities(&store), Capabilities::ALL);
        let lease = LockStore::try_acquire(&store, &req()).await.unwrap();
        assert!(LockStore::release(&store, &lease).await.unwrap());
        LockStore::extend(&store, &lease, Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(LockStore::inspect(&store, lease.key()).await.unwrap(), None);
        assert!(LockStore::list(&store, "").await.unwrap().is_empty());
        assert_eq!(LockStore::shutdown(&store).await.unwrap(), 3);
        assert_eq!(
            store.0.seen(),
            ["acquire", "release", "extend", "inspect", "list", "shutdown"]
        );
    }

    #[tokio::test]
    async fn an_override_replaces_only_its_operation() {
        let store = RefuseRelease(Recorder::default(), AtomicUsize::new(0));
        let lease = LockStore::try_acquire(&store, &req()).await.unwrap();
        assert!(LockStore::release(&store, &lease).await.is_err());
        LockStore::extend(&store, &lease, Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(store.1.load(Ordering::Relaxed), 1);
        assert_eq!(
            store.0.seen(),
            ["acquire", "extend"],
            "the refused release never reached the inner store"
        );
    }
}
