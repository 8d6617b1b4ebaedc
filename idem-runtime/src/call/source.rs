//! Where a call gets its connection, and the outbox lease that drives it.

use crate::backend::Backend;
use sqlx::Pool;

/// Where a call gets its connection, and which outbox message (if any)
/// drives it.
///
/// A plain `&Pool` converts into a `Source`, so a handler is called as
/// `handler(&pool, args…)`. A relay delivering an outbox message passes
/// [`Source::outbox`] with the delivery's [`OutboxLease`], and the message
/// is marked `success` in the same transaction as the handler's effects.
#[derive(Debug)]
pub struct Source<'a, DB: Backend> {
    pub(crate) pool: &'a Pool<DB>,
    pub(crate) outbox: Option<OutboxLease>,
    #[cfg(feature = "redis")]
    pub(crate) cache: Option<crate::cache::RedisCache>,
}

/// One delivery's hold on one outbox message: the message, its topic, and
/// the lease token the claim wrote (owner and attempt number).
///
/// A call driven by an outbox message ([`Source::outbox`]) first marks the
/// message `success` in its own transaction, fenced by this token: the
/// update must find the message pending, of this topic, and still held by
/// this very claim. Otherwise nothing runs and the call fails:
/// [`Error::LeaseLost`](crate::Error::LeaseLost) (retryable) when another claim took the message
/// over, [`Error::OutboxMessage`](crate::Error::OutboxMessage) (not retryable) when it does not exist,
/// belongs to another topic or is already finished. The row stays locked
/// until the call commits or rolls back, so on PostgreSQL and MariaDB no
/// other relay can claim it meanwhile (claims skip locked rows), however
/// long the handler runs; on SQLite the call's write lock does the same.
///
/// A [`Relay`](crate::outbox::Relay) hands one out with every delivery
/// ([`Delivery::source`](crate::outbox::Delivery::source)); build one by
/// hand only in a relay of your own, from the row your claim returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxLease {
    pub(crate) id: i64,
    pub(crate) topic: String,
    pub(crate) owner: String,
    pub(crate) attempt: i32,
}

impl OutboxLease {
    /// The lease of message `id` of `topic`, claimed by `owner` as attempt
    /// number `attempt` (the row's `lease_owner` and `attempts`).
    pub fn new(id: i64, topic: impl Into<String>, owner: impl Into<String>, attempt: i32) -> Self {
        OutboxLease {
            id,
            topic: topic.into(),
            owner: owner.into(),
            attempt,
        }
    }

    /// The message's primary key.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The message's topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The lease owner (the relay).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The attempt number the claim wrote.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }
}

impl<'a, DB: Backend> Source<'a, DB> {
    /// A call driven by the outbox message that `lease` holds.
    pub fn outbox(pool: &'a Pool<DB>, lease: OutboxLease) -> Self {
        Source {
            outbox: Some(lease),
            ..Source::from(pool)
        }
    }

    /// Puts the Redis front cache in front of the database for this call
    /// (feature `redis`). See [`cache`](crate::cache).
    #[cfg(feature = "redis")]
    pub fn cache(mut self, cache: &crate::cache::RedisCache) -> Self {
        self.cache = Some(cache.clone());
        self
    }
}

impl<'a, DB: Backend> From<&'a Pool<DB>> for Source<'a, DB> {
    fn from(pool: &'a Pool<DB>) -> Self {
        Source {
            pool,
            outbox: None,
            #[cfg(feature = "redis")]
            cache: None,
        }
    }
}
