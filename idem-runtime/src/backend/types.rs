//! The rows and arguments the stores exchange with the rest of the
//! runtime. They live here, below every concept, so that the dependency
//! goes one way: `archive`, `outbox` and `call` use `backend`, never the
//! reverse.

use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// An outbox message's status and lease, as the fenced update found it.
#[derive(Debug, Clone)]
pub struct OutboxState {
    /// The message's topic.
    pub topic: String,
    /// `pending`, `success` or `failed`.
    pub status: String,
    /// The relay holding its lease, if any.
    pub lease_owner: Option<String>,
    /// Attempts so far (the lease token of the latest claim).
    pub attempts: i32,
}

/// What inserting an outbox message found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboxInsert {
    /// Inserted, with this id.
    New(i64),
    /// `(topic, msg_id)` exists: its id and stored payload.
    Existing {
        /// The existing message's id.
        id: i64,
        /// Its JSON payload, as stored.
        payload: String,
    },
    /// Not inserted, and no such message found either (it was removed in
    /// between, or the database ignored another error).
    Missing,
}

/// A new idempotency record.
#[derive(Debug)]
pub struct NewRecord<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// The business type.
    pub biz_type: &'a str,
    /// The business document number.
    pub biz_no: &'a str,
    /// Hex SHA-256 of the canonical payload.
    pub fingerprint: &'a str,
    /// Seconds until the record may be archived.
    pub ttl_secs: i64,
}

/// A stored idempotency record.
#[derive(Debug, Clone)]
pub struct StoredRecord {
    /// Hex SHA-256 of the payload of the call that wrote it.
    pub fingerprint: String,
    /// The serialized result, once the call committed.
    pub result: Option<String>,
}

/// A claimed outbox row.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// Primary key.
    pub id: i64,
    /// Topic (selects the handler).
    pub topic: String,
    /// The producer's message id; `(topic, msg_id)` is unique.
    pub msg_id: String,
    /// The JSON payload, as stored.
    pub payload: String,
    /// Attempts so far, this one included.
    pub attempts: i32,
}

/// What one claim leased: the rows, and how many of them were taken
/// over from an expired lease.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The leased rows, attempts already counted.
    pub rows: Vec<OutboxRow>,
    /// How many of them still had a lease owner when claimed: their
    /// previous lease had expired with nobody settling them (a crashed
    /// relay, a lost acknowledgement nobody recovered).
    pub reclaimed: usize,
}

/// Why a claim returned no rows.
#[derive(Debug)]
pub enum ClaimError {
    /// The claim failed, and leased nothing: an error before its commit,
    /// or the server's refusal of the commit.
    Failed(sqlx::Error),
    /// The commit failed with the outcome unknown (I/O, protocol, closed
    /// connection): the rows the claim chose may be leased under its
    /// owner. Read them back with
    /// [`recover_claim`](super::OutboxStore::recover_claim).
    CommitUnknown {
        /// The commit's error.
        error: sqlx::Error,
        /// The rows the claim chose, as its statement returned them.
        chosen: Claimed,
    },
}

impl ClaimError {
    /// The underlying error.
    pub fn into_error(self) -> sqlx::Error {
        match self {
            ClaimError::Failed(e) | ClaimError::CommitUnknown { error: e, .. } => e,
        }
    }
}

/// A table the archiver moves rows out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveTable {
    /// `idem_record` → `idem_record_history`: records whose `expire_time`
    /// has passed.
    Records,
    /// `idem_outbox` → `idem_outbox_history`: finished (`success`,
    /// `failed`) messages last updated before the retention.
    Outbox,
}

/// An idempotency record, online or archived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordInfo {
    /// The idempotency key.
    pub key: String,
    /// The business type.
    pub biz_type: String,
    /// The business document number.
    pub biz_no: String,
    /// Hex SHA-256 of the payload of the call that wrote it.
    pub fingerprint: String,
    /// The handler's serialized result (JSON).
    pub result: Option<String>,
    /// When the record was written: `YYYY-MM-DD HH:MM:SS.ffffff`, UTC
    /// (SQLite: milliseconds; MariaDB: as stored, UTC since schema
    /// version 2 — rows an earlier release wrote from a session in another
    /// time zone keep that zone's local time).
    pub create_time: String,
    /// When it may be archived, in the same format.
    pub expire_time: String,
    /// Whether it was found in `idem_record_history`.
    pub archived: bool,
    /// When it was archived, in the same format.
    pub archived_at: Option<String>,
}

/// An outbox message as the operator sees it (no payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutboxMessage {
    /// Primary key.
    pub id: i64,
    /// Topic.
    pub topic: String,
    /// The producer's message id.
    pub msg_id: String,
    /// `pending`, `success` or `failed`.
    pub status: String,
    /// Attempts so far.
    pub attempts: i64,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// Last change: `YYYY-MM-DD HH:MM:SS.ffffff` (UTC).
    pub updated_at: String,
}

