//! From etcd client errors to leasehold errors: what the caller can conclude, with the cause kept.

use leasehold_core::{Error, ErrorKind};
use tonic::Code;

/// What was being done: a lost reply to a write leaves its outcome in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Connect,
    /// Granting the lease a lock or a waiter key lives on (nothing held yet if it fails).
    Grant,
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
            Op::Grant => "lease grant",
            Op::Acquire => "acquire",
            Op::Release => "release",
            Op::Extend => "extend",
            Op::Inspect => "inspect",
            Op::List => "list",
        }
    }

    /// Writes whose lost reply matters to the lock: acquire, release, extend.
    fn writes(self) -> bool {
        matches!(self, Op::Acquire | Op::Release | Op::Extend)
    }
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
/// - No leader, too many requests, corrupt or out-of-space cluster (etcd refused before applying):
///   [`ErrorKind::Connection`], temporary.
/// - Authentication or permission failures: [`ErrorKind::StoreSetup`].
/// - Anything else: [`ErrorKind::Internal`], with etcd's error as the cause.
pub(crate) fn map(op: Op, key: &str, address: &str, error: etcd_client::Error) -> Error {
    let what = op.name();
    let status_code = match &error {
        etcd_client::Error::GRpcStatus(status) => Some(status.code()),
        _ => None,
    };
    let refused_now = |status: &tonic::Status| {
        let text = status.message();
        text.contains("no leader")
            || text.contains("too many requests")
            || text.contains("leader changed")
            || text.contains("database space exceeded")
    };
    let kind = if before_sending(&error) {
        ErrorKind::Connection
    } else {
        match (&error, status_code) {
            (etcd_client::Error::GRpcStatus(status), _) if refused_now(status) => {
                ErrorKind::Connection
            }
            (_, Some(Code::Unauthenticated | Code::PermissionDenied)) => ErrorKind::StoreSetup,
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
        ErrorKind::InvalidArgument => format!("etcd rejected the {what} as invalid"),
        _ => format!("etcd at {address} failed the {what}"),
    };
    let error = Error::new(kind, message).with_source(error);
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
    .with_key(key)
}
