//! The record layout, shared with the Java lock manager: set and bin names, and their limits.

use leasehold_core::{Error, LockKey, LockLevel, Result};

/// Aerospike's longest set name, in bytes.
pub const MAX_SET_NAME: usize = 63;
/// Aerospike's longest bin name, in bytes.
pub const MAX_BIN_NAME: usize = 15;
/// Longest farm id: `<farmId>##data` must fit in a bin name.
pub const MAX_FARM_ID: usize = MAX_BIN_NAME - "##data".len();

/// Bin holding the owner token (leasehold only; the Java manager ignores it).
pub const TOKEN_BIN: &str = "lh_token";
/// Bin holding the fencing token of the current holder (leasehold only).
pub const FENCE_BIN: &str = "lh_fence";
/// Bin of a shared record (readers, semaphore permits) naming its kind: `shared` or
/// `semaphore:<permits>` (leasehold only; its presence is what makes a record shared).
pub const MODE_BIN: &str = "lh_mode";
/// Map bin of a shared record: owner token → expiry in ms since the Unix epoch (client clocks).
pub const HOLDERS_BIN: &str = "lh_holders";
/// Bin of a shared record: until when (ms since the Unix epoch) a waiting writer keeps new
/// readers out.
pub const WRITER_BIN: &str = "lh_writer";
/// Bin of the fence counter record.
pub const COUNTER_BIN: &str = "lh_counter";
/// Bin of the fence counter record: the owner token of the acquisition that took the counter's
/// current value (a holder's fencing token, when its lock record carries none).
pub const OWNER_BIN: &str = "lh_owner";
/// Map bin of a key's queue record: waiter id (one per process) → `[ticket, deadline]`, both µs
/// since the Unix epoch on the waiter's clock (the ticket is its arrival time: the line's order).
pub const LINE_BIN: &str = "lh_line";
/// Bin of a key's queue record: when (µs since the Unix epoch) a queued process last took the
/// lock.
pub const GRANTED_BIN: &str = "lh_granted";
/// Bin of a key's queue record: that process's estimate of how long it holds the key (µs).
pub const HOLD_BIN: &str = "lh_hold";
/// List bin of a lock's history record (the lock trace): encoded
/// [`HistoryEntry`](leasehold_core::HistoryEntry)s, newest first.
pub const TRACE_BIN: &str = "lh_trace";

/// Set and bin names for one farm and set suffix, validated against Aerospike's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    farm_id: String,
    set_suffix: String,
    data_bin: String,
    uat_bin: String,
}

impl Layout {
    /// Validates `farm_id` and `set_suffix`: the bin names `<farmId>##data`/`##uat` and the set
    /// names `DC#<farmId>#<setSuffix>`, `XDC#<setSuffix>` and their `#fence` twins must fit.
    pub fn new(farm_id: &str, set_suffix: &str) -> Result<Self> {
        if farm_id.is_empty() || farm_id.len() > MAX_FARM_ID {
            return Err(Error::invalid_argument(format!(
                "farm id {farm_id:?} must be 1-{MAX_FARM_ID} bytes: the Java lock manager's bin \
                 `<farmId>##data` is limited to {MAX_BIN_NAME} bytes (e.g. \"farm1\")"
            )));
        }
        if set_suffix.is_empty() {
            return Err(Error::invalid_argument(
                "set suffix must not be empty (the Java manager's default is \"distributed_lock\")",
            ));
        }
        for (what, value) in [("farm id", farm_id), ("set suffix", set_suffix)] {
            if value
                .chars()
                .any(|c| c == '#' || c == ':' || c == ';' || c.is_whitespace() || c.is_control())
            {
                return Err(Error::invalid_argument(format!(
                    "{what} {value:?} must not contain `#`, `:`, `;`, whitespace or control characters"
                )));
            }
        }
        let layout = Layout {
            farm_id: farm_id.to_owned(),
            set_suffix: set_suffix.to_owned(),
            data_bin: format!("{farm_id}##data"),
            uat_bin: format!("{farm_id}##uat"),
        };
        for lock_set in [layout.dc_set(farm_id), layout.xdc_set()] {
            Self::check_len(lock_set.len(), || lock_set.clone())?;
        }
        Ok(layout)
    }

