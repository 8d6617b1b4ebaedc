//! What a running consumer's tasks share: its settings, its RocketMQ
//! consumer and producer, and the offsets settled since the last commit.

use super::message::{KeyFrom, Message};
use idem_core::backoff::Backoff;
use idem_core::consume::{self, ConsumerStats};
use rocketmq_client_rust::{DefaultLitePullConsumer, DefaultMQProducer};
use rocketmq_model::message::MessageQueue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, watch};

/// The handler as stored (see [`consume`]).
pub(super) type Handler = consume::Handler<Message>;

/// What the consumer's tasks share.
pub(super) struct Shared {
    pub(super) consumer: DefaultLitePullConsumer,
    /// The producer of dead letters.
    pub(super) producer: DefaultMQProducer,
    pub(super) topic: String,
    pub(super) group: String,
    pub(super) dead_letter_topic: String,
    pub(super) key_from: KeyFrom,
    pub(super) handler: Handler,
    pub(super) max_attempts: u32,
    pub(super) backoff: Backoff,
    pub(super) outage_retry: Duration,
    pub(super) send_timeout: Duration,
    pub(super) commit_interval: Duration,
    pub(super) slots: Arc<Semaphore>,
    /// Messages a queue's worker may hold before the queue is paused.
    pub(super) buffer: usize,
    /// Per queue, the offset to commit next (the last settled message's
    /// plus one), for the queues settled since the last commit.
    pub(super) settled: Mutex<HashMap<MessageQueue, i64>>,
    pub(super) stats: Arc<ConsumerStats>,
}

impl Shared {
    /// Records that every message of `queue` up to `offset` is settled
    /// (a queue's messages are settled one at a time, in offset order).
    pub(super) fn settle(&self, queue: &MessageQueue, offset: i64) {
        let mut s = self.settled.lock().unwrap_or_else(|p| p.into_inner());
        let next = s.entry(queue.clone()).or_insert(offset + 1);
        *next = (*next).max(offset + 1);
    }

    /// Commits the offsets settled since the last commit, to the broker.
    /// The client keeps them for the queues still assigned to this member
    /// only (a queue given to another member in between is its to commit).
    pub(super) async fn commit(&self) {
        let due = std::mem::take(&mut *self.settled.lock().unwrap_or_else(|p| p.into_inner()));
        if due.is_empty() {
            return;
        }
        self.consumer.commit_with_map(due, true).await;
    }
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
