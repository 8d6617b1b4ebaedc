//! What can stop a run before it gives a report.

use std::fmt;

/// Why a run could not give a [`Report`](crate::Report). A handler that
/// does not act once is not an error: it is in the report.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The server at `url` could not be reached (through the run's fault
    /// proxy). A test usually skips on it locally and fails in CI.
    Unreachable {
        /// The URL given to the run.
        url: String,
        /// The connection's error.
        source: sqlx::Error,
    },
    /// The database failed outside the handler: opening it, idem's
    /// migration, or a statement of the harness.
    Database(sqlx::Error),
    /// The run's setup, a `prepare`, or an `effect` count failed.
    Fixture {
        /// Which step, and of which action.
        step: String,
        /// The step's error.
        source: sqlx::Error,
    },
    /// The run's `enqueue` failed for an action.
    Enqueue {
        /// The action's number.
        action: usize,
        /// Its error.
        source: idem_runtime::Error,
    },
    /// The run is missing something it needs (its `call`, its `effect`, a
    /// server's URL) or cannot start its fault proxy.
    Config(String),
}

impl Error {
    /// Whether the server could not be reached.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable { .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unreachable { url, source } => write!(f, "cannot reach {url}: {source}"),
            Error::Database(e) => write!(f, "database: {e}"),
            Error::Fixture { step, source } => write!(f, "{step} failed: {source}"),
            Error::Enqueue { action, source } => {
                write!(f, "enqueue of action #{action} failed: {source}")
            }
            Error::Config(why) => write!(f, "acts_once: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Unreachable { source, .. } | Error::Fixture { source, .. } => Some(source),
            Error::Database(e) => Some(e),
            Error::Enqueue { source, .. } => Some(source),
            Error::Config(_) => None,
        }
    }
}