    /// Checks that every record set of a lock set `lock_len` bytes long fits Aerospike's
    /// set-name limit (the suffixes are as long as the fence set's); `lock_set` names it for the
    /// message.
    fn check_len(lock_len: usize, lock_set: impl FnOnce() -> String) -> Result<()> {
        let len = lock_len + Record::Fence.suffix().len();
        if len > MAX_SET_NAME {
            return Err(Error::invalid_argument(format!(
                "set name {:?} is {len} bytes, longer than Aerospike's {MAX_SET_NAME}: shorten the \
                 set suffix or the farm id",
                fence_set(&lock_set())
            )));
        }
        Ok(())
    }

    /// The configured farm id (used in bin names for every level, as the Java manager does).
    pub fn farm_id(&self) -> &str {
        &self.farm_id
    }

    /// `<farmId>##data`.
    pub fn data_bin(&self) -> &str {
        &self.data_bin
    }

    /// `<farmId>##uat`.
    pub fn uat_bin(&self) -> &str {
        &self.uat_bin
    }

    fn dc_set(&self, farm_id: &str) -> String {
        ["DC#", farm_id, "#", &self.set_suffix].concat()
    }

    fn xdc_set(&self) -> String {
        ["XDC#", &self.set_suffix].concat()
    }

    /// The lock set of `key`: `DC#<farmId>#<setSuffix>` (farm id of the key) or
    /// `XDC#<setSuffix>`. Checked against the set-name limit before any I/O.
    pub fn lock_set(&self, key: &LockKey) -> Result<String> {
        self.set_of(key, Record::Lock)
    }

    /// The set of `key`'s `record`: its lock set, with the record's suffix. Every record of a
    /// key is checked against the set-name limit (the longest suffix is the fence set's), so
    /// that a key whose lock set fits has every record's set fit too. One allocation, of the
    /// exact size: a lock operation names three or four sets.
    pub fn set_of(&self, key: &LockKey, record: Record) -> Result<String> {
        let parts = self.lock_set_parts(key);
        let lock_len: usize = parts.iter().map(|part| part.len()).sum();
        Self::check_len(lock_len, || parts.concat())?;
        let mut set = String::with_capacity(lock_len + record.suffix().len());
        parts.iter().for_each(|part| set.push_str(part));
        set.push_str(record.suffix());
        Ok(set)
    }

    /// Checks `key` against the set-name limit, as [`Self::set_of`] does, naming no set.
    pub fn check_key(&self, key: &LockKey) -> Result<()> {
        let parts = self.lock_set_parts(key);
        Self::check_len(parts.iter().map(|part| part.len()).sum(), || parts.concat())
    }

    /// The pieces of `key`'s lock set's name, in order.
    fn lock_set_parts<'a>(&'a self, key: &'a LockKey) -> [&'a str; 4] {
        match (key.level(), key.farm_id()) {
            (LockLevel::Dc, Some(farm)) => ["DC#", farm, "#", &self.set_suffix],
            _ => ["XDC#", &self.set_suffix, "", ""],
        }
    }

    /// The sets `list` scans: this farm's DC set and the XDC set.
    pub fn listed_sets(&self) -> [(LockLevel, String); 2] {
        [
            (LockLevel::Dc, self.dc_set(&self.farm_id)),
            (LockLevel::Xdc, self.xdc_set()),
        ]
    }
}

/// A key's records, each in a set of its own named after the lock set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// The lock record, the Java manager's (`<lock set>`).
    Lock,
    /// The fence counter record (`<lock set>#fence`).
    Fence,
    /// The waiter line of fair waiting (`<lock set>#queue`).
    Queue,
    /// The lock history, the lock trace (`<lock set>#trace`).
    Trace,
}

impl Record {
    /// What the record's set name adds to the lock set's.
    pub fn suffix(self) -> &'static str {
        match self {
            Record::Lock => "",
            Record::Fence => "#fence",
            Record::Queue => "#queue",
            Record::Trace => "#trace",
        }
    }

    /// What the record is, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Record::Lock => "record",
            Record::Fence => "fence",
            Record::Queue => "queue",
            Record::Trace => "trace",
        }
    }
}

