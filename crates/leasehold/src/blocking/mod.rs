//! A blocking API, for code that has no async runtime (a CLI tool, a synchronous service).
//!
//! Modelled on `reqwest::blocking`: a [`blocking::LockManager`](LockManager) owns a small tokio
//! runtime (one worker thread, named `leasehold-blocking`) and drives the async
//! [`crate::LockManager`] on it. Each call blocks the calling thread until it completes; the
//! background work of the manager (the renewal watchdog, releases of dropped guards, store
//! connections) runs on the worker thread between calls, so a guard's lease is renewed while the
//! thread that holds it is busy.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::{blocking, LockOptions};
//!
//! # fn main() -> leasehold::Result<()> {
//! let locks = blocking::LockManager::new(
//!     leasehold::LockManager::builder().client_id("cli").farm_id("f1"),
//! )?;
//! let guard = locks.try_lock("nightly-report")?;
//! assert!(guard.is_held());
//!
//! // Another thread fails fast, or waits up to a deadline.
//! std::thread::scope(|s| {
//!     s.spawn(|| assert!(locks.try_lock("nightly-report").unwrap_err().is_unavailable()));
//! });
//! assert!(guard.release()?); // true: it was still ours
//!
//! let wait = LockOptions::new().wait(Duration::from_secs(5));
//! let guard = locks.lock_with("nightly-report", wait)?;
//! println!("fencing token {:?}", guard.fencing_token());
//! drop(guard); // released in the background
//!
//! let total = locks.with_lock("nightly-report", |_guard| 40 + 2)?; // released after, even on panic
//! assert_eq!(total, 42);
//! locks.shutdown()?;
//! # Ok(()) }
//! ```
//!
//! # Lock kinds
//! Every kind of the async manager (see `docs/LOCK_KINDS.md`), with the same names and rules:
//!
//! | kind | methods | guard |
//! |---|---|---|
//! | exclusive (= write side) | [`lock`](LockManager::lock), [`try_lock`](LockManager::try_lock), [`with_lock`](LockManager::with_lock) | [`LockGuard`] |
//! | read side | [`read`](LockManager::read), [`try_read`](LockManager::try_read), [`read_with`](LockManager::read_with), [`with_read`](LockManager::with_read) | [`LockGuard`] (`mode() == Shared`) |
//! | semaphore, N permits | [`semaphore`](LockManager::semaphore), [`try_semaphore`](LockManager::try_semaphore), [`with_permit`](LockManager::with_permit) | [`LockGuard`] (`mode() == Semaphore{n}`) |
//! | multi-lock | [`lock_all`](LockManager::lock_all), [`try_lock_all`](LockManager::try_lock_all), [`lock_all_with`](LockManager::lock_all_with), [`with_all`](LockManager::with_all) | [`MultiGuard`] |
//! | anything, per call | [`lock_with`](LockManager::lock_with) with [`LockOptions::mode`] | [`LockGuard`] |
//!
//! Every guard releases when dropped (in the background, on the manager's runtime) and is renewed
//! by the manager's watchdog while it lives.
//!
//! # Network stores
//! Connecting a network store is async, and its connection must live on the manager's runtime:
//! build the builder inside it with [`LockManager::connect`].
//!
//! # Threads, not tasks
//! A call runs on the calling thread, so the holder of a lock (for reentrancy, see
//! [`LockManagerBuilder::task_holders`]) is that thread: the same thread locking a key twice
//! counts up, another thread contends. Pass a [`Holder`](crate::Holder) in
//! [`LockOptions::holder`] to share a hold across threads.
//!
//! # Not from async code
//! Blocking a thread of an async runtime would stall it (and tokio refuses to start a runtime
//! inside another): every call made where a tokio runtime is current — inside a task, a
//! `block_on`, or a `spawn_blocking` closure — returns
//! [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) instead. Use
//! [`crate::LockManager`] there.
//!
//! [`LockManagerBuilder::task_holders`]: crate::LockManagerBuilder::task_holders
//! [`LockOptions::holder`]: crate::LockOptions::holder
//! [`LockOptions::mode`]: crate::LockOptions::mode

mod guard;
mod kinds;
mod manager;
mod multi_guard;
mod runtime;

pub use guard::LockGuard;
pub use manager::LockManager;
pub use multi_guard::MultiGuard;
