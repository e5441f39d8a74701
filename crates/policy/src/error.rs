//! What can be wrong with a set of policies, each problem named by file and line.

use std::fmt;

/// One problem in one policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file, as it was named when loaded.
    pub file: String,
    /// The line the problem is on, from 1.
    pub line: usize,
    /// What is wrong, and what to do when it is not obvious.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// Why a set of policies could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A policy file could not be read.
    #[error("cannot read the policy file {file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// One or more policies do not parse, or do not fit the schema; every problem found.
    #[error("{}", problems_text(.0))]
    Invalid(Vec<Problem>),
    /// The schema runwarden ships with did not load: a bug in this build.
    #[error("the built-in policy schema does not load ({0}); this is a bug, please report it")]
    Schema(String),
}

impl PolicyError {
    /// Every problem, for a command that prints one per line.
    pub fn problems(&self) -> Vec<String> {
        match self {
            Self::Invalid(problems) => problems.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        }
    }
}

fn problems_text(problems: &[Problem]) -> String {
    match problems {
        [] => "the policies are not valid".to_string(),
        [one] => format!("policy not valid: {one}"),
        [first, rest @ ..] => format!(
            "policies not valid: {first} (and {} more problem{})",
            rest.len(),
            if rest.len() == 1 { "" } else { "s" }
        ),
    }
}
