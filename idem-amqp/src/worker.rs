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
use std::future::Future;
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
    pub(super) outage_retry: Duration,
    pub(super) stats: Arc<ConsumerStats>,
}

/// How long an acknowledgement, a reject or a retry's publish (with its
/// confirm) may take before the delivery is left to the broker to deliver
/// again: a settlement on a connection that died without the client
/// noticing must not hold a delivery task, and the consumer's end, forever.
pub(super) const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a consumer checks that its channel is still open, beside
/// waiting for its next delivery: a stream that does not end when its
/// connection dies still ends the consume loop within this.
const LIVENESS_CHECK: Duration = Duration::from_secs(1);

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
    // Ends the waits of handlers in an outage (`through_outages`) when the
    // consumer stops or its fixed connection failed.
    let (ending, ending_rx) = watch::channel(false);
    let failure = loop {
        let ended = consume(
            &shared,
            &channel,
            &mut consumer,
            &mut tasks,
            &mut stop,
            &ending_rx,
        )
        .await;
        match ended {
            Ended::Stopped => break None,
            Ended::Failed(e) if start.connector.reconnects_on_failure() => {
                tracing::warn!(queue = %shared.queue, error = %format_args!("{e:#}"), "AMQP consumer lost its connection; reconnecting");
                match reopen(&start, &mut stop).await {
                    Some((ch, c)) => {
                        (channel, consumer) = (ch, c);
                        shared.stats.count(Counter::Reconnect);
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
    ending.send_replace(true);
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
    ending: &watch::Receiver<bool>,
) -> Ended {
    let mut alive = tokio::time::interval(LIVENESS_CHECK);
    alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            // A stop request, or the handle was dropped.
            _ = stop.changed() => return Ended::Stopped,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    let (s, ending) = (shared.clone(), ending.clone());
                    tasks.spawn(async move { s.process(delivery, ending).await });
                }
                Some(Err(e)) => return Ended::Failed(from_lapin("basic.consume", e)),
                // Cancelled: by the broker (the queue was deleted) on a
                // live channel, else the channel went with its connection.
                None if channel.status().connected() => return Ended::Stopped,
                None => return Ended::Failed(Error::broker_unavailable("amqp", "the consumer's channel closed")),
            },
            // A channel that closed without its stream ending.
            _ = alive.tick() => if !channel.status().connected() {
                return Ended::Failed(Error::broker_unavailable("amqp", "the consumer's channel closed"));
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
    async fn process(&self, d: AmqpDelivery, mut ending: watch::Receiver<bool>) {
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
            "otel.name" = tracing::field::Empty,
            "otel.kind" = "consumer",
        );
        #[cfg(feature = "opentelemetry")]
        continue_trace(&span, &d, &self.queue, message_id.as_deref());
        async move {
            let verdict = match message_id {
                None => Err(Failure::unkeyed("message_id property")),
                Some(id) => {
                    let run = || self.handle(&d, id.clone(), attempt);
                    consume::through_outages(run, &mut ending, self.outage_retry, &self.stats).await
                }
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

    /// Awaits a settlement (`op`: "ack", "nack", "reject") for at most
    /// [`SETTLE_TIMEOUT`]: `true` when the broker took it, else counted as
    /// failed (the broker delivers the message again).
    pub(super) async fn settled(
        &self,
        op: &str,
        settlement: impl Future<Output = lapin::Result<bool>>,
    ) -> bool {
        let (error, why) = match tokio::time::timeout(SETTLE_TIMEOUT, settlement).await {
            Ok(Ok(true)) => return true,
            Ok(Ok(false)) => (None, "the channel closed before settling"),
            Ok(Err(e)) => (Some(e), "could not settle the delivery"),
            Err(_) => (None, "the settlement was not sent in time"),
        };
        self.stats.count(Counter::SettleFailed);
        match error {
            Some(e) => {
                tracing::warn!(op, error = %format_args!("{e:#}"), "{why}; the broker will redeliver it")
            }
            None => tracing::warn!(op, "{why}; the broker will redeliver it"),
        }
        false
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
        let ack = self.d.acker.ack(BasicAckOptions::default());
        if self.shared.settled("ack", ack).await {
            self.shared.stats.acked(executed);
        }
    }

    async fn retry(&self, reason: &str) {
        self.shared.retry(self.d, self.attempt, reason).await;
    }

    async fn dead_letter(&self, reason: &str) {
        let reject = self.d.acker.reject(BasicRejectOptions { requeue: false });
        if self.shared.settled("reject", reject).await {
            self.shared.stats.count(Counter::DeadLettered);
            idem_core::consume::count_dead_letter();
            tracing::warn!(%reason, "AMQP delivery dead-lettered");
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

/// The delivery's span continues the trace of its `traceparent` header.
#[cfg(feature = "opentelemetry")]
fn continue_trace(span: &tracing::Span, d: &AmqpDelivery, queue: &str, message_id: Option<&str>) {
    let headers = ["traceparent", "tracestate"]
        .into_iter()
        .filter_map(|name| Some((name.to_owned(), header_str(&d.properties, name)?)))
        .collect();
    consume::continue_trace(span, &headers, "rabbitmq", queue, message_id);
}
