//! This store's places in the waiter queues of the keys its tasks wait on: the places
//! themselves (the process's, or in strict FIFO mode each waiting call's), the watches that
//! hold them, and the subscriptions that linger after the last wait on a key.
//!
//! Their data ([`Watched`], [`Watcher`], and the map of them in [`Waiting`]) is defined in
//! [`super::state`]; this module is what is done with it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use leasehold_core::{Acquire, ReleaseWatch, WaiterId};
use tokio::sync::Notify;
use tokio::time::Instant;

use futures::FutureExt;

pub(crate) use super::state::Leave;
use super::state::{Leaving, Parked, Waiting, Watched, Watcher};

impl Watched {
    /// Wakes every waiter of this process on the key.
    pub(super) fn wake_all(&self) {
        for watcher in self.watchers.values() {
            watcher.notify.notify_waiters();
        }
    }

    /// Gives up the process's place in the key's line (`id`, the store's): forgets it here and
    /// starts the leave script, recorded in `leaving` under the map's lock, so the process's next
    /// attempt on the key waits for it.
    pub(super) fn leave_process_place(&mut self, id: &str, leave: &Leave) {
        self.queued = false;
        self.kept = false;
        self.renewed = None;
        self.parked = None;
        if let Some(task) = leave(id.to_owned()) {
            self.leaving = Some(task.map(drop).boxed().shared());
        }
    }

    /// Gives up the parked place, if any (see [`Self::leave_process_place`]).
    pub(super) fn give_up_parked(&mut self, id: &str) {
        if let Some(parked) = self.parked.take() {
            self.leave_process_place(id, &parked.leave);
        }
    }
}

/// How long a key's subscription outlives its last waiter.
const LINGER: std::time::Duration = std::time::Duration::from_secs(30);

/// How long after the grant that kept it (a grant while others were in line) the process keeps
/// its place in a key's line with nobody here waiting, for a task of it to ask again: a loop on
/// a hot key then waits for its turn without a try and a join. Given up sooner when its turn
/// comes with nobody here waiting (the next in line is told at once).
const KEEP: std::time::Duration = std::time::Duration::from_secs(1);

/// At most this many idle subscriptions are kept; beyond it the longest idle go first.
const MAX_IDLE: usize = 1024;

/// How often, at most, the idle subscriptions are looked over.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The entry a blocking attempt holds in a key's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// A try: never queued (the empty id in the scripts).
    None,
    /// The process's entry (the store's id): the default, and in strict mode the fallback for an
    /// attempt whose wait this store does not know.
    Process,
    /// A waiting call's own entry (strict FIFO).
    Waiter(WaiterId, String),
}

impl Waiting {
    /// Whether more than one task of this process waits on `lock_key` (the one asking, and others).
    pub(crate) fn others_wait(&self, lock_key: &str) -> bool {
        self.lock()
            .get(lock_key)
            .is_some_and(|w| w.watchers.len() > 1)
    }

    /// The entry `req` asks under: none for a try; in strict mode the waiting call's own entry
    /// when this store minted its wait ([`Acquire::waiter`]), else the process's.
    pub(crate) fn place(&self, lock_key: &str, req: &Acquire, strict: bool) -> Place {
        if req.wait.is_none() {
            return Place::None;
        }
        if strict {
            if let Some(waiter) = req.waiter() {
                if let Some(watcher) = self
                    .lock()
                    .get(lock_key)
                    .and_then(|w| w.watchers.get(&waiter))
                {
                    return Place::Waiter(waiter, watcher.entry.clone());
                }
            }
        }
        Place::Process
    }

    /// The id a place is queued under in the scripts (empty: never queued).
    pub(crate) fn entry<'a>(&'a self, place: &'a Place) -> &'a str {
        match place {
            Place::None => "",
            Place::Process => &self.id,
            Place::Waiter(_, entry) => entry,
        }
    }

    /// Whether the process's place in `lock_key`'s queue is due to be renewed: it has none on
    /// record, or the attempt that last renewed it was sent `every` ago or longer.
    pub(crate) fn place_due(&self, lock_key: &str, every: std::time::Duration) -> bool {
        self.lock()
            .get(lock_key)
            .and_then(|w| w.renewed)
            .is_none_or(|at| at.elapsed() >= every)
    }

