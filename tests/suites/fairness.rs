//! Fair waiting across processes, the behaviour every store runs (included by each store's
//! `tests/fairness.rs` with `#[path]`): every process gets a hot key (none starves), and a crashed
//! waiter leaves the line when its place lapses, while a try-lock never passes it.
//!
//! The test binary is its own worker (`leasehold_testkit::fleet`): spawned with a role, it plays
//! it (a contending process, or a waiter that will be killed) instead of coordinating.
//!
//! A store's test file implements [`Deployment`] and invokes `fairness_suite!`.

use std::future::Future;
use std::time::{Duration, Instant};

use leasehold::{ErrorKind, LockManager, LockOptions};
use leasehold_testkit::fleet;

const PROCESSES: usize = 4;
const TASKS: usize = 2;
const RUN: Duration = Duration::from_secs(3);
const HOLD: Duration = Duration::from_millis(2);

/// A deployment of one store, and what a test needs to see of its waiting line.
pub(crate) trait Deployment: Sized {
    /// The longest a contending request may wait for the hot key.
    const STARVES_AFTER: Duration;
    /// The longest the next process waits for a crashed waiter's place to lapse.
    const LAPSES_WITHIN: Duration;

    /// Starts a private deployment; a fixture serves from `runtime` while the test waits.
    fn start(runtime: &tokio::runtime::Runtime) -> Self;
    /// Everything a worker process needs to reach the deployment, as one string.
    fn address(&self) -> String;
    /// A manager (a process) with client id `fair` on the deployment at `address`.
    fn manager(address: &str) -> impl Future<Output = LockManager> + Send;
    /// The manager of the process that comes after a waiter crashed.
    fn latecomer(address: &str) -> impl Future<Output = LockManager> + Send {
        Self::manager(address)
    }
    /// How many places the line of `entity` holds (lapsed ones included), read beside the store.
    fn line_length(address: &str, entity: &str) -> impl Future<Output = usize> + Send;
}

/// One `#[test]` per behaviour, on deployments of `$deployment` (a type implementing
/// [`Deployment`]). The including file names this module `suite`.
macro_rules! fairness_suite {
    ($deployment:ty) => {
        suite::fairness_suite!(@tests $deployment;
            every_process_gets_a_hot_key_none_starves,
            a_crashed_waiter_leaves_the_line_by_its_waiter_timeout,
        );
    };
    (@tests $deployment:ty; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                suite::$name::<$deployment>(stringify!($name));
            }
        )*
    };
}
pub(crate) use fairness_suite;

/// Runs the role this process was spawned for, if any.
fn play_role<D: Deployment>() -> bool {
    let Some((role, address)) = fleet::role() else {
        return false;
    };
    fleet::runtime().block_on(async move {
        match role.as_str() {
            "contend" => {
                let locks = D::manager(&address).await;
                fleet::contend(TASKS, RUN, move || {
                    let locks = locks.clone();
                    async move {
                        let guard = locks
                            .lock_with("hot", LockOptions::new().wait(D::STARVES_AFTER))
                            .await
                            .unwrap_or_else(|e| {
                                panic!("no request starves for {:?}: {e}", D::STARVES_AFTER)
                            });
                        tokio::time::sleep(HOLD).await;
                        guard.release().await.expect("release");
                    }
                })
                .await
            }
            // Joins the line of `held`, then hangs until killed.
            "hang" => {
                let locks = D::manager(&address).await;
                let _ = locks
                    .lock_with("held", LockOptions::new().wait(Duration::from_secs(600)))
                    .await;
            }
            other => panic!("unknown role {other}"),
        }
    });
    true
}

/// `test` is the name the test runs under, so the workers run this same function.
pub(crate) fn every_process_gets_a_hot_key_none_starves<D: Deployment>(test: &str) {
    if play_role::<D>() {
        return;
    }
    let runtime = fleet::runtime();
    let deployment = D::start(&runtime);
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| fleet::spawn_role("contend", test, &deployment.address()))
        .collect();
    // First-come, one process took most of the acquisitions and the least-served a small part of
    // that (the fleet benchmark). In line, each process gets one turn per round.
    let counts: Vec<u64> = fleet::results(children).iter().map(|r| r.0).collect();
    fleet::assert_fair_shares(&counts);
    drop(deployment);
}

/// `test` is the name the test runs under, so the waiter runs this same function.
pub(crate) fn a_crashed_waiter_leaves_the_line_by_its_waiter_timeout<D: Deployment>(test: &str) {
    if play_role::<D>() {
        return;
    }
    let runtime = fleet::runtime();
    let deployment = D::start(&runtime);
    let address = deployment.address();
    runtime.block_on(async {
        let holder = D::manager(&address).await;
        let held = holder.try_lock("held").await.expect("free");
        let mut waiter = fleet::spawn_role("hang", test, &address);
        // Wait until the child is in line, then SIGKILL it: it never leaves by itself.
        let deadline = Instant::now() + Duration::from_secs(20);
        while D::line_length(&address, "held").await != 1 {
            assert!(
                Instant::now() < deadline,
                "the waiter never joined the line"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        waiter.kill().unwrap(); // SIGKILL, by pid
        waiter.wait().unwrap();
        held.release().await.unwrap();

        // The dead waiter is first in line until its place lapses (its waiter timeout).
        let next = D::latecomer(&address).await;
        let refused = next.try_lock("held").await.unwrap_err();
        assert_eq!(
            refused.kind(),
            ErrorKind::LockUnavailable,
            "a try-lock does not pass a waiter in line"
        );
        let guard = next
            .lock_with("held", LockOptions::new().wait(D::LAPSES_WITHIN))
            .await
            .expect("the crashed waiter's place lapsed");
        guard.release().await.unwrap();
    });
    drop(deployment);
}
