//! The running consumer: one task per delivery, each settled by the rules
//! of the [module documentation](super).

use super::Connector;
use super::channel::ConfirmChannel;
use super::error::from_lapin;
use super::fields::{header_str, header_u32, short};
use super::message::Message;
use super::{ATTEMPTS_HEADER, EXCHANGE_HEADER, ROUTING_KEY_HEADER};
use futures_util::StreamExt;
use idem_core::Error;
use idem_core::backoff::Backoff;
use idem_core::consume::{self, ConsumerStats, Counter, Failure, Running, Settle, Verdict};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicRejectOptions};
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

/// The handler as stored (see [`consume`]).
pub(super) type Handler = consume::Handler<Message>;

/// What every delivery task of one consumer shares.
pub(super) struct Shared {
    pub(super) queue: String,
    pub(super) retry_queue: String,
    pub(super) handler: Handler,
    pub(super) retry: ConfirmChannel,
    pub(super) max_attempts: u32,
    pub(super) backoff: Backoff,
    pub(super) stats: Arc<ConsumerStats>,
}

impl Running for Shared {
    fn stats(&self) -> &Arc<ConsumerStats> {
        &self.stats
    }

    fn describe(&self, f: &mut std::fmt::DebugStruct<'_, '_>) {
        f.field("queue", &self.queue);
    }
}

/// How a consumer's stream of deliveries ended.
enum Ended {
    /// A stop request, the handle dropped, or the broker cancelled the
    /// consumer (the queue was deleted) on a live channel.
    Stopped,
    /// The connection or the channel failed.
    Failed(Error),
}

/// The consumer's task: a delivery task per delivery, until stopped. When
/// the connection or the channel dies and the connector reconnects, it
/// waits for a new connection and consumes again; the deliveries in
/// flight on the dead channel cannot be acknowledged, and the broker
/// redelivers them (answered `Duplicate` if their handler had committed).
pub(super) async fn run(
    shared: Arc<Shared>,
    start: Start,
    mut channel: Channel,
    mut consumer: lapin::Consumer,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    let mut tasks = JoinSet::new();
    let failure = loop {
        let ended = consume(&shared, &channel, &mut consumer, &mut tasks, &mut stop).await;
        match ended {
            Ended::Stopped => break None,
            Ended::Failed(e) if start.connector.reconnects_on_failure() => {
                tracing::warn!(queue = %shared.queue, error = %format_args!("{e:#}"), "AMQP consumer lost its connection; reconnecting");
                match reopen(&start, &mut stop).await {
                    Some((ch, c)) => {
                        (channel, consumer) = (ch, c);
                        tracing::warn!(queue = %shared.queue, "AMQP consumer consuming again after a reconnect");
                    }
                    None => break None,
                }
            }
            Ended::Failed(e) => {
                tracing::warn!(queue = %shared.queue, error = %format_args!("{e:#}"), "AMQP consumer failed; stopping (a fixed connection: use a Connector to reconnect)");
                break Some(e);
            }
        }
    };
    if channel.status().connected() {
        let _ = channel
            .basic_cancel(consumer.tag(), BasicCancelOptions::default())
            .await;
    }
    // In-flight handlers finish and settle their deliveries.
    while tasks.join_next().await.is_some() {}
    if channel.status().connected() {
        let _ = channel.close(200, "OK".into()).await;
    }
    shared.retry.close().await;
    failure.map_or(Ok(()), Err)
}

/// Runs one consumer stream: a delivery task per delivery, until it ends.
async fn consume(
    shared: &Arc<Shared>,
    channel: &Channel,
    consumer: &mut lapin::Consumer,
    tasks: &mut JoinSet<()>,
    stop: &mut watch::Receiver<bool>,
) -> Ended {
    loop {
        tokio::select! {
            biased;
            // A stop request, or the handle was dropped.
            _ = stop.changed() => return Ended::Stopped,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    let s = shared.clone();
                    tasks.spawn(async move { s.process(delivery).await });
                }
                Some(Err(e)) => return Ended::Failed(from_lapin("basic.consume", e)),
                // Cancelled: by the broker (the queue was deleted) on a
                // live channel, else the channel went with its connection.
                None if channel.status().connected() => return Ended::Stopped,
                None => return Ended::Failed(Error::broker_unavailable("amqp", "the consumer's channel closed")),
            },
        }
    }
}

