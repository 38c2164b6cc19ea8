//! Who is ahead of this process in a lock's line: the rule that makes a deletion wake only the
//! process it concerns.
//!
//! Every waiting process watches the whole key prefix of the lock (one stream carries the lock
//! record, the holders and the line), so etcd sends every deletion to every waiting process. Woken
//! on all of them, each process would read the line after every hand-over to learn it is not its
//! turn: with eight processes in line that was 14 reads per acquisition, served by the same etcd
//! that must commit the hand-over. Like etcd's own `concurrency.Mutex` and Curator's recipes,
//! a process should only wake for its predecessor; here it learns the waiter keys ahead of its
//! place when it reads the line, and the watch then wakes it only when
//! - the last of those leaves (it is now first in line, and the lock may be free), or
//! - a hold goes (a release or an expiry) while nobody is ahead of it (its turn may have come).
//!
//! Deletions it cannot place (before its first read of the line) wake it. The state is
//! a hint and only ever wakes too often, never too rarely: a deletion the watch saw while the read
//! was in flight is applied to what that read returns (by revision), and a hold that went after
//! the read tells the caller to try at once.

use std::collections::{HashSet, VecDeque};

/// Waiter-key deletions remembered for reads still in flight (far more than can happen during one
/// read: each is a committed etcd write).
const RECENT: usize = 64;

/// One lock's view of the line ahead of this process's place.
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    /// The waiter keys ahead of our place; `None` until the line has been read for this place.
    keys: Option<HashSet<Vec<u8>>>,
    /// Waiter keys the watch saw deleted lately, with the revision of their deletion.
    recent: VecDeque<(Vec<u8>, i64)>,
    /// The revision at which the watch last saw a hold go (record, holder key, writer marker).
    hold_gone: i64,
    /// Holds that went at or before this revision are not ours to take: the last read of the
    /// line saw them go, they went to a waiter ahead of us, or a turn was already taken for them.
    turn_from: i64,
}

/// What a read of the line says, once the deletions the watch saw since are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Learned {
    /// Nobody is ahead of our place any more.
    pub(crate) first: bool,
    /// A hold went after the read: the lock the read saw held may be free now.
    pub(crate) hold_gone_since: bool,
}

impl Ahead {
    /// The watch saw `key` deleted at `revision` (`waiter`: a waiter key, else a hold). Returns
    /// whether the waiters of this process should wake.
    pub(crate) fn deleted(&mut self, key: &[u8], revision: i64, waiter: bool) -> bool {
        if waiter {
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back((key.to_vec(), revision));
        } else {
            self.hold_gone = self.hold_gone.max(revision);
        }
        match &mut self.keys {
            None => true,
            // Our predecessor went: wake only if it was the last one ahead.
            Some(keys) if waiter => {
                let now_first = keys.remove(key) && keys.is_empty();
                if now_first {
                    // A hold that went before this went to those ahead of us, not to us.
                    self.turn_from = self.turn_from.max(revision);
                }
                now_first
            }
            // A hold went: only the first in line may take it.
            Some(keys) => keys.is_empty(),
        }
    }

    /// A read of the line at revision `read_at` found `keys` ahead of our place: remember them,
    /// without those the watch saw go after the read.
    pub(crate) fn learn(
        &mut self,
        keys: impl IntoIterator<Item = Vec<u8>>,
        read_at: i64,
    ) -> Learned {
        let mut keys: HashSet<Vec<u8>> = keys.into_iter().collect();
        // Holds that went before the read, or before the last one ahead of us left, were not
        // ours to take.
        let mut from = read_at;
        for (gone, revision) in &self.recent {
            if *revision > read_at && keys.remove(gone) {
                from = from.max(*revision);
            }
        }
        let first = keys.is_empty();
        self.keys = Some(keys);
        let hold_gone_since = first && self.hold_gone > from;
        // The caller tries now for that hold (if it went): no second turn for it.
        self.turn_from = self.turn_from.max(from).max(if hold_gone_since {
            self.hold_gone
        } else {
            from
        });
        Learned {
            first,
            hold_gone_since,
        }
    }

    /// Whether the watch alone says it is our turn: nobody ahead, and a hold went since the line
    /// was last read. Then reading the line again would only say so too, and the attempt can go
    /// straight to the transaction (which decides). Taken once per hold that went.
    pub(crate) fn take_turn(&mut self) -> bool {
        let turn =
            self.keys.as_ref().is_some_and(HashSet::is_empty) && self.hold_gone > self.turn_from;
        if turn {
            self.turn_from = self.hold_gone;
        }
        turn
    }

