//! Explicit holder identities for reentrant locking.

use crate::core::HolderId;

/// An explicit holder identity: pass the same `Holder` (or a clone) to nested acquisitions of a key
/// and, with the reentrancy layer on, they count up instead of deadlocking.
///
/// A thread-local identity is wrong in async Rust (a task moves between threads), so the holder is a
/// value you create and pass down. Clones are the same holder; `Holder::new()` is a new one.
///
/// ```
/// use leasehold::Holder;
/// let a = Holder::new();
/// assert_eq!(a, a.clone());
/// assert_ne!(a, Holder::new());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holder(HolderId);

impl Holder {
    /// A new holder identity, unique in this process.
    pub fn new() -> Self {
        Holder(HolderId::new_explicit())
    }

    /// The id layers see.
    pub fn id(&self) -> HolderId {
        self.0
    }
}

impl Default for Holder {
    fn default() -> Self {
        Holder::new()
    }
}
