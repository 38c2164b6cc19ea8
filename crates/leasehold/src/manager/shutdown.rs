//! The end of a manager's lifecycle, and the signal handler that triggers it.

use std::sync::atomic::{fence, Ordering};

use tokio::time::Instant;

use crate::core::{instant_after, LockStore, Result};

use super::state::LockManager;
#[cfg(feature = "signal")]
use crate::core::Error;

impl LockManager {
    /// Shuts the manager down, in one lifecycle, bounded by the shutdown timeout (the waits for
    /// tracked work) and the graceful-shutdown deadline (the release of live locks):
    ///
    /// 1. **stop new work and wake waiters**: new acquisitions fail with
    ///    [`ErrorKind::ShutDown`](crate::ErrorKind::ShutDown), waiting `lock()` calls (and local
    ///    waiters in the local-competition layer) end at once, renewal stops (its guards are
    ///    marked lost);
    /// 2. **wait for tracked work**: acquisitions in flight and every background release (dropped
    ///    guards, undone attempts, returned hand-offs, renewal cleanup), and the stores' undo work
    ///    for calls that stopped waiting (the release of what an acquire in flight may have
    ///    taken, a waiter leaving its line: [`undo_finished`](crate::core::undo_finished)), so a
    ///    process that exits after this leaves neither behind;
    /// 3. **release live locks and shut the store down**: with graceful shutdown (on by default)
    ///    every live lock is released, within its own deadline (the stacks of scenarios with
    ///    layers of their own are swept at the same time, each within its deadline);
    /// 4. wait for background work started meanwhile, so nothing of this manager runs after this
    ///    returns (bounded by the same timeout).
    ///
    /// Returns how many locks were released in step 3, or an error naming the locks it could not
    /// release (the store failed, or did not answer within the sweep's deadline): they stay in
    /// the store until their TTL. Calling it again is harmless.
    pub async fn shutdown(&self) -> Result<usize> {
        let handle = &self.inner.handle;
        handle.lifecycle.close();
        fence(Ordering::SeqCst);
        let deadline = instant_after(Instant::now(), self.inner.config.shutdown_timeout);
        self.wait_for_tracked_work(deadline).await;
        // Every stack at once: one after another, their deadlines would add up.
        let stacks = std::iter::once(handle).chain(self.inner.config.stacks.values());
        let swept = futures::future::join_all(stacks.map(|stack| stack.store.shutdown())).await;
        self.wait_for_tracked_work(deadline).await;
        all_released(swept)
    }

    async fn wait_for_tracked_work(&self, deadline: Instant) {
        let lifecycle = &self.inner.handle.lifecycle;
        let all = async { tokio::join!(lifecycle.wait(), crate::core::undo_finished()) };
        if tokio::time::timeout_at(deadline, all).await.is_err() {
            tracing::warn!(
                in_flight = lifecycle.in_flight(),
                undoing = crate::core::undo_running(),
                "shutdown timeout passed with acquisitions, background releases or undo work \
                 still running"
            );
        }
    }

    /// Whether [`LockManager::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.handle.lifecycle.is_closing()
    }
}

/// How many locks the stacks' shutdowns released, or an error naming what each stack that
/// failed could not release (the first failure is the cause).
fn all_released(swept: Vec<Result<usize>>) -> Result<usize> {
    let mut released = 0;
    let mut failed: Vec<crate::core::Error> = Vec::new();
    for outcome in swept {
        match outcome {
            Ok(count) => released += count,
            Err(error) => failed.push(error),
        }
    }
    let mut failed = failed.into_iter();
    let Some(first) = failed.next() else {
        return Ok(released);
    };
    let rest: Vec<String> = failed.map(|e| e.chain().to_string()).collect();
    if rest.is_empty() {
        return Err(first);
    }
    let message = format!("{}; and: {}", first.message(), rest.join("; and: "));
    Err(crate::core::Error::new(first.kind(), message).with_source(first))
}

/// What [`LockManager::install_signal_handler`] returns: resolves once SIGINT or SIGTERM arrived
/// and the manager's shutdown (every live lock released) finished, with the status the process
/// should exit with. The library never exits the process itself; the application decides when,
/// typically right away (feature `signal`).
#[cfg(feature = "signal")]
#[derive(Debug)]
#[must_use = "a signal no longer ends the process by itself: await `exit_code()` and exit with it"]
pub struct SignalShutdown {
    done: tokio::sync::oneshot::Receiver<Result<usize>>,
    exit_code: i32,
}

/// What a signal-triggered shutdown did: [`SignalShutdown::outcome`].
#[cfg(feature = "signal")]
#[derive(Debug)]
#[non_exhaustive]
pub struct SignalOutcome {
    /// The exit status configured with
    /// [`GracefulShutdownLayer::exit_code`](crate::layers::GracefulShutdownLayer::exit_code),
    /// whatever the shutdown's result.
    pub exit_code: i32,
    /// What [`LockManager::shutdown`] returned: how many locks it released, or the error naming
    /// what it left behind (those locks stay until their TTL). A shutdown that outran the
    /// handler's budget is a [`Timeout`](crate::ErrorKind::Timeout).
    pub shutdown: Result<usize>,
}

