//! A schedule of work that starts later: entries in due order, and one driver task that sleeps
//! until the earliest is due and starts each entry then. The watchdog schedules every guard's
//! first renewal here, so a guard released before it is due (nearly all of them: a hot key
//! changes hands in microseconds, a renewal period is a third of a TTL) costs no task.
//!
//! Adding and removing an entry takes a mutex and wakes nobody, unless the new entry is due
//! before the driver means to wake (with one period for every entry, only when the schedule was
//! empty). The driver exits once the schedule is empty when it wakes, and the next entry starts
//! it again, so an idle schedule keeps no task. It holds nothing of what its entries start: each
//! entry starts itself.

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

    /// Takes every entry due by `now` off the schedule and says when the next is due. `None`
    /// with nothing due and nothing left: the driver stops (marked under the lock, so the next
    /// entry added starts a new one).
    fn take_due(&self, now: Instant) -> Option<Taken> {
        let mut queue = self.queue();
        let mut due = Vec::new();
        while let Some(first) = queue.due.first_entry() {
            if first.key().0 > now {
                break;
            }
            due.push(first.remove());
        }
        let next = queue.due.keys().next().map(|(at, _)| *at);
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
