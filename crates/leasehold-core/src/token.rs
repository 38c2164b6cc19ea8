//! Owner tokens: who holds a lock, unique per acquisition.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// The longest label an [`OwnerToken`] carries, in bytes.
pub const MAX_LABEL_LEN: usize = 256;

/// A holder's note carried by its owner tokens ([`OwnerToken::label`]), checked: not empty, at
/// most [`MAX_LABEL_LEN`] bytes, no control characters (tools print a token on one line).
///
/// ```
/// use leasehold_core::{OwnerToken, TokenLabel};
/// let label = TokenLabel::new("10.0.0.7:8080").unwrap();
/// assert_eq!(OwnerToken::generate_labelled(&label).label(), Some("10.0.0.7:8080"));
/// assert!(TokenLabel::new("").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenLabel(Arc<str>);

impl TokenLabel {
    /// Checks `label`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) when it is empty, longer
    /// than [`MAX_LABEL_LEN`] bytes, or holds a control character.
    pub fn new(label: impl Into<Arc<str>>) -> Result<Self> {
        let label = label.into();
        if label.is_empty() {
            return Err(Error::invalid_argument(
                "the lock label is empty: give a short note such as an address, or no label",
            ));
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(Error::invalid_argument(format!(
                "the lock label is {} bytes long; the most is {MAX_LABEL_LEN}: store a longer \
                 value elsewhere and label the lock with a reference to it",
                label.len()
            )));
        }
        if label.chars().any(char::is_control) {
            return Err(Error::invalid_argument(format!(
                "the lock label {label:?} holds a control character"
            )));
        }
        Ok(TokenLabel(label))
    }

    /// The label.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The value a lock record holds: unique per acquisition, and readable by a person debugging a
/// stuck lock.
///
/// Tokens leasehold makes look like `web-3/4711/5f0c…e2/1763805600123`:
/// `<host>/<pid>/<uuid v4, simple form>/<acquisition time in epoch ms>` (the composite of node,
/// random part and timestamp that Bond's readback scenario relies on), followed by `#<label>`
/// when the holder gave a [label](Self::label) (an address to reach it, a job's run id). Owner
/// checks compare the whole string; the parts are only for people and tools. A token read from a
/// store that was written by something else (another library, a hand-made record) is kept
/// verbatim and its parts read as `None`.
///
/// ```
/// use leasehold_core::OwnerToken;
///
/// let a = OwnerToken::generate();
/// let b = OwnerToken::generate();
/// assert_ne!(a, b);
/// assert_eq!(a.pid(), Some(std::process::id()));
/// assert!(a.acquired_at().is_some());
///
/// let foreign = OwnerToken::from_string("java-dlm");
/// assert_eq!(foreign.host(), None);
///
/// let address = leasehold_core::TokenLabel::new("10.0.0.7:8080").unwrap();
/// let labelled = OwnerToken::generate_labelled(&address);
/// assert_eq!(labelled.label(), Some("10.0.0.7:8080"));
/// assert_eq!(labelled.pid(), Some(std::process::id()));
/// ```
#[derive(Clone, PartialOrd, Ord)]
pub struct OwnerToken(Arc<str>);

// Clones share one allocation, so an owner check against the token a lease carries is usually a
// pointer comparison.
impl PartialEq for OwnerToken {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for OwnerToken {}

impl std::hash::Hash for OwnerToken {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl OwnerToken {
    /// A new token for this process, now.
    pub fn generate() -> Self {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let mut uuid = uuid::Uuid::encode_buffer();
        let uuid = uuid::Uuid::new_v4().simple().encode_lower(&mut uuid);
        let mut digits = itoa::Buffer::new();
        let millis = digits.format(millis);
        let prefix = token_prefix();
        // Assembled on the stack and copied once into the shared allocation: one heap allocation
        // per token (one token per acquisition attempt).
        let mut stack = [0u8; 256];
        let len = prefix.len() + uuid.len() + 1 + millis.len();
        if let Some(buf) = stack.get_mut(..len) {
            let (head, tail) = buf.split_at_mut(prefix.len());
            head.copy_from_slice(prefix.as_bytes());
            let (mid, tail) = tail.split_at_mut(uuid.len());
            mid.copy_from_slice(uuid.as_bytes());
            tail[0] = b'/';
            tail[1..].copy_from_slice(millis.as_bytes());
            if let Ok(token) = std::str::from_utf8(buf) {
                return OwnerToken(Arc::from(token));
            }
        }
        // A host name too long for the stack buffer.
        OwnerToken(format!("{prefix}{uuid}/{millis}").into())
    }

