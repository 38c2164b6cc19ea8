//! Fair waiting across processes on Aerospike: a waiter line per key in its own record, one place
//! per process (per store), served in arrival order; and since Aerospike cannot notify, a
//! per-key schedule in each process that wakes its waiters when the line says their turn is near.
//!
//! The line only orders who may *try*: exclusion is still decided by the lock record's
//! create-only write alone, so the Java manager and first-come clients, which never look at the
//! line, exclude and are excluded exactly as before. docs/AEROSPIKE.md walks through every
//! interleaving.
//!
//! Queue record `<lock set>#queue` / lock id (expires 2 × the waiter timeout after its last
//! write): `lh_line` map waiter id → `[ticket, deadline]`, `lh_granted` and `lh_hold` (when the
//! last queued process took the lock, and how long it expects to hold it: what waiters schedule
//! their next look by). Its operations and the fair acquire are in [`crate::queue`]; this module
//! is the per-process side: who waits on which key, the schedule that wakes them, and what the
//! process learned (hold estimates, how late its wake-ups resume).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::{NotifyRegistry, OwnerToken, ReleaseWatch};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::line::Line;

/// How soon a process whose waiters were woken but did not ask the store (none was listening,
/// or the one woken was refused in memory) is woken again: the net under a lost wake-up.
const FALLBACK: Duration = Duration::from_millis(25);
/// The last stretch of a scheduled wake-up slept precisely (see [`sleep_until`]).
const PRECISE: Duration = Duration::from_millis(2);
/// Longest correction of the drivers' wake-ups for their own lateness (see [`Lateness`]).
const MAX_EARLY: Duration = Duration::from_millis(1);
/// Hold estimates kept per store (one per key): past this, they are forgotten and relearned.
const MAX_HOLD_ESTIMATES: usize = 4096;

/// µs since the Unix epoch on this client's clock.
pub(crate) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(crate) fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// How the process left a key's line when its last waiter went.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Left {
    /// An entry was sent and never answered (its caller stopped waiting, or its reply was lost):
    /// it can land after the leave, so the leave looks again until such a place would lapse.
    pub(crate) entry_in_flight: bool,
}

/// A key some task of this process waits on (its live watches, blocking `lock()` calls in this
/// process, are counted by the registry).
#[derive(Debug)]
struct Watched {
    /// Whether the last attempt on the key left this process in the line.
    queued: bool,
    /// Entries into the line sent and not answered: their caller stopped waiting, or their reply
    /// was lost. Any of them can still land after the process left the line.
    unanswered_entries: u32,
    /// Refusals of this process at the head of the line since the holder's expected release.
    late: u32,
    /// The line as last read, when it showed this process at the head and the lock record then
    /// refused it: the next attempt soon after goes straight to the lock record (a place only
    /// moves forward, so the process is still the head, or its place lapsed — and trying then is
    /// safe, exclusion being the create's).
    head: Option<(Instant, Line)>,
    /// When the key's driver wakes this process's waiters next.
    wake_at: watch::Sender<Option<Instant>>,
}

/// What this process knows of its holds of one key.
#[derive(Debug, Default)]
struct Hold {
    /// Moving average of its holds, µs.
    average: Option<i64>,
    /// When its current hold began.
    since: Option<Instant>,
    /// The grant time it last wrote to the key's line (`lh_granted`), and the hold estimate
    /// written with it (`lh_hold`).
    published: Option<(i64, Option<i64>)>,
}

/// This store's waiting state: its id in every line, the keys it waits on, its hold estimates.
pub(crate) struct Waiting {
    /// One place per process (per store): fairness is between processes, and local competition
    /// orders the tasks inside one.
    id: String,
    /// The keys this process waits on, each with the wake-up its watches share.
    watched: NotifyRegistry<Watched>,
    /// Key → how long this process holds it (a moving average, µs), published when it takes the
    /// key so waiters elsewhere know when to look again; when its current hold began; the grant
    /// time it last published.
    holds: Mutex<HashMap<String, Hold>>,
    /// How late the drivers' wake-ups come, shared by every key's driver.
    lateness: Arc<Lateness>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting").field("id", &self.id).finish()
    }
}

