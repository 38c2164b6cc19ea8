//! What every case starts from: a key of its own, and the TTL of a lock no case sees expire.

use std::time::Duration;

use leasehold_core::LockKey;

/// A fresh key for one case: `DC#conf#conformance#<case>-<uuid>` (the farm id fits Aerospike's
/// nine-character bound).
pub fn fresh_key(case: &str) -> LockKey {
    let entity = format!("{case}-{}", uuid::Uuid::new_v4().simple());
    LockKey::dc("conf", "conformance", &entity).expect("valid conformance key")
}

/// A lease long enough that no case sees it expire by itself.
pub(super) const LONG: Duration = Duration::from_secs(30);