    /// A new token for this process, now, carrying `label` (see [`label`](Self::label)).
    pub fn generate_labelled(label: &TokenLabel) -> Self {
        let token = Self::generate();
        OwnerToken(format!("{}#{}", token.0, label.0).into())
    }

    /// Wraps a token read from a store (or typed by an operator), verbatim.
    pub fn from_string(token: impl Into<Arc<str>>) -> Self {
        OwnerToken(token.into())
    }

    /// The whole token.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The token without its label, and the label.
    fn split_label(&self) -> (&str, Option<&str>) {
        // Host names never hold `#` (see `host_name`), so the first one starts the label.
        match self.0.split_once('#') {
            Some((head, label)) => (head, Some(label)),
            None => (&self.0, None),
        }
    }

    fn parts(&self) -> Option<(&str, &str, &str, &str)> {
        let mut it = self.split_label().0.rsplitn(4, '/');
        let millis = it.next()?;
        let uuid = it.next()?;
        let pid = it.next()?;
        let host = it.next()?;
        (uuid.len() == 32 && uuid.bytes().all(|b| b.is_ascii_hexdigit())).then_some(())?;
        Some((host, pid, uuid, millis))
    }

    /// The host that took the lock, for tokens leasehold made.
    pub fn host(&self) -> Option<&str> {
        self.parts().map(|(h, ..)| h)
    }

    /// The process id that took the lock, for tokens leasehold made.
    pub fn pid(&self) -> Option<u32> {
        self.parts().and_then(|(_, p, ..)| p.parse().ok())
    }

    /// The holder's label (an address to reach it, a job's run id), for tokens leasehold made
    /// with one ([`generate_labelled`](Self::generate_labelled); the manager's
    /// `LockOptions::label`).
    pub fn label(&self) -> Option<&str> {
        self.parts()?;
        self.split_label().1
    }

    /// When the token was made (just before the acquire request was sent), for tokens leasehold
    /// made.
    pub fn acquired_at(&self) -> Option<SystemTime> {
        self.parts()
            .and_then(|(.., m)| m.parse::<u64>().ok())
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
    }
}

/// `<host>/<pid>/`, computed once: the part of every token that never changes in a process.
fn token_prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| format!("{}/{}/", host_name(), std::process::id()))
}

/// This machine's host name, read once. Falls back to `unknown-host`; `/` and `#` are replaced so
/// the token stays parseable.
fn host_name() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let name = gethostname::gethostname()
            .to_string_lossy()
            .replace(['/', '#'], "_");
        if name.is_empty() {
            "unknown-host".to_owned()
        } else {
            name
        }
    })
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({:?})", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_carry_who_and_when() {
        let before = SystemTime::now() - Duration::from_millis(1);
        let t = OwnerToken::generate();
        assert_eq!(t.host(), Some(host_name()));
        assert_eq!(t.pid(), Some(std::process::id()));
        let at = t.acquired_at().unwrap();
        assert!(at >= before && at <= SystemTime::now() + Duration::from_millis(1));
        let many: std::collections::HashSet<_> =
            (0..1000).map(|_| OwnerToken::generate()).collect();
        assert_eq!(many.len(), 1000);
    }

    #[test]
    fn foreign_tokens_are_kept_verbatim() {
        let t = OwnerToken::from_string("a/b/c/d");
        assert_eq!(t.as_str(), "a/b/c/d");
        assert_eq!(t.host(), None);
        assert_eq!(t.pid(), None);
        assert_eq!(t.acquired_at(), None);
    }

    #[test]
    fn a_label_rides_after_the_parts_and_may_hold_any_printable_text() {
        let url = "http://10.0.0.7:8080/leader#main";
        let t = OwnerToken::generate_labelled(&TokenLabel::new(url).unwrap());
        assert_eq!(t.label(), Some(url));
        assert_eq!(t.host(), Some(host_name()));
        assert_eq!(t.pid(), Some(std::process::id()));
        assert!(t.acquired_at().is_some());
        assert!(t.as_str().ends_with(&format!("#{url}")));
        assert_eq!(OwnerToken::generate().label(), None);
        // A foreign token with a `#` has no label: only tokens leasehold made are read.
        assert_eq!(OwnerToken::from_string("java#dlm").label(), None);
    }

    #[test]
    fn bad_labels_are_refused() {
        let long = "x".repeat(MAX_LABEL_LEN + 1);
        for bad in ["", long.as_str(), "two\nlines", "bell\u{7}"] {
            let err = TokenLabel::new(bad).unwrap_err();
            assert_eq!(
                err.kind(),
                crate::error::ErrorKind::InvalidArgument,
                "{bad:?}: {err}"
            );
        }
        assert!(TokenLabel::new("x".repeat(MAX_LABEL_LEN)).is_ok());
    }
}
