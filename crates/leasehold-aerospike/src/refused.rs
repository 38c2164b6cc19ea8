//! A refusal on its way out of the acquisition's steps. The steps are a chain of round trips,
//! each of which may find the lock held; `?` carries such a refusal out like an error, and the
//! store's `acquire` turns it into the answer it is ([`Attempt::Refused`]), never an error.

use std::time::Duration;

use leasehold_core::{Attempt, Error, Lease, Result};

/// Why an acquisition step did not go on: the lock is not ours to take, or the step failed.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Held by another owner (or others ahead in line): asking again in `retry_after`, where
    /// known, can succeed without a release.
    Refused { retry_after: Option<Duration> },
    /// The step failed.
    Failed(Error),
}

/// What an acquisition step returns.
pub(crate) type Step<T> = std::result::Result<T, Stop>;

impl Stop {
    /// Refused, with nothing known about when to ask again.
    pub(crate) fn refused() -> Self {
        Stop::Refused { retry_after: None }
    }

    /// Refused; asking again in `retry_after` can succeed without a release.
    pub(crate) fn refused_for(retry_after: Duration) -> Self {
        Stop::Refused {
            retry_after: Some(retry_after),
        }
    }
}

impl From<Error> for Stop {
    fn from(error: Error) -> Self {
        Stop::Failed(error)
    }
}

/// The answer of an acquisition whose steps ended in `step`.
pub(crate) fn answer(step: Step<Lease>) -> Result<Attempt> {
    match step {
        Ok(lease) => Ok(Attempt::Granted(lease)),
        Err(Stop::Refused { retry_after }) => Ok(Attempt::Refused { retry_after }),
        Err(Stop::Failed(error)) => Err(error),
    }
}
