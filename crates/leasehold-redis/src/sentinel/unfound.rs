//! Why a round of the search for the master found none, and a refusal of the URL's
//! credentials met on the way: what the rounds report and the link keeps.

use redis::RedisError;

/// Why one round of the search found no master.
#[derive(Debug, Clone)]
pub(super) struct Unfound {
    /// A sentinel named a master, which did not answer as one: the node is down or restarting,
    /// or a failover is under way. Not set when no sentinel named one (none answered, or none
    /// monitors the master's name), which waiting does not mend.
    pub(super) named: bool,
    /// What went wrong, naming the sentinels or the node.
    pub(super) problem: String,
    /// Set when a node, or a sentinel while none named a master, refused the credentials or
    /// permissions the URL gives: waiting does not mend that, so once it lasts the search stops
    /// and callers fail instead of waiting out the master wait.
    pub(super) refused: Option<Refusal>,
}

/// Who refused the URL's credentials or permissions, and its error.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    /// The node (`host:port (named by sentinel …)`) or `sentinel host:port`, for messages.
    pub(crate) by: String,
    /// The node's `host:port`, or `sentinel host:port`: which refused, whoever named it.
    pub(super) at: String,
    pub(crate) error: RedisError,
}

impl Refusal {
    /// `error` from the node or sentinel `at` (`by` in messages), if it is a refusal of the
    /// credentials or permissions.
    pub(super) fn of(at: &str, by: &str, error: &RedisError) -> Option<Refusal> {
        crate::error::refused_access(error).then(|| Refusal {
            by: by.to_owned(),
            at: at.to_owned(),
            error: error.clone(),
        })
    }
}

impl std::fmt::Display for Unfound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.problem)
    }
}
