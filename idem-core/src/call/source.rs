//! Where a call gets its connection, and the outbox lease that drives it.

use crate::backend::Backend;
use crate::lease::OutboxLease;
use sqlx::Pool;

/// Where a call gets its connection, and which outbox message (if any)
/// drives it.
///
/// - A plain `&Pool` converts into a `Source`, so a handler is called as
///   `handler(&pool, args…)`: the call begins, and commits, a transaction
///   of its own.
/// - A relay delivering an outbox message passes [`Source::outbox`] with
///   the delivery's [`OutboxLease`], and the message is marked `success` in
///   the same transaction as the handler's effects.
/// - `&mut CallerTx` converts too: the call runs **inside the caller's
///   transaction**, under a savepoint, and the caller commits (see
///   [`CallerTx`](crate::CallerTx)).
#[derive(Debug)]
pub struct Source<'a, DB: Backend> {
    pub(crate) conn: Conn<'a, DB>,
    pub(crate) outbox: Option<OutboxLease>,
    pub(crate) cache: super::front::FrontCache,
}

/// The connection a call runs on.
pub(crate) enum Conn<'a, DB: Backend> {
    /// A transaction of the call's own, begun on this pool.
    Pool(&'a Pool<DB>),
    /// The caller's transaction: the call runs under a savepoint in it.
    Caller(&'a mut crate::CallerTx<DB>),
    /// A relay batch's transaction, shared by the calls of its messages:
    /// locked for the call, which runs under a savepoint in it.
    Shared(super::caller::SharedTx<DB>),
}

impl<DB: Backend> std::fmt::Debug for Conn<'_, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Pool(_) => "Pool",
            Conn::Caller(_) => "Caller",
            Conn::Shared(_) => "Shared",
        })
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

    /// A call driven by the outbox message that `lease` holds, inside a
    /// relay batch's shared transaction.
    pub(crate) fn outbox_shared(shared: super::caller::SharedTx<DB>, lease: OutboxLease) -> Self {
        Source {
            conn: Conn::Shared(shared),
            outbox: Some(lease),
            cache: Default::default(),
        }
    }

    /// A call inside a relay batch's shared transaction driven by no
    /// outbox message (a fanned-out message's subscriber that does not
    /// mark it).
    pub(crate) fn shared(shared: super::caller::SharedTx<DB>) -> Self {
        Source {
            conn: Conn::Shared(shared),
            outbox: None,
            cache: Default::default(),
        }
    }

    /// A call inside `tx`, a transaction the caller holds (the same as
    /// passing `&mut tx` to the handler). See [`CallerTx`](crate::CallerTx).
    pub fn transaction(tx: &'a mut crate::CallerTx<DB>) -> Self {
        Source {
            conn: Conn::Caller(tx),
            outbox: None,
            cache: Default::default(),
        }
    }

    /// Puts a front cache in front of the database for this call: the
    /// Redis one (`idem_runtime::cache::RedisCache`, feature `redis`), or
    /// any [`FrontCache`](crate::front::FrontCache).
    pub fn cache<C: crate::front::FrontCache + Clone>(mut self, cache: &C) -> Self {
        self.cache = super::front::FrontCache::of(std::sync::Arc::new(cache.clone()));
        self
    }
}

impl<'a, DB: Backend> From<&'a Pool<DB>> for Source<'a, DB> {
    fn from(pool: &'a Pool<DB>) -> Self {
        Source {
            conn: Conn::Pool(pool),
            outbox: None,
            cache: Default::default(),
        }
    }
}

impl<'a, DB: Backend> From<&'a mut crate::CallerTx<DB>> for Source<'a, DB> {
    fn from(tx: &'a mut crate::CallerTx<DB>) -> Self {
        Source::transaction(tx)
    }
}
