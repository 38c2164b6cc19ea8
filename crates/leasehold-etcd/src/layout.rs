//! Where one lock lives in etcd: every key of a lock starts with the lock's own record key.
//!
//! | key | what |
//! |---|---|
//! | `<lock>` | the exclusive (write) hold: value = owner token, on its own lease |
//! | `<lock>#holder#<mode>#<token>` | one reader (`shared`) or permit holder (`semaphore:N`), on its own lease |
//! | `<lock>#writer#<store id>` | a blocking writer refused by readers: keeps new readers out |
//! | `<lock>#waiter#<lease id hex>` | fair waiting: one waiting process's place in line |
//!
//! A lock key has a fixed number of `#`-separated parts and no part holds a `#`, so none of these
//! keys is another lock's key, and each parses back to its lock (see [`Entry::parse`]). The mode
//! is in the holder's key, not its value, so that one transaction can compare "no holder of
//! another mode" as two key ranges (see [`other_modes`]).

use std::borrow::Cow;

use leasehold_core::{LockKey, LockMode};

// Keys are joined with `concat`, one allocation of the exact size: an acquisition names up to
// six of them.

/// `<lock>#holder#`: every reader or permit holder of the lock.
pub(crate) fn holder_prefix(lock_key: &str) -> String {
    [lock_key, "#holder#"].concat()
}

/// `<lock>#holder#<mode>#`: the holders of one mode (`shared` or `semaphore:N`).
pub(crate) fn mode_prefix(lock_key: &str, mode: LockMode) -> String {
    [lock_key, "#holder#", &mode_field(mode), "#"].concat()
}

/// The key of one reader or permit holder.
pub(crate) fn holder_key(lock_key: &str, mode: LockMode, token: &str) -> String {
    [lock_key, "#holder#", &mode_field(mode), "#", token].concat()
}

/// `<lock>#writer#`: markers of blocking writers that wait for readers to leave.
pub(crate) fn writer_prefix(lock_key: &str) -> String {
    [lock_key, "#writer#"].concat()
}

/// The marker of the writers waiting in one process (`store_id`: the store's waiter id).
pub(crate) fn writer_key(lock_key: &str, store_id: &str) -> String {
    [lock_key, "#writer#", store_id].concat()
}

/// `<lock>#waiter#`: the line of one lock.
pub(crate) fn waiter_prefix(lock_key: &str) -> String {
    [lock_key, "#waiter#"].concat()
}

/// A mode as it appears in a holder key: `shared`, or `semaphore:N`.
pub(crate) fn mode_field(mode: LockMode) -> Cow<'static, str> {
    match mode {
        LockMode::Semaphore { permits } => Cow::Owned(format!("semaphore:{permits}")),
        other => Cow::Borrowed(other.as_str()),
    }
}

/// The mode of a holder key's mode field; `None` for anything this store does not write.
pub(crate) fn parse_mode(field: &str) -> Option<LockMode> {
    match field {
        "shared" => Some(LockMode::Shared),
        _ => {
            let permits = field.strip_prefix("semaphore:")?.parse().ok()?;
            LockMode::semaphore(permits).ok()
        }
    }
}

/// The end of the key range of everything starting with `prefix` (all our prefixes end in `#`,
/// so the end is the prefix with its last byte raised by one).
pub(crate) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last = last.saturating_add(1);
    }
    end
}

/// The two key ranges `[start, end)` that hold every holder of `lock_key` whose mode is not
/// `mode`: before and after `mode`'s own prefix. A `#` ends the mode field, so `semaphore:30#…`
/// lies outside `semaphore:3#…`'s range.
pub(crate) fn other_modes(lock_key: &str, mode: LockMode) -> [(Vec<u8>, Vec<u8>); 2] {
    let all = holder_prefix(lock_key);
    let mine = mode_prefix(lock_key, mode);
    [
        (all.clone().into_bytes(), mine.clone().into_bytes()),
        (prefix_end(&mine), prefix_end(&all)),
    ]
}

