//! A key's waiter line as read from its queue record, and what a waiter makes of it: whether it
//! may try the lock record, its place, and when to ask again.
//!
//! Pure functions of what was read and the time, so the ordering rules are tested without a
//! store. Times are µs since the Unix epoch on the clients' clocks (the line's order and its
//! lapses assume clocks that agree to well within the waiter timeout, as shared holds do).

use std::time::Duration;

use aerospike::Value;

/// Guess of the hand-over gap between one holder's release and the next one's grant, added to
/// the hold estimate to predict when a later place becomes the head.
const GAP_GUESS_US: i64 = 1_000;
/// How long after a holder's expected release its delete has probably landed (half a round
/// trip and the holder's own path to it), so the head's first try is not refused for being a
/// hair early.
const RELEASE_IN_FLIGHT_US: i64 = 100;
/// First pause of a head that is refused after the holder's expected release.
const HEAD_POLL_US: i64 = 200;
/// Refusals past the expected release answered with [`HEAD_POLL_US`] before the pause doubles.
const QUICK_LOOKS: u32 = 4;
/// Longest pause of a head refused again and again (a holder that keeps the lock long, or one
/// that never says when it took it: the Java manager, a first-come client).
const HEAD_POLL_MAX_US: i64 = 50_000;
/// Longest hold estimate believed, so a wild value in the record cannot park waiters.
const HOLD_MAX_US: i64 = 10_000_000;

/// One place in line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The waiting process's (store's) id.
    pub(crate) id: String,
    /// When it joined (its clock): the line's order, ties broken by id.
    pub(crate) ticket: i64,
    /// Until when the place is kept without the waiter asking again.
    pub(crate) deadline: i64,
}

/// A key's line as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Line {
    /// Every entry, in line order (lapsed ones included).
    pub(crate) entries: Vec<Entry>,
    /// When a queued process last took the lock.
    pub(crate) granted: Option<i64>,
    /// That process's estimate of its hold.
    pub(crate) hold: Option<i64>,
}

impl Line {
    /// Parses the queue record's bins (absent or malformed entries are left out: a reader never
    /// fails on them, and they lapse from everyone's view).
    pub(crate) fn parse(
        line: Option<&Value>,
        granted: Option<&Value>,
        hold: Option<&Value>,
    ) -> Line {
        let pairs: Vec<(&Value, &Value)> = match line {
            Some(Value::HashMap(m)) => m.iter().collect(),
            Some(Value::OrderedMap(m)) => m.iter().collect(),
            Some(Value::SortedMap(m)) => m.iter().collect(),
            _ => Vec::new(),
        };
        let mut entries: Vec<Entry> = pairs
            .into_iter()
            .filter_map(|(k, v)| match (k, v) {
                (Value::String(id), Value::List(place)) => match place.as_slice() {
                    [Value::Int(ticket), Value::Int(deadline)] => Some(Entry {
                        id: id.clone(),
                        ticket: *ticket,
                        deadline: *deadline,
                    }),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        entries.sort_by(|a, b| a.ticket.cmp(&b.ticket).then_with(|| a.id.cmp(&b.id)));
        let int = |v: Option<&Value>| match v {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        };
        Line {
            entries,
            granted: int(granted),
            hold: int(hold),
        }
    }

    /// The places still kept at `now`, in order.
    pub(crate) fn live(&self, now: i64) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(move |e| e.deadline >= now)
    }

    /// The places that lapsed by `now` (their waiters stopped asking: crashed, or gone).
    pub(crate) fn lapsed(&self, now: i64) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(move |e| e.deadline < now)
    }

    /// `me`'s entry, live or not.
    pub(crate) fn entry(&self, me: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.id == me)
    }

    /// How many live places come before `me` (all live places when `me` has none): `0` means
    /// `me` may try the lock record.
    pub(crate) fn ahead_of(&self, me: &str, now: i64) -> usize {
        self.live(now).take_while(|e| e.id != me).count()
    }

    /// Live places other than `me`'s: other processes waiting.
    pub(crate) fn others(&self, me: &str, now: i64) -> usize {
        self.live(now).filter(|e| e.id != me).count()
    }

    /// The hold estimate, bounded.
    fn hold_us(&self) -> i64 {
        self.hold.unwrap_or(0).clamp(0, HOLD_MAX_US)
    }

    /// How long the current holder (a queued process that said when it took the lock) probably
    /// keeps it from `now`.
    fn hold_left(&self, now: i64) -> i64 {
        self.granted
            .map_or(0, |granted| {
                granted.saturating_add(self.hold_us()).saturating_sub(now)
            })
            .max(0)
    }

    /// Whether the holder should have released by `now` (or nothing says when it took the
    /// lock).
    pub(crate) fn holder_overdue(&self, now: i64) -> bool {
        self.hold_left(now) == 0
    }

