//! From Redis errors to leasehold errors: what the caller can conclude, with the cause kept.

use leasehold_core::{Error, ErrorKind, Operation};
use redis::RedisError;

/// Error codes with which Redis refuses a command it did not run, for a while. `MOVED` and `ASK`
/// reach the store only when the cluster client ran out of redirections while a slot moved (a
/// failover in progress): nothing was applied. `NOSCRIPT` reaches it only when the script was
/// loaded and the call still met a node without it — a cluster's masters changing between the
/// two (a promoted replica's script cache starts empty).
/// `NOREPLICAS` (fewer replicas in sync than the server's `min-replicas-to-write`, as while a
/// failover re-forms the replicas) and `MISCONF` (the server cannot persist) refuse a write before
/// it runs too.
const NOT_SERVING_NOW: [&str; 11] = [
    "NOSCRIPT",
    "NOREPLICAS",
    "MISCONF",
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "BUSY",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
];

/// Maps a failed request.
///
/// - Connection refused / cannot connect: nothing was sent, so [`ErrorKind::Connection`].
/// - Timeout or connection lost while a write was in flight: the server may have applied it —
///   [`ErrorKind::InDoubt`] (the readback layer resolves it). For reads: `Connection`. So is a
///   cluster client that found no connection to the slot's node: a write it had sent before its
///   connection dropped may have run.
/// - Authentication or permission failures: [`ErrorKind::StoreSetup`].
/// - A script calling a command the server does not have (fair waiting's `LMOVE` on Redis
///   before 6.2, sent by an attempt that keeps its process's place in line; it is the first
///   command such an attempt runs, so nothing was applied):
///   [`ErrorKind::StoreSetup`], naming the version needed and the way out.
/// - Refused for now (`LOADING`, `READONLY`, `MASTERDOWN`, `TRYAGAIN`, `BUSY`, `CLUSTERDOWN`,
///   `NOREPLICAS`, `MISCONF`,
///   `MOVED`/`ASK` left over from a slot moving during a failover, and `NOSCRIPT` after the
///   reload): nothing applied,
///   [`ErrorKind::Connection`] (temporary). So is a `WAIT` its node's demotion cut short
///   (`UNBLOCKED`) or refused (a replica now): nothing was confirmed.
/// - Anything else: [`ErrorKind::Internal`], with the server's error as the cause.
pub(crate) fn map(op: Operation, key: &str, address: &str, error: RedisError) -> Error {
    let what = op;
    let kind = if error.is_connection_refusal() {
        ErrorKind::Connection
    } else if error.is_timeout()
        || error.is_connection_dropped()
        || error.is_io_error()
        || error.kind() == redis::ErrorKind::ClusterConnectionNotFound
    {
        if op.is_write() {
            ErrorKind::InDoubt
        } else {
            ErrorKind::Connection
        }
    } else if refused_access(&error)
        || error.kind() == redis::ErrorKind::InvalidClientConfig
        || too_old(&error)
    {
        ErrorKind::StoreSetup
    } else if error
        .code()
        .is_some_and(|code| NOT_SERVING_NOW.contains(&code))
        || demoted(error.code(), error.detail())
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
        ErrorKind::StoreSetup if too_old(&error) => format!(
            "Redis at {address} is too old for the {what}: fair waiting needs Redis 6.2 or later \
             (LMOVE); upgrade the server, or turn fair waiting off (RedisConfig::fair(false))"
        ),
        ErrorKind::StoreSetup => format!(
            "Redis at {address} refused the {what}: check the credentials and ACL permissions"
        ),
        _ => format!("Redis at {address} failed the {what}"),
    };
    let error = Error::new(kind, message)
        .with_operation(op)
        .with_source(error);
    if key.is_empty() {
        error
    } else {
        error.with_key(key)
    }
}