impl Waiting {
    pub(crate) fn new() -> Self {
        Waiting {
            // host/pid/uuid: unique per store instance, readable in the record.
            id: OwnerToken::generate().as_str().to_owned(),
            watched: NotifyRegistry::new(),
            holds: Mutex::new(HashMap::new()),
            lateness: Arc::new(Lateness::default()),
        }
    }

    /// This store's waiter id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Whether more than one task of this process waits on `key` (the one asking, and others).
    pub(crate) fn others_wait(&self, key: &str) -> bool {
        self.waiters(key) > 1
    }

    /// How many tasks of this process wait on `key` (live watches).
    pub(crate) fn waiters(&self, key: &str) -> usize {
        self.watched.registrations(key)
    }

    /// Registers a waiter on `key`; the first one starts the key's driver, which wakes this
    /// process's waiters when the line says to look again. The last one to go leaves the line
    /// (`leave`) if the process is still in it, saying whether an entry may still land.
    pub(crate) fn watch(
        self: &Arc<Self>,
        key: String,
        leave: impl FnOnce(Left) + Send + Sync + 'static,
    ) -> ReleaseWatch {
        let (notify, ()) = self.watched.register(
            &key,
            |notify| {
                let (wake_at, rx) = watch::channel(None);
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(drive(rx, notify.clone(), self.lateness.clone()));
                }
                Watched {
                    queued: false,
                    unanswered_entries: 0,
                    late: 0,
                    head: None,
                    wake_at,
                }
            },
            |_, _| (),
        );
        let waiting = self.clone();
        ReleaseWatch::new(notify, move || {
            if let Some(left) = waiting.unwatch(&key) {
                leave(left);
            }
        })
    }

    /// One waiter on `key` is gone; `Some` when it was the last and the process is in line, or
    /// an entry of it may still land.
    pub(crate) fn unwatch(&self, key: &str) -> Option<Left> {
        // Dropping the last entry drops its sender: the driver ends.
        self.watched
            .unregister(key)
            .filter(|entry| entry.queued || entry.unanswered_entries > 0)
            .map(|entry| Left {
                entry_in_flight: entry.unanswered_entries > 0,
            })
    }

    /// Before an entry into `key`'s line is sent: from now on the process may be in line, and
    /// the entry may land at any time until it is answered.
    pub(crate) fn entering(&self, key: &str) {
        self.watched.with(key, |entry| {
            entry.queued = true;
            entry.unanswered_entries = entry.unanswered_entries.saturating_add(1);
        });
    }

    /// An entry into `key`'s line was answered.
    pub(crate) fn entered(&self, key: &str) {
        self.watched.with(key, |entry| {
            entry.unanswered_entries = entry.unanswered_entries.saturating_sub(1);
        });
    }

    /// After an attempt on `key`: whether the process is in line now, and when its waiters should
    /// look again (`None`: nothing scheduled).
    pub(crate) fn attempted(&self, key: &str, queued: bool, again_in: Option<Duration>) {
        self.watched.with(key, |entry| {
            entry.queued = queued;
            if let Some(again_in) = again_in {
                entry.wake_at.send_replace(Some(Instant::now() + again_in));
            }
        });
    }

    /// Remembers (`Some`) or forgets the line that showed this process at the head.
    pub(crate) fn set_head(&self, key: &str, line: Option<Line>) {
        self.watched.with(key, |entry| {
            entry.head = line.map(|line| (Instant::now(), line));
        });
    }

    /// The line that showed this process at the head, if read less than `within` ago.
    pub(crate) fn head(&self, key: &str, within: Duration) -> Option<Line> {
        self.watched
            .with(key, |entry| {
                let (at, line) = entry.head.as_ref()?;
                (at.elapsed() < within).then(|| line.clone())
            })
            .flatten()
    }

    /// Refusals at the head past the holder's expected release, counting this one (`overdue`), or
    /// back to 0.
    pub(crate) fn late(&self, key: &str, overdue: bool) -> u32 {
        self.watched
            .with(key, |entry| {
                entry.late = if overdue {
                    entry.late.saturating_add(1)
                } else {
                    0
                };
                entry.late.saturating_sub(1)
            })
            .unwrap_or(0)
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, HashMap<String, Hold>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This process was granted `key` at `at` (measured after the grant, not from when the
    /// request was sent: the grant time waiters see is also taken after the grant), or `None`:
    /// this hold is not to be sampled (see [`sampled`]).
    pub(crate) fn granted(&self, key: &str, at: Option<Instant>) {
        let mut holds = self.holds();
        if at.is_none() && !holds.contains_key(key) {
            return;
        }
        if holds.len() >= MAX_HOLD_ESTIMATES && !holds.contains_key(key) {
            holds.clear();
        }
        holds.entry(key.to_owned()).or_default().since = at;
    }

    /// This process releases `key`: the hold since its grant is folded into the key's estimate
    /// (weight 1/4).
    pub(crate) fn released(&self, key: &str) {
        let mut holds = self.holds();
        let Some(hold) = holds.get_mut(key) else {
            return;
        };
        let Some(since) = hold.since.take() else {
            return;
        };
        let sample = us(since.elapsed());
        hold.average = Some(hold.average.map_or(sample, |avg| avg + (sample - avg) / 4));
    }

    /// This process writes `at` as the key's grant time (`lh_granted`), and `hold` as its
    /// estimate (`lh_hold`).
    pub(crate) fn publish(&self, key: &str, at: i64, hold: Option<i64>) {
        let mut holds = self.holds();
        if holds.len() >= MAX_HOLD_ESTIMATES && !holds.contains_key(key) {
            holds.clear();
        }
        holds.entry(key.to_owned()).or_default().published = Some((at, hold));
    }

    /// The grant time this process last wrote to the key's line: a line showing it shows this
    /// process's own hold, over once one of its tasks asks the store again.
    pub(crate) fn published(&self, key: &str) -> Option<i64> {
        self.holds()
            .get(key)
            .and_then(|hold| hold.published)
            .map(|(at, _)| at)
    }

    /// This process releases `key` at `now`: the grant time it published, if the line would
    /// still show it holding ([`Line::holder_busy`]), so that a head reading the line meanwhile
    /// would wait out the rest of the estimate for nothing.
    pub(crate) fn released_early(&self, key: &str, now: i64) -> Option<i64> {
        let (at, hold) = self.holds().get(key)?.published?;
        let shown = Line {
            granted: Some(at),
            hold,
            ..Line::default()
        };
        shown.holder_busy(now).then_some(at)
    }

    pub(crate) fn hold_estimate(&self, key: &str) -> Option<i64> {
        self.holds().get(key).and_then(|hold| hold.average)
    }
}

/// Whether a hold is one hold, to be folded into the key's estimate: granted while other
/// processes waited (`contended`: local competition never hands such a lease to another task of
/// the process), or while no other task of this process waited (`local_others`: none to hand it
/// to). Otherwise the lease may be handed from task to task (leasehold's local hand-off) and
/// held, across the chain, many times longer than one hold: an estimate learned from that tells
/// the next head to wait that long (measured on the fleet benchmark with hand-off: 27 ms
/// instead of 3, the lock idle 25 ms a turn for the first second).
pub(crate) fn sampled(contended: bool, local_others: bool) -> bool {
    contended || !local_others
}

/// A key's driver: wakes the process's waiters at the scheduled time, and again every
/// [`FALLBACK`] until an attempt reschedules; ends when the last waiter goes (the sender drops).
async fn drive(
    mut wake_at: watch::Receiver<Option<Instant>>,
    notify: Arc<Notify>,
    lateness: Arc<Lateness>,
) {
    let mut next = *wake_at.borrow_and_update();
    loop {
        let sleep = async {
            match next {
                Some(at) => {
                    let planned = lateness.start(at);
                    if sleep_until(planned).await {
                        lateness.observe(planned, Instant::now());
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = wake_at.changed() => {
                if changed.is_err() {
                    return;
                }
                next = *wake_at.borrow_and_update();
            }
            () = sleep => {
                // Every waiter of the process: which one asks is local competition's call.
                notify.notify_waiters();
                next = Some(Instant::now() + FALLBACK);
            }
        }
    }
}

/// How late this process's drivers resume after the sleep they asked for (a moving average, µs),
/// so that they start their sleeps that much earlier and wake at the scheduled time.
///
/// Measured on the fleet benchmark's 2 shared cores: 95–175 µs (the sleeping thread's timer
/// slack, handing the end of its sleep back to the runtime, the driver task being polled), on a
/// head scheduled to try about 100 µs after the holder's expected release: it more than doubled
/// the time the lock stood free. An early wake costs at worst one early look (refused, looked
/// again shortly); the correction is bounded by [`MAX_EARLY`].
#[derive(Debug, Default)]
pub(crate) struct Lateness {
    average_us: AtomicU64,
}

impl Lateness {
    /// When to start waking for a wake-up scheduled at `at`.
    fn start(&self, at: Instant) -> Instant {
        let early = Duration::from_micros(self.average_us.load(Ordering::Relaxed));
        at.checked_sub(early).unwrap_or(at)
    }

    /// A sleep meant to end at `planned` ended at `woke`: folded into the average (weight 1/8).
    fn observe(&self, planned: Instant, woke: Instant) {
        let sample = woke.saturating_duration_since(planned).min(MAX_EARLY);
        let sample = u64::try_from(sample.as_micros()).unwrap_or(u64::MAX);
        // Drivers of several keys may race here; a lost update only drops one sample.
        let average = self.average_us.load(Ordering::Relaxed);
        let average = if sample >= average {
            average + (sample - average) / 8
        } else {
            average - (average - sample) / 8
        };
        self.average_us.store(average, Ordering::Relaxed);
    }
}

/// Sleeps until `at`, to the tenth of a millisecond rather than tokio's whole milliseconds (a
/// timer fires on the next millisecond tick, up to one late): on a key held for a couple of
/// milliseconds, that lateness would be a third of the lock's time. The last [`PRECISE`] is slept
/// on a blocking thread. `true` when the sleep ended at a time asked for (`at` was ahead when it
/// began, so how late it ended says something about the timers).
async fn sleep_until(at: Instant) -> bool {
    if at <= Instant::now() {
        return false;
    }
    if let Some(coarse) = at.checked_sub(PRECISE) {
        if coarse > Instant::now() {
            tokio::time::sleep_until(coarse).await;
        }
    }
    let left = at.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        // Cancelled (rescheduled) meanwhile, the thread only finishes its short sleep.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(left)).await;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `notify` fires (to an enabled waiter) within `within`.
    async fn fires(notify: &Notify, within: Duration) -> bool {
        tokio::time::timeout(within, notify.notified())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn the_driver_wakes_at_the_schedule_then_keeps_a_net_until_the_last_waiter_goes() {
        let waiting = Arc::new(Waiting::new());
        let left = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = left.clone();
        let watch = waiting.watch("k".to_owned(), move |left: Left| {
            assert!(!left.entry_in_flight, "no entry was sent");
            flag.store(true, std::sync::atomic::Ordering::SeqCst)
        });
        let second = waiting.watch("k".to_owned(), |_| panic!("not the last waiter"));
        assert!(waiting.others_wait("k"));
        assert!(
            !fires(watch.notify(), Duration::from_secs(60)).await,
            "nothing scheduled"
        );

        waiting.attempted("k", true, Some(Duration::from_millis(40)));
        let start = Instant::now();
        // The last `PRECISE` is slept on a thread, outside paused time.
        let at = |d: Duration| d.checked_sub(PRECISE).unwrap()..=d;
        assert!(fires(watch.notify(), Duration::from_secs(1)).await);
        assert!(at(Duration::from_millis(40)).contains(&start.elapsed()));
        // Nobody asked the store again: the net wakes again.
        let start = Instant::now();
        assert!(fires(watch.notify(), Duration::from_secs(1)).await);
        assert!(at(FALLBACK).contains(&start.elapsed()));
        // A new attempt reschedules.
        waiting.attempted("k", true, Some(Duration::from_millis(5)));
        let start = Instant::now();
        assert!(fires(watch.notify(), Duration::from_secs(1)).await);
        assert!(at(Duration::from_millis(5)).contains(&start.elapsed()));

        drop(second);
        assert!(!waiting.others_wait("k"));
        drop(watch);
        assert!(
            left.load(std::sync::atomic::Ordering::SeqCst),
            "the last waiter of a queued process leaves the line"
        );
        assert!(waiting.watched.is_empty());
    }

    /// A runtime to enter, for the keys' drivers that `watch` spawns.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn a_leave_says_whether_an_entry_was_sent_and_never_answered() {
        let waiting = Arc::new(Waiting::new());
        let rt = runtime();
        let _enter = rt.enter();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let watch_k = |seen: &Arc<Mutex<Vec<bool>>>| {
            let seen = seen.clone();
            waiting.watch("k".to_owned(), move |left: Left| {
                seen.lock().unwrap().push(left.entry_in_flight)
            })
        };
        // Answered: nothing can land after the leave.
        let watch = watch_k(&seen);
        waiting.entering("k");
        waiting.entered("k");
        drop(watch);
        // Sent, and its caller gone before the answer.
        let watch = watch_k(&seen);
        waiting.entering("k");
        drop(watch);
        // Two sent at once, one answered: the other may still land.
        let watch = watch_k(&seen);
        waiting.entering("k");
        waiting.entering("k");
        waiting.entered("k");
        drop(watch);
        // Out of line after a grant, with an entry still unanswered: the leave still looks.
        let watch = watch_k(&seen);
        waiting.entering("k");
        waiting.attempted("k", false, None);
        drop(watch);
        assert_eq!(*seen.lock().unwrap(), [false, true, true, true]);
    }

    #[test]
    fn a_process_not_in_line_does_not_leave_it_and_late_refusals_count_up() {
        let waiting = Arc::new(Waiting::new());
        let rt = runtime();
        let _enter = rt.enter();
        let watch = waiting.watch("k".to_owned(), |_| panic!("was never in line"));
        waiting.attempted("k", false, None);
        assert_eq!(waiting.late("k", true), 0, "first overdue refusal");
        assert_eq!(waiting.late("k", true), 1);
        assert_eq!(waiting.late("k", false), 0, "reset");
        drop(watch);
    }

    #[tokio::test(start_paused = true)]
    async fn hold_estimates_follow_a_moving_average_of_grant_to_release() {
        let waiting = Waiting::new();
        assert_eq!(waiting.hold_estimate("k"), None);
        waiting.released("k");
        assert_eq!(waiting.hold_estimate("k"), None, "no grant, no sample");
        for held in [4, 8] {
            waiting.granted("k", Some(Instant::now()));
            tokio::time::sleep(Duration::from_millis(held)).await;
            waiting.released("k");
        }
        assert_eq!(waiting.hold_estimate("k"), Some(5_000));
        waiting.released("k");
        assert_eq!(
            waiting.hold_estimate("k"),
            Some(5_000),
            "one sample per grant"
        );
    }

    #[test]
    fn wake_ups_start_as_early_as_they_have_been_late_within_a_bound() {
        let lateness = Lateness::default();
        let at = Instant::now() + Duration::from_secs(10);
        assert_eq!(lateness.start(at), at, "nothing learned yet");
        // Every sleep ended 160 µs after it was meant to: the start moves earlier by 1/8 of the
        // difference each time.
        let planned = lateness.start(at);
        lateness.observe(planned, planned + Duration::from_micros(160));
        assert_eq!(lateness.start(at), at - Duration::from_micros(20));
        for _ in 0..100 {
            let planned = lateness.start(at);
            lateness.observe(planned, planned + Duration::from_micros(160));
        }
        let early = at - lateness.start(at);
        assert!(
            (Duration::from_micros(150)..=Duration::from_micros(160)).contains(&early),
            "{early:?}"
        );
        // Wild lateness (a stalled process) moves it at most to the bound.
        for _ in 0..200 {
            let planned = lateness.start(at);
            lateness.observe(planned, planned + Duration::from_secs(1));
        }
        assert!(at - lateness.start(at) <= MAX_EARLY);
        // Sleeps that end on time bring it back down.
        for _ in 0..200 {
            let planned = lateness.start(at);
            lateness.observe(planned, planned);
        }
        assert!(at - lateness.start(at) < Duration::from_micros(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_already_due_is_no_sample_of_lateness() {
        let now = Instant::now();
        assert!(!sleep_until(now).await, "due: no sleep, nothing to learn");
        assert!(!sleep_until(now - Duration::from_millis(1)).await);
        assert!(sleep_until(Instant::now() + Duration::from_millis(5)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_that_may_have_been_handed_on_is_not_learned() {
        assert!(sampled(true, true), "contended: never handed on");
        assert!(sampled(false, false), "no other task to hand it to");
        assert!(!sampled(false, true), "uncontended, other tasks waiting");

        let waiting = Waiting::new();
        waiting.granted("k", Some(Instant::now()));
        tokio::time::sleep(Duration::from_millis(3)).await;
        waiting.released("k");
        assert_eq!(waiting.hold_estimate("k"), Some(3_000));
        // A chain of hand-offs: granted unsampled, released 30 ms later.
        waiting.granted("k", None);
        tokio::time::sleep(Duration::from_millis(30)).await;
        waiting.released("k");
        assert_eq!(waiting.hold_estimate("k"), Some(3_000), "unchanged");
        // An unsampled grant also drops a sampled one that was never released (a lease lost).
        waiting.granted("k", Some(Instant::now()));
        waiting.granted("k", None);
        tokio::time::sleep(Duration::from_millis(30)).await;
        waiting.released("k");
        assert_eq!(waiting.hold_estimate("k"), Some(3_000));
        waiting.granted("other", None);
        assert!(
            !waiting.holds().contains_key("other"),
            "nothing kept for a key never learned"
        );
    }

    #[test]
    fn a_process_knows_the_grant_it_published_and_whether_it_releases_before_it() {
        let waiting = Waiting::new();
        assert_eq!(waiting.published("k"), None);
        assert_eq!(waiting.released_early("k", 0), None);
        waiting.publish("k", 1_000_000, Some(2_000));
        assert_eq!(waiting.published("k"), Some(1_000_000));
        assert_eq!(
            waiting.hold_estimate("k"),
            None,
            "publishing learns no hold"
        );
        assert_eq!(
            waiting.released_early("k", 1_000_500),
            Some(1_000_000),
            "released 1.5 ms before the line says: clear the grant"
        );
        assert_eq!(
            waiting.released_early("k", 1_001_900),
            None,
            "about when the line says"
        );
        waiting.publish("k", 1_003_000, None);
        assert_eq!(waiting.published("k"), Some(1_003_000));
        assert_eq!(
            waiting.released_early("k", 1_003_001),
            None,
            "no estimate published: nobody waits it out"
        );
    }
}
