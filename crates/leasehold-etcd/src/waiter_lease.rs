//! The waiter lease: the one lease every waiter key of a store lives on, granted when first
//! needed and kept alive in the background until it is lost or revoked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::members::Members;

/// How long to wait before opening the keep-alive stream again after it broke.
const RETRY_DELAY: Duration = Duration::from_millis(200);

/// A granted waiter lease and the task keeping it alive.
#[derive(Debug)]
pub(crate) struct WaiterLease {
    id: i64,
    alive: Arc<AtomicBool>,
    keeper: JoinHandle<()>,
}

impl WaiterLease {
    /// Grants a lease of `ttl` seconds on a member that answers and starts keeping it alive.
    pub(crate) async fn grant(members: Arc<Members>, ttl: i64) -> Result<Self, etcd_client::Error> {
        let id = members
            .grant_lease(ttl)
            .await
            .map_err(|failed| failed.error)?;
        let alive = Arc::new(AtomicBool::new(true));
        let keeper = tokio::spawn(keep_alive(members, id, ttl, alive.clone()));
        Ok(WaiterLease { id, alive, keeper })
    }

    /// The etcd lease id.
    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    /// Whether its keep-alive still renews it (false once etcd said it is gone, or renewals
    /// failed for its whole TTL).
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Stops keeping it alive (it lapses at its TTL unless revoked).
    pub(crate) fn stop(&self) {
        self.keeper.abort();
    }
}

/// Keeps the waiter lease alive (every third of its TTL) until it is lost; then marks it dead so
/// the next waiter grants a new one. The keep-alive stream runs on a member that answers, and
/// moves to another when a renewal gets no reply in time or that member is found failing.
async fn keep_alive(members: Arc<Members>, id: i64, ttl: i64, alive: Arc<AtomicBool>) {
    let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or(5));
    let period = ttl / 3;
    let timeout = members.timeout();
    let mut last_ok = Instant::now();
    loop {
        let mut on = None;
        let kept: Result<bool, etcd_client::Error> = async {
            let ((mut keeper, mut stream), member) = members
                .keep_lease_alive(id)
                .await
                .map_err(|failed| failed.error)?;
            on = Some(member);
            loop {
                let renewed = tokio::time::timeout(timeout, async {
                    keeper.keep_alive().await?;
                    stream.message().await
                })
                .await
                .map_err(|_| {
                    etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(
                        "no keep-alive answer in time",
                    ))
                })??;
                match renewed {
                    Some(answer) if answer.ttl() > 0 => last_ok = Instant::now(),
                    _ => return Ok(false), // the lease is gone
                }
                // Wait a period, or less if the member we renew on is found failing.
                let mut failures = members.failures();
                let wait = tokio::time::sleep(period);
                tokio::pin!(wait);
                loop {
                    tokio::select! {
                        () = &mut wait => break,
                        changed = failures.changed() => {
                            if changed.is_err() || members.is_suspect(member) {
                                break;
                            }
                        }
                    }
                }
                if members.is_suspect(member) {
                    return Err(etcd_client::Error::WatchError(format!(
                        "etcd at {} failed a request; moving the keep-alive",
                        members.name(member)
                    )));
                }
            }
        }
        .await;
        match kept {
            Err(error) if last_ok.elapsed() < ttl => {
                if let Some(member) = on {
                    members.failed_by(member, &error);
                }
                tracing::debug!(lease = id, %error, "waiter lease keep-alive failed; retrying");
                tokio::time::sleep(RETRY_DELAY).await;
            }
            _ => break,
        }
    }
    alive.store(false, Ordering::SeqCst);
}
