//! The checker: reads the histories of a run and counts what a lock user cares about.
//!
//! - **Fence violations**: writes the resource accepted out of fencing order (a token below one
//!   it had accepted: 0 by the resource's construction, checked anyway) and tokens shared by two
//!   acquisitions (the fence cannot tell such holders apart). Must be 0 wherever fencing is on.
//! - **Overlaps**: critical sections of different workers that overlapped in time while both
//!   holders believed they held the lock (from the grant until the release, or until the guard
//!   reported the loss), counted as incidents (sections joined by overlaps); and among them, the
//!   incidents where the store kept both holders (both released `Ok(true)` with no loss
//!   reported): mutual exclusion broken by the store.
//! - **Losses**: locks reported lost to their guard, and locks lost silently (the release found
//!   the lock no longer ours, the guard had not said so, and another holder had been granted it
//!   before the release was called); apart from those, releases that found the lock gone with
//!   nobody else granted it meanwhile.
//! - **Client pauses**: whether each paused holder's late write was rejected by the fence, and
//!   whether its guard reported the loss when it woke.
//! - **Availability**: failed acquisitions, the longest failed call, the longest gap between two
//!   grants.
//! - **Left behind**: the lock still held once every worker had stopped.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::clock::ms_between;
use super::history::{
    AcquireFailure, Acquisition, ClientPause, FaultRecord, ReleaseOutcome, WriteRecord,
};

/// Everything a run recorded.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Acquisitions, from every worker.
    pub acquisitions: Vec<Acquisition>,
    /// Failed acquisitions.
    pub failures: Vec<AcquireFailure>,
    /// Writes, in the order the resource decided them.
    pub writes: Vec<WriteRecord>,
    /// Client pauses.
    pub pauses: Vec<ClientPause>,
    /// Faults injected.
    pub faults: Vec<FaultRecord>,
    /// The lock as found after the workers stopped (`None`: free).
    pub left_behind: Option<String>,
    /// Workers that did not exit on their own (killed at the end).
    pub stuck_workers: usize,
}

/// What the checker found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Faults injected per kind (errors not counted).
    pub faults: BTreeMap<String, usize>,
    /// Faults that failed to inject or heal, with their errors.
    pub fault_errors: Vec<String>,
    /// Locks granted.
    pub acquisitions: usize,
    /// Writes accepted by the fence.
    pub writes_accepted: usize,
    /// Writes rejected by the fence.
    pub writes_rejected: usize,
    /// Accepted writes whose token was below one accepted earlier.
    pub out_of_order: usize,
    /// Acquisitions whose accepted writes carried a token an earlier acquisition had also
    /// written with.
    pub shared_tokens: usize,
    /// Overlap incidents: sets of critical sections of different workers, each overlapping
    /// another of the set in time while both holders believed they held the lock.
    pub overlaps: usize,
    /// Of those, incidents with a paused client among the holders.
    pub overlaps_paused: usize,
    /// Incidents among holders the store kept (both released `Ok(true)`, neither reported a
    /// loss): mutual exclusion broken by the store.
    pub overlaps_kept: usize,
    /// Locks whose loss the guard reported.
    pub lost_reported: usize,
    /// Locks lost without the guard saying so: the release answered "not ours", and another
    /// holder had been granted the lock before the release was called.
    pub lost_silent: usize,
    /// Releases that answered "not ours" with nobody else granted the lock before the release
    /// was called: no other holder overlapped the work (the lease ran out while the release was
    /// on its way, or the record was lost in a failover and nobody took the lock meanwhile).
    pub lapsed_in_release: usize,
    /// Silent losses by the fault in progress when the lock was released (or `none`).
    pub silent_by_fault: BTreeMap<String, usize>,
    /// Failed acquisitions by the fault in progress when they failed (or `none`).
    pub failures_by_fault: BTreeMap<String, usize>,
    /// Acquisitions sharing a token, by the fault in progress when the later one was granted.
    pub shared_by_fault: BTreeMap<String, usize>,
    /// Releases that failed.
    pub release_failed: usize,
    /// Client pauses carried out.
    pub client_pauses: usize,
    /// Of those, the paused holder's late write was rejected by the fence.
    pub late_write_rejected: usize,
    /// Of those, the late write was accepted: no other holder had written meanwhile (harmless).
    pub late_write_accepted_alone: usize,
    /// Of those, the guard reported the loss when the process woke.
    pub pause_loss_reported: usize,
    /// Failed acquisitions.
    pub acquire_failures: usize,
    /// Failed acquisitions by error kind.
    pub failure_kinds: BTreeMap<String, usize>,
    /// The longest failed `lock_with` call, ms.
    pub longest_failed_ms: f64,
    /// The longest time between two grants, ms: how long the lock was unavailable at worst.
    pub longest_gap_ms: f64,
    /// The lock as found after the run (`None`: free).
    pub left_behind: Option<String>,
    /// Workers killed at the end because they did not stop.
    pub stuck_workers: usize,
    /// A few examples of overlaps and violations, for the report.
    pub examples: Vec<String>,
}

