//! The running consumer: pull requests sized to the free slots, one task
//! per delivery, each settled by the rules of the
//! [module documentation](super).

use super::message::Message;
use super::{
    DEAD_CONSUMER_HEADER, DEAD_DELIVERED_HEADER, DEAD_REASON_HEADER, DEAD_SEQUENCE_HEADER,
    DEAD_STREAM_HEADER, DEAD_SUBJECT_HEADER,
};
use async_nats::header;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{AckKind, Context, Message as JsMessage};
use futures_util::{FutureExt, StreamExt};
use idem_core::Error;
use idem_core::backoff::{Backoff, FailureLog};
use idem_core::consume::{self, ConsumerStats, Counter, Failure, Running, Settle, Verdict};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

/// The handler as stored (see [`consume`]).
pub(super) type Handler = consume::Handler<Message>;

/// What every delivery task of one consumer shares.
pub(super) struct Shared {
    pub(super) js: Context,
    pub(super) stream: String,
    pub(super) consumer: String,
    pub(super) handler: Handler,
    /// The consumer's `max_deliver` (`0`: unbounded).
    pub(super) max_deliver: u32,
    pub(super) backoff: Backoff,
    pub(super) progress: Option<Duration>,
    pub(super) pull_wait: Duration,
    pub(super) max_in_flight: usize,
    pub(super) dead_letter_subject: Option<String>,
    pub(super) outage_retry: Duration,
    pub(super) stats: Arc<ConsumerStats>,
}

impl Running for Shared {
    fn stats(&self) -> &Arc<ConsumerStats> {
        &self.stats
    }

    fn describe(&self, f: &mut std::fmt::DebugStruct<'_, '_>) {
        f.field("stream", &self.stream)
            .field("consumer", &self.consumer);
    }
}

