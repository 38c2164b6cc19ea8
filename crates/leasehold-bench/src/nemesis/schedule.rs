//! The nemesis: on a schedule drawn from a seed, injects faults of the chosen kinds into the
//! deployment, one at a time, each healed (and the deployment settled) before a quiet spell and
//! the next. Kinds take turns in an order shuffled each round, so a run has about as many faults
//! of every kind.

use std::time::{Duration, Instant};

use super::clock::now_ns;
use super::deployment::{Deployment, Durations};
use super::fault::FaultKind;
use super::history::FaultRecord;
use super::resource::FencedResource;
use super::rng::Rng;

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
