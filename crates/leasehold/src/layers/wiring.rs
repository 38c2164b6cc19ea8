//! What a stack gives its scenario layers when it is assembled: where they report events, and the
//! lifecycle the layers that act at shutdown follow.
//!
//! A layer's configuration (`ReadbackLayer`, …) holds only its settings, so the same value serves
//! the builder, a scenario and the TOML file, and two configurations compare by their settings.
//! The wiring is given once, when a stack is built: the manager's builder builds every layer of
//! every stack with its own observers and lifecycle. A layer used alone
//! ([`Layer::layer`](crate::core::Layer::layer)) reports nowhere and shuts down with a lifecycle
//! of its own; [`WiredLayer::layer_wired`] builds it with other wiring.

use crate::core::{Layer, Lifecycle, LockStore, Observers};

/// Where a stack's layers report, and the lifecycle they shut down with.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// use std::sync::{Arc, Mutex};
/// use leasehold::core::{Lifecycle, Observers};
/// use leasehold::layers::{UnlockWindowLayer, Wiring, WiredLayer};
/// use leasehold::{LockEvent, LockStore, MemoryStore};
///
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let sink = seen.clone();
/// let observers = Observers::default().with(move |e: &LockEvent| sink.lock().unwrap().push(e.name()));
/// let wiring = Wiring::new(observers, Lifecycle::new());
/// let store = UnlockWindowLayer::new().layer_wired(MemoryStore::new(), &wiring);
/// # let _ = store;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Wiring {
    observers: Observers,
    lifecycle: Lifecycle,
}

impl Wiring {
    /// Layers report to `observers` and shut down with `lifecycle`.
    pub fn new(observers: Observers, lifecycle: Lifecycle) -> Self {
        Wiring {
            observers,
            lifecycle,
        }
    }

    /// Where the layers report events.
    pub fn observers(&self) -> &Observers {
        &self.observers
    }

    /// The lifecycle the layers that act at shutdown follow: once it is closing, they refuse
    /// acquisitions and give back one that lands late.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }
}

/// A scenario layer: a configuration that wraps a store given the wiring of the stack it joins.
/// Its [`Layer`] impl is [`layer_wired`](Self::layer_wired) with [`Wiring::default`].
pub trait WiredLayer<S: LockStore>: Layer<S> {
    /// Wraps `inner`, reporting and shutting down as `wiring` says.
    fn layer_wired(&self, inner: S, wiring: &Wiring) -> Self::Store;
}
