//! Where a call gets its connection, and the outbox lease that drives it.

use crate::backend::Backend;
pub use crate::backend::OutboxLease;
use sqlx::{Pool, Transaction};

/// Where a call gets its connection, and which outbox message (if any)
/// drives it.
///
/// - A plain `&Pool` converts into a `Source`, so a handler is called as
///   `handler(&pool, args…)`: the call begins, and commits, a transaction
///   of its own.
/// - A relay delivering an outbox message passes [`Source::outbox`] with
///   the delivery's [`OutboxLease`], and the message is marked `success` in
///   the same transaction as the handler's effects.
/// - `&mut Transaction` converts too: the call runs **inside the caller's
///   transaction**, under a savepoint, and the caller commits (see
///   [`Source::transaction`]).
#[derive(Debug)]
pub struct Source<'a, DB: Backend> {
    pub(crate) conn: Conn<'a, DB>,
    pub(crate) outbox: Option<OutboxLease>,
    #[cfg(feature = "redis")]
    pub(crate) cache: Option<crate::cache::RedisCache>,
}

/// The connection a call runs on.
pub(crate) enum Conn<'a, DB: Backend> {
    /// A transaction of the call's own, begun on this pool.
    Pool(&'a Pool<DB>),
    /// The caller's open transaction (its connection): the call runs under
    /// a savepoint in it.
    Caller(&'a mut DB::Connection),
}

impl<DB: Backend> std::fmt::Debug for Conn<'_, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Pool(_) => "Pool",
            Conn::Caller(_) => "Caller",
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

    /// A call inside `tx`, a transaction the caller holds (the same as
    /// `Source::from(tx)`, or passing `&mut tx` to the handler).
    ///
    /// The guard, the body and the bookkeeping run in `tx` under a
    /// savepoint: on success the savepoint is released and the call's
    /// effects commit — or roll back — with the caller's own writes, when
    /// the caller ends `tx`. On any error (and when the call's future is
    /// dropped before it finishes) the call rolls back to its savepoint,
    /// so `tx` is left as it was before the call and stays usable.
    ///
    /// What the call answers is only as durable as the caller's commit:
    /// `Executed` means "executed in `tx`". The front cache, if given, is
    /// read but never written (idem does not see the commit), and a failed
    /// commit is the caller's to handle. On SQLite begin `tx` with
    /// `BEGIN IMMEDIATE` (`pool.begin_with("BEGIN IMMEDIATE")`): a deferred
    /// transaction that reads first fails with "database is locked" when a
    /// concurrent writer got there between its read and its write.
    ///
    /// ```
    /// use idem_runtime::{idempotent, Outcome};
    /// use sqlx::SqliteConnection;
    ///
    /// #[derive(serde::Serialize)]
    /// struct Welcome { user_id: i64 }
    ///
    /// #[idempotent(key = "welcome:{w.user_id}", strategy = record, biz_type = "welcome")]
    /// async fn send_welcome(tx: &mut SqliteConnection, w: &Welcome) -> Result<(), sqlx::Error> {
    ///     sqlx::query("INSERT INTO mail (user_id) VALUES (?)").bind(w.user_id).execute(&mut *tx).await?;
    ///     Ok(())
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// idem_runtime::migrate(&pool).await?;
    /// sqlx::query("CREATE TABLE users (id INTEGER PRIMARY KEY)").execute(&pool).await?;
    /// sqlx::query("CREATE TABLE mail (user_id INTEGER)").execute(&pool).await?;
    ///
    /// // The caller's own write and the handler's effect commit together.
    /// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    /// sqlx::query("INSERT INTO users (id) VALUES (7)").execute(&mut *tx).await?;
    /// assert!(send_welcome(&mut tx, &Welcome { user_id: 7 }).await?.is_executed());
    /// tx.commit().await?;
    ///
    /// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    /// assert_eq!(send_welcome(&mut tx, &Welcome { user_id: 7 }).await?, Outcome::Duplicate(Some(())));
    /// tx.commit().await?;
    /// let mails: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM mail").fetch_one(&pool).await?;
    /// assert_eq!(mails, 1);
    /// # Ok(()) }
    /// ```
    pub fn transaction<'t>(tx: &'a mut Transaction<'t, DB>) -> Self {
        Source {
            conn: Conn::Caller(&mut **tx),
            outbox: None,
            #[cfg(feature = "redis")]
            cache: None,
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
            conn: Conn::Pool(pool),
            outbox: None,
            #[cfg(feature = "redis")]
            cache: None,
        }
    }
}

impl<'a, 't, DB: Backend> From<&'a mut Transaction<'t, DB>> for Source<'a, DB> {
    fn from(tx: &'a mut Transaction<'t, DB>) -> Self {
        Source::transaction(tx)
    }
}
