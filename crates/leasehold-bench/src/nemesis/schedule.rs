//! The nemesis: on a schedule drawn from a seed, injects faults of the chosen kinds into the
//! deployment, one at a time, each healed (and the deployment settled) before a quiet spell and
//! the next. Kinds take turns in an order shuffled each round, so a run has about as many faults
//! of every kind.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use super::clock::now_ns;
use super::deployment::{Deployment, Durations};
use super::history::FaultRecord;
use super::resource::FencedResource;
use super::rng::Rng;

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

/// What the nemesis is told.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The kinds to inject (each supported by the deployment).
    pub kinds: Vec<FaultKind>,
    /// The seed of every choice: order, quiet spells, targets, durations.
    pub seed: u64,
    /// Fault durations, from the TTL.
    pub durations: Durations,
    /// The quiet spell before each fault, drawn from this range.
    pub quiet: (Duration, Duration),
    /// No fault starts after this.
    pub until: Instant,
}

/// Runs the schedule to its end; returns every fault injected.
pub fn run(
    schedule: &Schedule,
    deployment: &mut Deployment,
    resource: &FencedResource,
    runtime: &tokio::runtime::Handle,
) -> Vec<FaultRecord> {
    let mut rng = Rng::new(schedule.seed);
    let mut done = Vec::new();
    let mut round: Vec<FaultKind> = Vec::new();
    loop {
        if round.is_empty() {
            round = schedule.kinds.clone();
            // Fisher–Yates with the seeded generator.
            for i in (1..round.len()).rev() {
                round.swap(i, rng.below(i + 1));
            }
        }
        let Some(kind) = round.pop() else {
            return done;
        };
        let quiet = rng.between(schedule.quiet.0, schedule.quiet.1);
        if Instant::now() + quiet >= schedule.until {
            return done;
        }
        std::thread::sleep(quiet);
        let start_ns = now_ns();
        let result = match kind {
            FaultKind::ClientPause => client_pause(resource, schedule.durations),
            _ => deployment.inject(kind, schedule.durations, &mut rng, runtime),
        };
        let (target, error) = match result {
            Ok(target) => (target, None),
            Err(error) => {
                deployment.heal_all();
                (String::new(), Some(error.to_string()))
            }
        };
        done.push(FaultRecord {
            kind: kind.name().to_owned(),
            target,
            start_ns,
            end_ns: now_ns(),
            error,
        });
    }
}

/// Has the resource stop the next worker that writes under the lock, and waits until it has been
/// continued.
fn client_pause(resource: &FencedResource, durations: Durations) -> std::io::Result<String> {
    let pause = durations.client_pause();
    let before = resource.pause_next_holder(pause);
    let armed = Instant::now();
    while resource.pauses_started() == before {
        if armed.elapsed() > Duration::from_secs(15) {
            resource.disarm();
            return Err(std::io::Error::other(
                "no worker wrote under the lock within 15 s",
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    while !resource.no_worker_stopped() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let worker = resource.pauses().last().map_or(String::new(), |p| {
        format!("worker {} for {pause:?}", p.worker)
    });
    Ok(worker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_lists_parse() {
        assert_eq!(FaultKind::parse_list("all").unwrap().len(), 6);
        assert_eq!(
            FaultKind::parse_list("kill,client-pause").unwrap(),
            vec![FaultKind::Kill, FaultKind::ClientPause]
        );
        assert!(FaultKind::parse_list("kill,nap").is_err());
    }
}
