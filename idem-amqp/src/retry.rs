//! A failed attempt republished to the retry queue with its back-off as
//! TTL (see the [module documentation](super)).

use super::fields::long;
use super::worker::{SETTLE_TIMEOUT, Shared};
use super::{ATTEMPTS_HEADER, EXCHANGE_HEADER, ROUTING_KEY_HEADER};
use idem_core::Error;
use idem_core::consume::Counter;
use lapin::BasicProperties;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable};
use std::time::Duration;

impl Shared {
    /// Republishes the delivery to the retry queue with a per-message TTL,
    /// then acks the original. The TTL dead-letters it back to the queue.
    pub(super) async fn retry(&self, d: &AmqpDelivery, attempt: u32, reason: &str) {
        // No jitter: the retry queue expires messages in order (a classic
        // queue only expires its head), so equal delays keep it first-in
        // first-out.
        let delay = self.backoff.delay(attempt);
        let properties = retry_properties(d, attempt, delay);
        let publish = self.retry.publish(
            "",
            &self.retry_queue,
            true,
            &d.data,
            properties,
            SETTLE_TIMEOUT,
        );
        let published = match tokio::time::timeout(SETTLE_TIMEOUT, publish).await {
            Ok(published) => published,
            Err(_) => Err(Error::broker_unavailable(
                "amqp",
                "the retry's publish was not confirmed in time",
            )),
        };
        match published {
            Ok(()) => {
                // The copy in the retry queue and a redelivered original
                // (an ack that did not go through) both reach the
                // idempotent handler: one effect.
                let ack = d.acker.ack(BasicAckOptions::default());
                if self.settled("ack", ack).await {
                    self.stats.count(Counter::Retried);
                    idem_core::consume::count_retry();
                    tracing::info!(%reason, retry_in = ?delay, "AMQP delivery failed; retry scheduled");
                }
            }
            Err(e) => {
                // The retry queue is missing or the broker is failing:
                // requeue in place after the delay (holding one prefetch
                // slot meanwhile). The attempt count does not advance.
                tracing::warn!(%reason, error = %format_args!("{e:#}"), retry_in = ?delay, "could not schedule the retry; requeueing in place");
                tokio::time::sleep(delay).await;
                let nack = d.acker.nack(BasicNackOptions {
                    multiple: false,
                    requeue: true,
                });
                if self.settled("nack", nack).await {
                    self.stats.count(Counter::Retried);
                    idem_core::consume::count_retry();
                }
            }
        }
    }
}

/// the original routing key and exchange, a TTL of `delay`, persistent.
/// Earlier dead-lettering history (`x-death`…) is dropped: the broker adds
/// its own when the TTL expires.
pub(super) fn retry_properties(d: &AmqpDelivery, attempt: u32, delay: Duration) -> BasicProperties {
    let mut headers = FieldTable::default();
    if let Some(old) = d.properties.headers() {
        for (k, v) in old.inner() {
            let k_str = k.as_str();
            if !(k_str.starts_with("x-death")
                || k_str.starts_with("x-first-death")
                || k_str.starts_with("x-last-death"))
            {
                headers.insert(k.clone(), v.clone());
            }
        }
    }
    headers.insert(
        ATTEMPTS_HEADER.into(),
        AMQPValue::LongInt(i32::try_from(attempt).unwrap_or(i32::MAX)),
    );
    if !headers.contains_key(ROUTING_KEY_HEADER) {
        headers.insert(ROUTING_KEY_HEADER.into(), long(d.routing_key.as_str()));
    }
    if !headers.contains_key(EXCHANGE_HEADER) {
        headers.insert(EXCHANGE_HEADER.into(), long(d.exchange.as_str()));
    }
    let ttl_ms = delay.as_millis().max(1).to_string();
    d.properties
        .clone()
        .with_headers(headers)
        .with_expiration(ttl_ms.as_str().into())
        .with_delivery_mode(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::{header, header_str, header_u32};

    #[test]
    fn retry_copy_keeps_origin_and_drops_death_history() {
        let mut h = FieldTable::default();
        h.insert("x-death".into(), AMQPValue::LongInt(1));
        h.insert("trace-id".into(), long("t-1"));
        let mut d = AmqpDelivery::mock(
            1,
            "orders".into(),
            "coupon.deduct".into(),
            false,
            b"{}".to_vec(),
        );
        d.properties = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(h);
        let p = retry_properties(&d, 2, Duration::from_millis(1500));
        assert_eq!(p.expiration().as_ref().map(|s| s.as_str()), Some("1500"));
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("m-1"));
        assert_eq!(header_u32(&p, ATTEMPTS_HEADER), Some(2));
        assert_eq!(
            header_str(&p, ROUTING_KEY_HEADER).as_deref(),
            Some("coupon.deduct")
        );
        assert_eq!(header_str(&p, EXCHANGE_HEADER).as_deref(), Some("orders"));
        assert_eq!(header_str(&p, "trace-id").as_deref(), Some("t-1"));
        assert!(header(&p, "x-death").is_none());
        // A second retry keeps the first origin.
        let mut d2 = AmqpDelivery::mock(2, "".into(), "q".into(), false, b"{}".to_vec());
        d2.properties = p;
        let p2 = retry_properties(&d2, 3, Duration::from_millis(10));
        assert_eq!(
            header_str(&p2, ROUTING_KEY_HEADER).as_deref(),
            Some("coupon.deduct")
        );
        assert_eq!(header_u32(&p2, ATTEMPTS_HEADER), Some(3));
    }
}
