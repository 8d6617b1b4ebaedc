//! A model of the outbox relay's delivery protocol, checked exhaustively
//! with [stateright]: relays claiming under leases, the handlers'
//! transactions fenced by those leases, the failure bookkeeping, lost
//! acknowledgements on every commit, crashes at every step, the Redis
//! marker, and batched commits with savepoints.
//!
//! Each step of the model is one statement (or one transaction) of the
//! relay as implemented in `idem-runtime`; `MODEL.md` beside this crate
//! maps every step to the function that issues it. The tests in `tests/`
//! prove the invariants ([`properties`]) over every interleaving of a
//! small configuration, and check that each [`Mutation`] of the protocol
//! yields a counterexample.

#![forbid(unsafe_code)]

pub mod check;
pub mod consumer;
pub mod galera;
mod model;
pub mod properties;
pub mod record;
pub mod state;
pub mod trace;

pub use model::{Action, Outcome};
pub use state::State;

/// A deliberate fault in the protocol: each must produce a counterexample
/// (the controls that show the model can fail).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// The article's fault version: the handler reads the entity's state
    /// outside its transaction, then a transaction of its own writes the
    /// effect and the new state unguarded.
    CheckOutsideTx,
    /// The handler's outbox success update without the fence: no lease
    /// owner or attempt in its `WHERE`, and its row count not checked.
    Unfenced,
    /// No lease renewal: the heartbeat is off (and a batch does not renew
    /// its leases), so a lease expires while its handler runs.
    NoRenewal,
    /// The cache marker written before the commit.
    MarkerBeforeCommit,
    /// A batch whose failing handler does not roll back to its savepoint:
    /// its writes commit with the batch.
    KeepFailedSavepoint,
    /// A publisher route whose relay-side success mark lost its
    /// acknowledgement takes it for the attempt's failure: the failure
    /// bookkeeping then writes over the success the mark left
    /// (`outbox_revert`), dead-lettering a published message on its last
    /// attempt (issue 23, point 4).
    MarkLostAckAsFailure,
    /// A publisher route marked `success` before its handler publishes.
    MarkBeforePublish,
    /// The relay before finding 3's fix (`tests/findings.rs`): a commit whose acknowledgement was lost and
    /// whose read-back failed is settled as a failure, and that
    /// bookkeeping, finding the row no longer pending, writes over the
    /// `success` of the same attempt (`outbox_revert`, meant for a
    /// handler failing after its call marked the message).
    RevertUnknownCommit,
    /// The failure bookkeeping written on the pool after the handler's
    /// transaction rolled back (and, in a batch, after the batch's commit),
    /// as the relay did before issue 23's fix: once the row is unlocked,
    /// another relay may claim it first, and the attempt goes unrecorded
    /// (finding 1).
    PoolSideFailure,
    /// The failure bookkeeping fenced by `status = 'pending'` alone (no
    /// lease owner, no attempt): a stale relay's bookkeeping lands on a
    /// row another claim holds.
    StatusOnlyFence,
    /// The claim skips every row with a lease owner, whether its lease ran
    /// out or not: a crashed holder's message is never claimed again.
    ClaimIgnoresExpiry,
    /// The claim ignores the ordering key: a row is claimed whatever the
    /// other rows of its key.
    ClaimIgnoresKey,
    /// The claim's head rule checks only that no pending row of the key
    /// has a smaller id, not that no pending row of the key holds a
    /// running lease.
    KeyHeadByIdOnly,
}

/// What a key does once its head is dead-lettered (the relay's mode for
/// ordering keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyMode {
    /// The rest of the key goes on (the default).
    Continue,
    /// A `failed` row counts as a blocking predecessor: the rest of the
    /// key waits until an operator requeues it.
    Hold,
}

/// The bound and the shape of one run of the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Relays (each runs one claim at a time).
    pub relays: usize,
    /// `Relay::max_attempts`.
    pub max_attempts: u8,
    /// Batched commits (`commit_batch` ≥ the number of messages): a claim
    /// takes up to both messages and delivers them in one batch.
    /// Otherwise each relay claims one message at a time.
    pub batched: bool,
    /// Message 1 is message 0's action enqueued again under another
    /// `msg_id` (the same entity); otherwise it acts on an entity of its
    /// own. (The same `msg_id` twice is the producer's retry, which the
    /// model always makes: the insert ignores it.)
    pub copies: bool,
    /// Which messages' handler bodies may fail (retryably), on any attempt.
    pub may_fail: [bool; state::ROWS],
    /// Which messages' routes are publishers: the handler does not take
    /// its delivery's source, its effect (a publish) happens outside the
    /// database, and the relay marks the success itself
    /// (`outbox_success_pool`).
    pub publisher: [bool; state::ROWS],
    /// How many faults (a lost acknowledgement, a refused commit, a crash,
    /// a failed read, a bookkeeping write given up) one run may inject.
    pub faults: u8,
    /// A handler's transaction may outlive its lease without a fault (the
    /// heartbeat skips the row that transaction locks): see
    /// `tests/findings.rs`.
    pub long_transactions: bool,
    /// Both messages carry one ordering key (message 0 has the smaller
    /// id): a row is claimed only as its key's head (no other `pending`
    /// row of the key with a smaller id, none holding a running lease;
    /// with [`KeyMode::Hold`], no `failed` one with a smaller id either).
    pub ordering: Option<KeyMode>,
    /// Message 0 (the smaller id) is inserted late, at any time, even
    /// after message 1 ran: its producer took its id from the sequence
    /// first but committed last (two producers of one key). Otherwise
    /// both are enqueued before the relays start.
    pub late_head: bool,
    /// The protocol's deliberate fault, if any.
    pub mutation: Option<Mutation>,
}

impl Config {
    /// The per-message relay: `relays` relays, 2 messages (one of which
    /// may fail), `max_attempts` attempts, `faults` faults.
    pub fn per_message(relays: usize, max_attempts: u8, faults: u8) -> Self {
        Config {
            relays,
            max_attempts,
            batched: false,
            copies: false,
            may_fail: [false, true],
            publisher: [false; state::ROWS],
            faults,
            long_transactions: false,
            ordering: None,
            late_head: false,
            mutation: None,
        }
    }

    /// The same with batched commits.
    pub fn batched(relays: usize, max_attempts: u8, faults: u8) -> Self {
        Config {
            batched: true,
            ..Config::per_message(relays, max_attempts, faults)
        }
    }

    /// This configuration with both messages under one ordering key, in
    /// `mode`; message 0's handler (the key's head) may fail, message
    /// 1's never does.
    pub fn ordered(self, mode: KeyMode) -> Self {
        Config {
            ordering: Some(mode),
            may_fail: [true, false],
            ..self
        }
    }

    /// This configuration with `mutation`.
    pub fn with(self, mutation: Mutation) -> Self {
        Config {
            mutation: Some(mutation),
            ..self
        }
    }

    /// The entity message `m` acts on.
    pub fn entity_of(&self, m: usize) -> usize {
        if self.copies { 0 } else { m }
    }

    pub(crate) fn has(&self, mutation: Mutation) -> bool {
        self.mutation == Some(mutation)
    }
}
