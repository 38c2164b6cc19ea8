//! The registry: scenarios by name and by key pattern.

use super::definition::Scenario;
use super::error::ScenarioError;

/// The scenarios a manager knows, in registration order (the first whose pattern matches a key
/// wins), and whether a key that matches none is an error ([strict](Self::strict)) or gets the
/// manager's defaults.
///
/// ```
/// use leasehold::scenario::{Scenario, ScenarioRegistry};
/// let registry = ScenarioRegistry::from_toml_str(r#"
///     strict = true
///     [[scenario]]
///     name = "checkout"
///     keys = "order-*"
///     mode = "blocking"
///     ttl = "5s"
///     wait = "200ms"
///     on_store_down = "fail"
/// "#, "inline")?;
/// assert!(registry.is_strict());
/// assert_eq!(registry.matching("order-1").map(Scenario::name), Some("checkout"));
/// assert!(registry.matching("refund-1").is_none());
/// # Ok::<(), leasehold::scenario::ScenarioError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScenarioRegistry {
    scenarios: Vec<Scenario>,
    strict: bool,
}

impl ScenarioRegistry {
    /// An empty, lenient registry.
    pub fn new() -> Self {
        ScenarioRegistry::default()
    }

    /// Strict: a lock call whose key matches no scenario (and names none) is rejected before any
    /// store I/O, instead of getting the manager's defaults.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Whether the registry is strict.
    pub fn is_strict(&self) -> bool {
        self.strict
    }

    /// Adds a scenario (see [`register`](Self::register)).
    pub fn with(mut self, scenario: Scenario) -> Result<Self, ScenarioError> {
        self.register(scenario)?;
        Ok(self)
    }

    /// Adds a scenario after checking its settings: a duplicate name or an invalid setting is a
    /// [`ScenarioError::Invalid`] naming the field.
    pub fn register(&mut self, scenario: Scenario) -> Result<(), ScenarioError> {
        self.register_at(scenario, "code", |_| None)
    }

    /// [`register`](Self::register), with errors located by `position_of(field)` (line and
    /// column) in `origin`.
    pub(super) fn register_at(
        &mut self,
        scenario: Scenario,
        origin: &str,
        position_of: impl Fn(&str) -> Option<(usize, usize)>,
    ) -> Result<(), ScenarioError> {
        let invalid = |field: &str, message: String| ScenarioError::Invalid {
            origin: origin.to_owned(),
            line: position_of(field).map(|(line, _)| line),
            column: position_of(field).and_then(|(_, column)| u32::try_from(column).ok()),
            scenario: scenario.name.to_string(),
            field: field.to_owned(),
            message,
        };
        if self.get(&scenario.name).is_some() {
            return Err(invalid(
                "name",
                "another scenario has this name; names must be unique".to_owned(),
            ));
        }
        scenario
            .check()
            .map_err(|(field, message)| invalid(field, message))?;
        self.scenarios.push(scenario);
        Ok(())
    }

    /// The scenario named `name`.
    pub fn get(&self, name: &str) -> Option<&Scenario> {
        self.scenarios.iter().find(|s| &*s.name == name)
    }

    /// The first scenario whose key pattern matches `entity`.
    pub fn matching(&self, entity: &str) -> Option<&Scenario> {
        self.scenarios.iter().find(|s| s.covers(entity))
    }

    /// The scenarios, in registration order.
    pub fn iter(&self) -> impl Iterator<Item = &Scenario> {
        self.scenarios.iter()
    }

    /// How many scenarios there are.
    pub fn len(&self) -> usize {
        self.scenarios.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.scenarios.is_empty()
    }
}
