//! What one attempt came to, and what becomes of a failed one.

use crate::Error;

/// A failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// Whether a later attempt may succeed.
    pub(crate) retryable: bool,
    /// Why, for the logs and the dead letter.
    pub(crate) reason: String,
    /// Whether the handler's commit may have landed (its outcome is
    /// unknown: [`Error::CommitUnknown`]).
    pub(crate) commit_unknown: bool,
}

impl Failure {
    /// A failure no retry heals.
    pub(crate) fn dead(reason: impl Into<String>) -> Self {
        Failure {
            retryable: false,
            reason: reason.into(),
            commit_unknown: false,
        }
    }

    /// A failure a retry may heal.
    pub(crate) fn retry(reason: impl Into<String>) -> Self {
        Failure {
            retryable: true,
            ..Failure::dead(reason)
        }
    }

    /// What a handler's error says about its attempt.
    pub(crate) fn of(e: &Error) -> Self {
        Failure {
            retryable: e.is_retryable(),
            reason: format!("{}: {e}", e.kind()),
            commit_unknown: matches!(e, Error::CommitUnknown(_)),
        }
    }
}

/// What one attempt came to: `Ok(executed)` (`false`: a duplicate), or
/// the failure.
pub(crate) type Verdict = Result<bool, Failure>;