    /// Records whether the last attempt under `place` left it in the key's queue, and for the
    /// process's place when that attempt (sent at `renewed`) renewed its deadline. Returns the
    /// entry to leave at once when a waiting call's attempt queued it after the call stopped
    /// waiting (its watch is gone, so nobody else would take it out).
    pub(crate) fn set_queued(
        &self,
        lock_key: &str,
        place: &Place,
        queued: bool,
        renewed: Option<Instant>,
    ) -> Option<String> {
        let mut watched = self.lock();
        let found = watched.get_mut(lock_key);
        match place {
            Place::None => None,
            Place::Process => {
                if let Some(watched) = found {
                    watched.queued = queued;
                    watched.kept = false;
                    watched.turn_given = false;
                    if !queued {
                        watched.renewed = None;
                    } else if renewed.is_some() {
                        watched.renewed = renewed;
                    }
                }
                None
            }
            Place::Waiter(waiter, entry) => match found.and_then(|w| w.watchers.get_mut(waiter)) {
                Some(watcher) => {
                    watcher.queued = queued;
                    None
                }
                None => queued.then(|| entry.clone()),
            },
        }
    }

    /// Whether a blocking attempt of this process was granted `lock_key` less than [`KEEP`]
    /// ago: a process waiting for the key again so soon keeps asking for it (a loop on a hot
    /// key), so its place is worth keeping after its grant.
    pub(crate) fn asks_again_soon(&self, lock_key: &str) -> bool {
        self.lock()
            .get(lock_key)
            .and_then(|w| w.last_grant)
            .is_some_and(|at| at.elapsed() < KEEP)
    }

    /// Records a grant to a blocking attempt under the process's place, sent at `sent_at`, and
    /// whether it kept the place in `lock_key`'s line (after [`Self::set_queued`]): a kept place
    /// outlives the last waiter for a moment.
    pub(crate) fn granted(&self, lock_key: &str, sent_at: Instant, kept: bool) {
        if let Some(watched) = self.lock().get_mut(lock_key) {
            watched.last_grant = Some(sent_at);
            watched.kept = kept && watched.queued;
        }
    }

    /// Whether the process has a place in `lock_key`'s line (see
    /// [`LockStore::is_in_line_here`](leasehold_core::LockStore::is_in_line_here)).
    pub(crate) fn in_line(&self, lock_key: &str) -> bool {
        self.lock()
            .get(lock_key)
            .is_some_and(|w| w.queued && !w.turn_given)
    }

    /// Gives up the place parked by the grant at `since` in `lock_key`'s line, if it is still
    /// parked: it was kept long enough.
    fn give_up_parked_since(&self, lock_key: &str, since: Instant) {
        if let Some(watched) = self.lock().get_mut(lock_key) {
            if watched.parked.as_ref().map(|p| p.since) == Some(since) {
                watched.give_up_parked(&self.id);
            }
        }
    }

    /// The leave script in flight for the process's place in `lock_key`'s line, if any: an
    /// attempt under that place waits for it first.
    pub(crate) fn leaving(&self, lock_key: &str) -> Option<Leaving> {
        let mut map = self.lock();
        let watched = map.get_mut(lock_key)?;
        if watched.leaving.as_ref().is_some_and(|l| l.peek().is_some()) {
            watched.leaving = None; // done
        }
        watched.leaving.clone()
    }

    /// Gives up every place this process parked (kept after a grant, nobody here waiting), and
    /// returns every leave in flight: a process shutting down tells the next in line now,
    /// instead of leaving them to wait for the places' deadlines.
    pub(crate) fn give_up_all_parked(&self) -> Vec<Leaving> {
        let mut map = self.lock();
        map.values_mut()
            .filter_map(|w| {
                w.give_up_parked(&self.id);
                w.leaving.clone()
            })
            .collect()
    }

