//! The leader loop behind [`LockManager::lead`]: campaign, work while leading, campaign again.

use std::future::Future;

use crate::core::{ErrorKind, Lease, Result};
use crate::manager::LockManager;

pub(super) async fn lead<F, Fut>(locks: &LockManager, name: &str, mut work: F) -> Result<()>
where
    F: FnMut(Lease) -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        let leadership = match locks.campaign(name).await {
            Ok(leadership) => leadership,
            Err(error) if error.kind() == ErrorKind::ShutDown => return Ok(()),
            Err(error) => return Err(error),
        };
        let term = leadership.term();
        tracing::info!(election = name, ?term, "leading");
        let finished = {
            let job = work(leadership.lease());
            tokio::select! {
                // Loss first: a job that would finish in the same poll must not be taken as
                // finished under a lost leadership.
                biased;
                lost = leadership.lost() => {
                    tracing::warn!(election = name, ?term, %lost, "leadership lost; work cancelled");
                    false
                }
                () = job => true,
            }
        };
        if finished {
            if let Err(error) = leadership.resign().await {
                tracing::warn!(election = name, ?term, error = %error.chain(),
                    "could not resign after the work ended; leadership expires at its TTL");
            }
        } else {
            drop(leadership);
        }
        if locks.is_shut_down() {
            return Ok(());
        }
    }
}
