//! The scenario file: TOML, parsed with serde, every value kept with its position so an error
//! names the line and column. The `[scenario.layers]` table is in [`layers`].

mod layers;

use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::core::TraceConfig;

use super::definition::{AcquireMode, Scenario, StoreDownPolicy};
use super::error::ScenarioError;
use super::glob::KeyPattern;
use super::registry::ScenarioRegistry;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    strict: bool,
    #[serde(default)]
    scenario: Vec<RawScenario>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawMode {
    Try,
    Blocking,
}

#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
enum RawLock {
    Exclusive,
    Write,
    Read,
    Semaphore,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawPolicy {
    Fail,
    Proceed,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: Spanned<String>,
    keys: Option<Spanned<String>>,
    mode: Option<RawMode>,
    lock: Option<Spanned<RawLock>>,
    permits: Option<Spanned<u32>>,
    ttl: Option<Spanned<String>>,
    wait: Option<Spanned<String>>,
    renew: Option<bool>,
    renew_every: Option<Spanned<String>>,
    on_store_down: Option<RawPolicy>,
    trace: Option<bool>,
    trace_len: Option<Spanned<u32>>,
    trace_ttl: Option<Spanned<String>>,
    layers: Option<layers::RawLayers>,
}

/// The text before byte `offset`, cut at the character boundary at or before it (an offset
/// inside a character, or past the end, never panics).
fn text_before(text: &str, offset: usize) -> &str {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// 1-based line and column of byte `offset` in `text`.
fn position(text: &str, offset: usize) -> (usize, usize) {
    let before = text_before(text, offset);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |nl| before.len() - nl - 1)
        + 1;
    (line, column)
}

/// The key whose value starts at byte `offset`: the last `key =` before it on its line (so a
/// setting inside an inline table is named, not the table), else the key at the line's start.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let before = text_before(text, offset);
    let line_start = before.rfind('\n').map_or(0, |nl| nl + 1);
    let (key, _) = before[line_start..].rsplit_once('=')?;
    let key = key.trim_end().trim_end_matches('"');
    // Past the last character that cannot be part of a key, whatever its length in bytes.
    let start = key
        .char_indices()
        .rfind(|(_, c)| !(c.is_alphanumeric() || "_-.".contains(*c)))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let key = &key[start..];
    (!key.is_empty()).then(|| key.to_owned())
}

/// Where a scenario's values are, to name the file, line, column, scenario and field in errors.
struct Place<'a> {
    text: &'a str,
    origin: &'a str,
    scenario: String,
}

impl Place<'_> {
    /// Line and column of the value at `span`.
    fn at(&self, span: &Range<usize>) -> (usize, usize) {
        position(self.text, span.start)
    }

    fn invalid(&self, field: &str, span: Range<usize>, message: String) -> ScenarioError {
        let (line, column) = self.at(&span);
        ScenarioError::Invalid {
            origin: self.origin.to_owned(),
            line: Some(line),
            column: u32::try_from(column).ok(),
            scenario: self.scenario.clone(),
            field: field.to_owned(),
            message,
        }
    }

    /// A humantime duration, if written.
    fn duration(
        &self,
        field: &str,
        value: Option<&Spanned<String>>,
    ) -> Result<Option<Duration>, ScenarioError> {
        value
            .map(|v| {
                humantime::parse_duration(v.get_ref()).map_err(|e| {
                    self.invalid(
                        field,
                        v.span(),
                        format!(
                            "{:?} is not a duration ({e}); write it as \"5s\", \"200ms\" or \"1m 30s\"",
                            v.get_ref()
                        ),
                    )
                })
            })
            .transpose()
    }
}

/// The key written at the start of `line` (`key = value`), if any.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let content = text.lines().nth(line.checked_sub(1)?)?;
    let (key, _) = content.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty()
        && key
            .chars()
            .all(|c| c.is_alphanumeric() || "_-.".contains(c)))
    .then(|| key.to_owned())
}

