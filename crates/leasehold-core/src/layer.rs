//! Layers: how a scenario middleware wraps a store (tower's `Layer`, for lock stores).

use std::fmt;

/// Wraps a store in another store, adding one behaviour.
///
/// A layer's store implements [`LockStore`](crate::LockStore) by forwarding to the inner store and
/// changing only what its scenario needs. Layers compose with [`Stack`]; the first layer added is
/// the innermost.
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
