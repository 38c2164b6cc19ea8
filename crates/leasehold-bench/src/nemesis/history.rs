//! What a run records: every acquisition and failed acquisition as its worker saw them, every
//! write as the fenced resource saw it, every client pause and every fault injected. All times
//! are nanoseconds on the machine-wide monotonic clock ([`super::clock`]).
//!
//! Workers write their records as JSON lines into a file of their own; the coordinator reads
//! them back once the workers have exited.

use serde::{Deserialize, Serialize};

/// How a release ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseOutcome {
    /// `release()` answered `Ok(true)`: the lock was still ours.
    Released,
    /// `release()` answered `Ok(false)`: the lock was no longer ours.
    NotOurs,
    /// `release()` failed (the store stayed down; the lock is left to expire).
    Failed(String),
}

/// What the resource answered to a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteOutcome {
    /// Accepted: the token was at least the highest seen.
    Accepted,
    /// Rejected by the fence: a higher token had been seen.
    Rejected,
    /// The resource could not be reached.
    Failed,
}

/// One acquisition, from the grant to the end of its release, as the worker saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Acquisition {
    /// The worker process (0-based).
    pub worker: usize,
    /// Its acquisitions, numbered from 0 in the worker.
    pub seq: u64,
    /// The guard's fencing token.
    pub token: Option<u64>,
    /// When `lock_with` was called.
    pub asked_ns: u64,
    /// When it returned the guard.
    pub acquired_ns: u64,
    /// The two writes of the critical section (begin, commit), as the worker saw their answers.
    pub writes: [WriteOutcome; 2],
    /// When the worker first saw the guard report the loss (`lost()` resolved), if it did before
    /// the release.
    pub lost_ns: Option<u64>,
    /// The reason the guard gave.
    pub lost_reason: Option<String>,
    /// When `release()` was called (the end of the critical section).
    pub release_ns: u64,
    /// When it returned.
    pub released_ns: u64,
    /// Its answer.
    pub release: ReleaseOutcome,
}

/// An acquisition that failed (its wait ran out, or the store stayed down).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AcquireFailure {
    /// The worker process.
    pub worker: usize,
    /// When `lock_with` was called.
    pub asked_ns: u64,
    /// When it failed.
    pub failed_ns: u64,
    /// The error's kind (`Timeout`, `Connection`, …).
    pub kind: String,
    /// The error's message.
    pub message: String,
}

/// One line of a worker's history file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WorkerEvent {
    /// A lock taken, used and released.
    Acquired(Acquisition),
    /// A lock not obtained.
    Failed(AcquireFailure),
}

/// A write as the fenced resource saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriteRecord {
    /// The worker that sent it.
    pub worker: usize,
    /// The worker's acquisition it belongs to.
    pub seq: u64,
    /// 1: the begin write, 2: the commit write of the critical section.
    pub phase: u8,
    /// The fencing token it carried (`None`: a store without fencing).
    pub token: Option<u64>,
    /// When the resource read the request.
    pub start_ns: u64,
    /// When it answered.
    pub end_ns: u64,
    /// Whether the fence let it through.
    pub accepted: bool,
    /// The highest token accepted before it.
    pub highest_before: Option<u64>,
}

/// A worker stopped (SIGSTOP) by the resource after its begin write, for a client pause.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientPause {
    /// The worker paused.
    pub worker: usize,
    /// The acquisition it held.
    pub seq: u64,
    /// The token of that acquisition.
    pub token: Option<u64>,
    /// When it was stopped.
    pub paused_ns: u64,
    /// When it was continued (SIGCONT).
    pub resumed_ns: u64,
}

/// A fault the nemesis injected.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultRecord {
    /// Its kind ([`super::fault::FaultKind::name`]).
    pub kind: String,
    /// What it hit (a node's port, a member, a worker).
    pub target: String,
    /// When it was injected.
    pub start_ns: u64,
    /// When it was healed and the deployment had settled again.
    pub end_ns: u64,
    /// An error injecting or healing it, if any (the run goes on).
    pub error: Option<String>,
}