/// Reading a registry from a scenario file is the file format's job: the registry itself knows
/// nothing of TOML.
impl ScenarioRegistry {
    /// Parses a scenario file's text; `origin` names it in errors (a path, or `inline`).
    /// The format is in docs/SCENARIOS.md.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ScenarioError> {
        parse(text, origin)
    }

    /// Reads and parses a scenario file. Errors name the file, the line and the field.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self, ScenarioError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.to_owned(),
            source,
        })?;
        parse(&text, &path.display().to_string())
    }
}

fn parse(text: &str, origin: &str) -> Result<ScenarioRegistry, ScenarioError> {
    let raw: RawFile = toml::from_str(text).map_err(|error| {
        let start = error.span().map_or(0, |span| span.start);
        let (line, column) = position(text, start);
        let message = error.message().trim().to_owned();
        // Serde names unknown and missing fields itself; otherwise the key the value belongs to.
        let field = if message.contains("field `") {
            None
        } else {
            key_at(text, start).or_else(|| key_on_line(text, line))
        };
        ScenarioError::Parse {
            origin: origin.to_owned(),
            line,
            column,
            field,
            message,
            source: Some(Box::new(error)),
        }
    })?;
    let mut registry = ScenarioRegistry::new().strict(raw.strict);
    for s in raw.scenario {
        let place = Place {
            text,
            origin,
            scenario: s.name.get_ref().clone(),
        };
        let invalid =
            |field: &str, span: Range<usize>, message: String| place.invalid(field, span, message);
        let ttl = place.duration("ttl", s.ttl.as_ref())?;
        let wait = place.duration("wait", s.wait.as_ref())?;
        let renew_every = place.duration("renew_every", s.renew_every.as_ref())?;
        let trace_ttl = place.duration("trace_ttl", s.trace_ttl.as_ref())?;
        let mut scenario = Scenario::new(place.scenario.as_str());
        scenario.keys = s.keys.as_ref().map(|k| KeyPattern::new(k.get_ref()));
        scenario.mode = match s.mode {
            Some(RawMode::Try) => AcquireMode::Try,
            Some(RawMode::Blocking) | None => AcquireMode::Blocking,
        };
        scenario.lock = match (s.lock.as_ref().map(|l| *l.get_ref()), &s.permits) {
            (Some(RawLock::Semaphore), Some(permits)) => {
                crate::core::LockMode::semaphore(*permits.get_ref())
                    .map_err(|e| invalid("permits", permits.span(), e.message().to_owned()))?
            }
            (Some(RawLock::Semaphore), None) => {
                let span = s.lock.as_ref().map_or(s.name.span(), |l| l.span());
                return Err(invalid(
                    "permits",
                    span,
                    "a semaphore scenario needs `permits = N` (how many holders at once)"
                        .to_owned(),
                ));
            }
            (_, Some(permits)) => {
                return Err(invalid(
                    "permits",
                    permits.span(),
                    "`permits` only applies to `lock = \"semaphore\"`".to_owned(),
                ))
            }
            (Some(RawLock::Read), None) => crate::core::LockMode::Shared,
            (Some(RawLock::Exclusive | RawLock::Write), None) | (None, None) => {
                crate::core::LockMode::Exclusive
            }
        };
        scenario.ttl = ttl;
        scenario.wait = wait;
        scenario.renew = s.renew.or(renew_every.map(|_| true));
        scenario.renew_every = renew_every;
        scenario.on_store_down = match s.on_store_down {
            Some(RawPolicy::Proceed) => StoreDownPolicy::Proceed,
            Some(RawPolicy::Fail) | None => StoreDownPolicy::Fail,
        };
        // Where each layer setting was written, for the registry's own checks.
        let mut spans: Vec<(&str, Range<usize>)> = Vec::new();
        if let Some(layers) = &s.layers {
            scenario.layers = layers.settings(&place, &mut spans)?;
        }
        if s.trace == Some(false) {
            let setting = match (&s.trace_len, &s.trace_ttl) {
                (Some(len), _) => Some(("trace_len", len.span())),
                (None, Some(ttl)) => Some(("trace_ttl", ttl.span())),
                (None, None) => None,
            };
            if let Some((field, span)) = setting {
                return Err(invalid(
                    field,
                    span,
                    format!("`trace = false` turns the lock trace off: remove `{field}`, or `trace = false`"),
                ));
            }
        }
        let traced = s.trace.unwrap_or(false) || s.trace_len.is_some() || trace_ttl.is_some();
        if traced {
            let len = s
                .trace_len
                .as_ref()
                .map_or(TraceConfig::DEFAULT_MAX_ENTRIES, |l| *l.get_ref());
            let ttl = trace_ttl.unwrap_or(TraceConfig::DEFAULT_TTL);
            let config = TraceConfig::new(len, ttl).map_err(|e| {
                let (field, span) = match (&s.trace_len, &s.trace_ttl) {
                    (Some(l), _) if !(1..=10_000).contains(l.get_ref()) => ("trace_len", l.span()),
                    (_, Some(t)) => ("trace_ttl", t.span()),
                    _ => ("trace", s.name.span()),
                };
                invalid(field, span, e.message().to_owned())
            })?;
            scenario.trace = Some(config);
        }
        // Where each field was written, for the registry's own checks.
        spans.extend(
            [
                ("name", Some(s.name.span())),
                ("keys", s.keys.as_ref().map(Spanned::span)),
                ("ttl", s.ttl.as_ref().map(Spanned::span)),
                ("wait", s.wait.as_ref().map(Spanned::span)),
                ("renew_every", s.renew_every.as_ref().map(Spanned::span)),
            ]
            .into_iter()
            .filter_map(|(f, span)| span.map(|span| (f, span))),
        );
        let name_span = s.name.span();
        registry.register_at(scenario, origin, |field| {
            let span = spans
                .iter()
                .find(|(f, _)| *f == field)
                .map_or(&name_span, |(_, span)| span);
            Some(place.at(span))
        })?;
    }
    Ok(registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based() {
        let text = "a = 1\nbb = 2\n";
        assert_eq!(position(text, 0), (1, 1));
        assert_eq!(position(text, 6), (2, 1));
        assert_eq!(position(text, 11), (2, 6));
        assert_eq!(key_on_line(text, 2).as_deref(), Some("bb"));
        assert_eq!(key_on_line("[[scenario]]", 1), None);
        let inline = "lc = { hand_off = true, max_hand_offs = -1 }";
        let value = inline.find("-1").unwrap();
        assert_eq!(key_at(inline, value).as_deref(), Some("max_hand_offs"));
        assert_eq!(key_at("ttl = 5s", 6).as_deref(), Some("ttl"));
        // A character of several bytes before the `=`, or an offset inside one: no panic.
        assert_eq!(key_at("\"ttl→ = 5s", 10).as_deref(), None);
        assert_eq!(key_at("aéb = 5s", 7).as_deref(), Some("aéb"));
        assert_eq!(key_at("a→b = 5s", 8).as_deref(), Some("b"));
        assert_eq!(key_at("ttl→ = 5s", 4), None);
        assert_eq!(position("→", 1), (1, 1));
    }

    #[test]
    fn a_malformed_file_with_characters_of_several_bytes_is_an_error() {
        for text in [
            "[[scenario]]\nname = \"a\"\n\"ttl→\" = 5s\n",
            "[[scenario]]\nname = \"a\"\nkeys = \"a→=b\" trace = true\n",
        ] {
            let outcome =
                std::panic::catch_unwind(|| ScenarioRegistry::from_toml_str(text, "t.toml"));
            let loaded = outcome.expect("no panic on a malformed file");
            assert!(loaded.is_err(), "{text}");
        }
    }
}
