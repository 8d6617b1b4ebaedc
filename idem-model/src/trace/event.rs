//! The events of a trace, as the runtime writes them (one JSON object
//! each).

use serde::Deserialize;

/// A claim's commit outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimOutcome {
    /// Committed and acknowledged.
    Ok,
    /// Unknown to the relay (applied or not).
    LostAck,
    /// Refused: nothing applied.
    Refused,
}

/// A handler transaction's commit outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitOutcome {
    /// Committed and acknowledged.
    Ok,
    /// Unknown to the relay (applied or not).
    LostAck,
    /// Refused: nothing applied.
    Failed,
}

/// A batch's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchOutcome {
    /// Committed and acknowledged.
    Ok,
    /// Unknown to the relay (applied or not).
    LostAck,
    /// Refused: nothing applied.
    Failed,
    /// The deferred success update matched fewer rows than expected: the
    /// batch rolled back.
    Short,
}

fn yes() -> bool {
    true
}

/// One protocol event of the runtime (see the [module's documentation](super)
/// for the JSON shape of each).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A claim of the row (one event per row of the claim).
    Claim {
        /// The outbox row's id.
        msg: i64,
        /// The attempts the claim wrote (`0`: unknown, for a claim not `ok`).
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The claim's commit outcome.
        outcome: ClaimOutcome,
        /// The row's ordering key, if it has one (absent: no key). Within
        /// a key, ids give the enqueue order.
        #[serde(default)]
        key: Option<String>,
    },
    /// The read-back of a claim whose outcome was unknown.
    ClaimReadBack {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The row is still this claim's, its lease running.
        held: bool,
    },
    /// A lease renewal under the claim's owner.
    Renew {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// It renewed the row.
        renewed: bool,
    },
    /// The handler transaction's fenced success update.
    FencedUpdate {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// It updated the row (row count 1).
        held: bool,
    },
    /// The state check.
    Guard {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The action is already done (a duplicate).
        done: bool,
    },
    /// A handler's call whose transaction aborted before its end (a
    /// statement failed: its `BEGIN`, its fenced update, its state check;
    /// a lost connection): nothing it wrote commits. Replayed as its body
    /// failing: the steps before the transition, then the transition
    /// failing (its rollback).
    Aborted {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
    },
    /// The handler's effect (its write, or a publisher's publish).
    Effect {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
    },
    /// The transition, or the body's failure.
    Transition {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The body and its transition succeeded.
        ok: bool,
    },
    /// The handler transaction's commit.
    Commit {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// Its outcome.
        outcome: CommitOutcome,
        /// The call answered `Duplicate`.
        dup: bool,
    },
    /// The read-back of a handler commit whose outcome was unknown.
    Landed {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The row is `success`.
        success: bool,
    },
    /// The failure bookkeeping.
    Settle {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The relay's decision: dead-letter.
        dead: bool,
        /// The error may be retried.
        retryable: bool,
        /// It changed the row.
        applied: bool,
        /// Written in the handler's own transaction (committed by the
        /// `commit` that follows).
        #[serde(default)]
        in_tx: bool,
        /// An attempt that failed in an outage, given back uncounted:
        /// pending again with the claim's attempt taken back.
        #[serde(default)]
        outage: bool,
    },
    /// The relay-side success mark of a route that did not take its source.
    RelayMark {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The relay confirmed the mark.
        applied: bool,
    },
    /// The cache marker.
    Marker {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
    },
    /// A batch's `BEGIN` and renewal.
    BatchOpen {
        /// The batch's claim's lease owner.
        owner: String,
        /// The ids the renewal returned.
        renewed: Vec<i64>,
        /// `BEGIN` succeeded.
        #[serde(default = "yes")]
        begun: bool,
    },
    /// A batch's deferred success update and commit.
    BatchCommit {
        /// The batch's claim's lease owner.
        owner: String,
        /// Its outcome.
        outcome: BatchOutcome,
    },
}

impl Event {
    /// The lease owner the event is under.
    pub fn owner(&self) -> &str {
        match self {
            Event::Claim { owner, .. }
            | Event::ClaimReadBack { owner, .. }
            | Event::Renew { owner, .. }
            | Event::FencedUpdate { owner, .. }
            | Event::Guard { owner, .. }
            | Event::Effect { owner, .. }
            | Event::Aborted { owner, .. }
            | Event::Transition { owner, .. }
            | Event::Commit { owner, .. }
            | Event::Landed { owner, .. }
            | Event::Settle { owner, .. }
            | Event::RelayMark { owner, .. }
            | Event::Marker { owner, .. }
            | Event::BatchOpen { owner, .. }
            | Event::BatchCommit { owner, .. } => owner,
        }
    }

    /// The message and attempt of a per-message event (`None` for the
    /// batch events, which concern every row of their claim).
    pub fn message(&self) -> Option<(i64, i32)> {
        match self {
            Event::Claim { msg, attempt, .. }
            | Event::ClaimReadBack { msg, attempt, .. }
            | Event::Renew { msg, attempt, .. }
            | Event::FencedUpdate { msg, attempt, .. }
            | Event::Guard { msg, attempt, .. }
            | Event::Effect { msg, attempt, .. }
            | Event::Aborted { msg, attempt, .. }
            | Event::Transition { msg, attempt, .. }
            | Event::Commit { msg, attempt, .. }
            | Event::Landed { msg, attempt, .. }
            | Event::Settle { msg, attempt, .. }
            | Event::RelayMark { msg, attempt, .. }
            | Event::Marker { msg, attempt, .. } => Some((*msg, *attempt)),
            Event::BatchOpen { .. } | Event::BatchCommit { .. } => None,
        }
    }

    /// Parses a trace written one JSON object per line (blank lines
    /// skipped).
    pub fn parse_lines(text: &str) -> Result<Vec<Event>, serde_json::Error> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect()
    }

    /// The events of a trace recorded as JSON values (the runtime's
    /// `testing::trace`), in order; the first value that is no event is
    /// the error, with its text.
    pub fn from_values(values: &[serde_json::Value]) -> Result<Vec<Event>, String> {
        values
            .iter()
            .map(|v| Event::deserialize(v).map_err(|e| format!("{e}: {v}")))
            .collect()
    }
}
