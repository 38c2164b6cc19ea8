//! Layers: how a scenario middleware wraps a store (tower's `Layer`, for lock stores).

use std::fmt;
use std::time::Duration;

use crate::acquire::{Acquire, HolderId};
use crate::attempt::Attempt;
use crate::change_watch::ChangeWatch;
use crate::error::Result;
use crate::key::LockKey;
use crate::lease::{Lease, LockInfo};
use crate::store::{Capabilities, LockStore};
use crate::watch::ReleaseWatch;

/// Wraps a store in another store, adding one behaviour.
///
/// A layer's store implements [`LayeredStore`](crate::LayeredStore): every operation forwards to
/// the inner store unless the layer overrides it. Layers compose with [`Stack`] (the first layer
/// added is the innermost), and an optional one with [`option_layer`].
///
/// ```
/// use leasehold_core::{Identity, Layer, Stack};
/// let stack = Stack::new(Identity, Identity);
/// let store: u8 = stack.layer(7u8); // identity layers return the store unchanged
/// assert_eq!(store, 7);
/// ```
pub trait Layer<S> {
    /// The wrapped store.
    type Store;

    /// Wraps `inner`.
    fn layer(&self, inner: S) -> Self::Store;
}

/// The layer that changes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity;

impl<S> Layer<S> for Identity {
    type Store = S;

    fn layer(&self, inner: S) -> S {
        inner
    }
}

/// Two layers, `inner` applied first, then `outer`.
#[derive(Clone, Copy, Default)]
pub struct Stack<Inner, Outer> {
    inner: Inner,
    outer: Outer,
}

impl<Inner, Outer> Stack<Inner, Outer> {
    /// `outer` wrapped around `inner`.
    pub fn new(inner: Inner, outer: Outer) -> Self {
        Stack { inner, outer }
    }
}

impl<S, Inner, Outer> Layer<S> for Stack<Inner, Outer>
where
    Inner: Layer<S>,
    Outer: Layer<Inner::Store>,
{
    type Store = Outer::Store;

    fn layer(&self, store: S) -> Self::Store {
        self.outer.layer(self.inner.layer(store))
    }
}

impl<Inner: fmt::Debug, Outer: fmt::Debug> fmt::Debug for Stack<Inner, Outer> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Innermost first, the order requests leave the stack.
        write!(f, "{:?} <- {:?}", self.inner, self.outer)
    }
}

/// One of two layers (or, once applied, one of two stores): how an optional layer composes
/// without a pass-through written by hand (tower's `Either`). See [`option_layer`].
#[derive(Debug, Clone, Copy)]
pub enum Either<A, B> {
    /// The first.
    Left(A),
    /// The second.
    Right(B),
}

/// `Some(layer)` applies `layer`; `None` leaves the store as it is (tower's `option_layer`).
///
/// ```
/// use leasehold_core::{option_layer, Either, Identity, Layer};
/// let on = option_layer(Some(Identity)).layer(7u8);
/// let off = option_layer(None::<Identity>).layer(7u8);
/// assert!(matches!(on, Either::Left(7)));
/// assert!(matches!(off, Either::Right(7)));
/// ```
pub fn option_layer<L>(layer: Option<L>) -> Either<L, Identity> {
    match layer {
        Some(layer) => Either::Left(layer),
        None => Either::Right(Identity),
    }
}

impl<S, A, B> Layer<S> for Either<A, B>
where
    A: Layer<S>,
    B: Layer<S>,
{
    type Store = Either<A::Store, B::Store>;

    fn layer(&self, inner: S) -> Self::Store {
        match self {
            Either::Left(a) => Either::Left(a.layer(inner)),
            Either::Right(b) => Either::Right(b.layer(inner)),
        }
    }
}

impl<A: LockStore, B: LockStore> LockStore for Either<A, B> {
    fn name(&self) -> &'static str {
        match self {
            Either::Left(a) => a.name(),
            Either::Right(b) => b.name(),
        }
    }
    fn capabilities(&self) -> Capabilities {
        match self {
            Either::Left(a) => a.capabilities(),
            Either::Right(b) => b.capabilities(),
        }
    }
    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        match self {
            Either::Left(a) => a.acquire(req).await,
            Either::Right(b) => b.acquire(req).await,
        }
    }
    async fn release(&self, lease: &Lease) -> Result<bool> {
        match self {
            Either::Left(a) => a.release(lease).await,
            Either::Right(b) => b.release(lease).await,
        }
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        match self {
            Either::Left(a) => a.extend(lease, ttl).await,
            Either::Right(b) => b.extend(lease, ttl).await,
        }
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        match self {
            Either::Left(a) => a.inspect(key).await,
            Either::Right(b) => b.inspect(key).await,
        }
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        match self {
            Either::Left(a) => a.list(prefix).await,
            Either::Right(b) => b.list(prefix).await,
        }
    }
    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        match self {
            Either::Left(a) => a.watch(key).await,
            Either::Right(b) => b.watch(key).await,
        }
    }
    async fn watch_changes(&self, key: &LockKey) -> ChangeWatch {
        match self {
            Either::Left(a) => a.watch_changes(key).await,
            Either::Right(b) => b.watch_changes(key).await,
        }
    }
    fn is_held_by(&self, key: &LockKey, holder: HolderId) -> bool {
        match self {
            Either::Left(a) => a.is_held_by(key, holder),
            Either::Right(b) => b.is_held_by(key, holder),
        }
    }
    fn is_held_here(&self, key: &LockKey) -> bool {
        match self {
            Either::Left(a) => a.is_held_here(key),
            Either::Right(b) => b.is_held_here(key),
        }
    }
    fn is_in_line_here(&self, key: &LockKey) -> bool {
        match self {
            Either::Left(a) => a.is_in_line_here(key),
            Either::Right(b) => b.is_in_line_here(key),
        }
    }
    async fn shutdown(&self) -> Result<usize> {
        match self {
            Either::Left(a) => a.shutdown().await,
            Either::Right(b) => b.shutdown().await,
        }
    }
    async fn history(&self, key: &LockKey) -> Result<Vec<crate::history::HistoryEntry>> {
        match self {
            Either::Left(a) => a.history(key).await,
            Either::Right(b) => b.history(key).await,
        }
    }
    async fn append_history(
        &self,
        key: &LockKey,
        trace: &crate::history::TraceConfig,
        entry: &crate::history::HistoryEntry,
    ) -> Result<()> {
        match self {
            Either::Left(a) => a.append_history(key, trace, entry).await,
            Either::Right(b) => b.append_history(key, trace, entry).await,
        }
    }
}
