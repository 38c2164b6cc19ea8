//! From etcd client errors to leasehold errors: what the caller can conclude, with the cause kept.

use leasehold_core::{Error, ErrorKind, Operation};
use tonic::Code;

/// What was being done: a lost reply to a write leaves its outcome in doubt. The store's
/// [`Operation`] plus the lease grant, a step of an acquisition that holds nothing yet, so a lost
/// reply to it is no doubt about a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Connect,
    /// Granting the lease a lock or a waiter key lives on (nothing held yet if it fails).
    Grant,
    Acquire,
    /// A read an acquisition makes around its transaction (whether it is its turn, why it was
    /// refused, how many permits are taken): nothing was written if it fails.
    AcquireRead,
    Release,
    Extend,
    Inspect,
    List,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Connect => "connection",
            Op::Grant => "lease grant",
            Op::Acquire => "acquire",
            Op::AcquireRead => "acquire's read",
            Op::Release => "release",
            Op::Extend => "extend",
            Op::Inspect => "inspect",
            Op::List => "list",
        }
    }

    /// Writes whose lost reply matters to the lock: acquire (its transaction), release, extend.
    fn writes(self) -> bool {
        !matches!(self, Op::Grant | Op::AcquireRead) && self.operation().is_write()
    }

    /// The store operation this is, or is a step of.
    fn operation(self) -> Operation {
        match self {
            Op::Connect => Operation::Connect,
            Op::Grant | Op::Acquire | Op::AcquireRead => Operation::Acquire,
            Op::Release => Operation::Release,
            Op::Extend => Operation::Extend,
            Op::Inspect => Operation::Inspect,
            Op::List => Operation::List,
        }
    }
}

/// What a failed request says of the member it was sent to, and whether it may go to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not sent (no connection): nothing was applied; the member is down or unreachable.
    Unsent,
    /// The member refused before applying anything (no leader, too many requests, out of
    /// space): another member may serve it.
    Refused,
    /// Sent, and the reply was lost (timeout, connection lost, leader changed under it): a write
    /// may or may not have been applied.
    Lost,
    /// The cluster answered (lease not found, bad request, permission denied): the same on every
    /// member.
    Answer,
}

/// Classifies a failed request (see [`Verdict`]).
pub(crate) fn classify(error: &etcd_client::Error) -> Verdict {
    // A TLS handshake that failed (untrusted CA, wrong name) is a setup problem, and asking the
    // next member would only hide it behind a timeout.
    if leasehold_core::TlsFailure::classify(error).is_some() {
        return Verdict::Answer;
    }
    if before_sending(error) {
        return Verdict::Unsent;
    }
    match error {
        etcd_client::Error::GRpcStatus(status) if refused_before_applying(status) => {
            Verdict::Refused
        }
        etcd_client::Error::GRpcStatus(status)
            if matches!(
                status.code(),
                Code::DeadlineExceeded | Code::Unavailable | Code::Cancelled | Code::Unknown
            ) =>
        {
            Verdict::Lost
        }
        etcd_client::Error::IoError(_) | etcd_client::Error::TransportError(_) => Verdict::Lost,
        _ => Verdict::Answer,
    }
}

/// etcd refused the request before proposing it: nothing was applied.
fn refused_before_applying(status: &tonic::Status) -> bool {
    let text = status.message();
    text.contains("no leader")
        || text.contains("too many requests")
        || text.contains("database space exceeded")
        || text.contains("not capable")
}

/// A member not connected within `timeout` (connecting, or with credentials authenticating,
/// took longer): the request never left this process, so it may go to the next member. Said as
/// tonic says a connection it could not make, which [`classify`] takes as [`Verdict::Unsent`].
pub(crate) fn not_connected_within(timeout: std::time::Duration) -> etcd_client::Error {
    etcd_client::Error::GRpcStatus(tonic::Status::unavailable(format!(
        "could not connect within {timeout:?} (nothing was sent)"
    )))
}

/// Whether a failure surely happened before the request left this process (nothing applied).
fn before_sending(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::TransportError(_) | etcd_client::Error::InvalidUri(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            // tonic reports a connection it could not make as Unavailable with the connect error
            // as message; a request that was sent and lost its reply says otherwise.
            let text = status.message().to_ascii_lowercase();
            status.code() == Code::Unavailable
                && (text.contains("connect") || text.contains("connection refused"))
                && !text.contains("reset")
                && !text.contains("closed")
                && !text.contains("broken pipe")
        }
        _ => false,
    }
}

