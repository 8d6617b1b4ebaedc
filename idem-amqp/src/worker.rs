//! The running consumer: one task per delivery, each settled by the rules
//! of the [module documentation](super).

use super::channel::ConfirmChannel;
use super::error::from_lapin;
use super::fields::{header_str, header_u32};
use super::message::Message;
use super::{ATTEMPTS_HEADER, EXCHANGE_HEADER, ROUTING_KEY_HEADER};
use futures_util::StreamExt;
use idem_core::Error;
use idem_core::backoff::Backoff;
use idem_core::consume::{self, ConsumerStats, Counter, Failure, Running, Settle, Verdict};
use lapin::Channel;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicRejectOptions};
use std::sync::Arc;
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

/// The consumer's task: a delivery task per delivery, until stopped.
pub(super) async fn run(
    shared: Arc<Shared>,
    channel: Channel,
    mut consumer: lapin::Consumer,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    let mut tasks = JoinSet::new();
    let mut failure = None;
    loop {
        tokio::select! {
            biased;
            // A stop request, or the handle was dropped.
            _ = stop.changed() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    let s = shared.clone();
                    tasks.spawn(async move { s.process(delivery).await });
                }
                Some(Err(e)) => {
                    tracing::warn!(queue = %shared.queue, error = %format_args!("{e:#}"), "AMQP consumer failed; stopping");
                    failure = Some(from_lapin("basic.consume", e));
                    break;
                }
                // Cancelled by the broker (the queue was deleted).
                None => break,
            },
        }
    }
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