    /// Whether the head, reading this line at `now`, should wait for the holder's expected
    /// release instead of trying the lock record at once: the holder (a queued process that said
    /// when it took the lock and how long it holds) has more than [`HEAD_POLL_US`] left. A try
    /// now would only be refused (two round trips: the create and its readback) unless the
    /// holder releases well ahead of its own estimate; exclusion is the create's either way.
    pub(crate) fn holder_busy(&self, now: i64) -> bool {
        self.hold.is_some() && self.hold_left(now) > HEAD_POLL_US
    }

    /// When a waiter `ahead` places from the head should look at the line again: the head and
    /// the next place as [`Line::ask_again_in`] says, a place further back one turn before it
    /// probably becomes the next place. A prediction many turns ahead is only as good as the
    /// guess of every hold and hand-over in between; a look that comes late leaves the lock
    /// idle (measured on the fleet benchmark: a late first look was a third of all hand-overs,
    /// 1.2 ms idle on average against a 3 ms hold), while one that comes early costs one read
    /// of the line and is corrected by it, the next look then being one or two turns ahead.
    pub(crate) fn look_again_in(
        &self,
        ahead: usize,
        now: i64,
        late: u32,
        cap: Duration,
    ) -> Duration {
        let ahead = if ahead >= 2 { ahead - 1 } else { ahead };
        self.ask_again_in(ahead, now, late, cap)
    }

