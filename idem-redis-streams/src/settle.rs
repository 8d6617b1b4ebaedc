//! One entry's run and settlement: its handler tried (an outage waited
//! out in place, a failure tried again after its back-off), then `XACK`,
//! or a copy to the dead-letter stream and then `XACK`.

use super::commands::{self, Entry};
use super::message::Message;
use super::shared::Shared;
use super::{
    DEAD_CONSUMER_FIELD, DEAD_DELIVERED_FIELD, DEAD_ENTRY_ID_FIELD, DEAD_GROUP_FIELD,
    DEAD_REASON_FIELD, DEAD_STREAM_FIELD,
};
use idem_core::consume::{self, Counter, Failure, Settle, Verdict};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tracing::Instrument;

/// The fields a dead letter gets, replacing any of the entry's own.
const DEAD_FIELDS: [&str; 6] = [
    DEAD_REASON_FIELD,
    DEAD_STREAM_FIELD,
    DEAD_ENTRY_ID_FIELD,
    DEAD_GROUP_FIELD,
    DEAD_CONSUMER_FIELD,
    DEAD_DELIVERED_FIELD,
];

impl Shared {
    /// Runs and settles one entry (handed out `delivered` times), then
    /// lets go of it.
    pub(super) async fn process(
        &self,
        entry: Entry,
        delivered: u32,
        _slot: OwnedSemaphorePermit,
        ending: watch::Receiver<bool>,
    ) {
        self.stats.count(Counter::Received);
        if delivered > 1 {
            self.stats.count(Counter::Redelivered);
        }
        let msg_id = entry.text(&self.key_field).filter(|s| !s.is_empty());
        let span = tracing::info_span!(
            "redis_stream_entry",
            stream = %self.stream,
            group = %self.group,
            entry_id = %entry.id,
            msg_id = msg_id.as_deref().unwrap_or(""),
            delivered,
            "otel.name" = tracing::field::Empty,
            "otel.kind" = "consumer",
        );
        #[cfg(feature = "opentelemetry")]
        {
            let headers = ["traceparent", "tracestate"]
                .into_iter()
                .filter_map(|name| {
                    let value = entry.text(&format!("{}{name}", super::HEADER_FIELD_PREFIX))?;
                    Some((name.to_owned(), value))
                })
                .collect();
            consume::continue_trace(&span, &headers, "redis", &self.stream, msg_id.as_deref());
        }
        self.tries(&entry, msg_id, delivered, ending)
            .instrument(span)
            .await;
        self.release(&entry.id);
    }

    /// The handler's tries, each settled by the one give-up rule
    /// ([`consume::settle`]); a retry runs again here after its back-off.
    async fn tries(
        &self,
        entry: &Entry,
        msg_id: Option<String>,
        delivered: u32,
        mut ending: watch::Receiver<bool>,
    ) {
        let mut attempt = 1;
        loop {
            let verdict = match &msg_id {
                _ if self.max_deliveries > 0 && delivered > self.max_deliveries => {
                    Err(Failure::dead(format!(
                        "handed out {delivered} times (max_deliveries {}) without being acknowledged: consumers died holding it",
                        self.max_deliveries
                    )))
                }
                None => Err(Failure::unkeyed(&format!("`{}` field", self.key_field))),
                Some(id) => {
                    let run = || self.handle(entry, id.clone(), delivered, attempt);
                    consume::through_outages(run, &mut ending, self.outage_retry, &self.stats).await
                }
            };
            let settling = Settling {
                shared: self,
                entry,
                delivered,
                attempt,
                ending: ending.clone(),
                again: AtomicBool::new(false),
            };
            consume::settle(&settling, verdict, attempt, self.max_attempts, "attempts").await;
            if !settling.again.load(Ordering::Relaxed) {
                return;
            }
            attempt += 1;
        }
    }