    /// Our place changed or went: nothing is known about who is ahead until the line is read.
    pub(crate) fn forget(&mut self) {
        self.keys = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Vec<u8> {
        name.as_bytes().to_vec()
    }

    #[test]
    fn before_the_line_is_read_every_deletion_wakes() {
        let mut ahead = Ahead::default();
        assert!(ahead.deleted(b"w1", 10, true));
        assert!(ahead.deleted(b"lock", 11, false));
    }

    #[test]
    fn only_the_last_predecessor_leaving_wakes() {
        let mut ahead = Ahead::default();
        let learned = ahead.learn([key("w1"), key("w2")], 20);
        assert_eq!(
            learned,
            Learned {
                first: false,
                hold_gone_since: false
            }
        );
        assert!(
            !ahead.deleted(b"lock", 21, false),
            "a hold goes to w1 first"
        );
        assert!(!ahead.deleted(b"w9", 22, true), "someone behind us left");
        assert!(!ahead.deleted(b"w1", 23, true), "w2 is still ahead");
        assert!(ahead.deleted(b"w2", 24, true), "now we are first");
        assert!(
            ahead.deleted(b"lock", 25, false),
            "and a release is ours to try"
        );
    }

    #[test]
    fn deletions_seen_during_the_read_are_applied_to_it() {
        let mut ahead = Ahead::default();
        // The watch saw w1 go (revision 31) and a release (32) while the read (at 30) was in
        // flight: both woke everyone, but the read still lists w1 and a held record.
        assert!(ahead.deleted(b"w1", 31, true));
        assert!(ahead.deleted(b"lock", 32, false));
        let learned = ahead.learn([key("w1")], 30);
        assert!(learned.first, "w1 left after the read");
        assert!(learned.hold_gone_since, "the record w1 took went since");
        // A hold that went before the one ahead left was that one's to take.
        let mut ahead = Ahead::default();
        ahead.deleted(b"lock", 31, false);
        ahead.deleted(b"w1", 32, true);
        let learned = ahead.learn([key("w1")], 30);
        assert!(learned.first);
        assert!(
            !learned.hold_gone_since,
            "w1 took the lock at 32 and holds it"
        );
        // Deletions before the read are already in it.
        let mut ahead = Ahead::default();
        ahead.deleted(b"w1", 29, true);
        ahead.deleted(b"lock", 29, false);
        let learned = ahead.learn([key("w1")], 30);
        assert!(
            !learned.first,
            "w1 is back in line (a new key with the same name)"
        );
        assert!(!learned.hold_gone_since);
    }

    #[test]
    fn a_release_seen_by_the_first_in_line_is_its_turn_once() {
        let mut ahead = Ahead::default();
        assert!(
            !ahead.take_turn(),
            "nothing is known before the line is read"
        );
        ahead.deleted(b"lock", 3, false);
        assert!(!ahead.take_turn(), "still nothing known");
        ahead.learn([key("w1")], 4);
        ahead.deleted(b"lock", 5, false);
        assert!(!ahead.take_turn(), "w1 goes first");
        ahead.deleted(b"w1", 6, true);
        assert!(
            !ahead.take_turn(),
            "first now, but no hold went since the read"
        );
        ahead.deleted(b"lock", 7, false);
        assert!(ahead.take_turn(), "first, and the hold went: try");
        assert!(!ahead.take_turn(), "once per hold that went");
        ahead.learn(Vec::<Vec<u8>>::new(), 9);
        ahead.deleted(b"lock", 8, false);
        assert!(!ahead.take_turn(), "the read at 9 already saw that release");
    }

    #[test]
    fn a_forgotten_place_wakes_on_everything_again() {
        let mut ahead = Ahead::default();
        ahead.learn([key("w1")], 5);
        assert!(!ahead.deleted(b"lock", 6, false));
        ahead.forget();
        assert!(ahead.deleted(b"lock", 7, false));
    }

    #[test]
    fn the_memory_of_recent_deletions_is_bounded() {
        let mut ahead = Ahead::default();
        for revision in 0..1_000 {
            ahead.deleted(format!("w{revision}").as_bytes(), revision, true);
        }
        assert_eq!(ahead.recent.len(), RECENT);
        let learned = ahead.learn([key("w999"), key("w1")], 990);
        assert!(
            !learned.first,
            "w1 went long before the read: still listed, so still ahead"
        );
    }
}
