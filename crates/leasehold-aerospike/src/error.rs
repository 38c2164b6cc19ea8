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
        Class::Server(ResultCode::NotAuthenticated | ResultCode::InvalidCredential) => (
            ErrorKind::StoreSetup,
            format!(
                "Aerospike at {address} refused the {op}: not authenticated (a secured cluster \
                 needs a user and password)"
            ),
        ),
        Class::Server(ResultCode::RoleViolation) => (
            ErrorKind::StoreSetup,
            format!(
                "Aerospike at {address} refused the {op}: the user's roles do not allow it \
                 (it needs read-write on the lock sets)"
            ),
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

/// A failed TLS handshake, said plainly: an untrusted certificate or a wrong TLS name is a setup
/// problem, not an unreachable cluster. `None` when the error is not about TLS.
pub(crate) fn tls_failure(address: &str, error: &aerospike::Error) -> Option<Error> {
    let (failure, text) = leasehold_core::TlsFailure::classify(error)?;
    let hint = match failure {
        leasehold_core::TlsFailure::UntrustedCa => {
            "the node's certificate is not signed by a trusted CA: give the CA that signed it \
             (tls_ca_file / ?tls_ca=)"
        }
        leasehold_core::TlsFailure::WrongName => {
            "the node's certificate does not list the TLS name: use the name the certificate \
             lists (host:tls_name:port, tls_name / ?tls_name=)"
        }
        leasehold_core::TlsFailure::Handshake => {
            "the TLS handshake failed: check the CA, the client certificate and the TLS name"
        }
    };
    Some(Error::new(
        ErrorKind::StoreSetup,
        format!("TLS with the Aerospike cluster at {address} failed: {hint} ({text})"),
    ))
}

/// A refused login, said plainly (it is a setup problem, not an unreachable cluster). The message
/// names the user, never the password. `None` when the error is not about authentication.
pub(crate) fn auth_failure(
    address: &str,
    user: Option<&str>,
    error: &aerospike::Error,
) -> Option<Error> {
    let lower = error.to_string().to_lowercase();
    let refused = [
        "invalid credential",
        "invalid password",
        "invalid user",
        "not authenticated",
    ]
    .iter()
    .any(|what| lower.contains(what));
    if !refused {
        return None;
    }
    let who = match user {
        Some(user) => format!("user {user:?}"),
        None => "no user given".to_owned(),
    };
    Some(Error::new(
        ErrorKind::StoreSetup,
        format!(
            "authentication failed at the Aerospike cluster at {address} ({who}): check the user \
             and password (a secured cluster needs both)"
        ),
    ))
}
