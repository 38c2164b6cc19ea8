//! From Aerospike errors to leasehold errors.

use aerospike::ResultCode;
use leasehold_core::{Error, ErrorKind, Operation};

/// An Aerospike client error as the cause of a leasehold error: shown on one line (the client's
/// own text spans several — one per seed that failed, one per cause), with the client error
/// itself as its source.
#[derive(Debug)]
pub(crate) struct Cause(pub(crate) aerospike::Error);

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0.to_string();
        let mut words = text.split_whitespace();
        if let Some(first) = words.next() {
            f.write_str(first)?;
        }
        for word in words {
            write!(f, " {word}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// What the client error says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The server answered with this result code.
    Server(ResultCode),
    /// The request may have been applied (timeout or connection lost after sending).
    InDoubt,
    /// Nothing was applied, and trying again can succeed: no connection, no node for the key's
    /// partition, partition unavailable, cluster re-forming, circuit breaker, pool exhausted,
    /// busy key.
    NotSent,
    /// Anything else (bad response, client bug).
    Other,
}

/// Server answers that mean "not applied, and the cluster is in flux": the request can succeed
/// once the cluster has re-formed (or the key cooled down, or the node has room again: out of
/// space or memory, `SERVER_MEM_ERROR`, as under stop-writes; a key busy with XDR shipping).
fn transient_code(code: ResultCode) -> bool {
    matches!(
        code,
        ResultCode::PartitionUnavailable
            | ResultCode::ClusterKeyMismatch
            | ResultCode::Timeout
            | ResultCode::KeyBusy
            | ResultCode::DeviceOverload
            | ResultCode::ServerMemError
            | ResultCode::XdrKeyBusy
    )
}

/// Socket failures of a request that was not sent (a sent one is flagged in doubt first).
fn transient_io(error: &std::io::Error) -> bool {
    use std::io::ErrorKind as Io;
    matches!(
        error.kind(),
        Io::ConnectionRefused
            | Io::ConnectionReset
            | Io::ConnectionAborted
            | Io::NotConnected
            | Io::BrokenPipe
            | Io::TimedOut
            | Io::UnexpectedEof
            | Io::AddrNotAvailable
            | Io::HostUnreachable
            | Io::NetworkUnreachable
    )
}

/// A request sent once and answered by the server with a refusal (not a timeout): not applied,
/// although the client flags it in doubt when it wraps the answer in "retries exceeded" (it does
/// for the codes it retries itself, like PARTITION_UNAVAILABLE).
fn answered_once(error: &aerospike::Error) -> bool {
    error.iteration() == Some(1)
        && error.sub_errors().is_empty()
        && matches!(error.server_result_code(), Some(code) if code != ResultCode::Timeout)
}

/// Classifies a client error.
pub(crate) fn classify(error: &aerospike::Error) -> Class {
    // In-doubt first: the client also flags server-reported timeouts of a sent write as in
    // doubt, and those must never read as a definitive server answer.
    if error.in_doubt() && !answered_once(error) {
        return Class::InDoubt;
    }
    if let Some(code) = error.server_result_code() {
        return if transient_code(code) {
            Class::NotSent
        } else {
            Class::Server(code)
        };
    }
    match error.kind() {
        aerospike::ErrorKind::Connection
        | aerospike::ErrorKind::ConnectionPoolEmpty
        | aerospike::ErrorKind::NoMoreConnections
        | aerospike::ErrorKind::MaxErrorRate
        | aerospike::ErrorKind::InvalidNode
        // The client's own "partition map empty" / "namespace not found in partition map": the
        // namespace was checked at connect, so this is a cluster re-forming.
        | aerospike::ErrorKind::InvalidNamespace
        | aerospike::ErrorKind::Timeout => Class::NotSent,
        aerospike::ErrorKind::Io(io) if transient_io(io) => Class::NotSent,
        _ => match error.cause() {
            // A wrapper ("retries exceeded") around a transient cause.
            Some(cause) => classify(cause),
            None => Class::Other,
        },
    }
}

/// Where a failure happened, for messages: the node the client last tried (its name and
/// address), or the seed hosts when the client names no node.
pub(crate) fn place(seeds: &str, error: &aerospike::Error) -> String {
    match error.node() {
        // The client names a node `NAME: host:port`.
        Some(node) => match node.split_once(": ") {
            Some((name, address)) => format!("Aerospike node {name} at {address}"),
            None => format!("Aerospike node {node}"),
        },
        None => format!("the Aerospike cluster at {seeds}"),
    }
}

/// What a transient failure says about the cluster, for messages.
pub(crate) fn transient_reason(error: &aerospike::Error) -> &'static str {
    if matches!(
        error.server_result_code(),
        Some(ResultCode::PartitionUnavailable)
    ) {
        return "the key's partition is unavailable (the cluster is re-forming, or lost the nodes \
                that hold it)";
    }
    if matches!(
        error.server_result_code(),
        Some(ResultCode::ClusterKeyMismatch)
    ) {
        return "the cluster changed under the request (nodes joined or left)";
    }
    if matches!(
        error.server_result_code(),
        Some(ResultCode::KeyBusy | ResultCode::DeviceOverload | ResultCode::XdrKeyBusy)
    ) {
        return "the node is overloaded";
    }
    if matches!(error.server_result_code(), Some(ResultCode::ServerMemError)) {
        return "the node is out of space or memory (stop-writes)";
    }
    let mut cur = Some(error);
    while let Some(e) = cur {
        match e.kind() {
            aerospike::ErrorKind::InvalidNode | aerospike::ErrorKind::InvalidNamespace => {
                return "no node serves the key's partition (the cluster is re-forming, or lost \
                        the nodes that hold it)"
            }
            aerospike::ErrorKind::MaxErrorRate => {
                return "the client stopped sending to a failing node for a moment"
            }
            _ => cur = e.cause(),
        }
    }
    "the node could not be reached"
}

