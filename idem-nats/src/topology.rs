//! The stream, dead-letter stream and durable pull consumer a handler
//! needs, created idempotently.

use super::error::{from_consumer, from_create_stream};
use async_nats::jetstream::Context;
use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::stream;
use idem_core::Error;
use std::time::Duration;

/// The JetStream objects of one consumed stream: the stream itself (file
/// storage, its subjects, a duplicate window, `num_replicas` copies), a
/// dead-letter stream taking the dead-letter subject, and a durable pull
/// consumer with explicit acks, an ack wait and a bound on deliveries
/// (`max_deliver`).
///
/// Declaring is idempotent: the same declaration twice is a no-op, from
/// any number of processes (streams are created or updated, the consumer
/// is created with the same configuration). A consumer that exists with
/// *another* configuration is refused by the server: a permanent
/// [`Error`].
///
/// ```no_run
/// # async fn f() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::nats::{self, Topology};
/// use std::time::Duration;
/// let js = nats::connect("nats://127.0.0.1:4222").await?;
/// let t = Topology::new("ORDERS", "orders.>", "deduct")
///     .duplicate_window(Duration::from_secs(120))
///     .ack_wait(Duration::from_secs(30))
///     .max_deliver(5);
/// assert_eq!(t.dead_letter_stream, "ORDERS_DLQ");
/// assert_eq!(t.dead_letter_subject, "ORDERS.dlq.deduct");
/// t.declare(&js).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// The stream (`[A-Za-z0-9_-]`, no dots).
    pub stream: String,
    /// The subjects the stream stores (wildcards allowed).
    pub subjects: Vec<String>,
    /// The durable pull consumer.
    pub consumer: String,
    /// The stream's `duplicate_window`: how long a `Nats-Msg-Id` is
    /// remembered (default 2 minutes, the server's default).
    pub duplicate_window: Duration,
    /// The stream's `num_replicas` (default 1; 3 on a three-node cluster
    /// survives the loss of one node).
    pub replicas: usize,
    /// The consumer's `ack_wait`: a delivery neither acked nor kept alive
    /// by a progress ack for this long is delivered again (default 30 s).
    pub ack_wait: Duration,
    /// The consumer's `max_deliver`: deliveries of one message, at most
    /// (default 5).
    pub max_deliver: i64,
    /// The consumer's `max_ack_pending`: deliveries out at once (default
    /// 256).
    pub max_ack_pending: i64,
    /// The dead-letter stream (`{stream}_DLQ`).
    pub dead_letter_stream: String,
    /// The subject dead letters are published to (`{stream}.dlq.{consumer}`),
    /// stored by the dead-letter stream.
    pub dead_letter_subject: String,
}

impl Topology {
    /// The topology of `stream` storing `subject`, consumed by the durable
    /// `consumer`, with the default settings and names.
    pub fn new(
        stream: impl Into<String>,
        subject: impl Into<String>,
        consumer: impl Into<String>,
    ) -> Self {
        let stream = stream.into();
        let consumer = consumer.into();
        Topology {
            dead_letter_stream: format!("{stream}_DLQ"),
            dead_letter_subject: format!("{stream}.dlq.{consumer}"),
            subjects: vec![subject.into()],
            stream,
            consumer,
            duplicate_window: Duration::from_secs(120),
            replicas: 1,
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            max_ack_pending: 256,
        }
    }

    /// Another subject the stream stores.
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subjects.push(subject.into());
        self
    }

    /// The stream's duplicate window.
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = window;
        self
    }

    /// The stream's (and the dead-letter stream's) replicas.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n.max(1);
        self
    }

    /// The consumer's ack wait.
    pub fn ack_wait(mut self, wait: Duration) -> Self {
        self.ack_wait = wait;
        self
    }

    /// The consumer's bound on deliveries of one message (at least 1).
    pub fn max_deliver(mut self, n: i64) -> Self {
        self.max_deliver = n.max(1);
        self
    }

    /// The consumer's bound on deliveries out at once.
    pub fn max_ack_pending(mut self, n: i64) -> Self {
        self.max_ack_pending = n.max(1);
        self
    }

    /// The main stream's configuration.
    pub fn stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.stream.clone(),
            subjects: self.subjects.clone(),
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            duplicate_window: self.duplicate_window,
            ..stream::Config::default()
        }
    }

    /// The consumer's configuration: durable, explicit acks, delivering
    /// every message of the stream from the first.
    pub fn consumer_config(&self) -> pull::Config {
        pull::Config {
            durable_name: Some(self.consumer.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: self.max_deliver,
            max_ack_pending: self.max_ack_pending,
            ..pull::Config::default()
        }
    }

    /// Creates (or updates) both streams, then creates the consumer.
    pub async fn declare(&self, js: &Context) -> Result<(), Error> {
        let stream = js
            .create_or_update_stream(self.stream_config())
            .await
            .map_err(from_create_stream)?;
        js.create_or_update_stream(stream::Config {
            name: self.dead_letter_stream.clone(),
            subjects: vec![self.dead_letter_subject.clone()],
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            ..stream::Config::default()
        })
        .await
        .map_err(from_create_stream)?;
        js.create_consumer_on_stream(self.consumer_config(), &stream.config.name)
            .await
            .map_err(|e| from_consumer("consumer create", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_configurations() {
        let t = Topology::new("ORDERS", "orders.>", "deduct")
            .subject("refunds.>")
            .duplicate_window(Duration::from_secs(30))
            .replicas(3)
            .ack_wait(Duration::from_secs(10))
            .max_deliver(0)
            .max_ack_pending(64);
        assert_eq!(t.dead_letter_stream, "ORDERS_DLQ");
        assert_eq!(t.dead_letter_subject, "ORDERS.dlq.deduct");
        let s = t.stream_config();
        assert_eq!(s.subjects, ["orders.>", "refunds.>"]);
        assert_eq!(s.duplicate_window, Duration::from_secs(30));
        assert_eq!(s.num_replicas, 3);
        let c = t.consumer_config();
        assert_eq!(c.durable_name.as_deref(), Some("deduct"));
        assert_eq!(c.ack_policy, AckPolicy::Explicit);
        assert_eq!(c.ack_wait, Duration::from_secs(10));
        assert_eq!(c.max_deliver, 1, "at least one delivery");
        assert_eq!(c.max_ack_pending, 64);
    }
}
