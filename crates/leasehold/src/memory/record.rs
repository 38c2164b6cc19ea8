//! One key's record in the embedded store, and the rules that decide who may join it.
//!
//! Kept free of maps and tasks so every rule of the lock modes can be read (and tested) in one
//! place: an exclusive record has one owner; a shared record has a holder list that is either the
//! readers of a read-write lock or the permit holders of a semaphore of N permits.

use tokio::time::Instant;

use crate::core::{
    instant_after, wall_time_of, Acquire, HolderInfo, Lease, LockInfo, LockKey, LockMode,
    OwnerToken, Result,
};

/// A live or expired record for one key.
#[derive(Debug, Clone)]
pub(super) enum Record {
    /// Held by one owner: an exclusive lock, or the write side of a read-write lock.
    Exclusive(Owner),
    /// Held by readers or semaphore permit holders, each with its own expiry.
    Shared(Holders),
}

#[derive(Debug, Clone)]
pub(super) struct Owner {
    pub(super) token: OwnerToken,
    pub(super) expires_at: Instant,
    pub(super) acquired_at: Instant,
    pub(super) fencing_token: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Holders {
    /// `Shared` (readers) or `Semaphore { permits }`: fixed by whoever created the record.
    mode: LockMode,
    holders: Vec<Holder>,
    /// Until when a blocking writer keeps new readers out.
    writer_waiting_until: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Holder {
    token: OwnerToken,
    expires_at: Instant,
}

/// What an acquisition does to an existing record.
pub(super) enum Admit {
    /// The record is free (expired, or only a writer's marker is left): write a fresh one.
    Replace,
    /// The request joined the shared record in place.
    Joined,
    /// The mode's rule refuses the request: the lock can be free without a release after
    /// `retry_after`.
    Refused {
        /// How long the holders that keep the request out have left.
        retry_after: std::time::Duration,
    },
}

impl Record {
    /// A fresh record for `req`, taken at `now`. `fence` is used by exclusive holds only.
    pub(super) fn fresh(req: &Acquire, now: Instant, fence: u64) -> Record {
        let expires_at = instant_after(now, req.ttl);
        match req.mode {
            LockMode::Exclusive => Record::Exclusive(Owner {
                token: req.token.clone(),
                expires_at,
                acquired_at: now,
                fencing_token: fence,
            }),
            mode => Record::Shared(Holders {
                mode,
                holders: vec![Holder {
                    token: req.token.clone(),
                    expires_at,
                }],
                writer_waiting_until: None,
            }),
        }
    }

    /// Whether any hold (or a waiting writer's marker) is still in force.
    pub(super) fn is_live(&self, now: Instant) -> bool {
        match self {
            Record::Exclusive(owner) => now < owner.expires_at,
            Record::Shared(shared) => {
                shared.holders.iter().any(|h| now < h.expires_at)
                    || shared.writer_waiting_until.is_some_and(|until| now < until)
            }
        }
    }

    /// Decides whether `req` may take or join this record.
    ///
    /// [`Admit::Refused`] (with how long to wait) when the mode's rule refuses.
    ///
    /// # Errors
    /// [`ErrorKind::ModeConflict`] when the key is held as another kind of lock.
    ///
    /// [`ErrorKind::ModeConflict`]: crate::core::ErrorKind::ModeConflict
    pub(super) fn admit(&mut self, req: &Acquire, now: Instant) -> Result<Admit> {
        if !self.is_live(now) {
            return Ok(Admit::Replace);
        }
        let shared = match self {
            Record::Exclusive(owner) => {
                return match req.mode {
                    LockMode::Semaphore { .. } => {
                        Err(req.mode.conflict("an exclusive lock", &req.key))
                    }
                    _ => Ok(Admit::Refused {
                        retry_after: owner.expires_at - now,
                    }),
                };
            }
            Record::Shared(shared) => shared,
        };
        let compatible = match (shared.mode, req.mode) {
            (LockMode::Shared, LockMode::Exclusive | LockMode::Shared) => true,
            (held, asked) => held == asked,
        };
        if !compatible {
            return Err(req.mode.conflict(&shared.mode.to_string(), &req.key));
        }
        shared.holders.retain(|h| now < h.expires_at);
        match req.mode {
            LockMode::Exclusive if shared.holders.is_empty() => Ok(Admit::Replace),
            LockMode::Exclusive => {
                if let Some(deadline) = req.deadline() {
                    // A blocking writer keeps new readers out until it is served, gives up
                    // (its deadline) or would have lost the lock anyway (its TTL): a crashed
                    // waiter cannot shut readers out for longer than its own lease.
                    let until = deadline.min(instant_after(now, req.ttl));
                    shared.writer_waiting_until =
                        Some(shared.writer_waiting_until.map_or(until, |u| u.max(until)));
                }
                Ok(Admit::Refused {
                    retry_after: shared.longest_left(now),
                })
            }
            LockMode::Shared => match shared.writer_waiting_until {
                Some(until) if now < until => Ok(Admit::Refused {
                    retry_after: until - now,
                }),
                _ => {
                    shared.join(req, now);
                    Ok(Admit::Joined)
                }
            },
            LockMode::Semaphore { permits } => {
                if shared.holders.len() >= permits as usize {
                    let soonest = shared.holders.iter().map(|h| h.expires_at).min();
                    let left = soonest.map_or(Default::default(), |at| at - now);
                    return Ok(Admit::Refused { retry_after: left });
                }
                shared.join(req, now);
                Ok(Admit::Joined)
            }
        }
    }

    /// Removes `lease`'s hold if it is live; returns whether it was.
    pub(super) fn release(&mut self, lease: &Lease, now: Instant) -> bool {
        match self {
            Record::Exclusive(owner) => owner.token == *lease.token() && now < owner.expires_at,
            Record::Shared(shared) => {
                let before = shared.holders.len();
                let mut released = false;
                shared.holders.retain(|h| {
                    let mine = h.token == *lease.token();
                    released |= mine && now < h.expires_at;
                    !mine && now < h.expires_at
                });
                released && shared.holders.len() < before
            }
        }
    }

    /// Moves `lease`'s expiry to `until` if it is live; returns whether it was.
    pub(super) fn extend(&mut self, lease: &Lease, now: Instant, until: Instant) -> bool {
        match self {
            Record::Exclusive(owner) if owner.token == *lease.token() && now < owner.expires_at => {
                owner.expires_at = until;
                true
            }
            Record::Exclusive(_) => false,
            Record::Shared(shared) => match shared
                .holders
                .iter_mut()
                .find(|h| h.token == *lease.token() && now < h.expires_at)
            {
                Some(holder) => {
                    holder.expires_at = until;
                    true
                }
                None => false,
            },
        }
    }

    /// What `inspect` reports: `None` when nobody holds the key (a writer's marker alone is no
    /// hold).
    pub(super) fn info(&self, key: &LockKey, now: Instant) -> Option<LockInfo> {
        match self {
            Record::Exclusive(owner) if now < owner.expires_at => Some(
                LockInfo::new(key.clone(), Some(owner.token.clone()))
                    .with_ttl_remaining(Some(owner.expires_at - now))
                    .with_acquired_at(Some(wall_time_of(owner.acquired_at)))
                    .with_fencing_token(Some(owner.fencing_token)),
            ),
            Record::Exclusive(_) => None,
            Record::Shared(shared) => {
                let holders: Vec<HolderInfo> = shared
                    .holders
                    .iter()
                    .filter(|h| now < h.expires_at)
                    .map(|h| HolderInfo::new(h.token.clone(), Some(h.expires_at - now)))
                    .collect();
                if holders.is_empty() {
                    return None;
                }
                let waiting = shared.writer_waiting_until.is_some_and(|u| now < u);
                Some(
                    LockInfo::shared(key.clone(), shared.mode, holders)
                        .with_writer_waiting(waiting),
                )
            }
        }
    }

    /// Whether nothing is left in the record (after a release), so it can be removed.
    pub(super) fn is_empty(&self, now: Instant) -> bool {
        !self.is_live(now)
    }
}

impl Holders {
    fn join(&mut self, req: &Acquire, now: Instant) {
        self.holders.push(Holder {
            token: req.token.clone(),
            expires_at: instant_after(now, req.ttl),
        });
    }

    /// How long until the last current holder's lease runs out: when a writer may get in at the
    /// latest.
    fn longest_left(&self, now: Instant) -> std::time::Duration {
        self.holders
            .iter()
            .map(|h| h.expires_at.saturating_duration_since(now))
            .max()
            .unwrap_or_default()
    }
}
