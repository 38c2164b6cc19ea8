//! What the real-client tests of the fixture share.

use aerospike::{Client, ClientPolicy};
use leasehold_testkit::aerospike::AerospikeTarget;

/// A raw `aerospike` client connected to `target` (with its credentials, if any).
pub(crate) async fn client(target: &AerospikeTarget) -> Client {
    let mut policy = ClientPolicy::default();
    if let Some((user, password)) = target.credentials() {
        policy.auth_mode = aerospike::policy::AuthMode::Internal(user.into(), password.into());
    }
    Client::new(&policy, &target.hosts())
        .await
        .expect("connect to the Aerospike target")
}
