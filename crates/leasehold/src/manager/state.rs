//! The manager's state: the type every part of the manager adds its methods to, and the settings
//! the builder resolved. A leaf, so the parts (options, acquire, kinds, builder, shutdown) depend
//! on it and not on each other's parent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::core::LockLevel;
use crate::handle::Handle;
use crate::layers::GracefulShutdownLayer;
use crate::scenario::ScenarioRegistry;

/// The lock manager: acquire, wait for, release and inspect distributed locks.
///
/// Cheap to clone (one `Arc`); share one per process. Built over a store (the embedded
/// [`MemoryStore`](crate::MemoryStore) by default) wrapped in the scenario layers.
///
/// ```
/// use leasehold::LockManager;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let locks = LockManager::builder().client_id("orders").farm_id("farm1").build()?;
///
/// let guard = locks.try_lock("order-42").await?;         // one attempt
/// let other = locks.clone();                              // another task contends...
/// let contender = tokio::spawn(async move { other.try_lock("order-42").await.map(drop) });
/// assert!(contender.await.unwrap().unwrap_err().is_unavailable());
/// assert!(guard.release().await?);                       // true: it was still ours
///
/// let total = locks.with_lock("order-42", |_lease| async { 40 + 2 }).await?;
/// assert_eq!(total, 42);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LockManager {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    /// What guards and renewal tasks share with the manager.
    pub(super) handle: Arc<Handle>,
    pub(super) config: Config,
}

/// The settings the builder resolved.
#[derive(Debug)]
pub(super) struct Config {
    pub(super) client_id: String,
    pub(super) farm_id: Option<String>,
    pub(super) default_level: LockLevel,
    pub(super) lock_ttl: Duration,
    pub(super) wait_for_lock: Duration,
    pub(super) backoff: Backoff,
    pub(super) shutdown_timeout: Duration,
    pub(super) task_holders: bool,
    pub(super) renewal: Renewal,
    /// The scenario label of calls no scenario covers.
    pub(super) scenario: Arc<str>,
    pub(super) registry: ScenarioRegistry,
    /// The layer stacks of scenarios that change the layers (others use the manager's).
    pub(super) stacks: HashMap<Arc<str>, Arc<Handle>>,
    #[cfg_attr(not(feature = "signal"), allow(dead_code))]
    pub(super) graceful: Option<GracefulShutdownLayer>,
    /// The longest graceful-shutdown deadline of any stack (zero without graceful shutdown):
    /// the stacks are swept at once, so a shutdown's sweep takes at most this.
    #[cfg_attr(not(feature = "signal"), allow(dead_code))]
    pub(super) sweep_deadline: Duration,
}

/// Whether guards renew their lease: the manager-wide setting of
/// [`LockManagerBuilder::renewal`](crate::LockManagerBuilder::renewal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Renewal {
    /// A watchdog for guards taken without an explicit TTL (Redisson's default).
    #[default]
    Watchdog,
    /// Every guard.
    Always,
    /// No guard (the Java lock manager's semantics).
    Never,
}
