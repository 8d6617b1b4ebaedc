//! One delivery of an outbox message: what a route's handler gets.

use crate::backend::{Backend, OutboxRow};
use crate::call::SharedTx;
use crate::{OutboxLease, Source};
use sqlx::Pool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One delivery of an outbox message to its handler.
///
/// Its `topic` and `msg_id` can be key parts, so a handler's key never
/// depends on the payload repeating them: take `d: &Delivery<DB>` as a
/// parameter and write `key = "deduct:{d.topic}:{d.msg_id}"`. It
/// serializes as that identity only (`topic`, `msg_id`), so a `record`
/// handler's default fingerprint stays the same from one attempt to the
/// next.
#[derive(Debug, Clone)]
pub struct Delivery<DB: Backend> {
    /// The message's topic.
    pub topic: String,
    /// The producer's id of the message, unique within its topic.
    pub msg_id: String,
    pub(super) pool: Pool<DB>,
    pub(super) message: OutboxRow,
    pub(super) lease: OutboxLease,
    /// Set when the handler took its outbox source: a successful handler
    /// then marked the message itself, and the relay need not.
    pub(super) marked: Arc<AtomicBool>,
    /// In a batch ([`Relay::commit_batch`](super::Relay::commit_batch)):
    /// the batch's shared transaction, which [`source`](Delivery::source)
    /// runs the call in.
    pub(super) batch: Option<SharedTx<DB>>,
}

impl<DB: Backend> Delivery<DB> {
    pub(super) fn new(
        pool: Pool<DB>,
        message: OutboxRow,
        lease: OutboxLease,
        marked: Arc<AtomicBool>,
    ) -> Self {
        Delivery {
            topic: message.topic.clone(),
            msg_id: message.msg_id.clone(),
            pool,
            message,
            lease,
            marked,
            batch: None,
        }
    }

    /// Pass this to the handler: its transaction then marks the message,
    /// fenced by this delivery's lease (see [`OutboxLease`]). On a relay
    /// with [`commit_batch`](super::Relay::commit_batch), the call runs
    /// under a savepoint of the batch's transaction, which the relay
    /// commits once for the whole batch.
    pub fn source(&self) -> Source<'_, DB> {
        self.marked.store(true, Ordering::Relaxed);
        match &self.batch {
            Some(shared) => Source::outbox_shared(shared.clone(), self.lease.clone()),
            None => Source::outbox(&self.pool, self.lease.clone()),
        }
    }

    /// Like [`source`](Delivery::source), with the call on `pool`: another
    /// pool on **the same database** as the relay's, such as the node of a
    /// multi-master cluster that the message's entity is pinned to (see
    /// [`shard`](crate::shard)). A pool on another database finds no such
    /// message, and the call fails with
    /// [`Error::OutboxMessage`](crate::Error::OutboxMessage) before its
    /// body runs.
    pub fn source_on<'p>(&self, pool: &'p Pool<DB>) -> Source<'p, DB> {
        self.marked.store(true, Ordering::Relaxed);
        Source::outbox(pool, self.lease.clone())
    }

    /// This delivery's hold on its message.
    pub fn lease(&self) -> &OutboxLease {
        &self.lease
    }

    /// The message being delivered.
    pub fn message(&self) -> &OutboxRow {
        &self.message
    }

    /// The relay's pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }
}

impl<DB: Backend> serde::Serialize for Delivery<DB> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Delivery", 2)?;
        st.serialize_field("topic", &self.topic)?;
        st.serialize_field("msg_id", &self.msg_id)?;
        st.end()
    }
}