/// Whether the server refused the credentials or the permissions the client was given (a wrong
/// password or user, none where one is needed, a command the user's ACL forbids): no wait or
/// retry mends these.
pub(crate) fn refused_access(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(error.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
}

/// The place a cluster command failed, for [`map`]'s `address`: the node the slot map named for
/// the key's slot, and the slot, within the cluster `address` describes —
/// `node 127.0.0.1:7001 (slot 1234) of the Redis Cluster at …`, or `slot 1234 of …` when no
/// master was known for the slot.
pub(crate) fn on_node(address: &str, node: Option<&str>, slot: u16) -> String {
    match node {
        Some(node) => format!("node {node} (slot {slot}) of {address}"),
        None => format!("slot {slot} (no master known) of {address}"),
    }
}

/// Whether a node answered as one that stopped being a master: a `WAIT` cut short by its
/// demotion (`UNBLOCKED`), or refused because it is a replica now. Nothing was confirmed, and
/// the caller's retry goes to the new master.
pub(crate) fn demoted(code: Option<&str>, detail: Option<&str>) -> bool {
    code == Some("UNBLOCKED")
        || detail.is_some_and(|detail| detail.starts_with("WAIT cannot be used with replica"))
}

/// Whether a script failed on a command this server does not know (an older Redis).
fn too_old(error: &RedisError) -> bool {
    error
        .detail()
        .is_some_and(|detail| detail.contains("Unknown Redis command called from"))
}

#[cfg(test)]
mod tests {
    use redis::{ErrorKind as RedisKind, ServerErrorKind};

    use super::*;

    #[test]
    fn a_redirection_left_over_from_a_failover_is_temporary() {
        let moved = RedisError::from((
            RedisKind::Server(ServerErrorKind::Moved),
            "An error was signalled by the server",
            "14124 127.0.0.1:38421".to_owned(),
        ));
        assert_eq!(moved.code(), Some("MOVED"));
        let error = map(Operation::Acquire, "DC#f1#app#k", "the cluster", moved);
        assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
        assert!(error.to_string().contains("MOVED"), "{error}");
    }

    #[test]
    fn a_cluster_client_without_a_connection_is_a_temporary_failure() {
        let lost = || {
            RedisError::from((
                RedisKind::ClusterConnectionNotFound,
                "No connections found for the slot",
            ))
        };
        let write = map(Operation::Acquire, "DC#f1#app#k", "the cluster", lost());
        assert_eq!(write.kind(), ErrorKind::InDoubt, "{write}");
        let read = map(Operation::Inspect, "DC#f1#app#k", "the cluster", lost());
        assert_eq!(read.kind(), ErrorKind::Connection, "{read}");
    }

    #[test]
    fn a_write_refused_for_want_of_replicas_or_persistence_is_temporary() {
        for (code, detail) in [
            ("NOREPLICAS", "Not enough good replicas to write."),
            ("MISCONF", "Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."),
        ] {
            let refused = redis::make_extension_error(code.to_owned(), Some(detail.to_owned()));
            assert_eq!(refused.code(), Some(code));
            let error = map(Operation::Acquire, "DC#f1#app#k", "127.0.0.1:6380", refused);
            assert_eq!(error.kind(), ErrorKind::Connection, "{code}: {error}");
            assert!(error.to_string().contains("nothing was applied"), "{error}");
        }
    }

    #[test]
    fn a_cluster_error_names_the_node_and_slot_and_keeps_the_cause() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let site = on_node(
            "the Redis Cluster at 127.0.0.1:7000",
            Some("127.0.0.1:7002"),
            8119,
        );
        let error = map(Operation::Release, "DC#f1#app#k", &site, refused);
        assert_eq!(error.kind(), ErrorKind::Connection);
        let message = error.to_string();
        assert!(
            message
                .contains("node 127.0.0.1:7002 (slot 8119) of the Redis Cluster at 127.0.0.1:7000"),
            "{message}"
        );
        let cause = std::error::Error::source(&error).expect("the cause is kept");
        assert!(cause.downcast_ref::<RedisError>().is_some(), "{cause}");
        assert!(on_node("c", None, 3).contains("slot 3"));
    }

    #[test]
    fn a_wait_cut_short_or_refused_by_a_demoted_master_is_temporary() {
        // As the server sends it: an error code of its own.
        let unblocked = redis::parse_redis_value(
            b"-UNBLOCKED force unblock from blocking operation, instance state changed \
              (master -> replica?)\r\n",
        )
        .unwrap()
        .extract_error()
        .unwrap_err();
        assert_eq!(unblocked.code(), Some("UNBLOCKED"));
        let on_replica = RedisError::from((
            RedisKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "WAIT cannot be used with replica instances. Please also note that since Redis 4.0 \
             if a replica is configured to be writable (which is not the default) writes to \
             replicas are just local and are not propagated."
                .to_owned(),
        ));
        assert!(demoted(Some("UNBLOCKED"), None));
        assert!(!demoted(Some("ERR"), Some("unknown command")));
        let error = map(
            Operation::Acquire,
            "DC#f1#app#k",
            "node 127.0.0.1:7002",
            on_replica,
        );
        assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
        assert!(error.to_string().contains("127.0.0.1:7002"), "{error}");
        let error = map(
            Operation::Extend,
            "DC#f1#app#k",
            "node 127.0.0.1:7002",
            unblocked,
        );
        assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
        assert!(error.is_temporary(), "{error}");
    }

    #[test]
    fn a_script_command_the_server_lacks_is_a_setup_error_naming_the_version() {
        // What Redis 6.0 answers a script calling LMOVE (6.2+).
        let refused = RedisError::from((
            RedisKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "Error running script (call to f_0a1b): @user_script:40: @user_script: 40: Unknown \
             Redis command called from Lua script"
                .to_owned(),
        ));
        let error = map(Operation::Acquire, "DC#f1#app#k", "127.0.0.1:6379", refused);
        assert_eq!(error.kind(), ErrorKind::StoreSetup);
        let message = error.to_string();
        assert!(message.contains("Redis 6.2"), "{message}");
        assert!(message.contains("fair(false)"), "{message}");
        assert!(
            std::error::Error::source(&error).is_some(),
            "the cause is kept"
        );
    }
}