/// What a key under the store's prefix is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The exclusive record of a lock.
    Record(LockKey),
    /// A reader or permit holder of a lock.
    Holder(LockKey, LockMode),
    /// A waiting writer's marker.
    Writer(LockKey),
    /// A waiting process's place in a lock's line.
    Waiter(LockKey),
}

impl Entry {
    /// Parses a key with the store prefix already taken off; `None` for keys this store does not
    /// write.
    pub(crate) fn parse(name: &str) -> Option<Entry> {
        let parts: Vec<&str> = name.split('#').collect();
        let len = match parts.first() {
            Some(&"DC") => 4,
            Some(&"XDC") => 3,
            _ => return None,
        };
        if parts.len() < len {
            return None;
        }
        let key = parts[..len].join("#").parse::<LockKey>().ok()?;
        match &parts[len..] {
            [] => Some(Entry::Record(key)),
            ["holder", mode, token @ ..] if !token.is_empty() => {
                Some(Entry::Holder(key, parse_mode(mode)?))
            }
            ["writer", _, ..] => Some(Entry::Writer(key)),
            ["waiter", _, ..] => Some(Entry::Waiter(key)),
            _ => None,
        }
    }

    /// The lock this key belongs to.
    pub(crate) fn key(&self) -> &LockKey {
        match self {
            Entry::Record(key)
            | Entry::Holder(key, _)
            | Entry::Writer(key)
            | Entry::Waiter(key) => key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sem(n: u32) -> LockMode {
        LockMode::semaphore(n).unwrap()
    }

    #[test]
    fn every_key_of_a_lock_parses_back_to_it_and_never_as_a_lock() {
        let key = LockKey::dc("f", "holder", "e").unwrap();
        let lock = key.as_str();
        let token = "host/12/uuid/1700000000000";
        let cases = [
            (lock.to_owned(), Entry::Record(key.clone())),
            (
                holder_key(lock, LockMode::Shared, token),
                Entry::Holder(key.clone(), LockMode::Shared),
            ),
            (
                holder_key(lock, sem(3), token),
                Entry::Holder(key.clone(), sem(3)),
            ),
            (writer_key(lock, token), Entry::Writer(key.clone())),
            (
                format!("{}1f", waiter_prefix(lock)),
                Entry::Waiter(key.clone()),
            ),
        ];
        for (name, entry) in cases {
            assert_eq!(Entry::parse(&name), Some(entry), "{name}");
            if name != lock {
                assert!(name.parse::<LockKey>().is_err(), "{name}");
            }
        }
        assert_eq!(Entry::parse("XDC#c#e#holder#semaphore:0#t"), None);
        assert_eq!(Entry::parse("XDC#c#e#other#x"), None);
        assert_eq!(Entry::parse("something-else"), None);
    }

    #[test]
    fn other_modes_ranges_leave_out_exactly_the_mode() {
        let lock = "XDC#c#e";
        let inside = |name: &str| {
            other_modes(lock, sem(3))
                .iter()
                .any(|(start, end)| name.as_bytes() >= &start[..] && name.as_bytes() < &end[..])
        };
        assert!(!inside(&holder_key(lock, sem(3), "t")));
        assert!(inside(&holder_key(lock, sem(30), "t")));
        assert!(inside(&holder_key(lock, sem(2), "t")));
        assert!(inside(&holder_key(lock, LockMode::Shared, "t")));
        assert!(!inside(&writer_key(lock, "t")));
        assert!(!inside(lock));
    }

    #[test]
    fn modes_round_trip() {
        for mode in [LockMode::Shared, sem(1), sem(10_000)] {
            assert_eq!(parse_mode(&mode_field(mode)), Some(mode));
        }
        assert_eq!(parse_mode("exclusive"), None);
        assert_eq!(parse_mode("semaphore:x"), None);
    }
}