/// The consumer's task: pulls as many deliveries as it has free slots,
/// a task per delivery, until stopped.
pub(super) async fn run(
    shared: Arc<Shared>,
    pull: PullConsumer,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    let slots = Arc::new(Semaphore::new(shared.max_in_flight));
    let mut tasks = JoinSet::new();
    // Ends the waits of handlers in an outage (`through_outages`) once the
    // consumer stops.
    let (ending, ending_rx) = watch::channel(false);
    // Failing pulls: one warning, then one line when they succeed again.
    let pause_after_failure = shared.pull_wait.min(Duration::from_secs(1));
    let mut pulls = FailureLog::new(
        "JetStream pulls",
        Backoff::new(pause_after_failure, pause_after_failure),
    );
    'pulling: loop {
        while tasks.try_join_next().is_some() {}
        let first = tokio::select! {
            biased;
            _ = stop.changed() => break,
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let mut permits = vec![first];
        while let Ok(p) = slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        let request = pull
            .batch()
            .max_messages(permits.len())
            .expires(shared.pull_wait)
            .messages();
        let mut batch = tokio::select! {
            biased;
            _ = stop.changed() => break,
            batch = request => match batch {
                Ok(batch) => {
                    pulls.succeeded();
                    batch
                }
                Err(e) => {
                    shared.pull_failed(&mut pulls, &e);
                    if pause(&mut stop, pause_after_failure).await {
                        break;
                    }
                    continue;
                }
            },
        };
        loop {
            tokio::select! {
                biased;
                _ = stop.changed() => {
                    // Pulled but not started: back to the server at once.
                    while let Some(Some(Ok(m))) = batch.next().now_or_never() {
                        let _ = m.ack_with(AckKind::Nak(None)).await;
                    }
                    break 'pulling;
                }
                next = batch.next() => match next {
                    Some(Ok(m)) => match permits.pop() {
                        Some(permit) => {
                            let (s, ending) = (shared.clone(), ending_rx.clone());
                            tasks.spawn(async move { s.process(m, permit, ending).await });
                        }
                        // More than asked for: never expected.
                        None => {
                            let _ = m.ack_with(AckKind::Nak(None)).await;
                        }
                    },
                    Some(Err(e)) => {
                        shared.pull_failed(&mut pulls, &e);
                        break;
                    }
                    None => break,
                },
            }
        }
    }
    ending.send_replace(true);
    // In-flight handlers finish and settle their deliveries.
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Sleeps `d`; `true` when a stop came first.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = stop.changed() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// What the ack subject of a delivery says about it.
struct Meta {
    stream_sequence: u64,
    consumer_sequence: u64,
    delivered: u32,
}

impl Shared {
    /// Counts a failed pull; logged once per change of state (`log`).
    fn pull_failed(&self, log: &mut FailureLog, e: &dyn std::fmt::Display) {
        self.stats.count(Counter::PullFailure);
        let e = format!("{e:#} (stream {}, consumer {})", self.stream, self.consumer);
        log.failed(&e);
    }

    async fn process(
        &self,
        m: JsMessage,
        _slot: OwnedSemaphorePermit,
        mut ending: watch::Receiver<bool>,
    ) {
        self.stats.count(Counter::Received);
        let meta = match m.info() {
            Ok(i) => Meta {
                stream_sequence: i.stream_sequence,
                consumer_sequence: i.consumer_sequence,
                delivered: u32::try_from(i.delivered.max(1)).unwrap_or(u32::MAX),
            },
            Err(e) => {
                // Not a JetStream delivery (no ack subject): nothing to settle.
                self.stats.count(Counter::SettleFailed);
                tracing::warn!(error = %format_args!("{e:#}"), "a message without a JetStream ack subject; ignored");
                return;
            }
        };
        if meta.delivered > 1 {
            self.stats.count(Counter::Redelivered);
        }
        let message_id = m
            .headers
            .as_ref()
            .and_then(|h| h.get(header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned())
            .filter(|s| !s.is_empty());
        let span = tracing::info_span!(
            "nats_delivery",
            stream = %self.stream,
            consumer = %self.consumer,
            message_id = message_id.as_deref().unwrap_or(""),
            stream_sequence = meta.stream_sequence,
            delivered = meta.delivered,
            "otel.name" = tracing::field::Empty,
            "otel.kind" = "consumer",
        );
        #[cfg(feature = "opentelemetry")]
        continue_trace(&span, &m, &self.stream, message_id.as_deref());
        async move {
            let verdict = match message_id {
                None => Err(Failure::unkeyed("Nats-Msg-Id header")),
                Some(id) => {
                    // In-progress acks while the handler runs, and while
                    // it waits out an outage in place.
                    let run = || self.handle(&m, id.clone(), &meta);
                    let waited =
                        consume::through_outages(run, &mut ending, self.outage_retry, &self.stats);
                    self.in_progress(&m, waited).await
                }
            };
            let settling = Settling {
                shared: self,
                m: &m,
                meta: &meta,
            };
            consume::settle(
                &settling,
                verdict,
                meta.delivered,
                self.max_deliver,
                "deliveries",
            )
            .await;
        }
        .instrument(span)
        .await
    }

    async fn handle(&self, m: &JsMessage, message_id: String, meta: &Meta) -> Verdict {
        let message = Message {
            stream: self.stream.clone(),
            consumer: self.consumer.clone(),
            subject: m.subject.to_string(),
            message_id,
            stream_sequence: meta.stream_sequence,
            consumer_sequence: meta.consumer_sequence,
            delivered: meta.delivered,
            body: m.payload.to_vec(),
            headers: m.headers.clone().unwrap_or_default(),
        };
        consume::run(&self.handler, message).await
    }

    /// Awaits `work`, sending an in-progress ack (`+WPI`) every
    /// `progress` meanwhile so that the server does not deliver the
    /// message again while it is in hand.
    async fn in_progress(&self, m: &JsMessage, work: impl Future<Output = Verdict>) -> Verdict {
        let Some(every) = self.progress else {
            return work.await;
        };
        let mut work = std::pin::pin!(work);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                verdict = &mut work => return verdict,
                _ = tick.tick() => match m.ack_with(AckKind::Progress).await {
                    Ok(()) => self.stats.count(Counter::ProgressAck),
                    Err(e) => tracing::debug!(error = %format_args!("{e:#}"), "in-progress ack not sent"),
                },
            }
        }
    }

    async fn nak(&self, m: &JsMessage, delay: Duration, reason: &str) {
        match m.ack_with(AckKind::Nak(Some(delay))).await {
            Ok(()) => {
                self.stats.count(Counter::Retried);
                idem_core::consume::count_retry();
                tracing::info!(%reason, retry_in = ?delay, "JetStream delivery failed; nak'd for a redelivery");
            }
            Err(e) => self.settle_failed("nak", &e),
        }
    }

    /// Copies the delivery to the dead-letter subject (when set, waiting
    /// for its stream's ack), then terminates it. A copy that cannot be
    /// stored leaves the delivery nak'd instead, for another try.
    async fn dead_letter(&self, m: &JsMessage, reason: &str, meta: &Meta) {
        if let Some(subject) = &self.dead_letter_subject
            && let Err(e) = self.copy_dead_letter(subject, m, reason, meta).await
        {
            tracing::warn!(%reason, error = %format_args!("{e:#}"), "could not store the dead letter; nak'd for another try");
            let delay = self.backoff.delay(meta.delivered);
            self.nak(m, delay, reason).await;
            return;
        }
        match m.ack_with(AckKind::Term).await {
            Ok(()) => {
                self.stats.count(Counter::DeadLettered);
                idem_core::consume::count_dead_letter();
                tracing::warn!(%reason, "JetStream delivery terminated (dead letter)");
            }
            Err(e) => self.settle_failed("term", &e),
        }
    }

    async fn copy_dead_letter(
        &self,
        subject: &str,
        m: &JsMessage,
        reason: &str,
        meta: &Meta,
    ) -> Result<(), Error> {
        let mut headers = m.headers.clone().unwrap_or_default();
        headers.insert(DEAD_STREAM_HEADER, self.stream.as_str());
        headers.insert(DEAD_CONSUMER_HEADER, self.consumer.as_str());
        headers.insert(DEAD_SUBJECT_HEADER, m.subject.as_str());
        headers.insert(
            DEAD_SEQUENCE_HEADER,
            meta.stream_sequence.to_string().as_str(),
        );
        headers.insert(DEAD_DELIVERED_HEADER, meta.delivered.to_string().as_str());
        // Header values are one line.
        let reason: String = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        headers.insert(DEAD_REASON_HEADER, reason.as_str());
        self.js
            .publish_with_headers(subject.to_owned(), headers, m.payload.clone())
            .await
            .map_err(super::error::from_publish)?
            .await
            .map_err(super::error::from_publish)?;
        Ok(())
    }

    fn settle_failed(&self, op: &str, e: &dyn std::fmt::Display) {
        self.stats.count(Counter::SettleFailed);
        tracing::warn!(op, error = %format_args!("{e:#}"), "could not settle the delivery; the server will deliver it again");
    }
}

