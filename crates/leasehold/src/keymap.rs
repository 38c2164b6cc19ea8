//! The concurrent map every in-process structure keyed by lock key uses.

use dashmap::DashMap;

use crate::core::LockKey;

/// A dashmap keyed by lock key, hashed with foldhash instead of std's SipHash.
///
/// Every acquire and release touches one or more of these maps (embedded store, local
/// competition, shutdown tracking), and hashing a 20–60 byte key with SipHash was the largest
/// single cost of a map operation (docs/PERFORMANCE.md). foldhash is the hasher hashbrown uses:
/// several times faster on short strings, randomly seeded so colliding keys cannot be
/// precomputed, and keys are capped at [`MAX_KEY_LEN`](crate::core::MAX_KEY_LEN) bytes.
pub(crate) type KeyMap<V> = DashMap<LockKey, V, foldhash::fast::RandomState>;
