//! A message's settlement: its offset recorded for the next commit once
//! its handler's verdict is carried out (done, to be run again in place,
//! or written to the dead-letter topic), by the rules of the
//! [crate documentation](crate#settlement).

use super::message::Record;
use super::publisher::outgoing;
use super::shared::{Shared, sleep_unless_ending};
use super::{
    ATTEMPT_PROPERTY, DEAD_GROUP_PROPERTY, DEAD_REASON_PROPERTY, MSG_ID_PROPERTY,
    ORIGIN_OFFSET_PROPERTY, ORIGIN_QUEUE_PROPERTY, ORIGIN_TOPIC_PROPERTY,
};
use idem_core::consume::{self, Counter, Settle};
use rocketmq_client_rust::SendStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// How long the dead-letter producer waits between two tries.
const DEAD_LETTER_RETRY: Duration = Duration::from_millis(500);

/// One attempt's settlement of a message.
pub(super) struct Settling<'a> {
    pub(super) shared: &'a Shared,
    pub(super) record: &'a Record,
    pub(super) msg_id: Option<&'a str>,
    pub(super) attempt: u32,
    /// Set by [`Settle::retry`]: the message runs again in place.
    pub(super) again: AtomicBool,
    pub(super) ending: watch::Receiver<bool>,
}

/// A reason on one line, bounded (properties are text).
fn one_line(reason: &str) -> String {
    reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(2000)
        .collect()
}

impl Settle for Settling<'_> {
    async fn ack(&self, executed: bool) {
        if !idem_core::probe::is_broken(idem_core::probe::Break::SettleFirst) {
            self.shared.settle(&self.record.queue, self.record.offset);
        }
        self.shared.stats.acked(executed);
    }

    async fn retry(&self, reason: &str) {
        let s = self.shared;
        s.stats.count(Counter::Retried);
        consume::count_retry();
        self.again.store(true, Ordering::Release);
        tracing::info!(%reason, retry_in = ?s.backoff.delay(self.attempt), "RocketMQ message failed; running it again in place");
    }

    async fn dead_letter(&self, reason: &str) {
        let s = self.shared;
        if self.write_dead_letter(reason).await {
            s.settle(&self.record.queue, self.record.offset);
            s.stats.count(Counter::DeadLettered);
            consume::count_dead_letter();
            tracing::warn!(%reason, dead_letter_topic = %s.dead_letter_topic, "RocketMQ message dead-lettered");
        }
    }
}

impl Settling<'_> {
    /// Writes the dead letter, trying again until the broker stored it or
    /// the consumer ends (the message then stays uncommitted: read again).
    async fn write_dead_letter(&self, reason: &str) -> bool {
        let s = self.shared;
        let r = self.record;
        let (queue, offset, attempt) = (
            r.queue.queue_id().to_string(),
            r.offset.to_string(),
            self.attempt.to_string(),
        );
        let reason = one_line(reason);
        let mut props = vec![
            (DEAD_REASON_PROPERTY, reason.as_str()),
            (DEAD_GROUP_PROPERTY, s.group.as_str()),
            (ORIGIN_TOPIC_PROPERTY, s.topic.as_str()),
            (ORIGIN_QUEUE_PROPERTY, queue.as_str()),
            (ORIGIN_OFFSET_PROPERTY, offset.as_str()),
            (ATTEMPT_PROPERTY, attempt.as_str()),
        ];
        if let Some(id) = self.msg_id {
            props.push((MSG_ID_PROPERTY, id));
        }
        let key = self
            .msg_id
            .map_or_else(|| format!("{}:{}", queue, r.offset), str::to_owned);
        let timeout = u64::try_from(s.send_timeout.as_millis()).unwrap_or(u64::MAX);
        let mut ending = self.ending.clone();
        let mut tries = 0u32;
        loop {
            let sent = match outgoing(
                &s.dead_letter_topic,
                r.tags.as_deref(),
                &key,
                &r.body,
                &props,
                None,
            ) {
                Ok(m) => s.producer.send_with_timeout(m, timeout).await,
                Err(e) => {
                    tracing::error!(error = %e, "the dead letter cannot be written; the message stays unsettled");
                    return false;
                }
            };
            match sent {
                Ok(Some(res)) if res.send_status == SendStatus::SendOk => return true,
                other => {
                    tries = tries.saturating_add(1);
                    if tries == 1 || tries.is_power_of_two() {
                        tracing::warn!(topic = %s.dead_letter_topic, tries, result = ?other.map(|o| o.map(|r| r.send_status)), "could not write the dead letter; trying again (the message stays unsettled)");
                    }
                }
            }
            if !sleep_unless_ending(&mut ending, DEAD_LETTER_RETRY).await {
                s.stats.count(Counter::SettleFailed);
                return false;
            }
        }
    }
}
