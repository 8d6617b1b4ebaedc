//! What one attempt came to, and what becomes of a failed one.

use crate::Error;

/// A failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Failure {
    /// Whether a later attempt may succeed.
    pub retryable: bool,
    /// Why, for the logs and the dead letter.
    pub reason: String,
    /// Whether the handler's commit may have landed (its outcome is
    /// unknown: [`Error::CommitUnknown`]).
    pub commit_unknown: bool,
    /// Whether the handler lost a conflict with a concurrent transaction
    /// (a deadlock, a serialization failure, a lock wait that timed out):
    /// in a relay batch, the batch's contention rather than the message's
    /// failure.
    pub conflict: bool,
    /// Whether the attempt failed because the infrastructure was down
    /// ([`Error::is_outage`]): a broker connection that is gone, a
    /// database that cannot be reached. Not an attempt: the outbox relay
    /// gives it back uncounted, the broker consumers wait it out in place
    /// ([`through_outages`](super::through_outages)), and
    /// [`next`](Self::next) never makes it a dead letter.
    pub outage: bool,
}

impl Failure {
    /// A failure no retry heals.
    pub fn dead(reason: impl Into<String>) -> Self {
        Failure {
            retryable: false,
            reason: reason.into(),
            commit_unknown: false,
            conflict: false,
            outage: false,
        }
    }

    /// A failure a retry may heal.
    pub fn retry(reason: impl Into<String>) -> Self {
        Failure {
            retryable: true,
            ..Failure::dead(reason)
        }
    }

    /// What a handler's error says about its attempt.
    pub fn of(e: &Error) -> Self {
        Failure {
            retryable: e.is_retryable(),
            reason: format!("{}: {e:#}", e.kind()),
            commit_unknown: matches!(e, Error::CommitUnknown(_)),
            conflict: crate::backend::classify::is_contention(e),
            outage: e.is_retryable() && e.is_outage(),
        }
    }
}

/// What one attempt came to: `Ok(executed)` (`false`: a duplicate), or
/// the failure.
pub type Verdict = Result<bool, Failure>;
/// What becomes of a failed attempt (see [`Failure::next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Next {
    /// A later attempt, for the failure's reason.
    Retry(String),
    /// A dead letter, for this reason.
    Dead(String),
}

impl Failure {
    /// The give-up rule every entry point follows: a failure no retry
    /// heals is dead at once; a retryable one is retried, unless `attempt`
    /// (from 1) is the last one allowed, `max` (`0`: no bound), and then
    /// it is dead with a reason that says so, "gave up after {attempt}
    /// {counted}: …" (`counted`: "attempts", "deliveries"). An
    /// [`outage`](Self::outage) is retried whatever the attempt: the
    /// infrastructure being down is no reason to dead-letter a message.
    pub fn next(self, attempt: u32, max: u32, counted: &str) -> Next {
        let outage = self.outage && !crate::probe::broken(crate::probe::Break::OutageCounted);
        match self.retryable {
            false => Next::Dead(self.reason),
            // An outage is no attempt: never a dead letter.
            true if outage => Next::Retry(self.reason),
            true if max > 0 && attempt >= max => Next::Dead(format!(
                "gave up after {attempt} {counted}: {}",
                self.reason
            )),
            true => Next::Retry(self.reason),
        }
    }

    /// The failure of a delivery without the id its key is made of
    /// (`id`: "message_id property", "Nats-Msg-Id header"): no retry
    /// heals it.
    pub fn unkeyed(id: &str) -> Self {
        Failure::dead(format!("no {id}: the delivery cannot be made idempotent"))
    }
}
