//! The key pattern of a scenario: a glob on the entity name.

use std::fmt;

/// A glob on a lock's entity name (the part after `<client_id>#`): `*` matches any run of
/// characters (including none), `?` exactly one character, anything else itself. Matching is
/// case-sensitive and covers the whole name.
///
/// ```
/// use leasehold::scenario::KeyPattern;
/// let orders = KeyPattern::new("order-*");
/// assert!(orders.matches("order-42"));
/// assert!(!orders.matches("refund-42"));
/// assert!(KeyPattern::new("job-??").matches("job-07"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPattern {
    pattern: String,
}

impl KeyPattern {
    /// A pattern; an empty one matches nothing but the empty name (scenario validation rejects it).
    pub fn new(pattern: impl Into<String>) -> Self {
        KeyPattern {
            pattern: pattern.into(),
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether `entity` matches the whole pattern.
    pub fn matches(&self, entity: &str) -> bool {
        let p: Vec<char> = self.pattern.chars().collect();
        let s: Vec<char> = entity.chars().collect();
        // Iterative glob matching with backtracking to the last `*`: linear in practice, never
        // exponential.
        let (mut pi, mut si) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while si < s.len() {
            match p.get(pi) {
                Some('*') => {
                    star = Some((pi, si));
                    pi += 1;
                }
                Some('?') => {
                    pi += 1;
                    si += 1;
                }
                Some(c) if *c == s[si] => {
                    pi += 1;
                    si += 1;
                }
                _ => match star {
                    Some((sp, ss)) => {
                        pi = sp + 1;
                        si = ss + 1;
                        star = Some((sp, ss + 1));
                    }
                    None => return false,
                },
            }
        }
        p[pi..].iter().all(|c| *c == '*')
    }
}

impl fmt::Display for KeyPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.pattern)
    }
}

#[cfg(test)]
mod tests {
    use super::KeyPattern;

    #[test]
    fn globs_match_the_whole_entity_name() {
        let cases = [
            ("order-*", "order-1", true),
            ("order-*", "order-", true),
            ("order-*", "xorder-1", false),
            ("*", "", true),
            ("*-eu", "shop-eu", true),
            ("*-eu", "shop-us", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("job-??", "job-7", false),
            ("job-??", "job-77", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ];
        for (pattern, entity, expected) in cases {
            assert_eq!(
                KeyPattern::new(pattern).matches(entity),
                expected,
                "{pattern} ~ {entity}"
            );
        }
    }
}
