//! Several databases, each holding a slice of the entities: the call, its
//! record and its outbox row always land in the entity's own database.
//!
//! The article's warning for sharded architectures is that "the idempotent
//! record must reside in the same shard as the business data": the check,
//! the mutation and the record are one local transaction only when they
//! are in one database. A record kept in another database than the data it
//! guards commits or rolls back on its own, and then the effect exists
//! without its record (the retry acts twice) or the record without its
//! effect (the retry never acts).
//!
//! [`Shards`] holds one pool per database and a **shard function** from a
//! shard key (an entity id, or any [`KeyPart`]) to the index of its
//! database. Everything that belongs to one entity goes through it:
//!
//! - a call: `handler(shards.source(&entity)?, args…)` runs the whole call
//!   (state check, body, record, cache marker) on the entity's database;
//! - a message for the entity: `shards.begin(&entity)` opens the caller's
//!   transaction there, where the business write and
//!   [`enqueue`](idem_core::outbox::enqueue) commit together;
//! - one relay per shard: [`Shards::relays`] builds one per database, each
//!   delivering its own database's messages into calls on that same
//!   database (so a message must be enqueued in its entity's shard, through
//!   [`Shards::begin`]).
//!
//! The default shard function is a stable 64-bit FNV-1a hash of the key's
//! canonical encoding (the same text a key template writes: `7_i64` and
//! `"7"` are one key), modulo the number of shards. It never changes
//! between releases, since a changed function would move entities away
//! from their records; adding a shard moves entities too, so resharding
//! means moving their rows (records and outbox included) with them.
//! [`Shards::with_function`] takes a function of your own, for a directory
//! lookup or ranges.
//!
//! The same mechanism pins each entity to one node of a multi-master
//! cluster (MariaDB Galera): with one pool per node, every duplicate of an
//! entity's message reaches the same node and waits on the same row lock,
//! where duplicates spread over the nodes would each run their body and
//! lose at certification. A relay's delivery then runs its call on the
//! entity's node with [`Delivery::source_on`](idem_core::outbox::Delivery::source_on).
//!
//! ```
//! use idem_runtime::shard::Shards;
//! use idem_runtime::{idempotent, outbox, CallerTx, Outcome};
//! use sqlx::SqliteConnection;
//!
//! #[derive(serde::Serialize)]
//! struct Award { order_id: i64, customer: i64, points: i64 }
//!
//! #[idempotent(key = "award:{a.order_id}", strategy = record, biz_type = "award")]
//! async fn award(tx: &mut SqliteConnection, a: &Award) -> Result<(), sqlx::Error> {
//!     sqlx::query("UPDATE account SET points = points + ? WHERE customer = ?")
//!         .bind(a.points).bind(a.customer)
//!         .execute(&mut *tx).await?;
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut pools = Vec::new();
//! for _ in 0..3 {
//!     // Three databases (in memory here: one connection each).
//!     let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1)
//!         .connect("sqlite::memory:").await?;
//!     sqlx::query("CREATE TABLE account (customer INTEGER PRIMARY KEY, points INTEGER NOT NULL)")
//!         .execute(&pool).await?;
//!     pools.push(pool);
//! }
//! let shards = Shards::new(pools)?;
//! shards.migrate().await?;
//!
//! let a = Award { order_id: 9, customer: 42, points: 10 };
//! // The customer's row lives in the customer's shard ...
//! sqlx::query("INSERT INTO account VALUES (?, 0)").bind(a.customer)
//!     .execute(shards.pool_for(&a.customer)?).await?;
//! // ... and so do the call, its record, and a retry's duplicate check.
//! assert_eq!(award(shards.source(&a.customer)?, &a).await?, Outcome::Executed(()));
//! assert_eq!(award(shards.source(&a.customer)?, &a).await?, Outcome::Duplicate(Some(())));
//! let points: i64 = sqlx::query_scalar("SELECT points FROM account WHERE customer = 42")
//!     .fetch_one(shards.pool_for(&42)?).await?;
//! assert_eq!(points, 10);
//!
//! // A message about the customer: enqueued beside the customer's data.
//! let mut tx: CallerTx<_> = shards.begin(&a.customer).await?;
//! outbox::enqueue(&mut tx, "award", "order-9", &serde_json::json!({"order_id": 9})).await?;
//! tx.commit().await?;
//! assert_eq!(shards.shard_of(&a.customer)?, shards.shard_of(&"42")?);
//! # Ok(()) }
//! ```

