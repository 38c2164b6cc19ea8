//! The object-safe twin of [`LockStore`], so a stack of layers is erased to one type at the end.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::acquire::{Acquire, HolderId};
use crate::attempt::Attempt;
use crate::change_watch::ChangeWatch;
use crate::error::Result;
use crate::history::{HistoryEntry, TraceConfig};
use crate::key::LockKey;
use crate::lease::{Lease, LockInfo};
use crate::store::{Capabilities, LockStore};
use crate::watch::ReleaseWatch;

/// Object-safe form of [`LockStore`], implemented for every store.
trait DynLockStore: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn capabilities(&self) -> Capabilities;
    fn acquire<'a>(&'a self, req: &'a Acquire) -> BoxFuture<'a, Result<Attempt>>;
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool>>;
    fn extend<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<Lease>>;
    fn inspect<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<LockInfo>>>;
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>>>;
    fn watch<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, ReleaseWatch>;
    fn watch_changes<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, ChangeWatch>;
    fn is_held_by(&self, key: &LockKey, holder: HolderId) -> bool;
    fn is_held_here(&self, key: &LockKey) -> bool;
    fn is_in_line_here(&self, key: &LockKey) -> bool;
    fn shutdown(&self) -> BoxFuture<'_, Result<usize>>;
    fn history<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<HistoryEntry>>>;
    fn append_history<'a>(
        &'a self,
        key: &'a LockKey,
        trace: &'a TraceConfig,
        entry: &'a HistoryEntry,
    ) -> BoxFuture<'a, Result<()>>;
}

impl<S: LockStore> DynLockStore for S {
    fn name(&self) -> &'static str {
        LockStore::name(self)
    }
    fn capabilities(&self) -> Capabilities {
        LockStore::capabilities(self)
    }
    fn acquire<'a>(&'a self, req: &'a Acquire) -> BoxFuture<'a, Result<Attempt>> {
        in_box(|| LockStore::acquire(self, req))
    }
    fn release<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool>> {
        in_box(|| LockStore::release(self, lease))
    }
    fn extend<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> BoxFuture<'a, Result<Lease>> {
        in_box(|| LockStore::extend(self, lease, ttl))
    }
    fn inspect<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<LockInfo>>> {
        in_box(|| LockStore::inspect(self, key))
    }
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>>> {
        in_box(|| LockStore::list(self, prefix))
    }
    fn watch<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, ReleaseWatch> {
        in_box(|| LockStore::watch(self, key))
    }
    fn watch_changes<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, ChangeWatch> {
        in_box(|| LockStore::watch_changes(self, key))
    }
    fn is_held_by(&self, key: &LockKey, holder: HolderId) -> bool {
        LockStore::is_held_by(self, key, holder)
    }
    fn is_held_here(&self, key: &LockKey) -> bool {
        LockStore::is_held_here(self, key)
    }
    fn is_in_line_here(&self, key: &LockKey) -> bool {
        LockStore::is_in_line_here(self, key)
    }
    fn shutdown(&self) -> BoxFuture<'_, Result<usize>> {
        in_box(|| LockStore::shutdown(self))
    }
    fn history<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<HistoryEntry>>> {
        in_box(|| LockStore::history(self, key))
    }
    fn append_history<'a>(
        &'a self,
        key: &'a LockKey,
        trace: &'a TraceConfig,
        entry: &'a HistoryEntry,
    ) -> BoxFuture<'a, Result<()>> {
        in_box(|| LockStore::append_history(self, key, trace, entry))
    }
}

/// Boxes the future `make` returns, made in its box: the box is allocated first and the future
/// written into it, which lets the compiler make it there, where `Box::pin(future)` makes it on
/// the stack and copies it over. A network store's futures are large (an Aerospike acquire's is
/// about 9 KB, an etcd one's about 7 KB: the client crates' request futures are inside), and on
/// Aerospike that copy was the largest single cost a call added on the client (*Counted*, in
/// docs/PERFORMANCE.md).
fn in_box<'a, F: Future + Send + 'a>(make: impl FnOnce() -> F) -> BoxFuture<'a, F::Output> {
    let slot = Box::<F>::new_uninit();
    let future: Box<F> = Box::write(slot, make());
    Box::into_pin(future)
}

/// Any [`LockStore`] behind one type: a cheap-to-clone, type-erased handle.
///
/// The manager erases its layer stack to a `BoxStore` once, at build time; one boxed future per
/// call costs nothing next to a network round trip, and users never see a five-deep generic type.
///
/// ```
/// use leasehold_core::{BoxStore, LockStore};
/// # #[derive(Debug)] struct MyStore;
/// # impl LockStore for MyStore {
/// #   fn name(&self) -> &'static str { "my" }
/// #   fn capabilities(&self) -> leasehold_core::Capabilities { leasehold_core::Capabilities::NONE }
/// #   async fn acquire(&self, _: &leasehold_core::Acquire) -> leasehold_core::Result<leasehold_core::Attempt> { unimplemented!() }
/// #   async fn release(&self, _: &leasehold_core::Lease) -> leasehold_core::Result<bool> { unimplemented!() }
/// #   async fn extend(&self, _: &leasehold_core::Lease, _: std::time::Duration) -> leasehold_core::Result<leasehold_core::Lease> { unimplemented!() }
/// #   async fn inspect(&self, _: &leasehold_core::LockKey) -> leasehold_core::Result<Option<leasehold_core::LockInfo>> { unimplemented!() }
/// # }
/// let store = BoxStore::new(MyStore);
/// assert_eq!(store.name(), "my");
/// ```
#[derive(Clone)]
pub struct BoxStore {
    inner: Arc<dyn DynLockStore>,
}

impl BoxStore {
    /// Erases `store`. Boxing a `BoxStore` again returns it unchanged.
    pub fn new<S: LockStore>(store: S) -> Self {
        // Avoid double boxing when a stack is already erased.
        if let Some(boxed) = (&store as &dyn std::any::Any).downcast_ref::<BoxStore>() {
            return boxed.clone();
        }
        BoxStore {
            inner: Arc::new(store),
        }
    }
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxStore")
            .field("name", &self.inner.name())
            .finish()
    }
}

impl LockStore for BoxStore {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        self.inner.acquire(req).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.inner.release(lease).await
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
    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        self.inner.watch(key).await
    }
    async fn watch_changes(&self, key: &LockKey) -> ChangeWatch {
        self.inner.watch_changes(key).await
    }
    fn is_held_by(&self, key: &LockKey, holder: HolderId) -> bool {
        self.inner.is_held_by(key, holder)
    }
    fn is_held_here(&self, key: &LockKey) -> bool {
        self.inner.is_held_here(key)
    }
    fn is_in_line_here(&self, key: &LockKey) -> bool {
        self.inner.is_in_line_here(key)
    }
    async fn shutdown(&self) -> Result<usize> {
        self.inner.shutdown().await
    }
    async fn history(&self, key: &LockKey) -> Result<Vec<HistoryEntry>> {
        self.inner.history(key).await
    }
    async fn append_history(
        &self,
        key: &LockKey,
        trace: &TraceConfig,
        entry: &HistoryEntry,
    ) -> Result<()> {
        self.inner.append_history(key, trace, entry).await
    }
}
