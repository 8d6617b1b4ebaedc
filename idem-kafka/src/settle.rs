//! A record's settlement: its offset stored once its handler's verdict
//! is carried out (acknowledged, copied to the retry topic or to the
//! dead-letter topic), by the rules of the
//! [module documentation](super#settlement).

use super::message::Message;
use super::shared::{Shared, Tp, now_ms, sleep_unless_ending};
use super::{
    ATTEMPT_HEADER, DEAD_GROUP_HEADER, DEAD_REASON_HEADER, MSG_ID_HEADER, NOT_BEFORE_HEADER,
    ORIGIN_OFFSET_HEADER, ORIGIN_PARTITION_HEADER, ORIGIN_TOPIC_HEADER, RETRY_REASON_HEADER,
};
use idem_core::backoff::Backoff;
use idem_core::consume::{self, Counter, Settle};
use rdkafka::consumer::Consumer as _;
use rdkafka::message::{Header, Headers, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::future_producer::FutureRecord;
use rdkafka::util::Timeout;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// The consumed record, copied out of librdkafka.
pub(super) struct Record {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) key: Option<Vec<u8>>,
    pub(super) timestamp_ms: Option<i64>,
    pub(super) headers: Vec<(String, Vec<u8>)>,
    pub(super) body: Vec<u8>,
}

impl Record {
    pub(super) fn of(m: &OwnedMessage) -> Record {
        let headers = m.headers().map_or_else(Vec::new, |h| {
            h.iter()
                .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                .collect()
        });
        Record {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            timestamp_ms: m.timestamp().to_millis(),
            headers,
            body: m.payload().unwrap_or_default().to_vec(),
        }
    }

    pub(super) fn message(&self, origin: &str, msg_id: &str, attempt: u32) -> Message {
        Message {
            topic: origin.to_owned(),
            msg_id: msg_id.to_owned(),
            record_topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            attempt,
            record_key: self.key.clone(),
            timestamp_ms: self.timestamp_ms,
            headers: self.headers.clone(),
            body: self.body.clone(),
        }
    }

    /// Its headers without the ones idem sets on retry copies and dead
    /// letters, with `extra` added.
    pub(super) fn headers_with(&self, extra: &[(&str, String)]) -> OwnedHeaders {
        let ours = [
            MSG_ID_HEADER,
            ATTEMPT_HEADER,
            NOT_BEFORE_HEADER,
            ORIGIN_TOPIC_HEADER,
            ORIGIN_PARTITION_HEADER,
            ORIGIN_OFFSET_HEADER,
            RETRY_REASON_HEADER,
            DEAD_REASON_HEADER,
            DEAD_GROUP_HEADER,
        ];
        let mut out = OwnedHeaders::new_with_capacity(self.headers.len() + extra.len());
        for (k, v) in &self.headers {
            if !ours.contains(&k.as_str()) {
                out = out.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
        }
        for (k, v) in extra {
            out = out.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        out
    }
}

/// What a record is a copy of.
pub(super) struct Origin {
    /// The topic the message was published to.
    pub(super) origin: String,
    /// Its id (`None`: it has none, a dead letter).
    pub(super) msg_id: Option<String>,
    pub(super) attempt: u32,
    /// A retry copy: when it is due (ms since the epoch).
    pub(super) not_before: Option<i64>,
    /// Where the first copy was (`-1`: unknown).
    pub(super) partition: i64,
    pub(super) offset: i64,
}

impl Origin {
    fn origin_headers(&self) -> [(&'static str, String); 3] {
        [
            (ORIGIN_TOPIC_HEADER, self.origin.clone()),
            (ORIGIN_PARTITION_HEADER, self.partition.to_string()),
            (ORIGIN_OFFSET_HEADER, self.offset.to_string()),
        ]
    }
}

/// Header values are one line, and short.
fn one_line(reason: &str) -> String {
    reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(2000)
        .collect()
}

/// One record being settled: its offset stored, after its copy to the
/// retry or dead-letter topic when it goes there.
pub(super) struct Settling<'a> {
    pub(super) shared: &'a Shared,
    pub(super) record: &'a Record,
    pub(super) origin: &'a Origin,
    pub(super) tp: &'a Tp,
    pub(super) epoch: u64,
    pub(super) attempt: u32,
    /// Retried in place: the caller runs the record again.
    pub(super) again: AtomicBool,
    pub(super) ending: watch::Receiver<bool>,
}

impl Settling<'_> {
    fn store(&self) -> bool {
        self.shared.store(self.record, self.tp, self.epoch)
    }

    fn msg_id(&self) -> String {
        self.origin.msg_id.clone().unwrap_or_default()
    }

    /// Copies the record to `topic` with its headers, `extra` and where it
    /// came from, confirmed by the broker, then stores its offset; `false`
    /// when either did not happen (the record is read again).
    async fn copy_to(&self, topic: &str, mut extra: Vec<(&str, String)>) -> bool {
        extra.extend(self.origin.origin_headers());
        let headers = self.record.headers_with(&extra);
        let mut ending = self.ending.clone();
        let s = self.shared;
        s.produce(
            topic,
            self.record,
            headers,
            self.tp,
            self.epoch,
            &mut ending,
        )
        .await
            && self.store()
    }
}

impl Settle for Settling<'_> {
    async fn ack(&self, executed: bool) {
        if self.store() {
            self.shared.stats.acked(executed);
        }
    }