use idem_core::outbox::Relay;
use idem_core::{Backend, CallerTx, Error, KeyPart, Source};
use sqlx::Pool;
use std::fmt;
use std::sync::Arc;

/// The shard function: a key's canonical encoding to a shard index.
type ShardFn = dyn Fn(&str) -> usize + Send + Sync;

/// One pool per database and the function that picks an entity's
/// database. See the [module documentation](self).
///
/// Cloning is cheap (pools are handles).
pub struct Shards<DB: Backend> {
    pools: Vec<Pool<DB>>,
    function: Option<Arc<ShardFn>>,
}

impl<DB: Backend> Clone for Shards<DB> {
    fn clone(&self) -> Self {
        Shards {
            pools: self.pools.clone(),
            function: self.function.clone(),
        }
    }
}

impl<DB: Backend> fmt::Debug for Shards<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shards")
            .field("shards", &self.pools.len())
            .field(
                "function",
                &if self.function.is_some() {
                    "custom"
                } else {
                    "fnv1a64 % shards"
                },
            )
            .finish()
    }
}

impl<DB: Backend> Shards<DB> {
    /// Shards over `pools`, in this order (an entity's shard is an index
    /// into it, so keep the order stable), with the default shard function.
    ///
    /// [`Error::Config`] when `pools` is empty.
    pub fn new(pools: Vec<Pool<DB>>) -> Result<Self, Error> {
        if pools.is_empty() {
            return Err(Error::Config {
                reason: "Shards::new needs at least one pool".into(),
            });
        }
        Ok(Shards {
            pools,
            function: None,
        })
    }

    /// Replaces the shard function: `function` gets the key's canonical
    /// encoding (what a key template writes for it) and returns the index
    /// of its pool. An index out of range is an [`Error::Config`] at the
    /// call that meets it, never a silent remapping.
    ///
    /// ```
    /// # use idem_runtime::shard::Shards;
    /// # fn f(pools: Vec<sqlx::SqlitePool>) -> Result<(), idem_runtime::Error> {
    /// // Customers below 1,000,000 on the first database, the rest on the second.
    /// let shards = Shards::new(pools)?.with_function(|key| {
    ///     usize::from(key.parse::<i64>().map_or(true, |id| id >= 1_000_000))
    /// });
    /// assert_eq!(shards.shard_of(&7)?, 0);
    /// # Ok(()) }
    /// # let _ = f;
    /// ```
    pub fn with_function(
        mut self,
        function: impl Fn(&str) -> usize + Send + Sync + 'static,
    ) -> Self {
        self.function = Some(Arc::new(function));
        self
    }

    /// How many shards there are.
    pub fn len(&self) -> usize {
        self.pools.len()
    }

    /// Always `false`: [`Shards::new`] refuses an empty list.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// Every shard's pool, in shard order.
    pub fn pools(&self) -> &[Pool<DB>] {
        &self.pools
    }

    /// The index of `key`'s shard.
    pub fn shard_of<K: KeyPart + ?Sized>(&self, key: &K) -> Result<usize, Error> {
        let mut text = String::new();
        key.write_key_part(&mut text);
        let n = self.pools.len();
        let index = match &self.function {
            None => {
                // Lossless: the remainder is below n, a usize.
                (fnv1a64(text.as_bytes()) % n as u64) as usize
            }
            Some(f) => f(&text),
        };
        if index < n {
            Ok(index)
        } else {
            Err(Error::Config {
                reason: format!(
                    "the shard function returned {index} for the key {text:?}, \
                     but there are {n} shards (0..{n})"
                ),
            })
        }
    }

