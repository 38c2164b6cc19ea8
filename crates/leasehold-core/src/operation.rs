//! What a call to a store was doing when it failed, as a value an error carries (opendal's
//! `Operation`): metrics, logs and callers can tell a failed release from a failed acquire
//! without reading messages.

use std::fmt;

/// The store operation an [`Error`](crate::Error) comes from
/// ([`Error::operation`](crate::Error::operation)).
///
/// ```
/// use leasehold_core::{Error, Operation};
/// let err = Error::connection("no reply from 10.0.0.7:6379").with_operation(Operation::Release);
/// assert_eq!(err.operation(), Some(Operation::Release));
/// assert!(Operation::Release.is_write());
/// assert_eq!(Operation::Release.as_str(), "release");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Connecting to the store, or checking it before first use.
    Connect,
    /// Taking a lock (one attempt).
    Acquire,
    /// Releasing a lock.
    Release,
    /// Extending a lease.
    Extend,
    /// Reading who holds a lock.
    Inspect,
    /// Listing held locks.
    List,
    /// Reading a lock's history.
    History,
    /// Closing the store.
    Shutdown,
}

impl Operation {
    /// A stable snake_case label (for metrics attributes and log fields).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Connect => "connect",
            Operation::Acquire => "acquire",
            Operation::Release => "release",
            Operation::Extend => "extend",
            Operation::Inspect => "inspect",
            Operation::List => "list",
            Operation::History => "history",
            Operation::Shutdown => "shutdown",
        }
    }

    /// Whether the operation changes a lock: when its reply is lost, the outcome is in doubt
    /// ([`ErrorKind::InDoubt`](crate::ErrorKind::InDoubt)); a read that lost its reply changed
    /// nothing.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Operation::Acquire | Operation::Release | Operation::Extend
        )
    }
}

impl fmt::Display for Operation {
    /// In words, as messages use it (`the acquire`, `the connection`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Connect => "connection",
            Operation::History => "history read",
            other => other.as_str(),
        })
    }
}
