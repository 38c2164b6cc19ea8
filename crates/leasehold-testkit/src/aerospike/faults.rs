//! Fault injection on data messages, and three node-wide switches.
//!
//! A fault is a [`Fault`] (what goes wrong) bound to a [`Target`] (which requests it hits),
//! registered through the [`Faults`] handle of a running fixture. Faults only ever apply to data
//! messages (reads, writes, deletes, operates, scans), never to info requests: a node whose info
//! requests fail is dropped by the client's tend, which is a different failure than the one a
//! test usually wants.
//!
//! The switches act on the whole node: [`Faults::pause`] holds data messages (info is still
//! answered, the client keeps the node); [`Faults::freeze`] holds everything, info included, as
//! a SIGSTOPped server process does (the client's tend times out and drops the node);
//! [`Faults::set_partitions`] changes what the node says it owns, as while a cluster re-forms.
//!
//! Each data request is checked against the registered rules in registration order; the first
//! rule that matches decides the fault and, if it is count-limited, uses one of its requests.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::time::Duration;
//! use leasehold_testkit::aerospike::{AerospikeFixture, Fault, Target};
//!
//! let fixture = AerospikeFixture::start().await?;
//! // The next data request is answered 2 s late: a client with a shorter timeout times out.
//! fixture.faults().inject(Fault::DelayReply(Duration::from_secs(2)), Target::NextRequests(1));
//! // Every request on user key "lock-a" (any set) is applied but never answered.
//! let id = fixture.faults().inject(Fault::DropReply, Target::Key("lock-a".into()));
//! fixture.faults().remove(id);
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ripemd::{Digest, Ripemd160};
use tokio::sync::watch;

/// What goes wrong with a request a fault targets.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Apply the request, then wait this long before answering. With a client timeout shorter
    /// than the delay the client gives up first: for a write this is the in-doubt case (the write
    /// did happen).
    DelayReply(Duration),
    /// Close the connection as soon as the request is read, without applying it. The client sees
    /// a connection error; the request had no effect.
    DropConnection,
    /// Apply the request, then close the connection instead of answering: the write happened but
    /// the client never learns it (the in-doubt case, without waiting for a timeout).
    DropReply,
    /// Do not apply the request; answer it with this result code (see
    /// [`result_code`](super::result_code) for the usual ones).
    ResultCode(u8),
    /// Hold the request before applying it until [`Faults::release_held`]; the other connections
    /// go on. Pauses one client between two of its steps (give that client a timeout longer than
    /// the hold, or it gives up first); [`Faults::held`] tells when the request has arrived.
    Hold,
    /// No fault: the request goes through. With a count-limited target it lets the first requests
    /// on a record pass, so that a rule registered after it hits a later one. It counts in
    /// [`Faults::applied`], so a `NextRequests(u32::MAX)` pass-through rule counts data requests.
    PassThrough,
}

/// Which data requests a fault applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// The next `n` data requests, whatever their key. The rule is removed once used up.
    NextRequests(u32),
    /// Every request on the record whose user key is this string, in any set, until the rule is
    /// removed. Matched by digest (`RIPEMD-160(set ‖ 3 ‖ key)`), so it also hits requests that do
    /// not send the user key (reads and deletes never do).
    Key(String),
    /// Every request on the record with this 20-byte digest, until the rule is removed.
    Digest([u8; 20]),
    /// The next `n` requests on the record whose user key is this string (see [`Target::Key`]).
    KeyTimes(String, u32),
    /// The next `n` requests on the record with this digest.
    DigestTimes([u8; 20], u32),
}

/// What a node tells the client's tend about the partitions it owns ([`Faults::set_partitions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Partitions {
    /// Every partition of the namespace, as a one-node cluster does (the default).
    #[default]
    Owned,
    /// None: the node is up but masters no partition, as while a cluster re-forms and the
    /// partitions are being handed to other nodes. A client that maps the namespace now finds no
    /// node for any key (`InvalidNode`, "Cannot get appropriate node"); a client that mapped it
    /// before keeps routing to this node (the client drops a node's partitions only when another
    /// node claims them).
    Unowned,
    /// No partition table at all (an empty `replicas` answer), as from a node that has not
    /// joined a cluster yet: a client connecting now gives up with "the partition table never
    /// formed".
    NoTable,
}

