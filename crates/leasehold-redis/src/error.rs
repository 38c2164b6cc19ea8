//! From Redis errors to leasehold errors: what the caller can conclude, with the cause kept.

use leasehold_core::{Error, ErrorKind};
use redis::RedisError;

/// Whether an operation changes the record: if its reply is lost, the outcome is in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Connect,
    Acquire,
    Release,
    Extend,
    Inspect,
    List,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Connect => "connection",
            Op::Acquire => "acquire",
            Op::Release => "release",
            Op::Extend => "extend",
            Op::Inspect => "inspect",
            Op::List => "list",
        }
    }

    fn writes(self) -> bool {
        matches!(self, Op::Acquire | Op::Release | Op::Extend)
    }
}

/// Error codes with which Redis refuses a command it did not run, for a while.
const NOT_SERVING_NOW: [&str; 6] = [
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "BUSY",
    "CLUSTERDOWN",
];

/// Maps a failed request.
///
/// - Connection refused / cannot connect: nothing was sent, so [`ErrorKind::Connection`].
/// - Timeout or connection lost while a write was in flight: the server may have applied it —
///   [`ErrorKind::InDoubt`] (the readback layer resolves it). For reads: `Connection`.
/// - Authentication or permission failures: [`ErrorKind::StoreSetup`].
/// - Refused for now (`LOADING`, `READONLY`, `MASTERDOWN`, `TRYAGAIN`, `BUSY`, `CLUSTERDOWN`):
///   nothing applied, [`ErrorKind::Connection`] (temporary).
/// - Anything else: [`ErrorKind::Internal`], with the server's error as the cause.
pub(crate) fn map(op: Op, key: &str, address: &str, error: RedisError) -> Error {
    let what = op.name();
    let kind = if error.is_connection_refusal() {
        ErrorKind::Connection
    } else if error.is_timeout() || error.is_connection_dropped() || error.is_io_error() {
        if op.writes() {
            ErrorKind::InDoubt
        } else {
            ErrorKind::Connection
        }
    } else if matches!(
        error.kind(),
        redis::ErrorKind::AuthenticationFailed | redis::ErrorKind::InvalidClientConfig
    ) || error.code() == Some("NOPERM")
    {
        ErrorKind::StoreSetup
    } else if error
        .code()
        .is_some_and(|code| NOT_SERVING_NOW.contains(&code))
    {
        // The server refused before running the command (loading, a replica after failover,
        // master down, busy script): nothing applied, and worth trying again.
        ErrorKind::Connection
    } else {
        ErrorKind::Internal
    };
    let message = match kind {
        ErrorKind::Connection if error.code().is_some() => format!(
            "Redis at {address} is not serving the {what} right now ({}); nothing was applied, \
             retry later",
            error.code().unwrap_or_default()
        ),
        ErrorKind::Connection => format!("{what} could not reach Redis at {address}"),
        ErrorKind::InDoubt => format!(
            "{what} was sent to Redis at {address} but no reply came back: it may or may not \
             have been applied (read the lock back, or use the readback layer)"
        ),
        ErrorKind::StoreSetup => format!(
            "Redis at {address} refused the {what}: check the credentials and ACL permissions"
        ),
        _ => format!("Redis at {address} failed the {what}"),
    };
    let error = Error::new(kind, message).with_source(error);
    if key.is_empty() {
        error
    } else {
        error.with_key(key)
    }
}