#[cfg(feature = "signal")]
impl SignalShutdown {
    /// Waits for a signal and for the shutdown it runs, then gives the exit status configured
    /// with [`GracefulShutdownLayer::exit_code`](crate::layers::GracefulShutdownLayer::exit_code)
    /// (default 130 = 128 + SIGINT; `ctrlc` does not say which of the two signals arrived).
    ///
    /// The status is the configured one even when the shutdown failed (the failure is logged as
    /// a warning); use [`outcome`](Self::outcome) to tell a clean shutdown from one that left
    /// locks behind.
    pub async fn exit_code(self) -> i32 {
        self.outcome().await.exit_code
    }

    /// Waits for a signal and for the shutdown it runs, then says what the shutdown did and the
    /// configured exit status. A service whose supervisor must know that locks were left behind
    /// exits with a status of its own when [`SignalOutcome::shutdown`] is an error:
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::LockManager::builder().client_id("svc").farm_id("f1").build()?;
    /// let outcome = locks.install_signal_handler()?.outcome().await;
    /// match outcome.shutdown {
    ///     Ok(_released) => std::process::exit(outcome.exit_code),
    ///     Err(left) => {
    ///         eprintln!("shutdown left locks behind: {}", left.chain());
    ///         std::process::exit(75)
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn outcome(self) -> SignalOutcome {
        let shutdown = match self.done.await {
            Ok(shutdown) => shutdown,
            Err(_) => Err(Error::internal(
                "the signal handler's task ended (its runtime shut down) before any shutdown \
                 it ran finished",
            )),
        };
        SignalOutcome {
            exit_code: self.exit_code,
            shutdown,
        }
    }
}

#[cfg(feature = "signal")]
impl LockManager {
    /// Runs [`LockManager::shutdown`] when the process receives SIGINT or SIGTERM (Ctrl-C on
    /// Windows), and tells the application when it is done (feature `signal`).
    ///
    /// A `ctrlc` handler (with its `termination` feature, so SIGTERM is caught too) sends on a
    /// channel; a task spawned on the current tokio runtime receives it and runs the shutdown —
    /// which, with [graceful shutdown](crate::LockManagerBuilder::graceful_shutdown) on (the
    /// default), releases every live lock — bounded by the graceful-shutdown deadline plus the
    /// manager's shutdown timeout. The returned [`SignalShutdown`] resolves then; the process
    /// exits when the application says so, since the handler replaces the signal's default
    /// action:
    ///
    /// ```no_run
    /// # async fn serve() {}
    /// # #[tokio::main] async fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::LockManager::builder().client_id("svc").farm_id("f1").build()?;
    /// let signalled = locks.install_signal_handler()?;
    /// tokio::select! {
    ///     () = serve() => locks.shutdown().await.map(drop)?,
    ///     code = signalled.exit_code() => std::process::exit(code),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::Internal`](crate::ErrorKind::Internal) outside a tokio runtime, if a `ctrlc`
    /// handler is already installed in this process (only one can be), or if SIGINT or SIGTERM
    /// already has another handler or is ignored: `ctrlc` never overwrites one, and neither does
    /// this method.
    pub fn install_signal_handler(&self) -> Result<SignalShutdown> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::internal("install_signal_handler must be called inside a tokio runtime")
                .with_source(e)
        })?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        ctrlc::try_set_handler(move || {
            let _ = tx.send(());
        })
        .map_err(|e| {
            let what = match e {
                ctrlc::Error::MultipleHandlers => {
                    "could not install the signal handler: SIGINT/SIGTERM already has a handler \
                     in this process (an earlier install_signal_handler call or another \
                     library), or SIGINT is ignored (as for a process a non-interactive shell \
                     started with `&`); handle the signal yourself and call \
                     LockManager::shutdown"
                }
                _ => "could not install the signal handler",
            };
            Error::internal(what).with_source(e)
        })?;
        Ok(self.shut_down_on_signal(&runtime, rx))
    }

    /// Spawns the task that runs the shutdown once `signals` receives, and the handle that
    /// reports it (apart from the process-wide handler, so tests can send the signal).
    pub(crate) fn shut_down_on_signal(
        &self,
        runtime: &tokio::runtime::Handle,
        mut signals: tokio::sync::mpsc::UnboundedReceiver<()>,
    ) -> SignalShutdown {
        let config = self.inner.config.graceful.clone().unwrap_or_default();
        let budget = self
            .inner
            .config
            .sweep_deadline
            .saturating_add(self.inner.config.shutdown_timeout);
        let manager = self.clone();
        let (done, finished) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            if signals.recv().await.is_none() {
                return;
            }
            tracing::info!("signal received: releasing live locks");
            let shutdown = match tokio::time::timeout(budget, manager.shutdown()).await {
                Ok(shutdown) => shutdown,
                Err(_) => Err(Error::new(
                    crate::ErrorKind::Timeout,
                    format!(
                        "the shutdown took longer than {budget:?} (the longest graceful-shutdown \
                         deadline plus the shutdown timeout): locks not released yet stay until \
                         their TTL"
                    ),
                )),
            };
            match &shutdown {
                Ok(released) => tracing::info!(released, "locks released"),
                Err(error) => tracing::warn!(error = %error.chain(), "shutdown failed"),
            }
            let _ = done.send(shutdown);
        });
        SignalShutdown {
            done: finished,
            exit_code: config.exit_code,
        }
    }
}
