//! What a running consumer's tasks share: its settings, its librdkafka
//! consumer and producer, and the assignment epochs of its partitions.

use super::context::Ctx;
use super::message::{KeyFrom, Message};
use idem_core::backoff::Backoff;
use idem_core::consume::{self, ConsumerStats};
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::producer::FutureProducer;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Semaphore, watch};

/// The handler as stored (see [`consume`]).
pub(super) type Handler = consume::Handler<Message>;

/// What the consumer's tasks share.
pub(super) struct Shared {
    pub(super) consumer: StreamConsumer<Ctx>,
    /// The producer of retry copies and dead letters.
    pub(super) producer: FutureProducer,
    pub(super) topic: String,
    pub(super) group: String,
    pub(super) retry_topic: Option<String>,
    pub(super) dead_letter_topic: String,
    pub(super) key_from: KeyFrom,
    pub(super) handler: Handler,
    pub(super) max_attempts: u32,
    pub(super) backoff: Backoff,
    pub(super) outage_retry: Duration,
    pub(super) send_timeout: Duration,
    pub(super) slots: Arc<Semaphore>,
    /// Bytes of records a partition's worker may hold before the
    /// partition is paused.
    pub(super) buffer: usize,
    pub(super) stats: Arc<ConsumerStats>,
}

/// The partition a worker runs, and the assignment it runs it for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Tp {
    pub(super) topic: String,
    pub(super) partition: i32,
}

impl Shared {
    pub(super) fn ctx(&self) -> &Ctx {
        self.consumer.context()
    }

    /// Whether the assignment `epoch` of `tp` ended (the partition was
    /// revoked since).
    pub(super) fn stale(&self, tp: &Tp, epoch: u64) -> bool {
        self.ctx().epoch(&tp.topic, tp.partition) != epoch
    }
}

/// Now, in milliseconds since the Unix epoch.
pub(super) fn now_ms() -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}

/// Sleeps `d`; `false` when the consumer is ending.
pub(super) async fn sleep_unless_ending(ending: &mut watch::Receiver<bool>, d: Duration) -> bool {
    if *ending.borrow() {
        return false;
    }
    tokio::select! {
        _ = ending.changed() => false,
        _ = tokio::time::sleep(d) => true,
    }
}