    /// The pool of `key`'s shard: for the caller's own reads and writes of
    /// the entity.
    pub fn pool_for<K: KeyPart + ?Sized>(&self, key: &K) -> Result<&Pool<DB>, Error> {
        Ok(&self.pools[self.shard_of(key)?])
    }

    /// The source for a call about `key`'s entity: the call, its record
    /// and its cache marker's database are the entity's.
    pub fn source<K: KeyPart + ?Sized>(&self, key: &K) -> Result<Source<'_, DB>, Error> {
        Ok(Source::from(self.pool_for(key)?))
    }

    /// Begins the caller's transaction on `key`'s shard (see
    /// [`CallerTx`]): the business writes about the entity, the messages
    /// [enqueued](idem_core::outbox::enqueue) for it and the calls made in it
    /// commit together there.
    pub async fn begin<K: KeyPart + ?Sized>(&self, key: &K) -> Result<CallerTx<DB>, Error> {
        CallerTx::begin(self.pool_for(key)?).await
    }

    /// Creates or upgrades idem's tables in every shard, in order; the
    /// first failure stops (and is logged with its shard's index).
    pub async fn migrate(&self) -> Result<(), Error> {
        for (i, pool) in self.pools.iter().enumerate() {
            if let Err(e) = idem_ops::migrate(pool).await {
                tracing::error!(shard = i, error = %format_args!("{e:#}"), "idem: migrating a shard failed");
                return Err(e);
            }
        }
        Ok(())
    }

    /// One relay per shard, each built by `build(shard index, its pool)`
    /// (routes, settings): each drains its own database's outbox into
    /// calls on that database.
    ///
    /// ```no_run
    /// # use idem_runtime::shard::Shards;
    /// # use idem_runtime::outbox::Relay;
    /// # async fn f(shards: Shards<sqlx::Sqlite>) {
    /// let handles: Vec<_> = shards
    ///     .relays(|_, pool| Relay::new(pool).concurrency(4))
    ///     .into_iter()
    ///     .map(Relay::spawn)
    ///     .collect();
    /// # let _ = handles; }
    /// ```
    pub fn relays(&self, mut build: impl FnMut(usize, Pool<DB>) -> Relay<DB>) -> Vec<Relay<DB>> {
        self.pools
            .iter()
            .enumerate()
            .map(|(i, pool)| build(i, pool.clone()))
            .collect()
    }
}

/// 64-bit FNV-1a: small, stable across platforms and releases, and spreads
/// sequential ids evenly.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    fn pools(n: usize) -> Vec<sqlx::SqlitePool> {
        (0..n)
            .map(|_| sqlx::SqlitePool::connect_lazy("sqlite::memory:").expect("lazy pool"))
            .collect()
    }

    #[tokio::test]
    async fn the_default_function_is_stable_and_spreads_ids() {
        let shards = Shards::new(pools(3)).expect("shards");
        // Fixed forever: a change would move entities away from their records.
        let first: Vec<usize> = (1..=12_i64)
            .map(|id| shards.shard_of(&id).unwrap())
            .collect();
        assert_eq!(first, [1, 1, 0, 1, 0, 0, 2, 1, 0, 1, 2, 0]);
        assert_eq!(
            shards.shard_of(&7_i64).unwrap(),
            shards.shard_of("7").unwrap()
        );
        let mut counts = [0usize; 3];
        for id in 0..30_000_i64 {
            counts[shards.shard_of(&id).unwrap()] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }

    #[tokio::test]
    async fn an_index_out_of_range_is_a_config_error() {
        let shards = Shards::new(pools(2)).expect("shards").with_function(|_| 2);
        let e = shards.shard_of(&1).expect_err("out of range");
        assert!(
            matches!(&e, Error::Config { reason } if reason.contains("returned 2")),
            "{e}"
        );
        assert!(shards.source(&1).is_err());
        assert!(matches!(
            Shards::<sqlx::Sqlite>::new(Vec::new()),
            Err(Error::Config { .. })
        ));
    }
}