/// Which failed messages a requeue takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequeueTarget {
    /// The failed message with this id.
    Id(i64),
    /// Every failed message of this topic.
    Topic(String),
    /// Every failed message.
    AllFailed,
    /// The failed messages among these ids (an operator's selection; at
    /// least 1 and at most 1000 ids).
    Ids(Vec<i64>),
}

/// One delivery's hold on one outbox message: the message, its topic, and
/// the lease token the claim wrote (owner and attempt number).
///
/// A call driven by an outbox message ([`Source::outbox`](crate::Source::outbox)) first marks the
/// message `success` in its own transaction, fenced by this token: the
/// update must find the message pending, of this topic, and still held by
/// this very claim. Otherwise nothing runs and the call fails:
/// [`Error::LeaseLost`](crate::Error::LeaseLost) (retryable) when another claim took the message
/// over, [`Error::OutboxMessage`](crate::Error::OutboxMessage) (not retryable) when it does not exist,
/// belongs to another topic or is already finished. The row stays locked
/// until the call commits or rolls back, so on PostgreSQL and MariaDB no
/// other relay can claim it meanwhile (claims skip locked rows), however
/// long the handler runs; on SQLite the call's write lock does the same.
///
/// A [`Relay`](crate::outbox::Relay) hands one out with every delivery
/// ([`Delivery::source`](crate::outbox::Delivery::source)); build one by
/// hand only in a relay of your own, from the row your claim returned.
#[derive(Debug, Clone)]
pub struct OutboxLease {
    pub(crate) id: i64,
    pub(crate) topic: String,
    pub(crate) owner: String,
    pub(crate) attempt: i32,
    /// Given by a relay: a call whose body fails books the failure in its
    /// own transaction, while it still holds the message's row (see
    /// [`FailureBook`]).
    pub(crate) book: Option<Arc<FailureBook>>,
}

impl PartialEq for OutboxLease {
    fn eq(&self, other: &Self) -> bool {
        (self.id, &self.topic, &self.owner, self.attempt)
            == (other.id, &other.topic, &other.owner, other.attempt)
    }
}

impl Eq for OutboxLease {}

/// A relay's failure policy for one attempt, and what the call wrote with
/// it.
///
/// A call driven by an outbox message holds the message's row locked from
/// its fenced update to its end, and the relay's heartbeat skips a locked
/// row: a handler slower than its lease lets the lease run out. If the
/// call then rolled back and left the failure to the relay, another relay
/// could claim the message between the rollback and the relay's write,
/// which would find the row no longer its own: the attempt would never be
/// recorded and the message could run past `max_attempts`. So the call
/// rolls back to a savepoint taken just after its fenced update, writes
/// the failure bookkeeping (retry with back-off, or dead letter) over its
/// own success mark, and commits: the row is never free and unrecorded.
#[derive(Debug)]
pub(crate) struct FailureBook {
    /// `Relay::max_attempts`.
    pub(crate) max_attempts: i32,
    /// The back-off before the next attempt, in seconds.
    pub(crate) delay_secs: f64,
    /// What the call's committed bookkeeping wrote: 0 nothing, 1 a retry,
    /// 2 a dead letter.
    pub(crate) written: AtomicU8,
}

impl FailureBook {
    /// Whether a failure (`retryable`) of attempt `attempt` dead-letters
    /// its message, and the reason to record.
    pub(crate) fn decide(&self, attempt: i32, retryable: bool, reason: String) -> (bool, String) {
        let dead = !retryable || attempt >= self.max_attempts;
        let reason = if dead && retryable {
            format!("gave up after {attempt} attempts: {reason}")
        } else {
            reason
        };
        (dead, reason.chars().take(2000).collect())
    }

    /// What the call wrote: `None`, or `Some(dead)`.
    pub(crate) fn written(&self) -> Option<bool> {
        match self.written.load(Ordering::Acquire) {
            1 => Some(false),
            2 => Some(true),
            _ => None,
        }
    }

    /// Records that the call's bookkeeping committed.
    pub(crate) fn wrote(&self, dead: bool) {
        self.written
            .store(if dead { 2 } else { 1 }, Ordering::Release);
    }
}

impl OutboxLease {
    /// The lease of message `id` of `topic`, claimed by `owner` as attempt
    /// number `attempt` (the row's `lease_owner` and `attempts`).
    pub fn new(id: i64, topic: impl Into<String>, owner: impl Into<String>, attempt: i32) -> Self {
        OutboxLease {
            id,
            topic: topic.into(),
            owner: owner.into(),
            attempt,
            book: None,
        }
    }

    /// This lease with the relay's failure policy for the attempt.
    pub(crate) fn with_book(mut self, max_attempts: i32, delay_secs: f64) -> Self {
        self.book = Some(Arc::new(FailureBook {
            max_attempts,
            delay_secs,
            written: AtomicU8::new(0),
        }));
        self
    }

    /// The message's primary key.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The message's topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The lease owner (the relay).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The attempt number the claim wrote.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }
}
