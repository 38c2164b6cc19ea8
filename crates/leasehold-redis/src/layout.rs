//! The names of a lock's Redis keys and channels: `<prefix><kind><lock key>`, with the lock key
//! in a hash tag on a cluster, so that every key of one lock lives in one slot.

use leasehold_core::LockKey;

use crate::store::RedisStore;

impl RedisStore {
    /// `<prefix><kind><lock key>`; on a cluster `<prefix><kind>{<lock key>}`, so that every key
    /// of one lock hashes to one slot and each operation stays one script on one node.
    ///
    /// An operation names up to six of these, so they are joined with `concat` (one allocation of
    /// the exact size): with `format!` the naming was a sixth of the client's instructions in an
    /// uncontended acquire + release.
    fn key_of(&self, kind: &str, key: &LockKey) -> String {
        let prefix = self.inner.config.prefix.as_str();
        if self.inner.cluster {
            [prefix, kind, "{", key.as_str(), "}"].concat()
        } else {
            [prefix, kind, key.as_str()].concat()
        }
    }

    /// The lock key of a Redis key [`lock_key`](Self::lock_key) made, if it is one.
    pub(crate) fn lock_key_of<'a>(&self, redis_key: &'a str) -> Option<&'a str> {
        let rest = redis_key.strip_prefix(&self.inner.config.prefix)?;
        if self.inner.cluster {
            rest.strip_prefix('{')?.strip_suffix('}')
        } else {
            Some(rest)
        }
    }

    /// The Redis key of a lock: `<prefix><lock key>` (on a cluster `<prefix>{<lock key>}`).
    pub fn lock_key(&self, key: &LockKey) -> String {
        self.key_of("", key)
    }

    /// The Redis key of a lock's fence counter: `<prefix>fence:<lock key>` (on a cluster
    /// `<prefix>fence:{<lock key>}`).
    pub fn fence_key(&self, key: &LockKey) -> String {
        self.key_of("fence:", key)
    }

    /// The Redis key of a lock's history (the lock trace): `<prefix>trace:<lock key>` (on a
    /// cluster `<prefix>trace:{<lock key>}`), a list, newest entry first.
    pub fn trace_key(&self, key: &LockKey) -> String {
        self.key_of("trace:", key)
    }

    /// The Redis key of a lock's waiter queue: `<prefix>queue:<lock key>` (a list of waiter ids;
    /// on a cluster `<prefix>queue:{<lock key>}`).
    pub fn queue_key(&self, key: &LockKey) -> String {
        self.key_of("queue:", key)
    }

    /// The Redis key of a lock's waiter deadlines: `<prefix>queue-deadline:<lock key>` (a hash;
    /// on a cluster `<prefix>queue-deadline:{<lock key>}`).
    pub fn queue_deadline_key(&self, key: &LockKey) -> String {
        self.key_of("queue-deadline:", key)
    }

    /// The pub/sub channel on which every grant and release of a lock taken with
    /// [`Acquire::announce`](leasehold_core::Acquire::announce) (an election's) is announced:
    /// `<prefix>changed:<Redis lock key>`, e.g. `leasehold:changed:leasehold:DC#f1#orders#o-42`
    /// (on a cluster a sharded channel sharing the lock's hash
    /// tag), with the token granted or released as the message.
    /// [`LockStore::watch_changes`](leasehold_core::LockStore::watch_changes)
    /// subscribes to it.
    pub fn change_channel(&self, key: &LockKey) -> String {
        self.change_channel_of(&self.lock_key(key))
    }

    /// [`change_channel`](Self::change_channel) from the lock's Redis key, for an operation
    /// that has it already.
    pub(crate) fn change_channel_of(&self, lock_key: &str) -> String {
        self.inner.waiting.changes().channel(lock_key)
    }

    /// The change channel a script call on `lock_key` names: only a call that announces (the
    /// server makes a string of every key on every call, and most locks are never announced), or
    /// a traced one (its script counts the trace's key from the end, after the channel).
    pub(crate) fn change_channel_if(
        &self,
        lock_key: &str,
        announce: bool,
        traced: bool,
    ) -> Option<String> {
        (announce || traced).then(|| self.change_channel_of(lock_key))
    }
}