impl Verdict {
    /// Fence violations of any sort.
    pub fn fence_violations(&self) -> usize {
        self.out_of_order + self.shared_tokens
    }
}

/// Checks a run's history.
pub fn check(history: &History) -> Verdict {
    let mut v = Verdict {
        acquisitions: history.acquisitions.len(),
        acquire_failures: history.failures.len(),
        left_behind: history.left_behind.clone(),
        stuck_workers: history.stuck_workers,
        ..Verdict::default()
    };
    for fault in &history.faults {
        match &fault.error {
            None => *v.faults.entry(fault.kind.clone()).or_default() += 1,
            Some(error) => v.fault_errors.push(format!("{}: {error}", fault.kind)),
        }
    }
    check_fence(history, &mut v);
    check_overlaps(history, &mut v);
    check_losses(history, &mut v);
    check_pauses(history, &mut v);
    for failure in &history.failures {
        *v.failure_kinds.entry(failure.kind.clone()).or_default() += 1;
        *v.failures_by_fault
            .entry(fault_at(&history.faults, failure.failed_ns))
            .or_default() += 1;
        v.longest_failed_ms = v
            .longest_failed_ms
            .max(ms_between(failure.asked_ns, failure.failed_ns));
    }
    let mut grants: Vec<u64> = history.acquisitions.iter().map(|a| a.acquired_ns).collect();
    grants.sort_unstable();
    v.longest_gap_ms = grants
        .windows(2)
        .map(|w| ms_between(w[0], w[1]))
        .fold(0.0, f64::max);
    v
}

fn check_fence(history: &History, v: &mut Verdict) {
    let mut highest: Option<u64> = None;
    let mut owner_of: HashMap<u64, (usize, u64)> = HashMap::new();
    let mut sharing: HashSet<(usize, u64)> = HashSet::new();
    for w in &history.writes {
        if !w.accepted {
            v.writes_rejected += 1;
            continue;
        }
        v.writes_accepted += 1;
        let Some(token) = w.token else { continue };
        if highest.is_some_and(|h| token < h) {
            v.out_of_order += 1;
            v.examples.push(format!(
                "accepted out of order: worker {} token {token} after {highest:?}",
                w.worker
            ));
        }
        highest = Some(highest.map_or(token, |h| h.max(token)));
        let owner = *owner_of.entry(token).or_insert((w.worker, w.seq));
        // Counted once per acquisition, not per write.
        if owner != (w.worker, w.seq) && sharing.insert((w.worker, w.seq)) {
            v.shared_tokens += 1;
            *v.shared_by_fault
                .entry(fault_at(&history.faults, w.start_ns))
                .or_default() += 1;
            v.examples.push(format!(
                "token {token} written by worker {} acquisition {} and worker {} acquisition {}",
                owner.0, owner.1, w.worker, w.seq
            ));
        }
    }
}

/// The kind of the fault in progress at `at`, or that ended less than a TTL-ish 2 s before it
/// (its effects outlive it: a failover's clients reconnect, a lease runs out); `none` if none.
fn fault_at(faults: &[FaultRecord], at: u64) -> String {
    const AFTER: u64 = 2_000_000_000;
    // The latest one: its effects are the freshest.
    faults
        .iter()
        .rev()
        .find(|f| f.start_ns <= at && at <= f.end_ns + AFTER)
        .map_or_else(|| "none".to_owned(), |f| f.kind.clone())
}

