//! The lock history (the fleet-wide lock trace): a bounded, expiring log per key kept in the
//! store itself, so an operator sees what every instance did to a lock without collecting logs.
//!
//! Opt-in per acquisition ([`Acquire::with_trace`](crate::Acquire::with_trace)); the lease carries
//! the setting so the release and renewals of that lease are traced too. Stores with
//! [`Capabilities::history`](crate::Capabilities::history) write the entry in the same round trip
//! as the operation where they can, and read it back with
//! [`LockStore::history`](crate::LockStore::history).

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::token::OwnerToken;

/// How a traced key's history is kept: at most `max_entries` entries (the oldest go first), the
/// whole log expiring `ttl` after its last write.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::TraceConfig;
/// let trace = TraceConfig::new(50, Duration::from_secs(3600))?;
/// assert_eq!(trace.max_entries(), 50);
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceConfig {
    max_entries: u32,
    ttl: Duration,
}

impl TraceConfig {
    /// Default number of entries kept per key.
    pub const DEFAULT_MAX_ENTRIES: u32 = 100;
    /// Default lifetime of a key's history after its last write (one day).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);

    /// A bound and a lifetime. `max_entries` must be 1..=10 000 and `ttl` at least one second and
    /// at most [`MAX_TTL`](crate::MAX_TTL), or [`ErrorKind::InvalidArgument`](crate::ErrorKind).
    pub fn new(max_entries: u32, ttl: Duration) -> Result<Self> {
        if !(1..=10_000).contains(&max_entries) {
            return Err(Error::invalid_argument(format!(
                "trace length {max_entries} is out of range: keep 1 to 10000 entries per key"
            )));
        }
        if ttl < Duration::from_secs(1) || ttl > crate::ttl::MAX_TTL {
            return Err(Error::invalid_argument(format!(
                "trace TTL {ttl:?} is out of range: keep a key's history from 1s to 30 days"
            )));
        }
        Ok(TraceConfig { max_entries, ttl })
    }

    /// Entries kept per key.
    pub fn max_entries(&self) -> u32 {
        self.max_entries
    }

    /// How long a key's history lives after its last write.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig {
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            ttl: Self::DEFAULT_TTL,
        }
    }
}

/// What a process did to a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HistoryEvent {
    /// Took the lock.
    Acquired,
    /// A single attempt found it held (a try-lock failed).
    Refused,
    /// An attempt of a blocking acquisition found it held; the process goes on waiting.
    Waited,
    /// Released it.
    Released,
    /// Sent a release but the lock was no longer its own (expired, or taken after expiry).
    NotHeld,
    /// Lost it: a renewal found the record gone or owned by another.
    Lost,
    /// Did not send its release because the unlock window had closed.
    Skipped,
}

impl HistoryEvent {
    /// The stable name stored in the history: `acquired`, `refused`, `waited`, `released`,
    /// `not_held`, `lost`, `skipped`.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryEvent::Acquired => "acquired",
            HistoryEvent::Refused => "refused",
            HistoryEvent::Waited => "waited",
            HistoryEvent::Released => "released",
            HistoryEvent::NotHeld => "not_held",
            HistoryEvent::Lost => "lost",
            HistoryEvent::Skipped => "skipped",
        }
    }

    /// The event of a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "acquired" => HistoryEvent::Acquired,
            "refused" => HistoryEvent::Refused,
            "waited" => HistoryEvent::Waited,
            "released" => HistoryEvent::Released,
            "not_held" => HistoryEvent::NotHeld,
            "lost" => HistoryEvent::Lost,
            "skipped" => HistoryEvent::Skipped,
            _ => return None,
        })
    }
}

impl fmt::Display for HistoryEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of a key's history: when, what, which acquisition (owner token), from which host
/// and process.
///
/// Stored as one tab-separated string (`event, unix ms, token, host, pid, detail`) so every store
/// can keep it in a plain list and a script can choose the event without parsing anything.
///
/// ```
/// use leasehold_core::{HistoryEntry, HistoryEvent, OwnerToken};
/// let entry = HistoryEntry::new(HistoryEvent::Acquired, &OwnerToken::generate(), "ttl 5s");
/// let stored = entry.encode();
/// assert_eq!(HistoryEntry::decode(&stored)?, entry);
/// assert_eq!(entry.pid, std::process::id());
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// When (this process's wall clock, millisecond precision).
    pub at: SystemTime,
    /// What happened.
    pub event: HistoryEvent,
    /// The owner token of the acquisition concerned.
    pub token: String,
    /// The host the process runs on.
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// Free text (a TTL, a reason); tabs and newlines are replaced by spaces.
    pub detail: String,
}

fn hostname() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| gethostname::gethostname().to_string_lossy().into_owned())
}

fn clean(text: &str) -> String {
    text.replace(['\t', '\n', '\r'], " ")
}

impl HistoryEntry {
    /// An entry for this process, now.
    pub fn new(event: HistoryEvent, token: &OwnerToken, detail: impl AsRef<str>) -> Self {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        HistoryEntry {
            at: UNIX_EPOCH + Duration::from_millis(at_ms),
            event,
            token: clean(token.as_str()),
            host: clean(hostname()),
            pid: std::process::id(),
            detail: clean(detail.as_ref()),
        }
    }

    /// Milliseconds since the Unix epoch.
    pub fn at_millis(&self) -> u64 {
        self.at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// The stored form.
    pub fn encode(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            self.event,
            self.at_millis(),
            self.token,
            self.host,
            self.pid,
            self.detail
        )
    }

    /// Reads a stored entry back; [`ErrorKind::Internal`](crate::ErrorKind::Internal) naming the
    /// text if it is not one.
    pub fn decode(stored: &str) -> Result<Self> {
        let bad = || {
            Error::new(
                crate::error::ErrorKind::Internal,
                format!("not a lock history entry: {stored:?}; was the trace list written by another program?"),
            )
        };
        let mut parts = stored.splitn(6, '\t');
        let mut next = || parts.next().ok_or_else(bad);
        let event = HistoryEvent::parse(next()?).ok_or_else(bad)?;
        let at: u64 = next()?.parse().map_err(|_| bad())?;
        let token = next()?.to_owned();
        let host = next()?.to_owned();
        let pid: u32 = next()?.parse().map_err(|_| bad())?;
        let detail = next()?.to_owned();
        Ok(HistoryEntry {
            at: UNIX_EPOCH + Duration::from_millis(at),
            event,
            token,
            host,
            pid,
            detail,
        })
    }
}

impl fmt::Display for HistoryEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}:{} {}",
            self.at_millis(),
            self.event,
            self.host,
            self.pid,
            self.token
        )?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_reject_garbage() {
        let token = OwnerToken::generate();
        let entry = HistoryEntry::new(HistoryEvent::Skipped, &token, "late\tby 3ms\n");
        assert_eq!(entry.detail, "late by 3ms ");
        assert_eq!(HistoryEntry::decode(&entry.encode()).unwrap(), entry);
        assert!(HistoryEntry::decode("nonsense").is_err());
        assert!(HistoryEntry::decode("acquired\tx\tt\th\t1\t").is_err());
    }

    #[test]
    fn trace_config_bounds_are_checked() {
        assert!(TraceConfig::new(0, Duration::from_secs(5)).is_err());
        assert!(TraceConfig::new(10, Duration::from_millis(10)).is_err());
        assert!(TraceConfig::new(10, Duration::from_secs(5)).is_ok());
    }
}
