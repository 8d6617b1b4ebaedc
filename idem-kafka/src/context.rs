//! What the consumer learns from librdkafka's rebalance callbacks: which
//! partition assignments ended.

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance};
use std::collections::HashMap;
use std::sync::Mutex;

/// The consumer's librdkafka context: an epoch per partition, moved on
/// when the partition is revoked, so that the worker of an assignment
/// that ended stops storing offsets and taking records (the partition's
/// new owner, or this consumer's next assignment of it, starts from the
/// committed offset).
#[derive(Debug, Default)]
pub(crate) struct Ctx {
    epochs: Mutex<HashMap<(String, i32), u64>>,
}

impl Ctx {
    /// The partition's current assignment epoch.
    pub(crate) fn epoch(&self, topic: &str, partition: i32) -> u64 {
        let epochs = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        epochs
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    }
}

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        // A partition the consumer paused (its worker's buffer full) stays
        // paused in librdkafka across a revocation: assigned to this
        // member again, it would never be fetched. Its next worker starts
        // unpaused, and so must the partition.
        let _ = consumer.resume(revoked);
        let mut epochs = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        for e in revoked.elements() {
            *epochs
                .entry((e.topic().to_owned(), e.partition()))
                .or_default() += 1;
        }
        tracing::info!(partitions = revoked.count(), "Kafka partitions revoked");
    }
}