/// Identifies one registered fault rule, for [`Faults::remove`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FaultId(u64);

#[derive(Debug)]
struct Rule {
    id: u64,
    fault: Fault,
    target: Target,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    rules: Vec<Rule>,
    applied: u64,
}

/// Handle to a fixture's fault rules and its pause switch. Cheap to clone; every clone controls
/// the same fixture.
#[derive(Debug, Clone)]
pub struct Faults {
    state: Arc<Mutex<State>>,
    paused: Arc<watch::Sender<bool>>,
    /// Bumped by `release_held`; a held request waits for it to change.
    releases: Arc<watch::Sender<u64>>,
    held: Arc<std::sync::atomic::AtomicUsize>,
    /// Set while the whole node stops answering (info too).
    frozen: Arc<watch::Sender<bool>>,
    /// What the node owns, and the partition generation it reports (bumped on every change).
    partitions: Arc<Mutex<(Partitions, u64)>>,
}

/// What a data request is about, as far as fault matching is concerned.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestKey<'a> {
    pub(crate) set: &'a [u8],
    pub(crate) digest: Option<&'a [u8]>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults::new()
    }
}

impl Faults {
    pub(crate) fn new() -> Self {
        let (paused, _) = watch::channel(false);
        let (releases, _) = watch::channel(0);
        let (frozen, _) = watch::channel(false);
        Faults {
            state: Arc::new(Mutex::new(State::default())),
            paused: Arc::new(paused),
            releases: Arc::new(releases),
            held: Arc::default(),
            frozen: Arc::new(frozen),
            partitions: Arc::new(Mutex::new((Partitions::Owned, 1))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the rules inconsistent: recover.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `fault` for the requests `target` selects and returns its id.
    pub fn inject(&self, fault: Fault, target: Target) -> FaultId {
        let mut state = self.lock();
        state.next_id += 1;
        let id = state.next_id;
        state.rules.push(Rule { id, fault, target });
        FaultId(id)
    }

    /// Removes one rule; returns whether it was still registered.
    pub fn remove(&self, id: FaultId) -> bool {
        let mut state = self.lock();
        let before = state.rules.len();
        state.rules.retain(|r| r.id != id.0);
        state.rules.len() != before
    }

    /// Removes every rule (does not resume a paused fixture).
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// Number of rules still registered (count-limited rules disappear once used up).
    pub fn pending(&self) -> usize {
        self.lock().rules.len()
    }

    /// Number of faults applied so far, over the fixture's lifetime.
    pub fn applied(&self) -> u64 {
        self.lock().applied
    }

    /// Holds every data request from now on (reading it, then waiting before applying it) until
    /// [`resume`](Self::resume). Info requests are still answered, so the client keeps the node.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Releases held data requests and lets new ones through.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Whether data requests are currently held.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Stops answering anything — info requests and data messages, on open and new connections
    /// — until [`thaw`](Self::thaw), as a SIGSTOPped server process: the kernel still accepts
    /// connections, every request waits. The client's tend times out and drops the node; data
    /// messages already received are applied after the thaw (a write whose client gave up meanwhile
    /// is the in-doubt case).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Answers again: the requests that waited are served in order.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Whether the node is frozen.
    pub fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// Waits until the node is not frozen.
    pub(crate) async fn wait_thawed(&self) {
        let mut rx = self.frozen.subscribe();
        // The sender lives in `self`, so `wait_for` only fails if it was dropped: then go on.
        let _ = rx.wait_for(|frozen| !*frozen).await.map(|_| ());
    }

    /// Changes what the node says it owns (see [`Partitions`]); the partition generation it
    /// reports changes with it, so a client asks again at its next tend (once a second by
    /// default).
    pub fn set_partitions(&self, partitions: Partitions) {
        let mut state = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 != partitions {
            *state = (partitions, state.1 + 1);
        }
    }

    /// What the node says it owns now.
    pub fn partitions(&self) -> Partitions {
        self.partition_state().0
    }

    /// What the node owns, and its partition generation.
    pub(crate) fn partition_state(&self) -> (Partitions, u64) {
        *self.partitions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets every request held by [`Fault::Hold`] go on (to be applied and answered).
    pub fn release_held(&self) {
        self.releases.send_modify(|n| *n += 1);
    }

    /// Number of requests currently held by [`Fault::Hold`].
    pub fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Holds the calling request until the next [`Faults::release_held`].
    pub(crate) async fn hold(&self) {
        let mut rx = self.releases.subscribe();
        rx.mark_unchanged();
        self.held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // The sender lives in `self`: `changed` only fails if it was dropped, then go on.
        let _ = rx.changed().await;
        self.held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until the fixture is not paused.
    pub(crate) async fn wait_resumed(&self) {
        let mut rx = self.paused.subscribe();
        // The sender lives in `self`, so `wait_for` only fails if it was dropped: then go on.
        let _ = rx.wait_for(|paused| !*paused).await.map(|_| ());
    }

    /// Picks the fault for one request, using up one count of a count-limited rule.
    pub(crate) fn take(&self, key: RequestKey<'_>) -> Option<Fault> {
        let mut state = self.lock();
        let mut hit = None;
        for (idx, rule) in state.rules.iter_mut().enumerate() {
            let (matches, remaining) = match &mut rule.target {
                Target::NextRequests(n) => (*n > 0, Some(n)),
                Target::Key(user_key) => (key_matches(user_key, key), None),
                Target::Digest(d) => (key.digest == Some(&d[..]), None),
                Target::KeyTimes(user_key, n) => (*n > 0 && key_matches(user_key, key), Some(n)),
                Target::DigestTimes(d, n) => (*n > 0 && key.digest == Some(&d[..]), Some(n)),
            };
            if matches {
                let used_up = match remaining {
                    Some(n) => {
                        *n -= 1;
                        *n == 0
                    }
                    None => false,
                };
                hit = Some((idx, rule.fault.clone(), used_up));
                break;
            }
        }
        let (idx, fault, used_up) = hit?;
        if used_up {
            state.rules.remove(idx);
        }
        state.applied += 1;
        Some(fault)
    }
}

impl Faults {
    /// Picks the fault for one batch request, whose rows are `keys`: the first rule that matches
    /// any row decides (a count-limited rule uses one count: the batch is one request). Returns
    /// the fault and which rows the rule matches (every row for [`Target::NextRequests`]), so
    /// that a result code can be imposed on those rows only, as a server answers per record.
    pub(crate) fn take_batch(&self, keys: &[RequestKey<'_>]) -> Option<(Fault, Vec<bool>)> {
        let mut state = self.lock();
        let mut hit = None;
        for (idx, rule) in state.rules.iter_mut().enumerate() {
            let matched: Vec<bool> = keys
                .iter()
                .map(|key| match &rule.target {
                    Target::NextRequests(n) => *n > 0,
                    Target::Key(user_key) => key_matches(user_key, *key),
                    Target::Digest(d) => key.digest == Some(&d[..]),
                    Target::KeyTimes(user_key, n) => *n > 0 && key_matches(user_key, *key),
                    Target::DigestTimes(d, n) => *n > 0 && key.digest == Some(&d[..]),
                })
                .collect();
            if !matched.iter().any(|m| *m) {
                continue;
            }
            let used_up = match &mut rule.target {
                Target::NextRequests(n) | Target::KeyTimes(_, n) | Target::DigestTimes(_, n) => {
                    *n -= 1;
                    *n == 0
                }
                Target::Key(_) | Target::Digest(_) => false,
            };
            hit = Some((idx, rule.fault.clone(), used_up, matched));
            break;
        }
        let (idx, fault, used_up, matched) = hit?;
        if used_up {
            state.rules.remove(idx);
        }
        state.applied += 1;
        Some((fault, matched))
    }
}

fn key_matches(user_key: &str, key: RequestKey<'_>) -> bool {
    key.digest == Some(&string_key_digest(key.set, user_key)[..])
}

/// The digest the client computes for a string user key in `set`: `RIPEMD-160(set ‖ 3 ‖ key)`.
pub(crate) fn string_key_digest(set: &[u8], user_key: &str) -> [u8; 20] {
    let mut hash = Ripemd160::new();
    hash.update(set);
    hash.update([crate::aerospike::wire::PARTICLE_STRING]);
    hash.update(user_key.as_bytes());
    hash.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_requests_is_used_up() {
        let faults = Faults::new();
        faults.inject(Fault::DropConnection, Target::NextRequests(2));
        let key = RequestKey {
            set: b"s",
            digest: None,
        };
        assert_eq!(faults.take(key), Some(Fault::DropConnection));
        assert_eq!(faults.take(key), Some(Fault::DropConnection));
        assert_eq!(faults.take(key), None);
        assert_eq!(faults.pending(), 0);
        assert_eq!(faults.applied(), 2);
    }

    #[test]
    fn key_rules_match_by_digest() {
        let faults = Faults::new();
        let id = faults.inject(Fault::ResultCode(14), Target::Key("k".into()));
        let digest = string_key_digest(b"set", "k");
        let hit = RequestKey {
            set: b"set",
            digest: Some(&digest),
        };
        let other = string_key_digest(b"set", "other");
        let miss = RequestKey {
            set: b"set",
            digest: Some(&other),
        };
        assert_eq!(faults.take(miss), None);
        assert_eq!(faults.take(hit), Some(Fault::ResultCode(14)));
        assert_eq!(faults.take(hit), Some(Fault::ResultCode(14)));
        assert!(faults.remove(id));
        assert_eq!(faults.take(hit), None);
    }

    #[test]
    fn a_batch_is_one_request_and_a_rule_says_which_rows_it_hits() {
        let faults = Faults::new();
        let target = string_key_digest(b"set", "k");
        let other = string_key_digest(b"set", "other");
        faults.inject(Fault::ResultCode(11), Target::DigestTimes(target, 1));
        fn rows<'a>(a: &'a [u8; 20], b: &'a [u8; 20]) -> [RequestKey<'a>; 2] {
            [
                RequestKey {
                    set: b"set",
                    digest: Some(&a[..]),
                },
                RequestKey {
                    set: b"set",
                    digest: Some(&b[..]),
                },
            ]
        }
        assert_eq!(faults.take_batch(&rows(&other, &other)), None);
        assert_eq!(
            faults.take_batch(&rows(&other, &target)),
            Some((Fault::ResultCode(11), vec![false, true]))
        );
        assert_eq!(faults.pending(), 0, "one count for the whole batch");
        faults.inject(Fault::DropReply, Target::NextRequests(1));
        assert_eq!(
            faults.take_batch(&rows(&other, &target)),
            Some((Fault::DropReply, vec![true, true]))
        );
        assert_eq!(faults.applied(), 2);
    }

    #[test]
    fn partition_changes_bump_the_generation_once_each() {
        let faults = Faults::new();
        assert_eq!(faults.partition_state(), (Partitions::Owned, 1));
        faults.set_partitions(Partitions::Unowned);
        faults.set_partitions(Partitions::Unowned);
        assert_eq!(faults.partition_state(), (Partitions::Unowned, 2));
        faults.set_partitions(Partitions::Owned);
        assert_eq!(faults.partitions(), Partitions::Owned);
        assert_eq!(faults.partition_state().1, 3);
    }
}
