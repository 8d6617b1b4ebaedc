//! The Redis front cache (cargo feature `redis`): a speed-up in front of the
//! database, never the source of truth.
//!
//! - A marker for a key answers `Duplicate` without a database round trip —
//!   except when an outbox message drives the call, whose status must still
//!   be updated in the database.
//! - Markers are scoped by handler (the record strategy's `biz_type`, else
//!   the handler's name): two handlers fanning out from one message with
//!   the same key template each run once.
//! - A record-strategy marker carries the payload fingerprint with the
//!   stored result: the same key with another payload falls through to the
//!   database, which answers `KeyConflict`. The cache only ever answers
//!   what the database would.
//! - The marker is written only **after** the commit (with a TTL), never
//!   before: a marker left by a rolled-back transaction would skip the
//!   action forever. A call whose commit outcome is unknown writes none.
//! - A marker never outlives its record: a record-strategy marker's TTL is
//!   the least of the cache's [`ttl`](RedisCache::ttl) and what is left of
//!   its record's ttl, read from the record in the call's transaction
//!   (by the database's clock); a record already expired gets none. Once
//!   the archiver moves the record and the database would execute the key
//!   again, no marker answers `Duplicate` for it. Markers of the other
//!   strategies, whose rows do not expire, live the cache's TTL.
//! - Every call to Redis (a lookup, a marker write) is bounded (default
//!   50 ms), waiting for a connection included: connections are made in
//!   the background, one attempt at a time and at most one a second; a
//!   call that finds an attempt under way waits for it within its bound,
//!   one that finds none falls through at once. Once connected, the
//!   connection dials again by itself after Redis restarts (redis-rs's
//!   connection manager); while Redis is down then, each call waits out
//!   its bound (a handler's call makes a lookup and a marker write: up to
//!   twice the bound). An error, a time-out or
//!   no connection falls through to the database path and is counted, per
//!   call ([`CacheStats`]: hits, misses, fall-throughs, errors). Redis
//!   being down slows idem down by at most the bound; it never makes it
//!   wrong.
//!
//! ```no_run
//! # async fn f(pool: sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
//! use idem_runtime::{cache::RedisCache, Source};
//! let cache = RedisCache::new("redis://127.0.0.1:6379/")?;
//! // handler(Source::from(&pool).cache(&cache), &msg).await?;
//! # Ok(()) }
//! ```

use idem_core::Error;
use idem_core::front::{CacheFuture, FrontCache, Marker};
use redis::AsyncCommands;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Counters of one cache. Every lookup is exactly one of a hit, a miss
/// or a fall-through: `hits + misses + fall_throughs` is the number of
/// lookups.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct CacheStats {
    /// Lookups that found a marker (duplicates stopped by the cache).
    /// Metric `idem_cache_hits_total`.
    pub(crate) hits: AtomicU64,
    /// Lookups Redis answered without a marker. Metric
    /// `idem_cache_misses_total`.
    pub(crate) misses: AtomicU64,
    /// Lookups that fell through to the database because of a Redis
    /// error, a time-out or no connection (counted per call, never per
    /// reconnect attempt).
    pub(crate) fall_throughs: AtomicU64,
    /// Markers written after a commit.
    pub(crate) writes: AtomicU64,
    /// Calls (lookups and marker writes) that failed: a Redis error, a
    /// time-out, or no connection. Each lookup among them fell through to
    /// the database; each write left no marker. Metric
    /// `idem_cache_errors_total`.
    pub(crate) errors: AtomicU64,
    /// Background connection attempts that failed or timed out (not
    /// calls: no call waits for more than its bound). Metric
    /// `idem_cache_connect_errors_total`.
    pub(crate) connect_errors: AtomicU64,
}