/// Waits for the connector's next connection and consumes on it again;
/// `None` when stopped meanwhile.
async fn reopen(
    start: &Start,
    stop: &mut watch::Receiver<bool>,
) -> Option<(Channel, lapin::Consumer)> {
    let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    for failures in 1.. {
        let connection = start.connector.wait(stop).await?;
        match start.open(&connection).await {
            Ok(opened) => return Some(opened),
            Err(e) => {
                tracing::warn!(error = %format_args!("{e:#}"), "AMQP consumer could not consume on the new connection; trying again");
                tokio::select! {
                    _ = stop.changed() => return None,
                    _ = tokio::time::sleep(backoff.jittered(failures, 0)) => {}
                }
            }
        }
    }
    None
}

impl Shared {
    async fn process(&self, d: AmqpDelivery) {
        self.stats.count(Counter::Received);
        let failed_before = header_u32(&d.properties, ATTEMPTS_HEADER).unwrap_or(0);
        let attempt = failed_before.saturating_add(1);
        let message_id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned())
            .filter(|s| !s.is_empty());
        let span = tracing::info_span!(
            "amqp_delivery",
            queue = %self.queue,
            message_id = message_id.as_deref().unwrap_or(""),
            attempt,
            redelivered = d.redelivered,
        );
        async move {
            let verdict = match message_id {
                None => Err(Failure::unkeyed("message_id property")),
                Some(message_id) => self.handle(&d, message_id, attempt).await,
            };
            let settling = Settling {
                shared: self,
                d: &d,
                attempt,
            };
            consume::settle(&settling, verdict, attempt, self.max_attempts, "attempts").await;
        }
        .instrument(span)
        .await
    }

    async fn handle(&self, d: &AmqpDelivery, message_id: String, attempt: u32) -> Verdict {
        let message = Message {
            queue: self.queue.clone(),
            message_id,
            routing_key: header_str(&d.properties, ROUTING_KEY_HEADER)
                .unwrap_or_else(|| d.routing_key.to_string()),
            exchange: header_str(&d.properties, EXCHANGE_HEADER)
                .unwrap_or_else(|| d.exchange.to_string()),
            redelivered: d.redelivered,
            attempt,
            body: d.data.clone(),
            properties: d.properties.clone(),
        };
        consume::run(&self.handler, message).await
    }

    pub(super) fn settle_failed(&self, op: &str, result: lapin::Result<bool>) {
        self.stats.count(Counter::SettleFailed);
        match result {
            Err(e) => {
                tracing::warn!(op, error = %format_args!("{e:#}"), "could not settle the delivery; the broker will redeliver it")
            }
            Ok(_) => {
                tracing::warn!(
                    op,
                    "channel closed before settling; the broker will redeliver it"
                )
            }
        }
    }
}

/// One delivery being settled: ack, the retry queue, or reject (to the
/// queue's dead-letter exchange).
struct Settling<'a> {
    shared: &'a Shared,
    d: &'a AmqpDelivery,
    attempt: u32,
}

impl Settle for Settling<'_> {
    async fn ack(&self, executed: bool) {
        match self.d.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => self.shared.stats.acked(executed),
            other => self.shared.settle_failed("ack", other),
        }
    }

    async fn retry(&self, reason: &str) {
        self.shared.retry(self.d, self.attempt, reason).await;
    }

    async fn dead_letter(&self, reason: &str) {
        match self
            .d
            .acker
            .reject(BasicRejectOptions { requeue: false })
            .await
        {
            Ok(true) => {
                self.shared.stats.count(Counter::DeadLettered);
                idem_core::consume::count_dead_letter();
                tracing::warn!(%reason, "AMQP delivery dead-lettered");
            }
            other => self.shared.settle_failed("reject", other),
        }
    }
}

/// What (re)starts consuming: on the first connection, and on each one
/// the connector dials after the previous died.
pub(super) struct Start {
    pub(super) connector: Connector,
    pub(super) queue: String,
    pub(super) tag: String,
    pub(super) prefetch: u16,
}

impl Start {
    /// Opens a channel on `connection`, sets the prefetch and starts
    /// consuming; the channel is closed again if that fails.
    pub(super) async fn open(
        &self,
        connection: &Connection,
    ) -> Result<(Channel, lapin::Consumer), Error> {
        let queue = short("queue", &self.queue)?;
        let tag = short("consumer tag", &self.tag)?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| from_lapin("channel.open", e))?;
        let started = async {
            channel
                .basic_qos(self.prefetch, BasicQosOptions::default())
                .await
                .map_err(|e| from_lapin("basic.qos", e))?;
            channel
                .basic_consume(
                    queue,
                    tag,
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| from_lapin("basic.consume", e))
        }
        .await;
        match started {
            Ok(c) => Ok((channel, c)),
            Err(e) => {
                if channel.status().connected() {
                    let _ = channel.close(200, "OK".into()).await;
                }
                Err(e)
            }
        }
    }
}
