//! What can go wrong registering or loading scenarios.

use std::path::PathBuf;

/// A scenario registry could not be built: a file that cannot be read or parsed, or a scenario
/// whose settings are wrong. The message names the file (or `code` for scenarios registered in
/// code), the line where known, the scenario and the field, and says what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario file {}: {source}; check the path and its permissions", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or does not have the shape of a scenario file (an unknown or
    /// missing field, a value of the wrong type or an unknown mode).
    #[error("{origin}:{line}:{column}: {}{message}; see docs/SCENARIOS.md for the file format",
        field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default())]
    Parse {
        /// The file (or `code`).
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field on that line, where one can be read off it.
        field: Option<String>,
        /// What the parser said.
        message: String,
        /// The parser's error.
        #[source]
        source: Option<Box<toml::de::Error>>,
    },
    /// A scenario's setting is invalid (a bad duration, a TTL out of range, a duplicate name, a
    /// layer setting out of range...).
    #[error("{origin}{}{}: scenario `{scenario}`, field `{field}`: {message}",
        line.map(|l| format!(":{l}")).unwrap_or_default(),
        column.map(|c| format!(":{c}")).unwrap_or_default())]
    Invalid {
        /// The file (or `code`).
        origin: String,
        /// 1-based line, for files.
        line: Option<usize>,
        /// 1-based column of the value, for files (`u32` keeps the error small enough to return
        /// by value; no line is that long).
        column: Option<u32>,
        /// The scenario's name.
        scenario: String,
        /// The field.
        field: String,
        /// What is wrong and what to do.
        message: String,
    },
}

impl ScenarioError {
    /// The line of a file the error points at, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            ScenarioError::Read { .. } => None,
            ScenarioError::Parse { line, .. } => Some(*line),
            ScenarioError::Invalid { line, .. } => *line,
        }
    }

    /// The column of a file the error points at, if any.
    pub fn column(&self) -> Option<usize> {
        match self {
            ScenarioError::Read { .. } => None,
            ScenarioError::Parse { column, .. } => Some(*column),
            ScenarioError::Invalid { column, .. } => column.map(|c| c as usize),
        }
    }

    /// The field the error is about, if known.
    pub fn field(&self) -> Option<&str> {
        match self {
            ScenarioError::Read { .. } => None,
            ScenarioError::Parse { field, .. } => field.as_deref(),
            ScenarioError::Invalid { field, .. } => Some(field),
        }
    }
}

impl From<ScenarioError> for crate::Error {
    fn from(error: ScenarioError) -> Self {
        crate::Error::invalid_argument(error.to_string()).with_source(error)
    }
}
