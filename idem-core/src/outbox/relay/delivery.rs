//! One delivery of an outbox message: what a route's handler gets.

use crate::Source;
use crate::backend::{Backend, OutboxRow};
use crate::call::SharedTx;
use crate::lease::OutboxLease;
use sqlx::Pool;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// One delivery of an outbox message to its handler.
///
/// Its `topic` and `msg_id` can be key parts, so a handler's key never
/// depends on the payload repeating them: take `d: &Delivery<DB>` as a
/// parameter and write `key = "deduct:{d.topic}:{d.msg_id}"`. It
/// serializes as that identity only (`topic`, `msg_id`), so a `record`
/// handler's default fingerprint stays the same from one attempt to the
/// next.
#[derive(Debug)]
pub struct Delivery<DB: Backend> {
    /// The message's topic.
    pub topic: String,
    /// The producer's id of the message, unique within its topic.
    pub msg_id: String,
    pub(super) pool: Pool<DB>,
    pub(super) message: OutboxRow,
    pub(super) lease: OutboxLease,
    /// How many times the handler took its outbox source: once, a
    /// successful handler marked the message itself, and the relay need
    /// not; twice or more is a misuse the relay dead-letters (see
    /// [`source`](Delivery::source)).
    pub(super) takes: Arc<AtomicU32>,
    /// Whether [`source`](Delivery::source) marks the message: false for
    /// a subscriber of a fanned-out topic other than the last one to run
    /// (see [`Relay::subscribe`](super::Relay::subscribe)).
    pub(super) marks: bool,
    /// In a batch ([`Relay::commit_batch`](super::Relay::commit_batch)):
    /// the batch's shared transaction, which [`source`](Delivery::source)
    /// runs the call in.
    pub(super) batch: Option<SharedTx<DB>>,
}

impl<DB: Backend> Clone for Delivery<DB> {
    fn clone(&self) -> Self {
        Delivery {
            topic: self.topic.clone(),
            msg_id: self.msg_id.clone(),
            pool: self.pool.clone(),
            message: self.message.clone(),
            lease: self.lease.clone(),
            takes: self.takes.clone(),
            marks: self.marks,
            batch: self.batch.clone(),
        }
    }
}

impl<DB: Backend> Delivery<DB> {
    pub(super) fn new(
        pool: Pool<DB>,
        message: OutboxRow,
        lease: OutboxLease,
        takes: Arc<AtomicU32>,
    ) -> Self {
        Delivery {
            topic: message.topic.clone(),
            msg_id: message.msg_id.clone(),
            pool,
            message,
            lease,
            takes,
            marks: true,
            batch: None,
        }
    }

    /// Pass this to the handler: its transaction then marks the message,
    /// fenced by this delivery's lease (see [`OutboxLease`]). On a relay
    /// with [`commit_batch`](super::Relay::commit_batch), the call runs
    /// under a savepoint of the batch's transaction, which the relay
    /// commits once for the whole batch.
    ///
    /// **One call per delivery.** The first call marks the message
    /// `success`; a second call on the same delivery would find it no
    /// longer pending. A handler that takes its source twice (two
    /// `#[idempotent]` calls for one message) is a misuse: the relay
    /// dead-letters the message with that reason, whatever the handler
    /// answered, rather than let it end a success with the second effect
    /// missing. To act on one message with several handlers, subscribe
    /// each ([`Relay::subscribe`](super::Relay::subscribe)): each gets a
    /// delivery of its own. A handler that fails after its call committed
    /// has its message retried (the call answers `Duplicate` then).
    pub fn source(&self) -> Source<'_, DB> {
        self.takes.fetch_add(1, Ordering::Relaxed);
        match (&self.batch, self.marks) {
            (Some(shared), true) => Source::outbox_shared(shared.clone(), self.lease.clone()),
            (Some(shared), false) => Source::shared(shared.clone()),
            (None, true) => Source::outbox(&self.pool, self.lease.clone()),
            (None, false) => Source::from(&self.pool),
        }
    }

    /// Like [`source`](Delivery::source), with the call on `pool`: another
    /// pool on **the same database** as the relay's, such as the node of a
    /// multi-master cluster that the message's entity is pinned to (see
    /// `idem_runtime::shard`). A pool on another database finds no such
    /// message, and the call fails with
    /// [`Error::OutboxMessage`](crate::Error::OutboxMessage) before its
    /// body runs.
    pub fn source_on<'p>(&self, pool: &'p Pool<DB>) -> Source<'p, DB> {
        self.takes.fetch_add(1, Ordering::Relaxed);
        match self.marks {
            true => Source::outbox(pool, self.lease.clone()),
            false => Source::from(pool),
        }
    }

    /// A delivery of the same message for a subscriber that does not mark
    /// it (see [`Relay::subscribe`](super::Relay::subscribe)), with a count
    /// of its own.
    pub(super) fn unmarking(&self) -> Self {
        Delivery {
            takes: Arc::new(AtomicU32::new(0)),
            marks: false,
            ..self.clone()
        }
    }

    /// This delivery's hold on its message.
    pub fn lease(&self) -> &OutboxLease {
        &self.lease
    }

    /// The message being delivered.
    pub fn message(&self) -> &OutboxRow {
        &self.message
    }

    /// The message's headers, as enqueued (see
    /// [`EnqueueOptions::header`](crate::outbox::EnqueueOptions::header)).
    ///
    /// ```
    /// # use idem_runtime::{outbox::Relay, Outcome};
    /// # fn f(pool: sqlx::SqlitePool) {
    /// let relay = Relay::new(pool).route("invoice.send", |d, _m: serde_json::Value| async move {
    ///     let tenant = d.header("tenant").unwrap_or("default");
    ///     println!("invoice for {tenant}: {:?}", d.headers());
    ///     Ok(Outcome::Executed(()))
    /// });
    /// # let _ = relay;
    /// # }
    /// ```
    pub fn headers(&self) -> &crate::outbox::Headers {
        &self.message.headers
    }

    /// The header `name`, if the message has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.message.headers.get(name).map(String::as_str)
    }

    /// The message's ordering key, if it was enqueued with one.
    pub fn ordering_key(&self) -> Option<&str> {
        self.message.ordering_key.as_deref()
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

impl<DB: Backend> crate::consume::Incoming for Delivery<DB> {
    fn body(&self) -> &[u8] {
        self.message.payload.as_bytes()
    }
}
