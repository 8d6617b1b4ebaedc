//! Where a call gets its connection, and the outbox lease that drives it.

use crate::backend::Backend;
pub use crate::backend::OutboxLease;
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
