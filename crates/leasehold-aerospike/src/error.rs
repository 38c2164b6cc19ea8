//! From Aerospike errors to leasehold errors.

use aerospike::ResultCode;
use leasehold_core::{Error, ErrorKind};

/// What the client error says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The server answered with this result code.
    Server(ResultCode),
    /// The request may have been applied (timeout or connection lost after sending).
    InDoubt,
    /// Nothing was applied: no connection, circuit breaker, pool exhausted.
    NotSent,
    /// Anything else (bad response, client bug).
    Other,
}

/// Classifies a client error.
pub(crate) fn classify(error: &aerospike::Error) -> Class {
    // In-doubt first: the client also flags server-reported timeouts of a sent write as in
    // doubt, and those must never read as a definitive server answer.
    if error.in_doubt() {
        return Class::InDoubt;
    }
    if let Some(code) = error.server_result_code() {
        return Class::Server(code);
    }
    match error.kind() {
        aerospike::ErrorKind::Connection
        | aerospike::ErrorKind::ConnectionPoolEmpty
        | aerospike::ErrorKind::NoMoreConnections
        | aerospike::ErrorKind::MaxErrorRate
        | aerospike::ErrorKind::InvalidNode
        | aerospike::ErrorKind::Timeout => Class::NotSent,
        _ => Class::Other,
    }
}

/// Maps an error no operation-specific rule took: in doubt, not sent, or unexpected (the server's
/// result code is kept in the message and the client error as the cause).
pub(crate) fn map(op: &str, key: &str, address: &str, error: aerospike::Error) -> Error {
    let (kind, message) = match classify(&error) {
        Class::InDoubt => (
            ErrorKind::InDoubt,
            format!(
                "{op} was sent to Aerospike at {address} but no reply came back: it may or may \
                 not have been applied (read the lock back, or use the readback layer)"
            ),
        ),
        Class::NotSent => (
            ErrorKind::Connection,
            format!("{op} could not reach Aerospike at {address}"),
        ),
        Class::Server(ResultCode::InvalidNamespace) => (
            ErrorKind::StoreSetup,
            format!("Aerospike at {address}: the namespace does not exist"),
        ),
        Class::Server(code) => (
            ErrorKind::Internal,
            format!("Aerospike at {address} failed the {op} with result code {code:?}"),
        ),
        Class::Other => (
            ErrorKind::Internal,
            format!("Aerospike client failed the {op}"),
        ),
    };
    let error = Error::new(kind, message).with_source(error);
    if key.is_empty() {
        error
    } else {
        error.with_key(key)
    }
}