impl CacheStats {
    /// Lookups that found a marker (duplicates stopped by the cache).
    /// Metric `idem_cache_hits_total`.
    pub fn hits(&self) -> u64 {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lookups Redis answered without a marker. Metric
    /// `idem_cache_misses_total`.
    pub fn misses(&self) -> u64 {
        self.misses.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lookups that fell through to the database because of a Redis
    /// error, a time-out or no connection (counted per call, never per
    /// reconnect attempt).
    pub fn fall_throughs(&self) -> u64 {
        self.fall_throughs
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Markers written after a commit.
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Calls (lookups and marker writes) that failed: a Redis error, a
    /// time-out, or no connection. Each lookup among them fell through to
    /// the database; each write left no marker. Metric
    /// `idem_cache_errors_total`.
    pub fn errors(&self) -> u64 {
        self.errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Background connection attempts that failed or timed out (not
    /// calls: no call waits for more than its bound). Metric
    /// `idem_cache_connect_errors_total`.
    pub fn connect_errors(&self) -> u64 {
        self.connect_errors
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[derive(Clone)]
enum Conn {
    Single(redis::aio::ConnectionManager),
    Cluster(Box<redis::cluster_async::ClusterConnection>),
}

enum Target {
    Single(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// The connection, and whether one is being made. Behind a plain mutex,
/// never held across an `.await`.
#[derive(Default)]
struct Slot {
    conn: Option<Conn>,
    connecting: bool,
    last_attempt: Option<Instant>,
}

/// The least time between two connection attempts.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

struct Inner {
    target: Target,
    slot: Mutex<Slot>,
    /// Woken when a connection attempt ends.
    attempt_done: Notify,
    prefix: String,
    ttl: Duration,
    timeout: Duration,
    stats: CacheStats,
}

/// A Redis (or Redis Cluster) front cache. Cheap to clone.
#[derive(Clone)]
pub struct RedisCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCache")
            .field("prefix", &self.inner.prefix)
            .field("ttl", &self.inner.ttl)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

fn config_error(e: redis::RedisError) -> Error {
    Error::config(format!("invalid Redis configuration: {e}"))
}

impl RedisCache {
    /// A cache on one Redis server (`redis://host:port/db`). Connects
    /// lazily, in the background: a server that is down now is retried at
    /// most once a second, meanwhile every call takes the database path at
    /// once.
    pub fn new(url: &str) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(config_error)?;
        Ok(Self::with_target(Target::Single(client)))
    }

    /// A cache on a Redis Cluster, given some of its nodes.
    pub fn cluster(nodes: &[&str]) -> Result<Self, Error> {
        let client = redis::cluster::ClusterClient::new(nodes.to_vec()).map_err(config_error)?;
        Ok(Self::with_target(Target::Cluster(Box::new(client))))
    }

    fn with_target(target: Target) -> Self {
        RedisCache {
            inner: Arc::new(Inner {
                target,
                slot: Mutex::new(Slot::default()),
                attempt_done: Notify::new(),
                prefix: "idem:".into(),
                ttl: Duration::from_secs(24 * 3600),
                timeout: Duration::from_millis(50),
                stats: CacheStats::default(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        f(Arc::get_mut(&mut self.inner).expect("configure a cache before cloning it"));
        self
    }

    /// How long a marker lives at most (default 24 h). Past it, the
    /// database answers — correctly, just slower. A record-strategy marker
    /// lives no longer than its record: the least of this and what is left
    /// of the record's ttl.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.edit(|i| i.ttl = ttl.max(Duration::from_millis(1)))
    }

    /// The bound on every call to Redis (default 50 ms): a lookup or a
    /// marker write, waiting for a connection included, never takes
    /// longer; past it the call falls through to the database.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.edit(|i| i.timeout = timeout)
    }

    /// The prefix of marker keys (default `idem:`).
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.edit(|i| i.prefix = prefix)
    }

    /// Waits up to `within` for a connection to Redis, starting an attempt
    /// if none is under way (at most one a second); true once connected.
    /// For start-up, so that the first calls find the connection ready:
    /// calls themselves never wait longer than their bound
    /// ([`timeout`](Self::timeout)), and answer from the database meanwhile.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_runtime::Error> {
    /// let cache = idem_runtime::cache::RedisCache::new("redis://127.0.0.1:6379/")?;
    /// if !cache.ready(std::time::Duration::from_secs(5)).await {
    ///     eprintln!("Redis is not reachable yet: calls go to the database");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn ready(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.conn(deadline).await.is_ok() {
                return true;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return false;
            }
            tokio::time::sleep_until(deadline.min(now + Duration::from_millis(50))).await;
        }
    }

    /// The counters.
    pub fn stats(&self) -> &CacheStats {
        &self.inner.stats
    }

    /// The Redis key of an idempotency key's marker: the prefix, the
    /// handler's scope (the record strategy's `biz_type`, else the
    /// handler's name), `|`, the key. Scopes never contain `|`, so two
    /// handlers sharing a key template never share a marker.
    pub fn marker_key(&self, scope: &str, key: &str) -> String {
        format!("{}{scope}|{key}", self.inner.prefix)
    }

    /// A call that failed (`what`: `GET` or `SET`).
    fn error(&self, what: &str, err: &dyn std::fmt::Display) {
        self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
        metrics_cache_error();
        tracing::debug!(error = %format_args!("{err:#}"), "redis {what} failed; using the database path");
    }

    /// A lookup that fell through to the database.
    fn fall_through(&self, err: &dyn std::fmt::Display) {
        self.inner
            .stats
            .fall_throughs
            .fetch_add(1, Ordering::Relaxed);
        self.error("GET", err);
    }

    /// The connection, if there is one by `deadline`. Never connects in
    /// the caller: when there is none it starts a background attempt (at
    /// most one at a time, at most one a second) and waits for that
    /// attempt until `deadline` at the latest; when an attempt is not due
    /// yet it answers `None` at once.
    async fn conn(&self, deadline: tokio::time::Instant) -> Result<Conn, &'static str> {
        let done = {
            let mut slot = self.slot();
            if let Some(c) = &slot.conn {
                return Ok(c.clone());
            }
            if !slot.connecting {
                if slot
                    .last_attempt
                    .is_some_and(|t| t.elapsed() < RECONNECT_EVERY)
                {
                    return Err("not connected (the next attempt is not due yet)");
                }
                slot.connecting = true;
                slot.last_attempt = Some(Instant::now());
                self.spawn_connect();
            }
            // Created under the lock: the attempt's wake-up, sent after it
            // updates the slot under the same lock, cannot be missed.
            self.inner.attempt_done.notified()
        };
        if tokio::time::timeout_at(deadline, done).await.is_err() {
            return Err("timed out waiting for the connection");
        }
        self.slot().conn.clone().ok_or("not connected")
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.inner
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// One connection attempt, in a task of its own: no call waits for
    /// more than its bound, and none waits behind another's reconnect.
    fn spawn_connect(&self) {
        let cache = self.clone();
        tokio::spawn(async move {
            let inner = &cache.inner;
            // Nobody waits for this longer than a call's bound; the attempt
            // may take longer (a slow network), up to a limit.
            let limit = (inner.timeout * 10).max(Duration::from_millis(500));
            let connect = async {
                match &inner.target {
                    Target::Single(c) => {
                        let cfg = redis::aio::ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(limit))
                            .set_response_timeout(Some(inner.timeout))
                            .set_number_of_retries(1);
                        redis::aio::ConnectionManager::new_with_config(c.clone(), cfg)
                            .await
                            .map(Conn::Single)
                    }
                    Target::Cluster(c) => c
                        .get_async_connection()
                        .await
                        .map(|c| Conn::Cluster(Box::new(c))),
                }
            };
            let result = tokio::time::timeout(limit, connect).await;
            let failed = match result {
                Ok(Ok(c)) => {
                    cache.slot().conn = Some(c);
                    None
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("timed out after {limit:?}")),
            };
            if let Some(e) = failed {
                inner.stats.connect_errors.fetch_add(1, Ordering::Relaxed);
                metrics_cache_connect_error();
                tracing::debug!(error = %format_args!("{e:#}"), "redis connection attempt failed");
            }
            {
                let mut slot = cache.slot();
                slot.connecting = false;
            }
            inner.attempt_done.notify_waiters();
        });
    }

    /// The marker of `key` in `scope`, if Redis answers in time and has one.
    async fn lookup(&self, scope: &str, key: &str) -> Option<String> {
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let conn = match self.conn(deadline).await {
            Ok(c) => c,
            Err(e) => {
                self.fall_through(&e);
                return None;
            }
        };
        let k = self.marker_key(scope, key);
        let op = async move {
            match conn {
                Conn::Single(mut c) => c.get::<_, Option<String>>(k).await,
                Conn::Cluster(mut c) => c.get::<_, Option<String>>(k).await,
            }
        };
        match tokio::time::timeout_at(deadline, op).await {
            Ok(Ok(Some(v))) => {
                self.inner.stats.hits.fetch_add(1, Ordering::Relaxed);
                metrics_cache_hit();
                Some(v)
            }
            Ok(Ok(None)) => {
                self.inner.stats.misses.fetch_add(1, Ordering::Relaxed);
                metrics_cache_miss();
                None
            }
            Ok(Err(e)) => {
                self.fall_through(&e);
                None
            }
            Err(_) => {
                self.fall_through(&"timed out");
                None
            }
        }
    }

    /// Writes the marker of a committed call, for the cache's TTL or until
    /// its record expires, whichever comes first; none for a record
    /// already expired.
    async fn store(&self, scope: &str, key: &str, marker: &Marker) {
        let Some(ttl) = marker.ttl(self.inner.ttl, self.inner.timeout) else {
            tracing::debug!("the record has expired; no cache marker");
            return;
        };
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let conn = match self.conn(deadline).await {
            Ok(c) => c,
            Err(e) => return self.error("SET", &e),
        };
        let k = self.marker_key(scope, key);
        // Rounded down: never a millisecond past the record.
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let v = marker.value().to_owned();
        let op = async move {
            match conn {
                Conn::Single(mut c) => c.pset_ex::<_, _, ()>(k, v, ms).await,
                Conn::Cluster(mut c) => c.pset_ex::<_, _, ()>(k, v, ms).await,
            }
        };
        match tokio::time::timeout_at(deadline, op).await {
            Ok(Ok(())) => {
                self.inner.stats.writes.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => self.error("SET", &e),
            Err(_) => self.error("SET", &"timed out"),
        }
    }
}

impl FrontCache for RedisCache {
    fn get<'a>(&'a self, scope: &'a str, key: &'a str) -> CacheFuture<'a, Option<String>> {
        Box::pin(self.lookup(scope, key))
    }

    fn put<'a>(&'a self, scope: &'a str, key: &'a str, marker: &'a Marker) -> CacheFuture<'a, ()> {
        Box::pin(self.store(scope, key, marker))
    }
}

fn metrics_cache_hit() {
    metrics::counter!("idem_cache_hits_total").increment(1);
}

fn metrics_cache_miss() {
    metrics::counter!("idem_cache_misses_total").increment(1);
}

fn metrics_cache_error() {
    metrics::counter!("idem_cache_errors_total").increment(1);
}

fn metrics_cache_connect_error() {
    metrics::counter!("idem_cache_connect_errors_total").increment(1);
}
