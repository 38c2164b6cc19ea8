//! Lease requests on whichever member answers: grant, revoke, keep alive. Each is safe to send
//! twice, so each is hedged across the members ([`Retry::Safe`]): a grant whose reply was lost
//! only leaves a lease nothing lives on, which lapses; revoking twice finds the lease gone the
//! second time; a keep-alive renews twice.

use std::sync::Arc;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

use crate::members::{Failed, Members, Retry};

impl Members {
    /// Grants a lease of `secs` seconds; returns its id.
    pub(crate) async fn grant_lease(&self, secs: i64) -> Result<i64, Failed> {
        self.run(Retry::Safe, |client| {
            let mut lease = client.lease_client();
            async move { lease.grant(secs, None).await }
        })
        .await
        .map(|granted| granted.id())
    }

    /// Revokes lease `id`.
    pub(crate) async fn revoke_lease(&self, id: i64) -> Result<(), Failed> {
        self.run(Retry::Safe, |client| {
            let mut lease = client.lease_client();
            async move { lease.revoke(id).await }
        })
        .await
        .map(drop)
    }

    /// Revokes lease `id` in the background: nobody waits for this; if it fails (or no runtime
    /// runs), the lease lapses at its TTL. Undo work (`spawn_undo`): the lease of an acquisition
    /// the caller stopped waiting for may carry its hold, and a shutdown waits for the revoke.
    pub(crate) fn revoke_lease_later(self: &Arc<Self>, id: i64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let members = self.clone();
        leasehold_core::spawn_undo(&runtime, async move {
            if let Err(failed) = members.revoke_lease(id).await {
                tracing::debug!(lease = id, at = %failed.at, error = %failed.error,
                    "could not revoke a lease; it lapses at its TTL");
            }
        });
    }

    /// Opens a keep-alive of lease `id`: etcd-client sends its first renewal and reads the
    /// answer before it returns (a lease that is gone is its `LeaseKeepAliveError`). Also says
    /// which member answered, for a stream that stays on it.
    pub(crate) async fn keep_lease_alive(
        &self,
        id: i64,
    ) -> Result<((LeaseKeeper, LeaseKeepAliveStream), usize), Failed> {
        self.run_at(Retry::Safe, |client| {
            let mut lease = client.lease_client();
            async move { lease.keep_alive(id).await }
        })
        .await
    }
}
