//! Scenarios: named business uses of locks, each with its own lock model (Bond phase 2).
//!
//! A [`Scenario`] fixes, for the keys it covers (a [`KeyPattern`] on the entity name), the lock
//! [`AcquireMode`], TTL, wait, renewal, which scenario layers run and with which settings, whether
//! the key's history is kept in the store ([`TraceConfig`](crate::core::TraceConfig)), and what to do when the store is
//! unreachable ([`StoreDownPolicy`]: fail closed by default). A [`ScenarioRegistry`] holds them:
//! registered in code through
//! [`LockManagerBuilder::scenarios`](crate::LockManagerBuilder::scenarios), or loaded from a TOML
//! file ops can change without a rebuild ([`ScenarioRegistry::from_toml_file`]).
//!
//! A lock call that names a scenario ([`LockOptions::scenario`](crate::LockOptions::scenario))
//! gets its settings; otherwise the first scenario whose pattern matches the entity name does; a
//! key that matches none gets the manager's defaults, or an error where the registry is
//! [strict](ScenarioRegistry::strict). Explicit per-call options override a scenario's.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::scenario::{AcquireMode, Scenario, ScenarioRegistry, StoreDownPolicy};
//! use leasehold::LockManager;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = ScenarioRegistry::new()
//!     .with(Scenario::new("checkout").keys("order-*").mode(AcquireMode::Blocking)
//!         .ttl(Duration::from_secs(5)).wait(Duration::from_millis(200)))?
//!     .with(Scenario::new("feed").keys("feed-*").mode(AcquireMode::Try)
//!         .on_store_down(StoreDownPolicy::Proceed))?;
//! let locks = LockManager::builder().client_id("shop").farm_id("eu1").scenarios(registry).build()?;
//!
//! let guard = locks.acquire("order-42").await?; // checkout: waits up to 200 ms
//! assert_eq!(guard.scenario(), "checkout");
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Layers: a scenario can turn each scenario layer off, on (with the manager's configuration of
//! it), or on with a configuration of its own ([`LayerSettings`], [`LayerSetting`]); a layer it
//! does not mention keeps the manager's setting. A scenario that sets any layer gets its own layer
//! stack over the same store, wired to the manager's observers and lifecycle.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::layers::{LocalCompetitionLayer, ReadbackLayer};
//! use leasehold::scenario::{LayerSettings, Scenario};
//! let hot = Scenario::new("hot").keys("counter-*").layers(
//!     LayerSettings::new()
//!         .local_competition(LocalCompetitionLayer::new().hand_off(true).max_hand_offs(4))
//!         .readback(ReadbackLayer::new().retries(2))
//!         .unlock_window(false),
//! );
//! assert!(hot.layer_settings().overrides_any());
//! ```
//!
//! In a file, each layer is `true`/`false` or a table of its settings (docs/SCENARIOS.md):
//! `local_competition = { hand_off = true, max_hand_offs = 4, max_hand_off_hold = "200ms" }`.
//!
//! Lock kinds: a scenario's `mode` says how `acquire` takes the lock ([`AcquireMode::Try`] or
//! [`AcquireMode::Blocking`]); its `lock` says which kind (`lock = "exclusive"`, the default and a
//! read-write lock's write side; `"read"`; `"semaphore"` with `permits = N`; see
//! [`Scenario::lock`]). A call's own kind (`read`, `semaphore`) wins over the scenario's.

mod definition;
mod error;
mod file;
mod glob;
mod layers;
mod registry;

pub use definition::{AcquireMode, Scenario, StoreDownPolicy};
pub use error::ScenarioError;
pub use glob::KeyPattern;
pub(crate) use layers::LayerStack;
pub use layers::{LayerSetting, LayerSettings};
pub use registry::ScenarioRegistry;
