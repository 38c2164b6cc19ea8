//! Lock modes: the kinds of hold a key can be taken in.
//!
//! A key is, at any moment, free or held in exactly one way: exclusively (one holder), shared
//! (any number of readers), or as a semaphore (up to N permit holders). The exclusive hold *is*
//! the write side of a read-write lock: `write(key)` and `lock(key)` take the same lock, so a
//! plain exclusive lock and a reader of the same key exclude each other without any agreement
//! between their callers.

use std::fmt;

use crate::error::{Error, Result};

/// Most permits a semaphore may have. More is almost always a unit mistake, and every store keeps
/// one entry per permit holder in one record.
pub const MAX_PERMITS: u32 = 10_000;

/// Which kind of hold an acquisition asks for (the Java lock manager's `LockMode`, with the
/// shared modes it reserved "for forward compatibility").
///
/// ```
/// use leasehold_core::LockMode;
///
/// let mode = LockMode::semaphore(3)?;
/// assert_eq!(mode.permits(), Some(3));
/// assert!(mode.is_shared_record());
/// assert!(LockMode::semaphore(0).is_err());
/// assert_eq!(LockMode::default(), LockMode::Exclusive);
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]

pub enum LockMode {
    /// One holder; also the write side of a read-write lock. Fenced.
    #[default]
    Exclusive,
    /// The read side of a read-write lock: many readers at once, never together with a writer.
    /// A blocking writer that waits stops new readers from entering, so writers do not starve.
    Shared,
    /// One of `permits` permits of a semaphore. Every permit is its own owner-checked lease.
    Semaphore {
        /// How many holders the semaphore admits at once (1..=[`MAX_PERMITS`]). Part of the
        /// lock's definition: callers that disagree get [`ErrorKind::ModeConflict`].
        ///
        /// [`ErrorKind::ModeConflict`]: crate::ErrorKind::ModeConflict
        permits: u32,
    },
}

impl LockMode {
    /// A semaphore mode, with `permits` checked (1..=[`MAX_PERMITS`]) before any store I/O.
    pub fn semaphore(permits: u32) -> Result<Self> {
        let mode = LockMode::Semaphore { permits };
        mode.validate()?;
        Ok(mode)
    }

    /// Checks the mode's parameters: a semaphore needs 1..=[`MAX_PERMITS`] permits.
    pub fn validate(self) -> Result<()> {
        match self {
            LockMode::Semaphore { permits: 0 } => Err(Error::invalid_argument(
                "a semaphore needs at least 1 permit (use 1 for a lock that expires per holder)",
            )),
            LockMode::Semaphore { permits } if permits > MAX_PERMITS => {
                Err(Error::invalid_argument(format!(
                    "a semaphore of {permits} permits is over the maximum of {MAX_PERMITS}; \
                     a limit that high is no limit, drop the semaphore"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The semaphore's permit count, if this is a semaphore.
    pub fn permits(self) -> Option<u32> {
        match self {
            LockMode::Semaphore { permits } => Some(permits),
            _ => None,
        }
    }

    /// Whether holds of this mode live in a holder map (readers, permits) rather than in the
    /// single-owner exclusive record.
    pub fn is_shared_record(self) -> bool {
        !matches!(self, LockMode::Exclusive)
    }

    /// A short stable name for logs, metrics, the CLI and store records: `exclusive`, `shared`,
    /// `semaphore`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
            LockMode::Semaphore { .. } => "semaphore",
        }
    }

    /// The error for a request whose mode disagrees with how the key is held now.
    pub fn conflict(self, held: &str, key: &crate::key::LockKey) -> Error {
        Error::new(
            crate::error::ErrorKind::ModeConflict,
            format!(
                "asked for a {self} hold but the key is in use as {held}; every caller of a key \
                 must use the same kind of lock (and a semaphore the same number of permits)"
            ),
        )
        .with_key(key.as_str())
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockMode::Semaphore { permits } => write!(f, "semaphore({permits})"),
            other => f.write_str(other.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_bounded() {
        assert!(LockMode::semaphore(1).is_ok());
        assert!(LockMode::semaphore(MAX_PERMITS).is_ok());
        let err = LockMode::semaphore(MAX_PERMITS + 1).unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::InvalidArgument);
        assert!(LockMode::Shared.validate().is_ok());
    }

    #[test]
    fn display_names_the_permits() {
        assert_eq!(LockMode::semaphore(3).unwrap().to_string(), "semaphore(3)");
        assert_eq!(LockMode::Shared.to_string(), "shared");
    }
}
