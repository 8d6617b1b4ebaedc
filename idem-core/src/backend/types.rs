//! The rows and arguments the stores exchange with the rest of the
//! runtime. They live here, below every concept, so that the dependency
//! goes one way: `outbox` and `call` use `backend`, never the
//! reverse. The outbox's own vocabulary that the stores speak (the lease
//! of a delivery, a message's status) lives in `lease.rs` and
//! `status.rs` (at the crate root), two leaves that import nothing of the crate.

use crate::status::Status;

/// An outbox message's status and lease, as the fenced update found it.
#[derive(Debug, Clone)]
pub struct OutboxState {
    /// The message's topic.
    pub topic: String,
    /// Its status.
    pub status: Status,
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

/// An `Idempotency-Key` request's in-flight row, once its claim (insert
/// or take-over) holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimedRow {
    /// Its primary key, where the dialect fences by it (MariaDB/MySQL);
    /// `None` elsewhere: the row is found by its unique key.
    pub id: Option<i64>,
    /// No row is written yet: the key was claimed in the handler's
    /// transaction (PostgreSQL's `claim_in`) under the key's transaction
    /// lock, and the completion inserts the answered row. `false`: a row
    /// holding this request's lease exists (inserted or taken over), and
    /// the completion updates it.
    pub unwritten: bool,
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
#[non_exhaustive]
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
    /// The ordering key it was enqueued with, if any (see
    /// [`EnqueueOptions::ordering_key`](crate::outbox::EnqueueOptions::ordering_key)).
    pub ordering_key: Option<String>,
    /// The headers it was enqueued with (see
    /// [`EnqueueOptions::header`](crate::outbox::EnqueueOptions::header)).
    pub headers: crate::outbox::Headers,
    /// How long it had been enqueued when it was claimed, by the
    /// database's clock (see [`enqueued_ago`](Self::enqueued_ago)).
    pub age: std::time::Duration,
    /// When it was read back from its claim, by this process's clock.
    pub(crate) claimed_at: std::time::Instant,
}

impl OutboxRow {
    /// How long ago it was enqueued: its [`age`](Self::age) at the claim,
    /// by the database's clock (no skew between the producer's host and
    /// this one), plus the time since the claim.
    pub fn enqueued_ago(&self) -> std::time::Duration {
        self.age + self.claimed_at.elapsed()
    }
}

/// A message to insert into the outbox (see
/// [`OutboxStore::outbox_insert`](super::OutboxStore::outbox_insert)).
#[derive(Debug)]
pub struct NewMessage<'a> {
    /// Its topic.
    pub topic: &'a str,
    /// The producer's id of it.
    pub msg_id: &'a str,
    /// The payload's JSON text.
    pub payload: &'a str,
    /// Its ordering key, if any.
    pub ordering_key: Option<&'a str>,
    /// The headers' JSON object, `None` without headers.
    pub headers: Option<&'a str>,
    /// Seconds from now until it is due.
    pub delay_secs: f64,
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

/// A process's row in `idem_process` (see [`crate::process`]), as its
/// heartbeat writes it.
#[derive(Debug, Clone, Copy)]
pub struct ProcessRow<'a> {
    /// Its id: a relay's owner, a consumer's id.
    pub id: &'a str,
    /// `relay` or `consumer`.
    pub kind: &'a str,
    /// What it serves: its topics, its queue.
    pub name: &'a str,
    /// The machine's hostname, if known.
    pub host: Option<&'a str>,
    /// The process id.
    pub pid: i64,
}
