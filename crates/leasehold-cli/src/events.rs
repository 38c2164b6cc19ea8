//! Counting lock events by name, for the demo and the bench summaries.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use leasehold::{LockEvent, Observer};

/// An observer that counts events by name. Cheap to clone; clones share the counts.
#[derive(Clone, Debug, Default)]
pub(crate) struct EventCounts {
    counts: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

impl EventCounts {
    pub(crate) fn get(&self, name: &str) -> u64 {
        self.lock().get(name).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, u64>> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Observer for EventCounts {
    fn on_event(&self, event: &LockEvent) {
        *self.lock().entry(event.name()).or_insert(0) += 1;
    }
}