    /// Registers a waiting call on `lock_key`; unless the key's subscription is still in place
    /// (others wait, or it lingers from an earlier wait), subscribes to this process's channel
    /// for the key, confirmed before this returns, so no release after it is missed.
    pub(crate) async fn watch(self: &Arc<Self>, lock_key: String, leave: Leave) -> ReleaseWatch {
        let notify = Arc::new(Notify::new());
        // The watch mints the wait's id; the registration follows under that id, before any
        // attempt of the wait can queue or be named.
        let watch = ReleaseWatch::new(notify.clone(), || {});
        let waiter = watch.waiter();
        let entry = format!(
            "{}#{}",
            self.id,
            self.next_watch.fetch_add(1, Ordering::Relaxed)
        );
        let subscribed = {
            let mut watched = self.lock();
            let watched = watched.entry(lock_key.clone()).or_default();
            watched.idle_since = None;
            // A parked place is this call's to wait in.
            watched.parked = None;
            watched.watchers.insert(
                waiter,
                Watcher {
                    notify,
                    entry,
                    queued: false,
                },
            );
            watched.subscribed
        };
        // Undone by the watch's drop from here on: a caller that stops waiting during the
        // subscription below (its deadline came, or it was cancelled) leaves nothing registered.
        let waiting = self.clone();
        let watch = watch.also_on_drop({
            let lock_key = lock_key.clone();
            move || waiting.unwatch(lock_key, waiter, leave)
        });
        if !subscribed {
            let dropped = self.dropped.load(Ordering::SeqCst);
            match self.subscribe(self.own_channel(&lock_key)).await {
                // Marked under the map's lock, where a drop clears every mark: either the drop
                // came first and is seen here, or it clears this mark after.
                Ok(()) => {
                    let mut watched = self.lock();
                    if self.dropped.load(Ordering::SeqCst) == dropped {
                        if let Some(watched) = watched.get_mut(&lock_key) {
                            watched.subscribed = true;
                        }
                    }
                }
                Err(error) => tracing::debug!(key = %lock_key, %error,
                    "could not subscribe to release notifications; waiting by polling"),
            }
        }
        watch
    }

    fn unwatch(self: &Arc<Self>, lock_key: String, waiter: WaiterId, leave: Leave) {
        let mut parked = None;
        let (own, last) = {
            let mut watched = self.lock();
            let Some(entry) = watched.get_mut(&lock_key) else {
                return;
            };
            let own = entry
                .watchers
                .remove(&waiter)
                .filter(|w| w.queued)
                .map(|w| w.entry);
            if entry.watchers.is_empty() {
                // The last waiter here: the process's place goes (so the next in line need not
                // wait out its timeout), unless a grant kept it and its turn has not come yet
                // (then for the rest of its keep time); the subscription lingers.
                entry.idle_since = Some(Instant::now());
                match entry.last_grant {
                    Some(since) if entry.queued && entry.kept && !entry.turn_given => {
                        entry.parked = Some(Parked {
                            since,
                            leave: leave.clone(),
                        });
                        parked = Some(since);
                    }
                    _ if entry.queued => entry.leave_process_place(&self.id, &leave),
                    _ => {}
                }
                (own, true)
            } else {
                (own, false)
            }
        };
        // A waiting call that gave up leaves its own place at once (strict FIFO).
        if let Some(own) = own {
            let _ = leave(own);
        }
        if let Some(since) = parked {
            self.give_up_later(lock_key, since);
        }
        if last {
            self.sweep();
            self.sweep_later();
        }
    }