fn check_overlaps(history: &History, v: &mut Verdict) {
    let paused: HashSet<(usize, u64)> = history.pauses.iter().map(|p| (p.worker, p.seq)).collect();
    let mut sections: Vec<&Acquisition> = history.acquisitions.iter().collect();
    sections.sort_by_key(|a| a.acquired_ns);
    let believed_end = |a: &Acquisition| a.release_ns.min(a.lost_ns.unwrap_or(u64::MAX));
    let kept = |a: &Acquisition| a.release == ReleaseOutcome::Released && a.lost_ns.is_none();
    // Overlapping sections are joined into incidents: a holder paused for seconds overlaps every
    // section granted meanwhile, and that is one incident, not hundreds.
    let mut believed = UnionFind::new(sections.len());
    let mut both_kept = UnionFind::new(sections.len());
    for (i, a) in sections.iter().enumerate() {
        let a_end = believed_end(a);
        for (j, b) in sections.iter().enumerate().skip(i + 1) {
            if b.acquired_ns >= a_end {
                break;
            }
            if a.worker == b.worker {
                continue;
            }
            believed.join(i, j);
            if kept(a) && kept(b) {
                both_kept.join(i, j);
                if v.examples.len() < 10 {
                    v.examples.push(format!(
                        "both kept: worker {} token {:?} held {:.1} ms, worker {} token {:?} \
                         granted {:.1} ms into it",
                        a.worker,
                        a.token,
                        ms_between(a.acquired_ns, a.release_ns),
                        b.worker,
                        b.token,
                        ms_between(a.acquired_ns, b.acquired_ns)
                    ));
                }
            }
        }
    }
    let groups = believed.groups();
    v.overlaps = groups.len();
    v.overlaps_paused = groups
        .iter()
        .filter(|g| {
            g.iter()
                .any(|&i| paused.contains(&(sections[i].worker, sections[i].seq)))
        })
        .count();
    v.overlaps_kept = both_kept.groups().len();
}

/// Connected sets of indices.
struct UnionFind(Vec<usize>);

impl UnionFind {
    fn new(n: usize) -> Self {
        UnionFind((0..n).collect())
    }

    fn root(&mut self, mut i: usize) -> usize {
        while self.0[i] != i {
            self.0[i] = self.0[self.0[i]];
            i = self.0[i];
        }
        i
    }

    fn join(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.root(a), self.root(b));
        self.0[ra] = rb;
    }

    /// The sets of two or more.
    fn groups(&mut self) -> Vec<Vec<usize>> {
        let mut by_root: HashMap<usize, Vec<usize>> = HashMap::new();
        for i in 0..self.0.len() {
            let r = self.root(i);
            by_root.entry(r).or_default().push(i);
        }
        by_root.into_values().filter(|g| g.len() > 1).collect()
    }
}

fn check_losses(history: &History, v: &mut Verdict) {
    let mut grants: Vec<u64> = history.acquisitions.iter().map(|a| a.acquired_ns).collect();
    grants.sort_unstable();
    for a in &history.acquisitions {
        if a.lost_ns.is_some() {
            v.lost_reported += 1;
        } else if a.release == ReleaseOutcome::NotOurs {
            // Lost to another holder only if someone else was granted the lock before the holder
            // called release; otherwise nobody overlapped the work: the lease ran out while the
            // release was on its way (a release stops the renewal, and a store that does not
            // answer holds it past the TTL), or a failover lost the record and nobody took the
            // lock before the release.
            let after_grant = grants.partition_point(|&g| g <= a.acquired_ns);
            let before_release = grants.partition_point(|&g| g < a.release_ns);
            let taken_meanwhile = after_grant < before_release;
            if taken_meanwhile {
                v.lost_silent += 1;
                *v.silent_by_fault
                    .entry(fault_at(&history.faults, a.release_ns))
                    .or_default() += 1;
            } else {
                v.lapsed_in_release += 1;
            }
        }
        if matches!(a.release, ReleaseOutcome::Failed(_)) {
            v.release_failed += 1;
        }
    }
}

