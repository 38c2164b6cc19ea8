//! A schedule of work that starts later: entries in due order, and one driver task that sleeps
//! until the earliest is due and starts each entry then. The watchdog schedules every guard's
//! first renewal here, so a guard released before it is due (nearly all of them: a hot key
//! changes hands in microseconds, a renewal period is a third of a TTL) costs no task.
//!
//! Adding and removing an entry takes a mutex and wakes nobody, unless the new entry is due
//! before the driver means to wake (with one period for every entry, only when the schedule was
//! empty). The driver exits once the schedule is empty when it wakes, and the next entry starts
//! it again, so an idle schedule keeps no task past the wake its driver last planned (at most
//! one renewal period; a shutdown ends it at once). A driver keeps that wake even if every entry
//! was removed before then: the entry that started it is usually gone before the driver first
//! runs (a lock taken and released at once), and ending it there would spawn a task, and wake an
//! idle worker thread to run it, for every lock taken. It holds nothing of what its entries
//! start: each entry starts itself.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::Lifecycle;

/// Where an entry is in a [`Schedule`]: its due time, then its order of adding.
pub(crate) type Place = (Instant, u64);

/// Work a [`Schedule`] starts when it is due.
pub(crate) trait Due: Send + Sync + std::fmt::Debug {
    /// Added at `place` (called under the schedule's lock, before the driver can see it).
    fn scheduled(&self, place: Place);
    /// Due now, and taken off the schedule: start.
    fn start(&self);
    /// The lifecycle closed before it was due: it will never start.
    fn shut_down(&self);
}

/// What the driver takes off the schedule: the entries due, and when the next one is.
type Taken = (Vec<Arc<dyn Due>>, Option<Instant>);

/// Entries not due yet, and the driver that starts them.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    queue: Mutex<Queue>,
    /// Wakes the driver when an entry is due before it means to wake.
    earlier: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    due: BTreeMap<Place, Arc<dyn Due>>,
    added: u64,
    /// When the driver wakes next (`None`: when woken).
    wakes_at: Option<Instant>,
    /// A driver task is running.
    driving: bool,
}

impl Schedule {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Every update is a few assignments with no fallible step: a panic elsewhere leaves the
        // queue consistent, so poisoning is ignored.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Schedules `entry` to start at `at`, starting the driver (a task `lifecycle` tracks and
    /// ends) if none runs. Returns `false`, with nothing scheduled, outside a tokio runtime.
    pub(crate) fn add(
        self: &Arc<Self>,
        lifecycle: &Lifecycle,
        entry: Arc<dyn Due>,
        at: Instant,
    ) -> bool {
        let (place, start_driver, earlier) = {
            let mut queue = self.queue();
            let place = (at, queue.added);
            queue.added += 1;
            entry.scheduled(place);
            queue.due.insert(place, entry);
            let earlier = queue.wakes_at.is_none_or(|wakes| at < wakes);
            let start_driver = !std::mem::replace(&mut queue.driving, true);
            if start_driver {
                // The new driver's first wake, kept even if this entry is removed before then.
                queue.wakes_at = Some(at);
            }
            (place, start_driver, earlier)
        };
        if start_driver {
            if lifecycle
                .spawn(drive(self.clone(), lifecycle.clone()))
                .is_none()
            {
                let mut queue = self.queue();
                queue.driving = false;
                queue.due.remove(&place);
                return false;
            }
        } else if earlier {
            // A permit if the driver is not waiting yet: it looks again at once.
            self.earlier.notify_one();
        }
        true
    }

    /// Takes the entry at `place` off the schedule (unless the driver took it to start).
    pub(crate) fn remove(&self, place: Place) {
        self.queue().due.remove(&place);
    }

    /// Takes every entry due by `now` off the schedule and says when the driver wakes next: when
    /// the next entry is due, or, with none left, at the wake it planned if that is still ahead.
    /// `None` with nothing due and nothing left to wait for: the driver stops (marked under the
    /// lock, so the next entry added starts a new one).
    fn take_due(&self, now: Instant) -> Option<Taken> {
        let mut queue = self.queue();
        let mut due = Vec::new();
        while let Some(first) = queue.due.first_entry() {
            if first.key().0 > now {
                break;
            }
            due.push(first.remove());
        }
        let next = match queue.due.keys().next() {
            Some((at, _)) => Some(*at),
            None => queue.wakes_at.filter(|planned| *planned > now),
        };
        queue.wakes_at = next;
        if next.is_none() && due.is_empty() {
            queue.driving = false;
            return None;
        }
        Some((due, next))
    }

