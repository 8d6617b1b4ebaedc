//! One delivery's hold on one outbox message ([`OutboxLease`]), and the
//! relay's failure policy for its attempt (`FailureBook`). A leaf: the
//! stores fence their updates with it, the calls and the relay hand it on,
//! and it imports nothing of the crate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

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
    /// Given by a relay: when the message was enqueued, by this process's
    /// clock (for the enqueue-to-settle latency).
    pub(crate) enqueued: Option<std::time::Instant>,
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
            enqueued: None,
        }
    }

    /// This lease with the time its message was enqueued (see
    /// [`OutboxRow::enqueued_ago`](crate::backend::OutboxRow::enqueued_ago)).
    pub(crate) fn enqueued(mut self, ago: std::time::Duration) -> Self {
        self.enqueued = std::time::Instant::now().checked_sub(ago);
        self
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
