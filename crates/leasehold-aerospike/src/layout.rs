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
        layout.check_set(&fence_set(&layout.dc_set(farm_id)))?;
        layout.check_set(&fence_set(&layout.xdc_set()))?;
        Ok(layout)
    }

    fn check_set(&self, set: &str) -> Result<()> {
        if set.len() > MAX_SET_NAME {
            return Err(Error::invalid_argument(format!(
                "set name {set:?} is {} bytes, longer than Aerospike's {MAX_SET_NAME}: shorten the \
                 set suffix or the farm id",
                set.len()
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
        format!("DC#{farm_id}#{}", self.set_suffix)
    }

    fn xdc_set(&self) -> String {
        format!("XDC#{}", self.set_suffix)
    }

    /// The lock set of `key`: `DC#<farmId>#<setSuffix>` (farm id of the key) or
    /// `XDC#<setSuffix>`. Checked against the set-name limit before any I/O.
    pub fn lock_set(&self, key: &LockKey) -> Result<String> {
        let set = match (key.level(), key.farm_id()) {
            (LockLevel::Dc, Some(farm)) => self.dc_set(farm),
            _ => self.xdc_set(),
        };
        self.check_set(&fence_set(&set))?;
        Ok(set)
    }

    /// The sets `list` scans: this farm's DC set and the XDC set.
    pub fn listed_sets(&self) -> [(LockLevel, String); 2] {
        [
            (LockLevel::Dc, self.dc_set(&self.farm_id)),
            (LockLevel::Xdc, self.xdc_set()),
        ]
    }
}

/// The fence counter set of a lock set: `<lock set>#fence`.
pub fn fence_set(lock_set: &str) -> String {
    format!("{lock_set}#fence")
}

/// The queue set of a lock set (fair waiting's lines): `<lock set>#queue`, as long as the fence
/// set, so the set-name check of [`Layout::lock_set`] covers it.
pub fn queue_set(lock_set: &str) -> String {
    format!("{lock_set}#queue")
}

/// The lock history set of a lock set: `<lock set>#trace` (as long as the fence set's name, so
/// the set-name check of [`Layout::lock_set`] covers it too).
pub fn trace_set(lock_set: &str) -> String {
    format!("{lock_set}#trace")
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
        assert!(layout.lock_set(&key).is_err(), "checked per key before I/O");
    }
}
