//! Lock keys: the seed lock manager's DC / XDC key formats, validated so two different keys can never
//! collide in the store.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Longest accepted part (farm id, client id, entity id), in bytes.
pub const MAX_PART_LEN: usize = 128;

/// Longest accepted storage key (`DC#<farmId>#<clientId>#<entityId>`), in bytes.
///
/// 256 bytes fits every store leasehold ships (Redis keys, Aerospike user keys) with room for a
/// store prefix, and is far above any key a lock should need.
pub const MAX_KEY_LEN: usize = 256;

/// The scope of a lock, as in the seed lock manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockLevel {
    /// Scoped to one farm (data center): the storage key carries the farm id, so the same entity
    /// locked in two farms is two different locks. The recommended default.
    Dc,
    /// Cross data center: the storage key omits the farm id, so every farm contends for one lock.
    /// Concurrent XDC acquisitions from several data centers are only as safe as the store's
    /// replication (see docs/DESIGN.md).
    Xdc,
}

impl LockLevel {
    /// The prefix used in storage keys: `DC` or `XDC`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockLevel::Dc => "DC",
            LockLevel::Xdc => "XDC",
        }
    }
}

impl fmt::Display for LockLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for LockLevel {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "dc" => Ok(LockLevel::Dc),
            "xdc" => Ok(LockLevel::Xdc),
            _ => Err(Error::invalid_argument(format!(
                "unknown lock level {s:?}: expected `dc` or `xdc`"
            ))),
        }
    }
}

/// A validated lock key.
///
/// The lock id is `<clientId>#<entityId>` (as the seed's `getLockInstance` builds it) and the
/// storage key is `DC#<farmId>#<lockId>` or `XDC#<lockId>`. Every part must be non-empty, at most
/// [`MAX_PART_LEN`] bytes, and free of `#`, whitespace and control characters — `#` is the
/// separator, so allowing it inside a part would let `("a#b", "c")` and `("a", "b#c")` become the
/// same key. Cloning is cheap (one reference count).
///
/// ```
/// use leasehold_core::{LockKey, LockLevel};
///
/// let key = LockKey::dc("farm1", "orders", "order-42")?;
/// assert_eq!(key.as_str(), "DC#farm1#orders#order-42");
/// assert_eq!(key.lock_id(), "orders#order-42");
///
/// let xdc = LockKey::xdc("orders", "order-42")?;
/// assert_eq!(xdc.as_str(), "XDC#orders#order-42");
/// assert_eq!(xdc.level(), LockLevel::Xdc);
///
/// assert!(LockKey::dc("farm1", "orders", "a#b").is_err());
/// assert_eq!("DC#farm1#orders#order-42".parse::<LockKey>()?, key);
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone)]
pub struct LockKey {
    inner: Arc<KeyInner>,
}

struct KeyInner {
    storage: String,
    level: LockLevel,
    /// Byte offset of the lock id inside `storage`.
    lock_id_at: usize,
    /// Byte offset of the entity id inside `storage`.
    entity_at: usize,
}

impl LockKey {
    /// A data-center lock: `DC#<farm_id>#<client_id>#<entity_id>`.
    pub fn dc(farm_id: &str, client_id: &str, entity_id: &str) -> Result<Self> {
        Self::new(LockLevel::Dc, Some(farm_id), client_id, entity_id)
    }

    /// A cross-data-center lock: `XDC#<client_id>#<entity_id>`.
    pub fn xdc(client_id: &str, entity_id: &str) -> Result<Self> {
        Self::new(LockLevel::Xdc, None, client_id, entity_id)
    }