/// The fence counter set of a lock set: `<lock set>#fence`.
pub fn fence_set(lock_set: &str) -> String {
    [lock_set, Record::Fence.suffix()].concat()
}

/// The queue set of a lock set (fair waiting's lines): `<lock set>#queue`, as long as the fence
/// set, so the set-name check of [`Layout::lock_set`] covers it.
pub fn queue_set(lock_set: &str) -> String {
    [lock_set, Record::Queue.suffix()].concat()
}

/// The lock history set of a lock set: `<lock set>#trace` (as long as the fence set's name, so
/// the set-name check of [`Layout::lock_set`] covers it too).
pub fn trace_set(lock_set: &str) -> String {
    [lock_set, Record::Trace.suffix()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_java_manager() {
        let layout = Layout::new("farm1", "distributed_lock").unwrap();
        assert_eq!(layout.data_bin(), "farm1##data");
        assert_eq!(layout.uat_bin(), "farm1##uat");
        let dc = LockKey::dc("farm1", "orders", "o-1").unwrap();
        assert_eq!(layout.lock_set(&dc).unwrap(), "DC#farm1#distributed_lock");
        let xdc = LockKey::xdc("orders", "o-1").unwrap();
        assert_eq!(layout.lock_set(&xdc).unwrap(), "XDC#distributed_lock");
        assert_eq!(
            fence_set("XDC#distributed_lock"),
            "XDC#distributed_lock#fence"
        );
        assert_eq!(
            queue_set("XDC#distributed_lock").len(),
            fence_set("XDC#distributed_lock").len()
        );
        assert_eq!(
            trace_set("XDC#distributed_lock").len(),
            fence_set("XDC#distributed_lock").len()
        );
        for key in [&dc, &xdc] {
            let lock_set = layout.lock_set(key).unwrap();
            assert_eq!(layout.set_of(key, Record::Lock).unwrap(), lock_set);
            assert_eq!(
                layout.set_of(key, Record::Fence).unwrap(),
                fence_set(&lock_set)
            );
            assert_eq!(
                layout.set_of(key, Record::Queue).unwrap(),
                queue_set(&lock_set)
            );
            assert_eq!(
                layout.set_of(key, Record::Trace).unwrap(),
                trace_set(&lock_set)
            );
            layout.check_key(key).unwrap();
        }
    }

    #[test]
    fn limits_are_enforced_with_clear_errors() {
        let err = Layout::new("farm123456", "s").unwrap_err();
        assert!(err.to_string().contains("1-9 bytes"), "{err}");
        assert!(Layout::new("farm12345", "s").is_ok());
        assert!(Layout::new("", "s").is_err());
        assert!(Layout::new("f", "").is_err());
        assert!(Layout::new("f#1", "s").is_err());
        let err = Layout::new("farm1", &"x".repeat(60)).unwrap_err();
        assert!(
            err.to_string().contains("longer than Aerospike's 63"),
            "{err}"
        );
        let layout = Layout::new("f", &"x".repeat(40)).unwrap();
        let key = LockKey::dc(&"g".repeat(30), "c", "e").unwrap();
        let err = layout.lock_set(&key).unwrap_err();
        assert!(err.to_string().contains("is 80 bytes"), "{err}");
        assert!(
            err.to_string().contains(&format!(
                "\"DC#{}#{}#fence\"",
                "g".repeat(30),
                "x".repeat(40)
            )),
            "names the longest set: {err}"
        );
        for record in [Record::Lock, Record::Fence, Record::Queue, Record::Trace] {
            assert!(
                layout.set_of(&key, record).is_err(),
                "checked per key before I/O"
            );
        }
        assert!(layout.check_key(&key).is_err());
        let fits = LockKey::dc(&"g".repeat(13), "c", "e").unwrap();
        assert_eq!(
            layout.set_of(&fits, Record::Fence).unwrap().len(),
            MAX_SET_NAME
        );
        layout.check_key(&fits).unwrap();
    }
}