    /// When a waiter `ahead` places from the head (0: the head) should ask again, after a
    /// refusal: the head when the holder is expected to release (then every [`HEAD_POLL_US`],
    /// doubling after [`QUICK_LOOKS`] `late` refusals past that); a later place halfway through the hold of
    /// the holder just before it, when it has become the head and before that holder releases.
    /// Never longer than `cap` (the waiter must ask again before its place lapses), never 0.
    pub(crate) fn ask_again_in(
        &self,
        ahead: usize,
        now: i64,
        late: u32,
        cap: Duration,
    ) -> Duration {
        let left = self.hold_left(now);
        let us = if ahead == 0 {
            if left > 0 {
                // The holder's estimate ends when it sends its delete, which lands a little later.
                left + RELEASE_IN_FLIGHT_US
            } else {
                // Holds vary (a loaded host, a slower holder): a few quick looks first, then
                // doubling.
                HEAD_POLL_US
                    .saturating_mul(1 << late.saturating_sub(QUICK_LOOKS).min(8))
                    .min(HEAD_POLL_MAX_US)
            }
        } else {
            let hold = self.hold_us();
            let cycle = hold + GAP_GUESS_US;
            left.saturating_add(cycle.saturating_mul(ahead as i64 - 1))
                .saturating_add(GAP_GUESS_US + hold / 2)
        };
        Duration::from_micros(u64::try_from(us.max(1)).unwrap_or(u64::MAX))
            .min(cap)
            .max(Duration::from_micros(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(entries: &[(&str, i64, i64)]) -> Line {
        Line {
            entries: entries
                .iter()
                .map(|&(id, ticket, deadline)| Entry {
                    id: id.to_owned(),
                    ticket,
                    deadline,
                })
                .collect(),
            ..Line::default()
        }
    }

    fn place(ticket: i64, deadline: i64) -> Value {
        Value::List(vec![Value::Int(ticket), Value::Int(deadline)])
    }

    #[test]
    fn the_line_is_in_arrival_order_ties_by_id_and_junk_is_left_out() {
        let map = std::collections::HashMap::from([
            (Value::from("late"), place(30, 100)),
            (Value::from("b"), place(10, 100)),
            (Value::from("a"), place(10, 100)),
            (Value::from("junk"), Value::Int(4)),
            (Value::Int(7), place(1, 100)),
        ]);
        let parsed = Line::parse(Some(&Value::HashMap(map)), Some(&Value::Int(5)), None);
        let ids: Vec<&str> = parsed.entries.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "late"]);
        assert_eq!((parsed.granted, parsed.hold), (Some(5), None));
        assert_eq!(Line::parse(None, None, None), Line::default());
    }

    #[test]
    fn only_the_head_may_try_and_a_newcomer_is_behind_everyone() {
        let l = line(&[("p1", 1, 100), ("p2", 2, 100), ("p3", 3, 100)]);
        assert_eq!(l.ahead_of("p1", 50), 0, "the head tries");
        assert_eq!(l.ahead_of("p3", 50), 2);
        assert_eq!(l.ahead_of("try-lock", 50), 3, "a try-lock passes nobody");
        assert_eq!(l.others("p2", 50), 2);
        assert_eq!(line(&[]).ahead_of("anyone", 50), 0, "nobody waits: try");
    }

    #[test]
    fn a_lapsed_place_neither_blocks_nor_counts() {
        // p1 crashed: its deadline passed. p2 is the head now, and p1's entry is swept.
        let l = line(&[("p1", 1, 40), ("p2", 2, 100)]);
        assert_eq!(l.ahead_of("p2", 50), 0);
        assert_eq!(l.others("p2", 50), 0);
        assert_eq!(
            l.lapsed(50).map(|e| e.id.as_str()).collect::<Vec<_>>(),
            ["p1"]
        );
        assert_eq!(l.ahead_of("p2", 40), 1, "kept until its deadline");
    }

    #[test]
    fn the_head_asks_when_the_holder_should_be_done_then_backs_off() {
        let cap = Duration::from_secs(1);
        let mut l = line(&[("p1", 1, i64::MAX)]);
        l.granted = Some(1_000_000);
        l.hold = Some(2_000);
        // Granted 500 µs ago, holds 2 ms: ask in 1.5 ms, when its delete should have landed.
        assert_eq!(
            l.ask_again_in(0, 1_000_500, 0, cap),
            Duration::from_micros(1_500 + 100)
        );
        // Past the expected release: 0.2 ms five times, then 0.4, 0.8 … up to 50 ms.
        for late in 0..=4 {
            assert_eq!(
                l.ask_again_in(0, 1_010_000, late, cap),
                Duration::from_micros(200)
            );
        }
        assert_eq!(
            l.ask_again_in(0, 1_010_000, 6, cap),
            Duration::from_micros(800)
        );
        assert_eq!(
            l.ask_again_in(0, 1_010_000, 30, cap),
            Duration::from_millis(50)
        );
        assert_eq!(
            l.ask_again_in(0, 1_010_000, 30, Duration::from_millis(7)),
            Duration::from_millis(7),
            "never past the cap (the waiter's place must not lapse)"
        );
    }

    #[test]
    fn a_later_place_asks_once_it_is_probably_the_head() {
        let cap = Duration::from_secs(1);
        let mut l = line(&[]);
        l.granted = Some(0);
        l.hold = Some(2_000);
        // Holder has 2 ms left; one place ahead: halfway through the next hold (2 + 1 + 1 ms).
        assert_eq!(l.ask_again_in(1, 0, 0, cap), Duration::from_millis(4));
        // Three ahead: two more cycles of 3 ms.
        assert_eq!(l.ask_again_in(3, 0, 0, cap), Duration::from_millis(10));
        // Nothing known about holds: a millisecond per place ahead.
        assert_eq!(
            line(&[]).ask_again_in(3, 0, 0, cap),
            Duration::from_millis(3)
        );
        // A wild estimate is bounded, and so is the pause.
        l.hold = Some(i64::MAX);
        assert_eq!(l.ask_again_in(5, 0, 0, cap), cap);
    }

    #[test]
    fn the_head_waits_out_a_holder_it_knows_and_tries_one_it_does_not() {
        let mut l = line(&[("p1", 1, i64::MAX)]);
        l.granted = Some(1_000_000);
        l.hold = Some(2_000);
        assert!(l.holder_busy(1_000_500), "1.5 ms of the hold left: wait");
        assert!(
            !l.holder_busy(1_001_800),
            "0.2 ms left: trying now is as good as waiting"
        );
        assert!(!l.holder_busy(1_003_000), "overdue: try");
        l.hold = None;
        assert!(
            !l.holder_busy(1_000_500),
            "no estimate (a process that has none yet): try"
        );
        let mut java = line(&[("p1", 1, i64::MAX)]);
        java.hold = Some(2_000);
        assert!(
            !java.holder_busy(1_000_500),
            "no grant time (nobody in line took it): try"
        );
    }

    #[test]
    fn a_place_further_back_looks_one_turn_before_it_is_probably_next() {
        let cap = Duration::from_secs(1);
        let mut l = line(&[]);
        l.granted = Some(0);
        l.hold = Some(2_000);
        // The head and the next place: as predicted.
        for ahead in [0, 1] {
            assert_eq!(
                l.look_again_in(ahead, 0, 0, cap),
                l.ask_again_in(ahead, 0, 0, cap)
            );
        }
        // Three ahead: when it is probably second (2 ms left + one 3 ms cycle + 1 + 1 ms), not
        // when it is probably next (10 ms): a look two turns early is corrected by the next.
        assert_eq!(l.look_again_in(3, 0, 0, cap), Duration::from_millis(7));
        assert_eq!(l.look_again_in(3, 0, 0, cap), l.ask_again_in(2, 0, 0, cap));
        assert!(l.look_again_in(2, 0, 0, cap) < l.ask_again_in(2, 0, 0, cap));
        assert_eq!(
            l.look_again_in(40, 0, 0, Duration::from_millis(20)),
            Duration::from_millis(20),
            "never past the cap"
        );
    }
}
