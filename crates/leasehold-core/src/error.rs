//! One error type for every store and layer: a kind, whether retrying can help, the key it
//! concerns, and the cause.

use std::fmt;

use crate::operation::Operation;

/// `Result` with leasehold's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong. The first five are the seed lock manager's error codes; the rest are what it
/// lacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock is held by another owner (seed: `LOCK_UNAVAILABLE`). Temporary: try again later or
    /// wait with `lock()`.
    LockUnavailable,
    /// The store could not be reached or failed with an I/O error (seed: `CONNECTION_ERROR`).
    /// Nothing was applied. Temporary.
    Connection,
    /// Every retry of a store operation failed (seed: `RETRIES_EXHAUSTED`). The cause is the last
    /// attempt's error. Temporary.
    RetriesExhausted,
    /// The store is not set up for locks: namespace, table or set missing, permission denied
    /// (seed: `TABLE_CREATION_ERROR`). Permanent until an operator fixes it.
    StoreSetup,
    /// A bug or an answer the store should never give (seed: `INTERNAL_ERROR`). Permanent.
    Internal,
    /// Bad input, caught before any store I/O: empty or oversized key, zero or absurd TTL, bad URL.
    /// Permanent: fix the call.
    InvalidArgument,
    /// The lock is not (or no longer) ours: it expired, was broken by an operator, or was taken by
    /// someone else after expiry. Permanent for this lease.
    NotHeld,
    /// The request may or may not have been applied: the store did not answer after the request was
    /// sent (timeout, connection lost). Read the record back to learn the outcome; the readback
    /// layer does this for you. Temporary.
    InDoubt,
    /// The wait deadline of a blocking acquire passed while the lock stayed held by another owner.
    Timeout,
    /// The manager or store is shutting down and takes no new acquisitions. Permanent.
    ShutDown,
    /// The store does not support this operation (see its capabilities). Permanent.
    Unsupported,
    /// The key is in use as another kind of lock (a semaphore of another permit count, a
    /// semaphore against a read-write lock), or the same holder asked for a hold that could only
    /// deadlock on itself (a write under its own read, a read under its own write). Permanent:
    /// use one kind of lock per key, and release a read before asking for the write.
    ModeConflict,
}

impl ErrorKind {
    /// Whether trying the same thing again later can succeed.
    pub fn is_temporary(self) -> bool {
        matches!(
            self,
            ErrorKind::LockUnavailable
                | ErrorKind::Connection
                | ErrorKind::RetriesExhausted
                | ErrorKind::InDoubt
                | ErrorKind::Timeout
        )
    }

    /// A short stable name (`lock_unavailable`, `connection`, ...), used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::LockUnavailable => "lock_unavailable",
            ErrorKind::Connection => "connection",
            ErrorKind::RetriesExhausted => "retries_exhausted",
            ErrorKind::StoreSetup => "store_setup",
            ErrorKind::Internal => "internal",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NotHeld => "not_held",
            ErrorKind::InDoubt => "in_doubt",
            ErrorKind::Timeout => "timeout",
            ErrorKind::ShutDown => "shut_down",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::ModeConflict => "mode_conflict",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::LockUnavailable => "lock unavailable",
            ErrorKind::Connection => "store connection error",
            ErrorKind::RetriesExhausted => "store retries exhausted",
            ErrorKind::StoreSetup => "store setup error",
            ErrorKind::Internal => "internal error",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::NotHeld => "lock not held",
            ErrorKind::InDoubt => "outcome in doubt",
            ErrorKind::Timeout => "timed out waiting for lock",
            ErrorKind::ShutDown => "shut down",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::ModeConflict => "lock mode conflict",
        })
    }
}

/// A leasehold error: what failed, on which key, what to do, and why (the source).
///
/// Like the standard library's errors, its `Display` says what failed and what to do, without
/// the cause: the cause is [`source()`](std::error::Error::source), so an error reporter walking
/// the chain (`anyhow`, [`Error::chain`]) shows it once. Print `error.chain()` where a user or a
/// log needs the whole story on one line.
///
/// ```
/// use leasehold_core::{Error, ErrorKind};
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let err = Error::connection("cannot reach 127.0.0.1:6379").with_source(io);
/// assert_eq!(err.kind(), ErrorKind::Connection);
/// assert!(err.is_temporary());
/// assert!(std::error::Error::source(&err).is_some());
/// assert_eq!(err.to_string(), "store connection error: cannot reach 127.0.0.1:6379");
/// ```
#[derive(thiserror::Error)]
#[error("{kind}{}: {message}", fmt_key(.key))]
pub struct Error {
    kind: ErrorKind,
    message: String,
    key: Option<String>,
    operation: Option<Operation>,
    #[source]
    source: Option<Source>,
}

