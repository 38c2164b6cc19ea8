//! The kinds of fault the nemesis injects, and their names on the command line.

use std::fmt;
use std::str::FromStr;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL of the node serving the lock (the slot's master, the Sentinel master, the etcd
    /// leader, the one node), then a restart.
    Kill,
    /// SIGSTOP of that node for half the TTL, then SIGCONT.
    PauseShort,
    /// SIGSTOP of that node for twice the TTL, then SIGCONT.
    PauseLong,
    /// A forced failover: `CLUSTER FAILOVER TAKEOVER`, `SENTINEL FAILOVER`, etcd `move-leader`.
    Failover,
    /// A node cut off by the black-hole proxy (accepting, answering nothing) for between half and
    /// twice the TTL.
    Blackhole,
    /// SIGSTOP of the worker process holding the lock, right after its first write, for twice the
    /// TTL and a second; then SIGCONT, and its commit write goes out with the old token.
    ClientPause,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 6] = [
        FaultKind::Kill,
        FaultKind::PauseShort,
        FaultKind::PauseLong,
        FaultKind::Failover,
        FaultKind::Blackhole,
        FaultKind::ClientPause,
    ];

    /// The name `--faults` takes.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::PauseShort => "pause-short",
            FaultKind::PauseLong => "pause-long",
            FaultKind::Failover => "failover",
            FaultKind::Blackhole => "blackhole",
            FaultKind::ClientPause => "client-pause",
        }
    }

    /// Parses `all` or a comma-separated list of kinds.
    pub fn parse_list(list: &str) -> Result<Vec<FaultKind>, String> {
        if list == "all" {
            return Ok(FaultKind::ALL.to_vec());
        }
        list.split(',')
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect()
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown fault {s:?}: kill, pause-short, pause-long, failover, blackhole, \
                     client-pause or all"
                )
            })
    }
}
