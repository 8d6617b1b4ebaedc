//! The counters of a broker consumer (AMQP, NATS), one set for both.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one consumer, since it started: the same for the AMQP and
/// the NATS consumer, each counter counted by the consumers it names.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Deliveries received.
    pub received: AtomicU64,
    /// NATS: of those, redeliveries (`delivered > 1`): nak'd, ack wait run
    /// out, or handed out again after a consumer or a server failed.
    /// The AMQP consumer does not count them (see its `Message`'s
    /// `redelivered`).
    pub redelivered: AtomicU64,
    /// Acknowledged after the handler executed the action.
    pub executed: AtomicU64,
    /// Acknowledged after the handler answered `Duplicate`.
    pub duplicates: AtomicU64,
    /// Failed attempts requeued for a retry. AMQP: through the retry
    /// queue, or requeued in place when the retry queue could not take
    /// them. NATS: nak'd with a back-off delay, for a redelivery.
    pub retried: AtomicU64,
    /// Dead letters: non-retryable, unparsable, without a message id
    /// (AMQP `message_id`, NATS `Nats-Msg-Id`), or out of attempts (NATS:
    /// of deliveries). AMQP: rejected to the dead-letter exchange. NATS:
    /// terminated (`+TERM`, after the copy to the dead-letter subject
    /// when one is set).
    pub dead_lettered: AtomicU64,
    /// NATS: in-progress acks sent while a handler ran.
    pub progress_acks: AtomicU64,
    /// Deliveries whose settlement could not be sent (AMQP ack, nack or
    /// reject: a channel or a connection gone) or was not confirmed (NATS:
    /// a connection or a server gone): the broker delivers them again.
    pub settle_failed: AtomicU64,
    /// NATS: pull requests that failed (no responders, a connection
    /// gone); each was made again after a pause.
    pub pull_failures: AtomicU64,
}

impl ConsumerStats {
    /// Counts one on `c`.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an acknowledged delivery: `executed`, or a duplicate.
    pub fn acked(&self, executed: bool) {
        ConsumerStats::bump(match executed {
            true => &self.executed,
            false => &self.duplicates,
        });
    }
}
