//! The counters of a broker consumer (AMQP, NATS), one set for both.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one consumer, since it started: the same for the AMQP, the
/// NATS and the Kafka consumer, each counter counted by the consumers it
/// names. Each one also counts in the `metrics` facade's
/// `idem_consumer_<name>_total` (see [`crate::metrics`]).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Deliveries received.
    pub(crate) received: AtomicU64,
    /// NATS: of those, redeliveries (`delivered > 1`): nak'd, ack wait run
    /// out, or handed out again after a consumer or a server failed.
    /// Kafka: records read back from the retry topic. The AMQP consumer
    /// does not count them (see its `Message`'s `redelivered`).
    pub(crate) redelivered: AtomicU64,
    /// Acknowledged after the handler executed the action.
    pub(crate) executed: AtomicU64,
    /// Acknowledged after the handler answered `Duplicate`.
    pub(crate) duplicates: AtomicU64,
    /// Failed attempts requeued for a retry. AMQP: through the retry
    /// queue, or requeued in place when the retry queue could not take
    /// them. NATS: nak'd with a back-off delay, for a redelivery. Kafka:
    /// copied to the retry topic (or run again in place).
    pub(crate) retried: AtomicU64,
    /// Dead letters: non-retryable, unparsable, without a message id
    /// (AMQP `message_id`, NATS `Nats-Msg-Id`), or out of attempts (NATS:
    /// of deliveries). AMQP: rejected to the dead-letter exchange. NATS:
    /// terminated (`+TERM`, after the copy to the dead-letter subject
    /// when one is set). Kafka: copied to the dead-letter topic.
    pub(crate) dead_lettered: AtomicU64,
    /// NATS: in-progress acks sent while a handler ran.
    pub(crate) progress_acks: AtomicU64,
    /// Deliveries whose settlement could not be sent (AMQP ack, nack or
    /// reject: a channel or a connection gone) or was not confirmed (NATS:
    /// a connection or a server gone), or (Kafka) whose offset was not
    /// stored (its partition revoked first): the broker delivers them
    /// again.
    pub(crate) settle_failed: AtomicU64,
    /// NATS: pull requests that failed (no responders, a connection
    /// gone); each was made again after a pause. Kafka: errors the
    /// consumer reported while reading (a broker down, a topic missing).
    pub(crate) pull_failures: AtomicU64,
    /// Tries of a handler that failed in an outage (its database down)
    /// and were run again in place, uncounted
    /// ([`through_outages`](super::through_outages)).
    pub(crate) outage_waits: AtomicU64,
    /// AMQP: connections dialled again after the consumer's died (a
    /// `Connector` with a URI). The NATS client reconnects on its own and
    /// counts it itself (async-nats' `Client::statistics().connects`).
    pub(crate) reconnects: AtomicU64,
}

impl ConsumerStats {
    /// Deliveries received.
    pub fn received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// NATS: of those, redeliveries (`delivered > 1`): nak'd, ack wait run
    /// out, or handed out again after a consumer or a server failed.
    /// Kafka: records read back from the retry topic. The AMQP consumer
    /// does not count them (see its `Message`'s `redelivered`).
    pub fn redelivered(&self) -> u64 {
        self.redelivered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Acknowledged after the handler executed the action.
    pub fn executed(&self) -> u64 {
        self.executed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Acknowledged after the handler answered `Duplicate`.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Failed attempts requeued for a retry. AMQP: through the retry
    /// queue, or requeued in place when the retry queue could not take
    /// them. NATS: nak'd with a back-off delay, for a redelivery. Kafka:
    /// copied to the retry topic (or run again in place).
    pub fn retried(&self) -> u64 {
        self.retried.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Dead letters: non-retryable, unparsable, without a message id
    /// (AMQP `message_id`, NATS `Nats-Msg-Id`), or out of attempts (NATS:
    /// of deliveries). AMQP: rejected to the dead-letter exchange. NATS:
    /// terminated (`+TERM`, after the copy to the dead-letter subject
    /// when one is set). Kafka: copied to the dead-letter topic.
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// NATS: in-progress acks sent while a handler ran.
    pub fn progress_acks(&self) -> u64 {
        self.progress_acks
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Deliveries whose settlement could not be sent (AMQP ack, nack or
    /// reject: a channel or a connection gone) or was not confirmed (NATS:
    /// a connection or a server gone), or (Kafka) whose offset was not
    /// stored (its partition revoked first): the broker delivers them
    /// again.
    pub fn settle_failed(&self) -> u64 {
        self.settle_failed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// NATS: pull requests that failed (no responders, a connection
    /// gone); each was made again after a pause. Kafka: errors the
    /// consumer reported while reading (a broker down, a topic missing).
    pub fn pull_failures(&self) -> u64 {
        self.pull_failures
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tries of a handler that failed in an outage (its database down)
    /// and were run again in place, uncounted
    /// ([`through_outages`](super::through_outages)).
    pub fn outage_waits(&self) -> u64 {
        self.outage_waits.load(Ordering::Relaxed)
    }

    /// AMQP: connections dialled again after the consumer's died (a
    /// `Connector` with a URI). The NATS client reconnects on its own and
    /// counts it itself (async-nats' `Client::statistics().connects`).
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }
}

impl ConsumerStats {
    /// Counts one on `c` (what an entry point saw happen).
    pub fn count(&self, c: Counter) {
        let counter = match c {
            Counter::Received => &self.received,
            Counter::Redelivered => &self.redelivered,
            Counter::Retried => &self.retried,
            Counter::DeadLettered => &self.dead_lettered,
            Counter::ProgressAck => &self.progress_acks,
            Counter::SettleFailed => &self.settle_failed,
            Counter::PullFailure => &self.pull_failures,
            Counter::OutageWait => &self.outage_waits,
            Counter::Reconnect => &self.reconnects,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        crate::metrics::consumer(c.metric());
    }

    /// Counts an acknowledged delivery: `executed`, or a duplicate.
    pub fn acked(&self, executed: bool) {
        match executed {
            true => &self.executed,
            false => &self.duplicates,
        }
        .fetch_add(1, Ordering::Relaxed);
        crate::metrics::consumer_acked(executed);
    }
}

/// What an entry point counts in its [`ConsumerStats`] (acknowledgements
/// are counted by [`ConsumerStats::acked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Counter {
    /// A delivery received.
    Received,
    /// A redelivery received.
    Redelivered,
    /// A failed attempt handed back for a retry.
    Retried,
    /// A delivery dead-lettered.
    DeadLettered,
    /// An in-progress ack sent while a handler ran.
    ProgressAck,
    /// A settlement that could not be sent or was not confirmed.
    SettleFailed,
    /// A pull request that failed.
    PullFailure,
    /// A handler's try that failed in an outage, run again in place.
    OutageWait,
    /// A connection dialled again after the consumer's died.
    Reconnect,
}

impl Counter {
    /// Its name in the metrics.
    fn metric(self) -> &'static str {
        use crate::metrics::*;
        match self {
            Counter::Received => CONSUMER_RECEIVED,
            Counter::Redelivered => CONSUMER_REDELIVERED,
            Counter::Retried => CONSUMER_RETRIED,
            Counter::DeadLettered => CONSUMER_DEAD_LETTERED,
            Counter::ProgressAck => CONSUMER_PROGRESS_ACKS,
            Counter::SettleFailed => CONSUMER_SETTLE_FAILED,
            Counter::PullFailure => CONSUMER_PULL_FAILURES,
            Counter::OutageWait => CONSUMER_OUTAGE_WAITS,
            Counter::Reconnect => CONSUMER_RECONNECTS,
        }
    }
}
