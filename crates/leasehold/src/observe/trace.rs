//! The lock trace: a bounded ring of recent lock events.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::core::{LockEvent, Observer};

/// One line of the lock trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// When the event happened.
    pub at: SystemTime,
    /// The lock key.
    pub key: String,
    /// The event name (`acquired`, `released`, `lost`, ...).
    pub event: &'static str,
    /// Who, how long, how it ended, in words.
    pub detail: String,
}

/// A bounded in-memory ring of recent lock events, for ops to dump when a lock misbehaves: who
/// acquired what, how long they waited, how long they held it, and how it ended.
///
/// Attach it as an observer and keep a clone to read from; when full, the oldest entry goes.
///
/// ```
/// use leasehold::{LockManager, observe::LockTrace};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let trace = LockTrace::new(1000);
/// let locks = LockManager::builder().client_id("app").farm_id("f1").observer(trace.clone()).build()?;
/// locks.try_lock("k").await?.release().await?;
/// let events: Vec<_> = trace.entries().iter().map(|e| e.event).collect();
/// assert_eq!(events, ["acquired", "released"]);
/// print!("{trace}"); // one line per event
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LockTrace {
    inner: Arc<Mutex<Ring>>,
}

#[derive(Debug)]
struct Ring {
    capacity: usize,
    entries: VecDeque<TraceEntry>,
}

impl LockTrace {
    /// A trace keeping the last `capacity` events (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        LockTrace {
            inner: Arc::new(Mutex::new(Ring {
                capacity,
                entries: VecDeque::with_capacity(capacity.min(4096)),
            })),
        }
    }

    /// A copy of the entries, oldest first.
    pub fn entries(&self) -> Vec<TraceEntry> {
        self.ring().entries.iter().cloned().collect()
    }

    /// Entries about `key` (a storage key such as `DC#f1#app#k`), oldest first.
    pub fn entries_for(&self, key: &str) -> Vec<TraceEntry> {
        self.ring()
            .entries
            .iter()
            .filter(|e| e.key == key)
            .cloned()
            .collect()
    }

    /// Empties the trace.
    pub fn clear(&self) {
        self.ring().entries.clear();
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn describe(event: &LockEvent) -> String {
    match event {
        LockEvent::Acquired {
            token,
            fencing_token,
            waited,
            attempts,
            ..
        } => {
            let fence = fencing_token
                .map(|f| format!(", fencing token {f}"))
                .unwrap_or_default();
            format!("by {token} after waiting {waited:?} ({attempts} attempts){fence}")
        }
        LockEvent::AcquireFailed {
            error,
            waited,
            attempts,
            ..
        } => format!("{error} after {waited:?} ({attempts} attempts)"),
        LockEvent::Contended { .. } => "held by another owner".to_owned(),
        LockEvent::FastFailed { .. } => "refused locally: another task holds it".to_owned(),
        LockEvent::RecoveredByReadback {
            operation, held, ..
        } => format!("{operation} reply lost; readback found it ours: {held}"),
        LockEvent::ReleaseSkipped { reason, .. } => format!("release skipped: {reason}"),
        LockEvent::Reentered { depth, .. } => format!("reentered, depth {depth}"),
        LockEvent::HandedOff { consecutive, .. } => {
            format!("handed to a local waiter ({consecutive} in a row)")
        }
        LockEvent::Released {
            held_for, was_held, ..
        } => {
            if *was_held {
                format!("released after holding {held_for:?}")
            } else {
                format!("release after {held_for:?} found it no longer ours")
            }
        }
        LockEvent::ReleasedAtShutdown { .. } => "released by graceful shutdown".to_owned(),
        LockEvent::Renewed { .. } => "lease renewed".to_owned(),
        LockEvent::Lost { reason, .. } => format!("lost: {reason}"),
        LockEvent::LeftToExpire {
            error,
            expires_in,
            attempts,
            ..
        } => format!(
            "release gave up after {attempts} attempts ({error}); left to expire in {expires_in:?}"
        ),
        _ => String::new(),
    }
}

impl Observer for LockTrace {
    fn on_event(&self, event: &LockEvent) {
        // A guard's end adds nothing to its release's own entry (or its left-to-expire one).
        if matches!(event, LockEvent::GuardEnded { .. }) {
            return;
        }
        let entry = TraceEntry {
            at: SystemTime::now(),
            key: event.key().as_str().to_owned(),
            event: event.name(),
            detail: describe(event),
        };
        let mut ring = self.ring();
        if ring.entries.len() == ring.capacity {
            ring.entries.pop_front();
        }
        ring.entries.push_back(entry);
    }
}

impl fmt::Display for LockTrace {
    /// One line per entry: `<epoch ms> <key> <event> <detail>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in self.ring().entries.iter() {
            let ms =
                e.at.duration_since(UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0);
            writeln!(f, "{ms} {} {} {}", e.key, e.event, e.detail)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::LockKey;
    use std::time::Duration;

    #[test]
    fn keeps_only_the_most_recent_entries() {
        let trace = LockTrace::new(3);
        let key = LockKey::xdc("c", "e").unwrap();
        for depth in 1..=5 {
            trace.on_event(&LockEvent::Reentered {
                key: key.clone(),
                depth,
            });
        }
        let details: Vec<_> = trace.entries().into_iter().map(|e| e.detail).collect();
        assert_eq!(
            details,
            [
                "reentered, depth 3",
                "reentered, depth 4",
                "reentered, depth 5"
            ]
        );
        trace.on_event(&LockEvent::Released {
            key: key.clone(),
            held_for: Duration::from_millis(5),
            was_held: false,
        });
        assert!(trace.to_string().contains("found it no longer ours"));
        assert_eq!(trace.entries_for("XDC#c#e").len(), 3);
        assert!(trace.entries_for("XDC#c#other").is_empty());
        trace.clear();
        assert!(trace.entries().is_empty());
    }
}