/// Maps a failed request.
///
/// - Cannot connect: nothing was sent, [`ErrorKind::Connection`].
/// - A write's reply lost (deadline exceeded, connection closed or reset after sending, stream
///   cancelled): the cluster may have applied it — [`ErrorKind::InDoubt`] (the readback layer
///   resolves it). For reads and lease grants: `Connection`.
/// - No leader, too many requests, out-of-space cluster (etcd refused before applying), or a read
///   interrupted by a leader change: [`ErrorKind::Connection`], temporary. A write interrupted by
///   a leader change is `InDoubt`.
/// - Authentication or permission failures: [`ErrorKind::StoreSetup`].
/// - Anything else: [`ErrorKind::Internal`], with etcd's error as the cause.
pub(crate) fn map(op: Op, key: &str, address: &str, error: etcd_client::Error) -> Error {
    let what = op.name();
    let status_code = match &error {
        etcd_client::Error::GRpcStatus(status) => Some(status.code()),
        _ => None,
    };
    // A leader change under a write may have let it commit: only a read is surely not applied.
    let refused_now = |status: &tonic::Status| {
        refused_before_applying(status)
            || (!op.writes() && status.message().contains("leader changed"))
    };
    let kind = if before_sending(&error) {
        ErrorKind::Connection
    } else {
        match (&error, status_code) {
            (etcd_client::Error::GRpcStatus(status), _) if refused_now(status) => {
                ErrorKind::Connection
            }
            (_, Some(Code::Unauthenticated | Code::PermissionDenied)) => ErrorKind::StoreSetup,
            // etcd says a wrong user or password (a password rotated since connecting, a member
            // connected later) with InvalidArgument.
            (etcd_client::Error::GRpcStatus(status), _)
                if status.message().contains("authentication failed") =>
            {
                ErrorKind::StoreSetup
            }
            (
                _,
                Some(Code::DeadlineExceeded | Code::Unavailable | Code::Cancelled | Code::Unknown),
            )
            | (etcd_client::Error::IoError(_), _) => {
                if op.writes() {
                    ErrorKind::InDoubt
                } else {
                    ErrorKind::Connection
                }
            }
            (etcd_client::Error::InvalidArgs(_), _) => ErrorKind::InvalidArgument,
            _ => ErrorKind::Internal,
        }
    };
    let message = match kind {
        ErrorKind::Connection if status_code.is_some() && !before_sending(&error) => format!(
            "etcd at {address} did not serve the {what} (nothing that holds a lock was applied); \
             retry later"
        ),
        ErrorKind::Connection => format!("{what} could not reach etcd at {address}"),
        ErrorKind::InDoubt => format!(
            "{what} was sent to etcd at {address} but no reply came back: it may or may not \
             have been applied (read the lock back, or use the readback layer)"
        ),
        ErrorKind::StoreSetup => format!(
            "etcd at {address} refused the {what}: check the user, password and role \
             permissions on the key prefix"
        ),
        ErrorKind::InvalidArgument => format!("etcd at {address} rejected the {what} as invalid"),
        _ => format!("etcd at {address} failed the {what}"),
    };
    let error = Error::new(kind, message)
        .with_operation(op.operation())
        .with_source(error);
    if key.is_empty() {
        error
    } else {
        error.with_key(key)
    }
}

/// An answer etcd should never give (a transaction response without the expected parts).
pub(crate) fn unexpected(op: Op, key: &str, what: &str) -> Error {
    Error::internal(format!(
        "etcd answered the {} with {what}; this is a bug, please report it",
        op.name()
    ))
    .with_operation(op.operation())
    .with_key(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn a_refused_connection_was_never_sent() {
        let refused = status(
            Code::Unavailable,
            "error trying to connect: tcp connect error: Connection refused (os error 111)",
        );
        assert_eq!(classify(&refused), Verdict::Unsent);
        assert_eq!(
            map(Op::Acquire, "k", "127.0.0.1:1", refused).kind(),
            ErrorKind::Connection
        );
    }

    #[test]
    fn a_wrong_password_is_a_setup_error_whenever_it_is_found() {
        let refused = status(
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password",
        );
        let error = map(Op::Acquire, "k", "127.0.0.1:1", refused);
        assert_eq!(error.kind(), ErrorKind::StoreSetup, "{error}");
        assert!(error.to_string().contains("password"), "{error}");
    }

    #[test]
    fn a_member_not_connected_in_time_was_never_sent_to() {
        let slow = not_connected_within(std::time::Duration::from_secs(2));
        assert_eq!(classify(&slow), Verdict::Unsent);
        let error = map(Op::Acquire, "k", "127.0.0.1:1", slow);
        assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    }

    #[test]
    fn no_leader_is_refused_before_applying_on_any_member() {
        let no_leader = status(Code::Unavailable, "etcdserver: no leader");
        assert_eq!(classify(&no_leader), Verdict::Refused);
        assert_eq!(
            map(Op::Release, "k", "127.0.0.1:1", no_leader).kind(),
            ErrorKind::Connection
        );
    }

    #[test]
    fn a_leader_change_under_a_write_is_in_doubt_and_under_a_read_is_not() {
        let changed = || status(Code::Unavailable, "etcdserver: leader changed");
        assert_eq!(classify(&changed()), Verdict::Lost);
        for write in [Op::Acquire, Op::Release, Op::Extend] {
            let error = map(write, "k", "127.0.0.1:1", changed());
            assert_eq!(error.kind(), ErrorKind::InDoubt, "{write:?}");
            assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
        }
        assert_eq!(
            map(Op::Inspect, "k", "127.0.0.1:1", changed()).kind(),
            ErrorKind::Connection
        );
        let timed_out = status(
            Code::Unavailable,
            "etcdserver: request timed out, possibly due to previous leader failure",
        );
        assert_eq!(classify(&timed_out), Verdict::Lost);
        assert_eq!(
            map(Op::Acquire, "k", "a", timed_out).kind(),
            ErrorKind::InDoubt
        );
        // A read around an acquire's transaction wrote nothing: not in doubt, and it says
        // which step failed.
        let timed_out = status(Code::Unavailable, "etcdserver: request timed out");
        let read = map(Op::AcquireRead, "k", "a", timed_out);
        assert_eq!(read.kind(), ErrorKind::Connection);
        assert!(read.to_string().contains("acquire's read"), "{read}");
    }

    #[test]
    fn the_clusters_answers_end_the_request() {
        for answer in [
            status(Code::NotFound, "etcdserver: requested lease not found"),
            status(Code::InvalidArgument, "etcdserver: authentication failed"),
            status(Code::PermissionDenied, "etcdserver: permission denied"),
        ] {
            assert_eq!(classify(&answer), Verdict::Answer, "{answer}");
        }
    }
}
