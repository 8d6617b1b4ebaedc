//! What one call or delivery answered, and the boxed local futures the
//! run's closures give. A leaf: every other module may use it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// A boxed future that need not be `Send` (the run's closures run in the
/// caller's task).
pub(crate) type Local<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What one call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Executed,
    Duplicate,
    Failed(String),
    /// Dropped by a fault while it committed (SQLite).
    Dropped,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Executed => f.write_str("Executed"),
            Answer::Duplicate => f.write_str("Duplicate"),
            Answer::Failed(e) => write!(f, "an error ({e})"),
            Answer::Dropped => f.write_str("nothing (dropped while it committed)"),
        }
    }
}