/// The kind of an acquisition's error when it leaves its lock record behind, unused until its
/// TTL, and says so: never in doubt, since the readback layer would find the record ours and
/// grant it without its fencing token (an in-doubt cause becomes `RetriesExhausted`).
pub(crate) fn left_behind(cause: ErrorKind) -> ErrorKind {
    match cause {
        ErrorKind::InDoubt => ErrorKind::RetriesExhausted,
        kind => kind,
    }
}

/// Names the store call an error comes from (`map_err(failed(Operation::Release))`): every
/// error a [`LockStore`](leasehold_core::LockStore) call of this store returns carries it.
pub(crate) fn failed(op: Operation) -> impl FnOnce(Error) -> Error {
    move |error| error.with_operation(op)
}

/// Maps an error no operation-specific rule took: in doubt, not sent, or unexpected (the server's
/// result code is kept in the message and the client error as the cause). Messages name the node
/// that failed when the client knows it, else the seed hosts.
pub(crate) fn map(op: &str, key: &str, seeds: &str, error: aerospike::Error) -> Error {
    let at = place(seeds, &error);
    let (kind, message) = match classify(&error) {
        Class::InDoubt => (
            ErrorKind::InDoubt,
            format!(
                "{op} was sent to {at} but no reply came back: it may or may not have been \
                 applied (read the lock back, or use the readback layer)"
            ),
        ),
        Class::NotSent => (
            ErrorKind::Connection,
            format!(
                "{op} failed at {at}: {}; nothing was applied, try again",
                transient_reason(&error)
            ),
        ),
        Class::Server(ResultCode::NotAuthenticated | ResultCode::InvalidCredential) => (
            ErrorKind::StoreSetup,
            format!(
                "{at} refused the {op}: not authenticated (a secured cluster needs a user and \
                 password)"
            ),
        ),
        Class::Server(ResultCode::RoleViolation) => (
            ErrorKind::StoreSetup,
            format!(
                "{at} refused the {op}: the user's roles do not allow it (it needs read-write on \
                 the lock sets)"
            ),
        ),
        Class::Server(ResultCode::FailForbidden) => (
            ErrorKind::StoreSetup,
            format!(
                "{at} refused the {op} (FORBIDDEN): most often a namespace with `nsup-period` 0, \
                 which refuses writes with a TTL (set `nsup-period`, e.g. 120); also a set at its \
                 stop-writes limit, a truncation in progress, or clock skew between nodes"
            ),
        ),
        Class::Server(ResultCode::InvalidNamespace) => (
            ErrorKind::StoreSetup,
            format!("{at}: the namespace does not exist"),
        ),
        Class::Server(code) => (
            ErrorKind::Internal,
            format!("{at} failed the {op} with result code {code:?}"),
        ),
        Class::Other => (
            ErrorKind::Internal,
            format!("Aerospike client failed the {op} ({at})"),
        ),
    };
    let error = Error::new(kind, message).with_source(Cause(error));
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