    /// Gives up the place parked by the grant at `since` [`KEEP`] after that grant, if it is
    /// still parked then. Holds the store weakly: a dropped store's places lapse in the store.
    fn give_up_later(self: &Arc<Self>, lock_key: String, since: Instant) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.give_up_parked_since(&lock_key, since);
            return;
        };
        let waiting = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep_until(since + KEEP).await;
            if let Some(waiting) = waiting.upgrade() {
                waiting.give_up_parked_since(&lock_key, since);
            }
        });
    }

    /// Sweeps again once the idle subscriptions have lingered, while any are left: a process
    /// that stops waiting altogether must not keep them subscribed for good. One timer at a time,
    /// holding the store weakly (a dropped store's timer ends).
    fn sweep_later(self: &Arc<Self>) {
        if self.sweep_scheduled.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweep_scheduled.store(false, Ordering::SeqCst);
            return;
        };
        let waiting = Arc::downgrade(self);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(LINGER + SWEEP_EVERY).await;
                let Some(waiting) = waiting.upgrade() else {
                    return;
                };
                waiting.sweep();
                let idle_left = waiting.lock().values().any(|w| w.idle_since.is_some());
                if !idle_left {
                    waiting.sweep_scheduled.store(false, Ordering::SeqCst);
                    // A wait that ended meanwhile found the flag set and scheduled nothing.
                    if waiting.lock().values().any(|w| w.idle_since.is_some()) {
                        waiting.sweep_later();
                    }
                    return;
                }
            }
        });
    }

    /// Ends the subscriptions idle for [`LINGER`] or beyond the [`MAX_IDLE`] newest, at most
    /// once per [`SWEEP_EVERY`].
    fn sweep(self: &Arc<Self>) {
        let now = Instant::now();
        {
            let mut swept = self.swept.lock().unwrap_or_else(PoisonError::into_inner);
            if now.duration_since(*swept) < SWEEP_EVERY {
                return;
            }
            *swept = now;
        }
        let ended = {
            let mut watched = self.lock();
            let mut idle: Vec<(Instant, String)> = watched
                .iter()
                .filter_map(|(key, w)| w.idle_since.map(|at| (at, key.clone())))
                .collect();
            idle.sort_unstable();
            let over = idle.len().saturating_sub(MAX_IDLE);
            let ended: Vec<String> = idle
                .into_iter()
                .enumerate()
                .filter(|(i, (at, _))| *i < over || now.duration_since(*at) >= LINGER)
                .map(|(_, (_, key))| key)
                .collect();
            for key in &ended {
                watched.remove(key);
            }
            ended
        };
        if ended.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let waiting = self.clone();
        runtime.spawn(async move {
            // Only those still unwatched once the connection is this task's: a wait that started
            // on one of them since has subscribed it again, and keeps it.
            waiting
                .unsubscribe(|| {
                    let watched = waiting.lock();
                    ended
                        .iter()
                        .filter(|key| !watched.contains_key(*key))
                        .map(|key| waiting.own_channel(key))
                        .collect()
                })
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use futures::FutureExt;
    use leasehold_core::{LockKey, OwnerToken, Wait};

    use super::super::state::Subscriber;
    use super::*;

    const LOCK: &str = "p:DC#f#k";

    fn waiting() -> Arc<Waiting> {
        Arc::new(Waiting::new("p:", Subscriber::None, Duration::from_secs(1)))
    }

    fn recorder() -> (Leave, Arc<Mutex<Vec<String>>>) {
        let left = Arc::new(Mutex::new(Vec::new()));
        let record = left.clone();
        (
            Arc::new(move |entry| {
                record.lock().unwrap().push(entry);
                None
            }),
            left,
        )
    }

    fn blocking(waiter: WaiterId) -> Acquire {
        Acquire::new(
            LockKey::dc("f", "c", "k").unwrap(),
            OwnerToken::generate(),
            Duration::from_secs(1),
        )
        .with_wait(Some(Wait::new(
            tokio::time::Instant::now() + Duration::from_secs(60),
            waiter,
        )))
    }

    fn entry_of(waiting: &Waiting, watch: &ReleaseWatch) -> String {
        match waiting.place(LOCK, &blocking(watch.waiter()), true) {
            Place::Waiter(_, entry) => entry,
            other => panic!("a watched wait has its own entry, not {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_is_due_for_renewal_only_once_its_period_passed_or_it_was_left() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let _watch = waiting.watch(LOCK.to_owned(), leave).await;
        let every = Duration::from_millis(1250);
        assert!(waiting.place_due(LOCK, every), "no place on record");

        waiting.set_queued(LOCK, &Place::Process, true, Some(Instant::now()));
        assert!(!waiting.place_due(LOCK, every), "just renewed");
        tokio::time::advance(Duration::from_millis(1000)).await;
        waiting.set_queued(LOCK, &Place::Process, true, None);
        assert!(
            !waiting.place_due(LOCK, every),
            "an attempt that kept the place without renewing it moves nothing"
        );
        tokio::time::advance(Duration::from_millis(250)).await;
        assert!(waiting.place_due(LOCK, every), "its period passed");

        waiting.set_queued(LOCK, &Place::Process, true, Some(Instant::now()));
        waiting.set_queued(LOCK, &Place::Process, false, None);
        assert!(
            waiting.place_due(LOCK, every),
            "a place given up is renewed when the process goes in line again"
        );
        assert!(
            waiting.place_due("p:DC#f#other", every),
            "a key nobody here waits on"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_subscriptions_end_after_lingering_even_when_nobody_waits_again() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let watch = waiting.watch(LOCK.to_owned(), leave).await;
        drop(watch);
        assert!(waiting.lock().contains_key(LOCK), "lingers while idle");
        // No wait starts or ends again: only the timer can end it.
        tokio::time::sleep(LINGER + SWEEP_EVERY * 3).await;
        assert!(!waiting.lock().contains_key(LOCK), "ended after lingering");
        assert!(
            !waiting.sweep_scheduled.load(Ordering::SeqCst),
            "and its timer with it"
        );
    }

    #[tokio::test]
    async fn only_the_named_waiter_wakes_and_the_process_id_wakes_every_waiter() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave.clone()).await;
        let b = waiting.watch(LOCK.to_owned(), leave).await;
        let (entry_a, entry_b) = (entry_of(&waiting, &a), entry_of(&waiting, &b));
        assert_ne!(entry_a, entry_b);
        assert!(entry_a.starts_with(&format!("{}#", waiting.id())));
        let channel = waiting.own_channel(LOCK);

        let (mut woken_a, mut woken_b) = (
            Box::pin(a.notify().notified()),
            Box::pin(b.notify().notified()),
        );
        woken_a.as_mut().enable();
        woken_b.as_mut().enable();
        waiting.deliver(&channel, Some(entry_b.clone()));
        assert!(woken_b.as_mut().now_or_never().is_some(), "b was named");
        assert!(woken_a.as_mut().now_or_never().is_none(), "a was not");

        waiting.deliver(&channel, Some(format!("other-process#{entry_a}")));
        waiting.deliver(&channel, Some("other-process".to_owned()));
        assert!(woken_a.as_mut().now_or_never().is_none(), "not ours");

        let mut woken_b = Box::pin(b.notify().notified());
        woken_b.as_mut().enable();
        waiting.deliver(&channel, Some(waiting.id().to_owned()));
        assert!(
            woken_a.now_or_never().is_some(),
            "the process's turn wakes a"
        );
        assert!(woken_b.now_or_never().is_some(), "and b");
    }

    #[tokio::test]
    async fn a_turn_is_heard_only_on_this_processs_own_channel() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave).await;
        let mut woken = Box::pin(a.notify().notified());
        woken.as_mut().enable();
        // The key's bare channel and another process's channel of the key are not ours.
        waiting.deliver(&waiting.channel(LOCK), Some(waiting.id().to_owned()));
        waiting.deliver(
            &format!("{}:other-process", waiting.channel(LOCK)),
            Some(waiting.id().to_owned()),
        );
        assert!(woken.as_mut().now_or_never().is_none());
        waiting.deliver(&waiting.own_channel(LOCK), Some(waiting.id().to_owned()));
        assert!(woken.now_or_never().is_some(), "our own channel wakes us");
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscription_outlives_its_last_waiter_until_it_was_idle_for_the_linger() {
        let waiting = waiting();
        let (leave, _) = recorder();
        drop(waiting.watch(LOCK.to_owned(), leave.clone()).await);
        let kept = |key: &str| waiting.lock().get(key).is_some_and(|w| w.subscribed);
        assert!(kept(LOCK), "idle, still subscribed");

        // Waited on again within the linger: the same subscription, idle no more.
        tokio::time::advance(LINGER / 2).await;
        drop(waiting.watch(LOCK.to_owned(), leave.clone()).await);
        tokio::time::advance(LINGER / 2 + SWEEP_EVERY).await;
        drop(
            waiting
                .watch("p:DC#f#other".to_owned(), leave.clone())
                .await,
        );
        assert!(kept(LOCK), "idle for half the linger only");

        tokio::time::advance(LINGER).await;
        drop(waiting.watch("p:DC#f#third".to_owned(), leave).await);
        assert!(!kept(LOCK), "idle past the linger: swept");
        assert!(!kept("p:DC#f#other"), "so was this one");
        assert!(kept("p:DC#f#third"), "just left");
    }

    #[tokio::test]
    async fn a_wake_up_is_never_stored_for_a_waiter_not_listening() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave).await;
        waiting.deliver(&waiting.own_channel(LOCK), Some(entry_of(&waiting, &a)));
        assert!(
            a.notify().notified().now_or_never().is_none(),
            "a turn given while nobody listened is not kept for a later round"
        );
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_its_own_place_and_the_last_leaves_the_process() {
        let waiting = waiting();
        let (leave, left) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave.clone()).await;
        let b = waiting.watch(LOCK.to_owned(), leave).await;
        let entry_a = entry_of(&waiting, &a);
        let place_a = Place::Waiter(a.waiter(), entry_a.clone());
        assert_eq!(waiting.set_queued(LOCK, &place_a, true, None), None);
        assert_eq!(waiting.set_queued(LOCK, &Place::Process, true, None), None);
        drop(a);
        assert_eq!(
            *left.lock().unwrap(),
            std::slice::from_ref(&entry_a),
            "a's place, at once"
        );
        drop(b);
        assert_eq!(
            *left.lock().unwrap(),
            [entry_a.clone(), waiting.id().to_owned()],
            "the process's place with its last waiter (b was never queued on its own)"
        );
        assert_eq!(
            waiting.set_queued(LOCK, &place_a, true, None),
            Some(entry_a),
            "an attempt that queued after its wait ended is taken out by the caller"
        );
        assert_eq!(waiting.set_queued(LOCK, &place_a, false, None), None);
    }

    /// A grant kept the process's place (see `Waiting::granted`), and its wait ends.
    async fn kept(waiting: &Arc<Waiting>, leave: &Leave) {
        let watch = waiting.watch(LOCK.to_owned(), leave.clone()).await;
        waiting.set_queued(LOCK, &Place::Process, true, Some(Instant::now()));
        waiting.granted(LOCK, Instant::now(), true);
        drop(watch);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_place_is_given_up_at_its_turn_or_keep_time_and_never_parked_past_its_turn() {
        let waiting = waiting();
        let (leave, left) = recorder();
        let turn = || waiting.deliver(&waiting.own_channel(LOCK), Some(waiting.id().to_owned()));
        let left_count = || left.lock().unwrap().len();

        kept(&waiting, &leave).await;
        assert!(
            waiting.in_line(LOCK),
            "parked: nobody waits, the place stays"
        );
        assert_eq!(left_count(), 0);
        turn();
        assert!(
            !waiting.in_line(LOCK),
            "its turn with nobody waiting: given up"
        );
        assert_eq!(left_count(), 1);

        // A wait comes back to the kept place and hears its turn, then ends before asking:
        // the place is not parked again (nobody would tell the line), it goes at once.
        kept(&waiting, &leave).await;
        let again = waiting.watch(LOCK.to_owned(), leave.clone()).await;
        turn();
        assert!(
            !waiting.in_line(LOCK),
            "a turn was given: a wait starting now asks at once"
        );
        drop(again);
        assert_eq!(left_count(), 2, "left at once, not parked past its turn");

        // Nobody comes back: given up a keep time after the grant.
        kept(&waiting, &leave).await;
        tokio::time::sleep(KEEP / 2).await;
        assert!(waiting.in_line(LOCK));
        tokio::time::sleep(KEEP / 2 + Duration::from_millis(1)).await;
        assert!(!waiting.in_line(LOCK), "kept no longer than its keep time");
        assert_eq!(left_count(), 3);
    }

    #[tokio::test]
    async fn tries_never_queue_and_unknown_waits_fall_back_to_the_process_place() {
        let waiting = waiting();
        let (leave, _) = recorder();
        let a = waiting.watch(LOCK.to_owned(), leave).await;
        let try_lock = blocking(a.waiter()).with_wait(None);
        assert_eq!(waiting.place(LOCK, &try_lock, true), Place::None);
        assert_eq!(
            waiting.place(LOCK, &blocking(WaiterId::new()), true),
            Place::Process,
            "a wait this store did not mint"
        );
        assert_eq!(
            waiting.place(LOCK, &blocking(a.waiter()), false),
            Place::Process,
            "default mode: one place per process"
        );
        assert_eq!(waiting.entry(&Place::None), "");
        assert_eq!(waiting.entry(&Place::Process), waiting.id());
    }
}
