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
//! - Every Redis operation is bounded (default 50 ms); an error or a
//!   time-out falls through to the database path and is counted. Redis
//!   being down slows idem down; it never makes it wrong.
//!
//! ```no_run
//! # async fn f(pool: sqlx::SqlitePool) -> Result<(), idem_runtime::Error> {
//! use idem_runtime::{cache::RedisCache, Source};
//! let cache = RedisCache::new("redis://127.0.0.1:6379/")?;
//! // handler(Source::from(&pool).cache(&cache), &msg).await?;
//! # Ok(()) }
//! ```

use crate::Error;
use redis::AsyncCommands;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Counters of one cache.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Lookups that found a marker (duplicates stopped by the cache).
    pub hits: AtomicU64,
    /// Lookups that found none.
    pub misses: AtomicU64,
    /// Markers written after a commit.
    pub writes: AtomicU64,
    /// Redis errors and time-outs (each fell through to the database).
    pub errors: AtomicU64,
}

enum Conn {
    Single(redis::aio::ConnectionManager),
    Cluster(Box<redis::cluster_async::ClusterConnection>),
}

enum Target {
    Single(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
}

struct Inner {
    target: Target,
    conn: Mutex<Option<Conn>>,
    last_connect_attempt: Mutex<Option<Instant>>,
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
    Error::permanent(format!("invalid Redis configuration: {e}"))
}

impl RedisCache {
    /// A cache on one Redis server (`redis://host:port/db`). Connects
    /// lazily: a server that is down now is retried later, meanwhile every
    /// call takes the database path.
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
                conn: Mutex::new(None),
                last_connect_attempt: Mutex::new(None),
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

    /// How long a marker lives (default 24 h). Past it, the database
    /// answers — correctly, just slower.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.edit(|i| i.ttl = ttl.max(Duration::from_millis(1)))
    }

    /// The bound on every Redis operation (default 50 ms).
    pub fn timeout(self, timeout: Duration) -> Self {
        self.edit(|i| i.timeout = timeout)
    }

    /// The prefix of marker keys (default `idem:`).
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.edit(|i| i.prefix = prefix)
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

    fn error(&self, what: &str, err: &dyn std::fmt::Display) {
        self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("idem_cache_errors_total").increment(1);
        tracing::debug!(error = %err, "redis {what} failed; using the database path");
    }

    /// A connection, (re)connecting at most once a second.
    async fn conn(&self) -> Option<Conn> {
        let mut slot = self.inner.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Some(match c {
                Conn::Single(m) => Conn::Single(m.clone()),
                Conn::Cluster(c) => Conn::Cluster(c.clone()),
            });
        }
        {
            let mut last = self.inner.last_connect_attempt.lock().await;
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return None;
            }
            *last = Some(Instant::now());
        }
        let connect = async {
            match &self.inner.target {
                Target::Single(c) => {
                    let cfg = redis::aio::ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(
                            self.inner.timeout.max(Duration::from_millis(200)),
                        ))
                        .set_response_timeout(Some(self.inner.timeout))
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
        match tokio::time::timeout(self.inner.timeout * 10, connect).await {
            Ok(Ok(c)) => {
                let copy = match &c {
                    Conn::Single(m) => Conn::Single(m.clone()),
                    Conn::Cluster(c) => Conn::Cluster(c.clone()),
                };
                *slot = Some(c);
                Some(copy)
            }
            Ok(Err(e)) => {
                self.error("connect", &e);
                None
            }
            Err(_) => {
                self.error("connect", &"timed out");
                None
            }
        }
    }

    /// The marker of `key` in `scope`, if Redis answers in time and has one.
    pub(crate) async fn get(&self, scope: &str, key: &str) -> Option<String> {
        let conn = self.conn().await?;
        let k = self.marker_key(scope, key);
        let op = async move {
            match conn {
                Conn::Single(mut c) => c.get::<_, Option<String>>(k).await,
                Conn::Cluster(mut c) => c.get::<_, Option<String>>(k).await,
            }
        };
        match tokio::time::timeout(self.inner.timeout, op).await {
            Ok(Ok(Some(v))) => {
                self.inner.stats.hits.fetch_add(1, Ordering::Relaxed);
                Some(v)
            }
            Ok(Ok(None)) => {
                self.inner.stats.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok(Err(e)) => {
                self.error("GET", &e);
                None
            }
            Err(_) => {
                self.error("GET", &"timed out");
                None
            }
        }
    }

    /// Writes the marker of a committed call (`value`: the payload
    /// fingerprint and the stored result for the record strategy, `1`
    /// otherwise).
    pub(crate) async fn put(&self, scope: &str, key: &str, value: &str) {
        let Some(conn) = self.conn().await else {
            return;
        };
        let k = self.marker_key(scope, key);
        let ms = u64::try_from(self.inner.ttl.as_millis()).unwrap_or(u64::MAX);
        let v = value.to_string();
        let op = async move {
            match conn {
                Conn::Single(mut c) => c.pset_ex::<_, _, ()>(k, v, ms).await,
                Conn::Cluster(mut c) => c.pset_ex::<_, _, ()>(k, v, ms).await,
            }
        };
        match tokio::time::timeout(self.inner.timeout, op).await {
            Ok(Ok(())) => {
                self.inner.stats.writes.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => self.error("SET", &e),
            Err(_) => self.error("SET", &"timed out"),
        }
    }
}