    /// The lifecycle closed: every entry ends without starting.
    fn shut_down(&self) {
        let entries: Vec<Arc<dyn Due>> = {
            let mut queue = self.queue();
            queue.driving = false;
            queue.wakes_at = None;
            std::mem::take(&mut queue.due).into_values().collect()
        };
        for entry in entries {
            entry.shut_down();
        }
    }
}

/// The driver: starts each entry when it is due, sleeping in between; ends with the schedule
/// empty, or with the lifecycle.
async fn drive(schedule: Arc<Schedule>, lifecycle: Lifecycle) {
    loop {
        if lifecycle.is_closing() {
            schedule.shut_down();
            return;
        }
        // Registered before the schedule is read: an earlier entry added after the read wakes it.
        let earlier = schedule.earlier.notified();
        tokio::pin!(earlier);
        earlier.as_mut().enable();
        let Some((due, next)) = schedule.take_due(Instant::now()) else {
            return;
        };
        for entry in due {
            entry.start();
        }
        let Some(next) = next else {
            continue; // started the last ones: stop unless something was added meanwhile
        };
        tokio::select! {
            () = lifecycle.closing() => {}
            () = &mut earlier => {}
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Counts its starts.
    #[derive(Debug, Default)]
    struct Counted {
        started: AtomicUsize,
    }

    impl Due for Counted {
        fn scheduled(&self, _place: Place) {}
        fn start(&self) {
            self.started.fetch_add(1, Ordering::SeqCst);
        }
        fn shut_down(&self) {}
    }

    /// Lets every ready task run (the driver included) on the test's one thread.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn driving(schedule: &Schedule) -> bool {
        schedule.queue().driving
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_starts_when_due_and_the_driver_then_ends() {
        let (schedule, lifecycle) = (Arc::new(Schedule::default()), Lifecycle::new());
        let entry = Arc::new(Counted::default());
        assert!(schedule.add(
            &lifecycle,
            entry.clone(),
            Instant::now() + Duration::from_secs(10)
        ));
        settle().await;
        assert_eq!(entry.started.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(11)).await;
        settle().await;
        assert_eq!(entry.started.load(Ordering::SeqCst), 1);
        assert!(!driving(&schedule), "an empty schedule keeps no driver");
    }

    #[tokio::test(start_paused = true)]
    async fn a_driver_whose_entry_left_before_it_ran_waits_out_its_planned_wake() {
        let (schedule, lifecycle) = (Arc::new(Schedule::default()), Lifecycle::new());
        let first = Arc::new(Counted::default());
        let due = Instant::now() + Duration::from_secs(10);
        schedule.add(&lifecycle, first.clone(), due);
        // Released at once, before the driver first looked.
        let place = *schedule.queue().due.keys().next().expect("scheduled");
        schedule.remove(place);
        settle().await;
        assert!(
            driving(&schedule),
            "the driver waits for its planned wake rather than ending at once"
        );

        // The next lock's entry, later than the planned wake: no new driver, nothing woken.
        let second = Arc::new(Counted::default());
        tokio::time::sleep(Duration::from_secs(1)).await;
        schedule.add(
            &lifecycle,
            second.clone(),
            Instant::now() + Duration::from_secs(15),
        );
        assert_eq!(schedule.queue().wakes_at, Some(due));

        // The driver wakes as planned, finds the second entry not due, sleeps until it is.
        tokio::time::sleep(Duration::from_secs(10)).await;
        settle().await;
        assert!(driving(&schedule));
        assert_eq!(second.started.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(6)).await;
        settle().await;
        assert_eq!(second.started.load(Ordering::SeqCst), 1);
        assert_eq!(
            first.started.load(Ordering::SeqCst),
            0,
            "removed: never started"
        );
        assert!(!driving(&schedule));
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_due_before_the_planned_wake_wakes_the_driver() {
        let (schedule, lifecycle) = (Arc::new(Schedule::default()), Lifecycle::new());
        let late = Arc::new(Counted::default());
        schedule.add(
            &lifecycle,
            late.clone(),
            Instant::now() + Duration::from_secs(30),
        );
        settle().await;
        let soon = Arc::new(Counted::default());
        schedule.add(
            &lifecycle,
            soon.clone(),
            Instant::now() + Duration::from_secs(1),
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(soon.started.load(Ordering::SeqCst), 1);
        assert_eq!(late.started.load(Ordering::SeqCst), 0);
    }
}