fn fmt_key(key: &Option<String>) -> String {
    key.as_ref().map(|k| format!(" on {k}")).unwrap_or_default()
}

/// An error followed by its causes (its [`source()`](std::error::Error::source) chain) on one
/// line, joined by `": "`: what [`Error::chain`] returns. Line breaks and runs of spaces within
/// an error's text become single spaces, and a cause whose text is already shown (a client that
/// repeats its own cause in its message) is not repeated.
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl<'a> ErrorChain<'a> {
    /// The chain of any error, for code in this crate that reads a foreign error's causes.
    pub(crate) fn of(error: &'a (dyn std::error::Error + 'static)) -> Self {
        ErrorChain(error)
    }
}

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = one_line(self.0);
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = one_line(cause);
            if !shown.contains(&text) {
                shown.push_str(": ");
                shown.push_str(&text);
            }
            source = cause.source();
        }
        f.write_str(&shown)
    }
}

/// An error's text with its whitespace collapsed: some clients spread theirs over several lines.
fn one_line(error: &dyn std::error::Error) -> String {
    error
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

impl Error {
    /// An error of `kind` with a message saying what failed and what to do.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            key: None,
            operation: None,
            source: None,
        }
    }

    /// [`ErrorKind::LockUnavailable`] for `key` (a [`LockKey`](crate::LockKey), or its text).
    pub fn unavailable(key: impl AsRef<str>) -> Self {
        Error::new(
            ErrorKind::LockUnavailable,
            "held by another owner; retry later or wait with lock()",
        )
        .with_key(key.as_ref())
    }

    /// [`ErrorKind::InvalidArgument`].
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// [`ErrorKind::Connection`].
    pub fn connection(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Connection, message)
    }

    /// [`ErrorKind::InDoubt`].
    pub fn in_doubt(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InDoubt, message)
    }

    /// [`ErrorKind::NotHeld`].
    pub fn not_held(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotHeld, message)
    }

    /// [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal, message)
    }

    /// [`ErrorKind::ShutDown`].
    pub fn shut_down() -> Self {
        Error::new(
            ErrorKind::ShutDown,
            "the lock manager is shutting down and takes no new acquisitions",
        )
    }

    /// [`ErrorKind::Unsupported`] for an operation the named store lacks.
    pub fn unsupported(store: &str, operation: &str) -> Self {
        Error::new(
            ErrorKind::Unsupported,
            format!("the {store} store does not support {operation}"),
        )
    }

    /// Records the storage key the error concerns.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Records the cause.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The storage key concerned, if known.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Records the store operation that failed.
    pub fn with_operation(mut self, operation: Operation) -> Self {
        self.operation = Some(operation);
        self
    }

    /// The store call that failed, as the store said: the Redis, etcd and Aerospike stores name
    /// it on every failure to reach or use their server (connecting, a lost reply, a connection
    /// error, the server refusing the request). An error raised without a store call (a bad
    /// argument found before any I/O, a wait that timed out, a refusal in memory) carries none,
    /// and a lock held by another owner (`LockUnavailable`) need not.
    ///
    /// ```
    /// use leasehold_core::{Error, Operation};
    /// let err = Error::connection("no node answered").with_operation(Operation::Acquire);
    /// assert_eq!(err.operation(), Some(Operation::Acquire));
    /// assert_eq!(Error::invalid_argument("an empty key").operation(), None);
    /// ```
    pub fn operation(&self) -> Option<Operation> {
        self.operation
    }

    /// This error and its causes on one line, joined by `": "`, for a user or a log that needs
    /// the whole story (`Display` alone leaves the cause to [`source()`](std::error::Error::source)).
    ///
    /// ```
    /// use leasehold_core::Error;
    ///
    /// let io = std::io::Error::other("connection refused");
    /// let err = Error::connection("cannot reach 127.0.0.1:6379").with_source(io);
    /// assert_eq!(err.to_string(), "store connection error: cannot reach 127.0.0.1:6379");
    /// assert_eq!(
    ///     err.chain().to_string(),
    ///     "store connection error: cannot reach 127.0.0.1:6379: connection refused"
    /// );
    /// ```
    pub fn chain(&self) -> ErrorChain<'_> {
        ErrorChain(self)
    }

    /// The message, without kind or key.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether trying again later can succeed (see [`ErrorKind::is_temporary`]).
    pub fn is_temporary(&self) -> bool {
        self.kind.is_temporary()
    }

    /// Shorthand for `kind() == ErrorKind::LockUnavailable`.
    pub fn is_unavailable(&self) -> bool {
        self.kind == ErrorKind::LockUnavailable
    }

    /// Shorthand for `kind() == ErrorKind::InDoubt`.
    pub fn is_in_doubt(&self) -> bool {
        self.kind == ErrorKind::InDoubt
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(key) = &self.key {
            d.field("key", key);
        }
        if let Some(operation) = self.operation {
            d.field("operation", &operation);
        }
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_says_what_where_and_why() {
        let key = crate::key::LockKey::xdc("c", "e").unwrap();
        let err = Error::unavailable(&key);
        assert_eq!(
            err.to_string(),
            "lock unavailable on XDC#c#e: held by another owner; retry later or wait with lock()"
        );
        // Kinds read as words in messages; `as_str` is the stable name for logs and metrics.
        assert_eq!(ErrorKind::ModeConflict.to_string(), "lock mode conflict");
        assert_eq!(ErrorKind::ModeConflict.as_str(), "mode_conflict");
    }

    #[test]
    fn display_leaves_the_cause_to_source_and_the_chain_shows_it_once() {
        let err = Error::connection("cannot reach 127.0.0.1:1")
            .with_key("DC#f#app#k")
            .with_source(std::io::Error::other("refused"));
        assert_eq!(
            err.to_string(),
            "store connection error on DC#f#app#k: cannot reach 127.0.0.1:1"
        );
        let cause = std::error::Error::source(&err).expect("the cause is the source");
        assert_eq!(cause.to_string(), "refused");
        assert!(cause.downcast_ref::<std::io::Error>().is_some());
        assert_eq!(
            err.chain().to_string(),
            "store connection error on DC#f#app#k: cannot reach 127.0.0.1:1: refused"
        );

        // A leasehold error under another: every link once, in order.
        let outer =
            Error::new(ErrorKind::RetriesExhausted, "gave up after 3 attempts").with_source(err);
        assert_eq!(
            outer.to_string(),
            "store retries exhausted: gave up after 3 attempts"
        );
        let chain = outer.chain().to_string();
        assert_eq!(
            chain,
            "store retries exhausted: gave up after 3 attempts: store connection error on \
             DC#f#app#k: cannot reach 127.0.0.1:1: refused"
        );
        assert_eq!(chain.matches("refused").count(), 1, "{chain}");

        // A cause whose text its error already repeats is not shown twice.
        let err = Error::connection("cannot reach 127.0.0.1:1 (refused)")
            .with_source(std::io::Error::other("refused"));
        assert_eq!(
            err.chain().to_string(),
            "store connection error: cannot reach 127.0.0.1:1 (refused)"
        );
        // A client that spreads its text, cause included, over several lines: one line, once.
        #[derive(Debug)]
        struct Client(std::io::Error);
        impl fmt::Display for Client {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "Error 9: timeout\ncaused by:  {}", self.0)
            }
        }
        impl std::error::Error for Client {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let err = Error::in_doubt("no reply to the write")
            .with_source(Client(std::io::Error::other("connection reset")));
        assert_eq!(
            err.chain().to_string(),
            "outcome in doubt: no reply to the write: Error 9: timeout caused by: connection reset"
        );
        // Without a cause the chain is the display.
        assert_eq!(
            Error::shut_down().chain().to_string(),
            Error::shut_down().to_string()
        );
    }

    #[test]
    fn temporary_classification() {
        assert!(ErrorKind::InDoubt.is_temporary());
        assert!(ErrorKind::Connection.is_temporary());
        assert!(!ErrorKind::InvalidArgument.is_temporary());
        assert!(!ErrorKind::NotHeld.is_temporary());
        assert!(!ErrorKind::ShutDown.is_temporary());
    }
}