fn check_pauses(history: &History, v: &mut Verdict) {
    for p in &history.pauses {
        v.client_pauses += 1;
        let commit = history
            .writes
            .iter()
            .find(|w| w.worker == p.worker && w.seq == p.seq && w.phase == 2);
        match commit {
            Some(w) if !w.accepted => v.late_write_rejected += 1,
            Some(w) => {
                let others_wrote = history.writes.iter().any(|o| {
                    o.accepted
                        && (o.worker, o.seq) != (p.worker, p.seq)
                        && o.start_ns > p.paused_ns
                        && o.start_ns < w.start_ns
                });
                if others_wrote {
                    v.examples
                        .push(format!("paused worker {}'s late write accepted", p.worker));
                } else {
                    v.late_write_accepted_alone += 1;
                }
            }
            None => {}
        }
        let reported = history
            .acquisitions
            .iter()
            .find(|a| a.worker == p.worker && a.seq == p.seq)
            .is_some_and(|a| a.lost_ns.is_some());
        if reported {
            v.pause_loss_reported += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::history::WriteOutcome;
    use super::*;

    fn acq(worker: usize, seq: u64, token: u64, from: u64, to: u64) -> Acquisition {
        Acquisition {
            worker,
            seq,
            token: Some(token),
            asked_ns: from,
            acquired_ns: from,
            writes: [WriteOutcome::Accepted; 2],
            lost_ns: None,
            lost_reason: None,
            release_ns: to,
            released_ns: to,
            release: ReleaseOutcome::Released,
        }
    }

    fn write(worker: usize, seq: u64, token: u64, at: u64, accepted: bool) -> WriteRecord {
        WriteRecord {
            worker,
            seq,
            phase: 1,
            token: Some(token),
            start_ns: at,
            end_ns: at,
            accepted,
            highest_before: None,
        }
    }

    #[test]
    fn overlaps_are_counted_only_while_both_believed_they_held() {
        let mut lost = acq(1, 0, 2, 150, 400);
        lost.lost_ns = Some(250);
        let history = History {
            acquisitions: vec![
                acq(0, 0, 1, 100, 200), // overlaps worker 1 (150..200), both kept? no: 1 lost
                lost,
                acq(2, 0, 3, 300, 500), // after worker 1 noticed its loss: no overlap
                acq(0, 1, 4, 450, 600), // overlaps worker 2, both kept
            ],
            ..History::default()
        };
        let v = check(&history);
        assert_eq!((v.lost_silent, v.lapsed_in_release), (0, 0));
        assert_eq!(v.overlaps, 2, "two incidents");
        assert_eq!(v.overlaps_kept, 1);
        assert_eq!(v.lost_reported, 1);
        assert_eq!(v.longest_gap_ms, 150.0 / 1e6);
    }

    #[test]
    fn a_lease_that_ran_out_during_its_release_is_not_a_silent_loss() {
        let mut lapsed = acq(0, 0, 1, 100, 200);
        lapsed.release = ReleaseOutcome::NotOurs;
        let mut taken = acq(1, 0, 2, 300, 400);
        taken.release = ReleaseOutcome::NotOurs;
        let history = History {
            acquisitions: vec![lapsed, taken, acq(2, 0, 3, 350, 500)],
            ..History::default()
        };
        let v = check(&history);
        assert_eq!((v.lost_silent, v.lapsed_in_release), (1, 1));
    }

    #[test]
    fn shared_tokens_and_out_of_order_writes_are_fence_violations() {
        let history = History {
            writes: vec![
                write(0, 0, 5, 1, true),
                write(1, 0, 5, 2, true),
                write(1, 0, 5, 2, true),
                write(2, 0, 4, 3, false),
                write(2, 1, 4, 4, true),
            ],
            ..History::default()
        };
        let v = check(&history);
        assert_eq!((v.shared_tokens, v.out_of_order), (1, 1));
        assert_eq!((v.writes_accepted, v.writes_rejected), (4, 1));
        assert_eq!(v.fence_violations(), 2);
    }
}