    async fn handle(&self, entry: &Entry, msg_id: String, delivered: u32, attempt: u32) -> Verdict {
        let body = entry
            .fields
            .iter()
            .find(|(n, _)| *n == self.payload_field)
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let message = Message {
            stream: self.stream.clone(),
            group: self.group.clone(),
            consumer: self.name.clone(),
            entry_id: entry.id.clone(),
            msg_id,
            topic: entry.text(super::TOPIC_FIELD),
            delivered,
            attempt,
            body,
            fields: entry.fields.clone(),
        };
        consume::run(&self.handler, message).await
    }

    /// Copies the entry to the dead-letter stream (waiting for Redis's
    /// answer), then acknowledges it. A copy that cannot be written
    /// leaves the entry pending, to be claimed and tried again.
    async fn dead_letter(&self, entry: &Entry, delivered: u32, reason: &str) {
        let delivered = delivered.to_string();
        let mut fields: Vec<(&str, &[u8])> = entry
            .fields
            .iter()
            .filter(|(n, _)| !DEAD_FIELDS.contains(&n.as_str()))
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .collect();
        fields.extend([
            (DEAD_REASON_FIELD, reason.as_bytes()),
            (DEAD_STREAM_FIELD, self.stream.as_bytes()),
            (DEAD_ENTRY_ID_FIELD, entry.id.as_bytes()),
            (DEAD_GROUP_FIELD, self.group.as_bytes()),
            (DEAD_CONSUMER_FIELD, self.name.as_bytes()),
            (DEAD_DELIVERED_FIELD, delivered.as_bytes()),
        ]);
        let mut conn = self.conn.clone();
        if let Err(e) = commands::add(&mut conn, &self.dead_letter_stream, None, &fields).await {
            tracing::warn!(%reason, error = %e, "could not write the dead letter; the entry stays pending, to be claimed again");
            self.stats.count(Counter::SettleFailed);
            return;
        }
        match commands::ack(&mut conn, &self.stream, &self.group, &entry.id).await {
            Ok(_) => {
                self.stats.count(Counter::DeadLettered);
                consume::count_dead_letter();
                tracing::warn!(%reason, dead_letter_stream = %self.dead_letter_stream, "stream entry dead-lettered");
            }
            Err(e) => self.settle_failed("XACK", &e),
        }
    }

    fn settle_failed(&self, op: &str, e: &dyn std::fmt::Display) {
        self.stats.count(Counter::SettleFailed);
        tracing::warn!(op, error = %e, "could not settle the entry; it stays pending, to be claimed after claim_after");
    }
}

/// One try being settled: `XACK`, a retry in place after the back-off, or
/// a dead letter.
struct Settling<'a> {
    shared: &'a Shared,
    entry: &'a Entry,
    delivered: u32,
    attempt: u32,
    ending: watch::Receiver<bool>,
    /// Set by `retry` when the handler is to run again.
    again: AtomicBool,
}

impl Settle for Settling<'_> {
    async fn ack(&self, executed: bool) {
        let s = self.shared;
        let mut conn = s.conn.clone();
        match commands::ack(&mut conn, &s.stream, &s.group, &self.entry.id).await {
            Ok(_) => s.stats.acked(executed),
            Err(e) => s.settle_failed("XACK", &e),
        }
    }

    async fn retry(&self, reason: &str) {
        let s = self.shared;
        let delay = s.backoff.delay(self.attempt);
        let mut ending = self.ending.clone();
        if *ending.borrow() {
            // Stopping: the entry stays pending, to be claimed.
            tracing::info!(%reason, "consumer stopping; the entry stays pending");
            return;
        }
        s.stats.count(Counter::Retried);
        consume::count_retry();
        tracing::info!(%reason, retry_in = ?delay, attempt = self.attempt, "handler failed; trying again in place");
        tokio::select! {
            _ = ending.changed() => {}
            _ = tokio::time::sleep(delay) => self.again.store(true, Ordering::Relaxed),
        }
    }

    async fn dead_letter(&self, reason: &str) {
        self.shared
            .dead_letter(self.entry, self.delivered, reason)
            .await;
    }
}
