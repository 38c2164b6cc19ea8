//! The scripts' arguments as the scripts spell them: lock modes (and a record's mode read
//! back), how long a refused writer keeps readers out.

use leasehold_core::{ttl_millis, Acquire, LockMode};
use tokio::time::Instant;

/// The `mode` field of a shared record: `shared`, or `semaphore:N`.
pub(crate) fn mode_field(mode: LockMode) -> String {
    match mode {
        LockMode::Semaphore { permits } => format!("semaphore:{permits}"),
        other => other.as_str().to_owned(),
    }
}

/// The mode a record's `mode` field names (`None`: not one leasehold writes).
pub(crate) fn parse_mode(field: &str) -> Option<LockMode> {
    match field.split_once(':') {
        Some(("semaphore", permits)) => permits
            .parse()
            .ok()
            .and_then(|n| LockMode::semaphore(n).ok()),
        None if field == "shared" => Some(LockMode::Shared),
        None if field == "exclusive" => Some(LockMode::Exclusive),
        _ => None,
    }
}

/// How a conflict names the hold found: `semaphore(3)`, `a read-write lock`, `an exclusive lock`.
pub(crate) fn describe_mode(field: &str) -> String {
    match parse_mode(field) {
        Some(LockMode::Shared) => "a read-write lock (read-held)".to_owned(),
        Some(LockMode::Exclusive) => "an exclusive lock".to_owned(),
        Some(mode) => mode.to_string(),
        None => format!("a record of unknown mode {field:?}"),
    }
}

/// How long a refused blocking writer keeps new readers out: until its deadline, at most its TTL
/// (0 for a try).
pub(crate) fn writer_wait_millis(req: &Acquire, now: Instant) -> u64 {
    req.deadline().map_or(0, |deadline| {
        ttl_millis(deadline.saturating_duration_since(now).min(req.ttl))
    })
}