    /// Builds a key of either level. `farm_id` is required for [`LockLevel::Dc`] and ignored for
    /// [`LockLevel::Xdc`].
    pub fn new(
        level: LockLevel,
        farm_id: Option<&str>,
        client_id: &str,
        entity_id: &str,
    ) -> Result<Self> {
        validate_part("client id", client_id)?;
        validate_part("entity id", entity_id)?;
        let mut storage = String::with_capacity(8 + client_id.len() + entity_id.len());
        storage.push_str(level.as_str());
        storage.push('#');
        if level == LockLevel::Dc {
            let farm_id = farm_id.ok_or_else(|| {
                Error::invalid_argument(
                    "a DC lock needs a farm id (set `farm_id` on the manager, e.g. \"farm1\")",
                )
            })?;
            validate_part("farm id", farm_id)?;
            storage.push_str(farm_id);
            storage.push('#');
        }
        let lock_id_at = storage.len();
        storage.push_str(client_id);
        storage.push('#');
        let entity_at = storage.len();
        storage.push_str(entity_id);
        if storage.len() > MAX_KEY_LEN {
            return Err(Error::invalid_argument(format!(
                "lock key is {} bytes, longer than the maximum of {MAX_KEY_LEN}: shorten the entity id",
                storage.len()
            )));
        }
        Ok(LockKey {
            inner: Arc::new(KeyInner {
                storage,
                level,
                lock_id_at,
                entity_at,
            }),
        })
    }

    /// The storage key, e.g. `DC#farm1#orders#order-42`.
    pub fn as_str(&self) -> &str {
        &self.inner.storage
    }

    /// The lock level.
    pub fn level(&self) -> LockLevel {
        self.inner.level
    }

    /// The lock id, `<clientId>#<entityId>`.
    pub fn lock_id(&self) -> &str {
        &self.inner.storage[self.inner.lock_id_at..]
    }

    /// The farm id of a DC key, `None` for XDC.
    pub fn farm_id(&self) -> Option<&str> {
        match self.inner.level {
            LockLevel::Dc => Some(&self.inner.storage[3..self.inner.lock_id_at - 1]),
            LockLevel::Xdc => None,
        }
    }

    /// The client id.
    pub fn client_id(&self) -> &str {
        &self.inner.storage[self.inner.lock_id_at..self.inner.entity_at - 1]
    }

    /// The entity id.
    pub fn entity_id(&self) -> &str {
        &self.inner.storage[self.inner.entity_at..]
    }
}

impl std::str::FromStr for LockKey {
    type Err = Error;

    /// Parses a storage key (`DC#farm#client#entity` or `XDC#client#entity`), as printed by
    /// [`LockKey::as_str`] and shown by `leasehold list`.
    fn from_str(s: &str) -> Result<Self> {
        let parts: Vec<&str> = s.split('#').collect();
        match parts.as_slice() {
            ["DC", farm, client, entity] => LockKey::dc(farm, client, entity),
            ["XDC", client, entity] => LockKey::xdc(client, entity),
            _ => Err(Error::invalid_argument(format!(
                "{s:?} is not a lock key: expected `DC#<farmId>#<clientId>#<entityId>` or \
                 `XDC#<clientId>#<entityId>`, e.g. `DC#farm1#orders#order-42`"
            ))),
        }
    }
}

// Identity is the storage string alone: level and offsets are derived from it. Clones share one
// allocation, so the common comparison (a key against a clone of itself, in every map lookup) is
// a pointer check.
impl PartialEq for LockKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || self.inner.storage == other.inner.storage
    }
}

impl Eq for LockKey {}

impl std::hash::Hash for LockKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.storage.hash(state);
    }
}

impl PartialOrd for LockKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LockKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.inner.storage.cmp(&other.inner.storage)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockKey({:?})", self.as_str())
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Validates one part of a key; see [`LockKey`] for the rules.
fn validate_part(what: &str, part: &str) -> Result<()> {
    if part.is_empty() {
        return Err(Error::invalid_argument(format!("{what} must not be empty")));
    }
    if part.len() > MAX_PART_LEN {
        return Err(Error::invalid_argument(format!(
            "{what} is {} bytes, longer than the maximum of {MAX_PART_LEN}",
            part.len()
        )));
    }
    if let Some(bad) = part
        .chars()
        .find(|c| *c == '#' || c.is_whitespace() || c.is_control() || is_invisible(*c))
    {
        return Err(Error::invalid_argument(format!(
            "{what} {part:?} contains {bad:?}: `#` separates key parts, and whitespace, control \
             and invisible formatting characters are not allowed; use e.g. `-` or `_` instead"
        )));
    }
    Ok(())
}

