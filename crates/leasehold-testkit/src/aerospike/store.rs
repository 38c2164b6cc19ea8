//! The fixture's records: one namespace, keyed by digest, with generation and expiry.
//!
//! Expiry follows a real server with expiration enabled: a record whose void time has passed is
//! invisible to every operation and is purged, lazily on access and by a periodic sweep.
//! Deadlines are kept on the tokio clock; void times sent to the client are seconds since the
//! citrusleaf epoch (2010-01-01 00:00:00 UTC) on the wall clock.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::wire::Particle;

/// Seconds between the Unix epoch and the citrusleaf epoch (2010-01-01T00:00:00Z).
pub(crate) const CITRUSLEAF_EPOCH_UNIX_SECS: u64 = 1_262_304_000;

/// Expiration value meaning "never expire".
pub(crate) const TTL_NEVER: u32 = 0xFFFF_FFFF;
/// Expiration value meaning "keep the record's current expiry".
pub(crate) const TTL_DONT_UPDATE: u32 = 0xFFFF_FFFE;
/// Expiration value meaning "use the namespace default".
pub(crate) const TTL_NAMESPACE_DEFAULT: u32 = 0;

/// When a record expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// Never.
    Never,
    /// At `deadline` (tokio clock); `void_time` is the same moment in citrusleaf seconds.
    At { deadline: Instant, void_time: u32 },
}

impl Expiry {
    /// An expiry `ttl` from now.
    pub(crate) fn after(ttl: Duration) -> Expiry {
        let now_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(CITRUSLEAF_EPOCH_UNIX_SECS);
        let void = now_unix
            .saturating_sub(CITRUSLEAF_EPOCH_UNIX_SECS)
            .saturating_add(ttl.as_secs());
        Expiry::At {
            deadline: Instant::now() + ttl,
            void_time: u32::try_from(void).unwrap_or(u32::MAX - 2).max(1),
        }
    }

    /// The void time sent to the client: 0 for "never".
    pub(crate) fn void_time(self) -> u32 {
        match self {
            Expiry::Never => 0,
            Expiry::At { void_time, .. } => void_time,
        }
    }

    /// Whether the record is past its void time.
    pub(crate) fn expired(self, now: Instant) -> bool {
        match self {
            Expiry::Never => false,
            Expiry::At { deadline, .. } => deadline <= now,
        }
    }

    /// Time to live left, `None` for never.
    pub(crate) fn remaining(self, now: Instant) -> Option<Duration> {
        match self {
            Expiry::Never => None,
            Expiry::At { deadline, .. } => Some(deadline.saturating_duration_since(now)),
        }
    }
}

/// One stored record.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) set: String,
    /// The user key as sent (particle type, bytes), when the client sent it.
    pub(crate) user_key: Option<Particle>,
    /// Bins in insertion order.
    pub(crate) bins: Vec<(String, Particle)>,
    pub(crate) generation: u16,
    pub(crate) expiry: Expiry,
    /// The record's last-update time, milliseconds since the citrusleaf epoch on the wall clock
    /// (as the server keeps it in its index): 0 while the write creating the record runs, set
    /// when a write completes.
    pub(crate) last_update_ms: u64,
}

/// The wall clock in milliseconds since the citrusleaf epoch, the server's clock for
/// last-update times and `since_update`.
pub(crate) fn clepoch_now_ms() -> u64 {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    unix_ms.saturating_sub(CITRUSLEAF_EPOCH_UNIX_SECS * 1000)
}

impl Record {
    pub(crate) fn bin(&self, name: &str) -> Option<&Particle> {
        self.bins.iter().find(|(n, _)| n == name).map(|(_, p)| p)
    }

    pub(crate) fn set_bin(&mut self, name: &str, value: Particle) {
        match self.bins.iter_mut().find(|(n, _)| n == name) {
            Some((_, slot)) => *slot = value,
            None => self.bins.push((name.to_owned(), value)),
        }
    }

    pub(crate) fn remove_bin(&mut self, name: &str) {
        self.bins.retain(|(n, _)| n != name);
    }
}

/// The next generation after `generation`: +1, wrapping from 65535 to 1 (never 0), as the
/// server's 16-bit generation does.
pub(crate) fn next_generation(generation: u16) -> u16 {
    match generation.wrapping_add(1) {
        0 => 1,
        g => g,
    }
}

/// All records of the namespace.
#[derive(Debug, Default)]
pub(crate) struct Store {
    records: BTreeMap<[u8; 20], Record>,
}

impl Store {
    /// The live record with `digest`, purging it first if it has expired.
    pub(crate) fn get_live(&mut self, digest: &[u8; 20], now: Instant) -> Option<&mut Record> {
        if self
            .records
            .get(digest)
            .is_some_and(|r| r.expiry.expired(now))
        {
            self.records.remove(digest);
        }
        self.records.get_mut(digest)
    }

    pub(crate) fn insert(&mut self, digest: [u8; 20], record: Record) {
        self.records.insert(digest, record);
    }

    pub(crate) fn remove(&mut self, digest: &[u8; 20]) -> Option<Record> {
        self.records.remove(digest)
    }

    /// Drops every expired record; returns how many.
    pub(crate) fn purge_expired(&mut self, now: Instant) -> usize {
        let before = self.records.len();
        self.records.retain(|_, r| !r.expiry.expired(now));
        before - self.records.len()
    }

    /// Live records in digest order, optionally of one set.
    pub(crate) fn live<'a>(
        &'a self,
        set: Option<&'a str>,
        now: Instant,
    ) -> impl Iterator<Item = (&'a [u8; 20], &'a Record)> + 'a {
        self.records
            .iter()
            .filter(move |(_, r)| !r.expiry.expired(now) && set.is_none_or(|s| s == r.set))
    }

    /// Removes every record.
    pub(crate) fn clear(&mut self) {
        self.records.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_wraps_to_one() {
        assert_eq!(next_generation(1), 2);
        assert_eq!(next_generation(u16::MAX), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_records_are_invisible_and_purged() {
        let mut store = Store::default();
        let rec = Record {
            set: "s".into(),
            user_key: None,
            bins: vec![],
            generation: 1,
            expiry: Expiry::after(Duration::from_secs(1)),
            last_update_ms: clepoch_now_ms(),
        };
        store.insert([1; 20], rec.clone());
        store.insert(
            [2; 20],
            Record {
                expiry: Expiry::Never,
                ..rec
            },
        );
        assert!(store.get_live(&[1; 20], Instant::now()).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        let now = Instant::now();
        assert_eq!(store.live(Some("s"), now).count(), 1);
        assert!(store.get_live(&[1; 20], now).is_none());
        assert_eq!(store.purge_expired(now), 0);
        assert!(store.get_live(&[2; 20], now).is_some());
    }
}
