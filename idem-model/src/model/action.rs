//! The model's actions and the outcomes the world may give a statement.

/// What the world answers a statement or a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It ran (and committed) as asked.
    Ok,
    /// The handler's body failed (a retryable error).
    Fail,
    /// The commit was applied, its acknowledgement lost (a fault).
    LostAck,
    /// The connection died before the commit reached the server: nothing
    /// applied, the outcome unknown to the relay (a fault).
    LostUnapplied,
    /// The commit was refused: nothing applied, the relay knows (a fault).
    Refused,
    /// A read failed on every try (a fault).
    ReadFailed,
    /// A bookkeeping write failed on every try: nothing applied (a fault).
    GaveUp,
    /// A batch's `BEGIN` failed (a fault).
    BeginFailed,
}

impl Outcome {
    pub(super) fn is_fault(self) -> bool {
        !matches!(self, Outcome::Ok | Outcome::Fail)
    }
}

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The producer enqueues message `m` again under the same `msg_id`
    /// (its retry after a lost acknowledgement).
    Enqueue(u8),
    /// Message `m`'s lease runs out (nobody renews it).
    Expire(u8),
    /// Message `m`'s lease runs out although its handler is running: the
    /// heartbeat's renewals failed, or the relay stalled longer than the
    /// lease (a fault).
    Stall(u8),
    /// A relay claims the messages of `rows` (a bit mask) in one
    /// transaction.
    Claim {
        /// The relay.
        relay: u8,
        /// The rows it takes.
        rows: u8,
        /// Message 1 first (the claim orders by `next_attempt_at`: after
        /// a back-off, either may be older).
        reversed: bool,
        /// Its commit's outcome.
        outcome: Outcome,
    },
    /// A relay's next statement.
    Step {
        /// The relay.
        relay: u8,
        /// Its outcome.
        outcome: Outcome,
    },
    /// A relay crashes: its transaction aborts, its memory is gone; it
    /// restarts idle (a fault).
    Crash(u8),
}

pub(super) const COMMIT_OUTCOMES: [Outcome; 4] = [
    Outcome::Ok,
    Outcome::LostAck,
    Outcome::LostUnapplied,
    Outcome::Refused,
];