    async fn retry(&self, reason: &str) {
        let s = self.shared;
        let Some(topic) = &s.retry_topic else {
            s.stats.count(Counter::Retried);
            consume::count_retry();
            self.again.store(true, Ordering::Release);
            tracing::info!(%reason, retry_in = ?s.backoff.delay(self.attempt), "Kafka record failed; running it again in place");
            return;
        };
        let delay = s.backoff.delay(self.attempt);
        let due = now_ms().saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX));
        let extra = vec![
            (MSG_ID_HEADER, self.msg_id()),
            (ATTEMPT_HEADER, (self.attempt.saturating_add(1)).to_string()),
            (NOT_BEFORE_HEADER, due.to_string()),
            (RETRY_REASON_HEADER, one_line(reason)),
        ];
        if self.copy_to(topic, extra).await {
            s.stats.count(Counter::Retried);
            consume::count_retry();
            tracing::info!(%reason, retry_in = ?delay, retry_topic = %topic, "Kafka record failed; copied to the retry topic");
        }
    }

    async fn dead_letter(&self, reason: &str) {
        let s = self.shared;
        let topic = &s.dead_letter_topic;
        let mut extra = vec![
            (DEAD_REASON_HEADER, one_line(reason)),
            (DEAD_GROUP_HEADER, s.group.clone()),
            (ATTEMPT_HEADER, self.attempt.to_string()),
        ];
        if let Some(id) = &self.origin.msg_id {
            extra.push((MSG_ID_HEADER, id.clone()));
        }
        if self.copy_to(topic, extra).await {
            s.stats.count(Counter::DeadLettered);
            consume::count_dead_letter();
            tracing::warn!(%reason, dead_letter_topic = %topic, "Kafka record dead-lettered");
        }
    }
}

impl Shared {
    /// Stores the offset after `record` (committed with the next commit),
    /// unless the assignment ended.
    pub(super) fn store(&self, record: &Record, tp: &Tp, epoch: u64) -> bool {
        if idem_core::probe::is_broken(idem_core::probe::Break::SettleFirst) {
            // The control stored it on arrival (see `route`).
            return true;
        }
        if self.stale(tp, epoch) {
            self.stats.count(Counter::SettleFailed);
            tracing::debug!(
                "partition revoked before its record was settled; its next owner reads it again"
            );
            return false;
        }
        match self
            .consumer
            .store_offset(&record.topic, record.partition, record.offset)
        {
            Ok(()) => true,
            Err(e) => {
                self.stats.count(Counter::SettleFailed);
                tracing::debug!(error = %e, "offset not stored; the record is read again");
                false
            }
        }
    }

    /// Writes a copy of `record` to `topic` with `headers`, confirmed by
    /// the broker, trying again (100 ms doubling to 5 s) until it is,
    /// or until the consumer ends or the partition is revoked (`false`:
    /// the record is not settled, and is read again).
    pub(super) async fn produce(
        &self,
        topic: &str,
        record: &Record,
        headers: OwnedHeaders,
        tp: &Tp,
        epoch: u64,
        ending: &mut watch::Receiver<bool>,
    ) -> bool {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut tries = 0u32;
        loop {
            let mut copy = FutureRecord::to(topic)
                .payload(&record.body)
                .headers(headers.clone());
            if let Some(k) = &record.key {
                copy = copy.key(k);
            }
            let sent = self
                .producer
                .send(copy, Timeout::After(self.send_timeout))
                .await;
            let Err((e, _)) = sent else {
                return true;
            };
            tries = tries.saturating_add(1);
            if tries == 1 || tries.is_power_of_two() {
                tracing::warn!(%topic, tries, error = %e, "could not write to the retry or dead-letter topic; trying again (the record stays unsettled)");
            }
            if !sleep_unless_ending(ending, backoff.jittered(tries, 0)).await
                || self.stale(tp, epoch)
            {
                self.stats.count(Counter::SettleFailed);
                return false;
            }
        }
    }
}
