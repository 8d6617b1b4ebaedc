//! What the relay tells a progress hook: one event per settled attempt.

use std::sync::Arc;

/// How one attempt of one message was settled (see [`Relay::on_settled`](super::Relay::on_settled)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Settlement {
    /// The handler executed the action; the message is `success`.
    Executed,
    /// The handler answered `Duplicate`; the message is `success`.
    Duplicate,
    /// The handler's commit outcome was unknown and it had landed: the
    /// message is `success`.
    Landed,
    /// The attempt failed and the message is due again after its back-off.
    Retried,
    /// The message is dead-lettered (`failed`).
    DeadLettered,
    /// The message was no longer held by this attempt (its lease was
    /// taken over): its current holder settles it.
    Stale,
    /// The bookkeeping could not be written (the database is unreachable):
    /// the message is delivered again when its lease runs out.
    Unrecorded,
}

impl Settlement {
    /// Whether the message is done with: `success` or dead-lettered. Each
    /// message has exactly one such settlement, whichever relay made it,
    /// so counting them counts messages.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Settlement::Executed
                | Settlement::Duplicate
                | Settlement::Landed
                | Settlement::DeadLettered
        )
    }
}

/// One settled attempt, as a progress hook sees it.
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[non_exhaustive]
pub struct Settled<'a> {
    /// The message's row id.
    pub id: i64,
    /// Its topic.
    pub topic: &'a str,
    /// Its attempt number (1 for the first).
    pub attempt: i32,
    /// What came of it.
    pub settlement: Settlement,
}

/// A progress hook as stored.
pub(super) type Hook = Arc<dyn Fn(&Settled<'_>) + Send + Sync>;
