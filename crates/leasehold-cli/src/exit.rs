//! Exit statuses and the errors that choose them.

use std::process::ExitCode;

/// Success, or for `inspect`: the lock is held.
pub(crate) const OK: u8 = 0;
/// `inspect`: the lock is free.
pub(crate) const FREE: u8 = 1;
/// Bad input: unknown scheme, malformed URL, zero TTL, missing `--force`, ...
pub(crate) const USAGE: u8 = 2;
/// Default status when the lock is held by someone else (sysexits' `EX_TEMPFAIL`: try again
/// later). `leasehold run --conflict-exit-code N` changes it, like `flock -E`.
pub(crate) const DEFAULT_CONFLICT: u8 = 75;
/// Default status of `leasehold run` when the lock was lost while the command ran (renewal found
/// it gone or could not reach the store in time). `--lost-exit-code N` changes it.
pub(crate) const DEFAULT_LOST: u8 = 76;
/// The store cannot be reached (sysexits' `EX_UNAVAILABLE`).
pub(crate) const UNREACHABLE: u8 = 69;
/// Anything else went wrong (sysexits' `EX_SOFTWARE`).
pub(crate) const FAILURE: u8 = 70;

/// An error that ends the command with a given status and one line on stderr.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct CliError {
    pub(crate) status: u8,
    pub(crate) message: String,
}

impl CliError {
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        CliError {
            status: USAGE,
            message: message.into(),
        }
    }

    pub(crate) fn new(status: u8, message: impl Into<String>) -> Self {
        CliError {
            status,
            message: message.into(),
        }
    }

    /// Maps a library error: bad input → 2, unreachable store → 69 naming the address, others → 70.
    /// The message is the error with its causes: the user sees why, not only what.
    pub(crate) fn from_lock(error: leasehold::Error, address: &str) -> Self {
        use leasehold::ErrorKind::*;
        let chain = error.chain();
        match error.kind() {
            InvalidArgument => CliError::usage(chain.to_string()),
            Connection | RetriesExhausted => CliError::new(
                UNREACHABLE,
                format!("cannot reach the store at {address}: {chain}"),
            ),
            // Sent, and the answer lost: unavailable all the same, but say what is unknown.
            InDoubt => CliError::new(
                UNREACHABLE,
                format!(
                    "the store at {address} did not confirm the request (it may or may not have \
                     been applied): {chain}"
                ),
            ),
            _ => CliError::new(FAILURE, chain.to_string()),
        }
    }

    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.status)
    }
}