/// Unicode's invisible formatting characters (general category `Cf`: zero-width spaces and
/// joiners, direction marks and overrides, the byte order mark, soft hyphens): a key holding
/// one looks like another key that does not, in logs and in `leasehold list`, and is another
/// lock. Keys are compared byte for byte, with no normalisation.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn a_key_with_an_invisible_character_is_refused() {
        for entity in [
            "a\u{200B}b",
            "\u{FEFF}order",
            "pay\u{202E}ment",
            "x\u{00AD}y",
        ] {
            let err = LockKey::xdc("c", entity).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{entity:?}");
            assert!(err.to_string().contains("invisible"), "{err}");
        }
        // Letters of any script are fine.
        LockKey::xdc("c", "café-заказ-注文").unwrap();
    }

    #[test]
    fn builds_seed_formats() {
        let dc = LockKey::dc("f1", "c", "e").unwrap();
        assert_eq!(dc.as_str(), "DC#f1#c#e");
        assert_eq!(dc.farm_id(), Some("f1"));
        assert_eq!(dc.client_id(), "c");
        assert_eq!(dc.entity_id(), "e");
        assert_eq!(dc.lock_id(), "c#e");
        let xdc = LockKey::xdc("c", "e").unwrap();
        assert_eq!(xdc.as_str(), "XDC#c#e");
        assert_eq!(xdc.farm_id(), None);
        assert_eq!(xdc.lock_id(), "c#e");
        assert_eq!(xdc.client_id(), "c");
    }

    #[test]
    fn rejects_empty_parts() {
        for (f, c, e) in [("", "c", "e"), ("f", "", "e"), ("f", "c", "")] {
            let err = LockKey::dc(f, "c", "e")
                .and(LockKey::dc("f", c, e))
                .and(LockKey::dc(f, c, e))
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
            assert!(err.to_string().contains("must not be empty"), "{err}");
        }
    }

    #[test]
    fn rejects_separator_so_keys_cannot_collide() {
        let err = LockKey::dc("f", "a#b", "c").unwrap_err();
        assert!(err.to_string().contains("`#` separates"), "{err}");
        assert!(LockKey::dc("f", "a", "b#c").is_err());
        assert!(LockKey::dc("f#x", "a", "b").is_err());
        assert!(LockKey::xdc("a", "has space").is_err());
        assert!(LockKey::xdc("a", "new\nline").is_err());
    }

    #[test]
    fn rejects_oversized_parts_and_keys() {
        let long = "x".repeat(MAX_PART_LEN + 1);
        assert!(LockKey::xdc("c", &long).is_err());
        let part = "y".repeat(MAX_PART_LEN);
        let err = LockKey::dc(&part, &part, "e").unwrap_err();
        assert!(err.to_string().contains("maximum of 256"), "{err}");
        assert!(LockKey::xdc("c", &part).is_ok());
    }

    #[test]
    fn dc_without_farm_is_an_error() {
        let err = LockKey::new(LockLevel::Dc, None, "c", "e").unwrap_err();
        assert!(err.to_string().contains("farm id"), "{err}");
        let xdc = LockKey::new(LockLevel::Xdc, Some("ignored"), "c", "e").unwrap();
        assert_eq!(xdc.as_str(), "XDC#c#e");
    }

    #[test]
    fn parses_what_it_prints() {
        for s in ["DC#f#c#e", "XDC#c#e"] {
            assert_eq!(s.parse::<LockKey>().unwrap().as_str(), s);
        }
        for s in ["", "DC#f#c", "XDC#c", "XDC#c#e#x", "ZZ#a#b", "DC#f##e"] {
            assert!(s.parse::<LockKey>().is_err(), "{s}");
        }
        assert_eq!("xdc".parse::<LockLevel>().unwrap(), LockLevel::Xdc);
        assert!("zone".parse::<LockLevel>().is_err());
    }
}