/// One delivery being settled: a double ack, a nak with its back-off, or
/// a term (after the copy to the dead-letter subject, when set).
struct Settling<'a> {
    shared: &'a Shared,
    m: &'a JsMessage,
    meta: &'a Meta,
}

impl Settle for Settling<'_> {
    async fn ack(&self, executed: bool) {
        // Confirmed by the server: an ack lost on the way is an error
        // here, and the server delivers the message again.
        match self.m.double_ack().await {
            Ok(()) => self.shared.stats.acked(executed),
            Err(e) => self.shared.settle_failed("ack", &e),
        }
    }

    async fn retry(&self, reason: &str) {
        let delay = self.shared.backoff.delay(self.meta.delivered);
        self.shared.nak(self.m, delay, reason).await;
    }

    async fn dead_letter(&self, reason: &str) {
        self.shared.dead_letter(self.m, reason, self.meta).await;
    }
}

/// The delivery's span continues the trace of its `traceparent` header.
#[cfg(feature = "opentelemetry")]
fn continue_trace(span: &tracing::Span, m: &JsMessage, stream: &str, message_id: Option<&str>) {
    let headers = ["traceparent", "tracestate"]
        .into_iter()
        .filter_map(|name| {
            let value = m.headers.as_ref()?.get(name)?;
            Some((name.to_owned(), value.as_str().to_owned()))
        })
        .collect();
    consume::continue_trace(span, &headers, "nats", stream, message_id);
}
