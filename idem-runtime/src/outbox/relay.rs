//! The relay: claims due outbox messages under a lease and drives each
//! through the `#[idempotent]` handler registered for its topic.
//!
//! The handler marks its message `success` inside its own transaction
//! (called with [`Delivery::source`]). A failed attempt goes back to
//! `pending` with exponential back-off and jitter and its error recorded; a
//! non-retryable error, an unparsable payload, or the last allowed attempt
//! dead-letters it (`failed`, with the reason). Failure bookkeeping is
//! guarded by status and lease owner, so it never overwrites a success —
//! not even after a commit whose acknowledgement was lost. A crashed
//! relay's messages come back when their lease expires.

use crate::archive::RetentionPolicy;
use crate::backend::{Backend, ClaimSql, OutboxRow};
use crate::backoff::Backoff;
use crate::task::{BoxFuture, TaskHandle};
use crate::{Error, OutboxLease, Outcome, Source};
use serde::de::DeserializeOwned;
use sqlx::Pool;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

type Route<DB> = Arc<
    dyn Fn(Delivery<DB>) -> Result<BoxFuture<Result<bool, Error>>, serde_json::Error> + Send + Sync,
>;

/// One delivery of an outbox message to its handler.
#[derive(Debug, Clone)]
pub struct Delivery<DB: Backend> {
    pool: Pool<DB>,
    message: OutboxRow,
    lease: OutboxLease,
    /// Set when the handler took its outbox source: a successful handler
    /// then marked the message itself, and the relay need not.
    marked: Arc<AtomicBool>,
}

impl<DB: Backend> Delivery<DB> {
    /// Pass this to the handler: its transaction then marks the message,
    /// fenced by this delivery's lease (see [`OutboxLease`]).
    pub fn source(&self) -> Source<'_, DB> {
        self.marked.store(true, Ordering::Relaxed);
        Source::outbox(&self.pool, self.lease.clone())
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

/// A relay's settings (see [`Relay::settings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelaySettings {
    /// The most messages claimed per round (never more than free slots).
    pub batch_size: u32,
    /// Handlers running at once.
    pub concurrency: usize,
    /// How long a claim holds a message.
    pub lease: Duration,
    /// How long to wait when nothing is due.
    pub poll_interval: Duration,
    /// Attempts before a message is dead-lettered.
    pub max_attempts: u32,
    /// Back-off after the first failed attempt.
    pub backoff_base: Duration,
    /// The longest back-off.
    pub backoff_max: Duration,
}

/// Counters of one relay, since it started.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Messages claimed (each claim is one attempt).
    pub claimed: AtomicU64,
    /// Attempts whose handler executed the action.
    pub executed: AtomicU64,
    /// Attempts answered `Duplicate`: the action had already happened.
    pub duplicates: AtomicU64,
    /// Failed attempts put back for a retry.
    pub retried: AtomicU64,
    /// Messages dead-lettered (`failed`).
    pub dead_lettered: AtomicU64,
    /// Failed attempts whose bookkeeping found the message no longer
    /// pending under this relay's lease (already a success, or re-leased).
    pub stale: AtomicU64,
}

/// A relay for the topics routed on it. Cheap to clone.
pub struct Relay<DB: Backend> {
    inner: Arc<Inner<DB>>,
}

impl<DB: Backend> Clone for Relay<DB> {
    fn clone(&self) -> Self {
        Relay {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<DB: Backend> {
    pool: Pool<DB>,
    routes: HashMap<String, Route<DB>>,
    topics: Vec<String>,
    claim: ClaimSql,
    owner: String,
    batch_size: i64,
    concurrency: usize,
    lease: Duration,
    poll_interval: Duration,
    max_attempts: i32,
    backoff: Backoff,
    stats: RelayStats,
}

impl<DB: Backend> fmt::Debug for Relay<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("backend", &<DB as Backend>::NAME)
            .field("owner", &self.inner.owner)
            .field("topics", &self.inner.topics)
            .field("settings", &self.settings())
            .field("stats", &self.inner.stats)
            .finish()
    }
}

impl<DB: Backend> Relay<DB> {
    /// A relay on `pool` with no routes and the default settings: batches of
    /// 64, 16 handlers at once, 30 s lease, 100 ms poll, 10 attempts,
    /// back-off from 200 ms doubling to 60 s.
    pub fn new(pool: Pool<DB>) -> Self {
        let owner = format!(
            "relay-{}-{:08x}",
            std::process::id(),
            std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now())
                as u32
        );
        Relay {
            inner: Arc::new(Inner {
                claim: DB::pool_dialect(&pool).claim_sql(0),
                pool,
                routes: HashMap::new(),
                topics: Vec::new(),
                owner,
                batch_size: 64,
                concurrency: 16,
                lease: Duration::from_secs(30),
                poll_interval: Duration::from_millis(100),
                max_attempts: 10,
                backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(60)),
                stats: RelayStats::default(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Inner<DB>)) -> Self {
        f(Arc::get_mut(&mut self.inner).expect("configure a relay before cloning or spawning it"));
        self
    }

    /// Routes `topic` to `handler`. The payload is parsed as `P`; a payload
    /// that does not parse is dead-lettered at once.
    ///
    /// ```no_run
    /// # use idem_runtime::{idempotent, outbox::Relay};
    /// # use sqlx::{Sqlite, Transaction};
    /// # #[derive(serde::Deserialize)] struct Deduct { msg_id: String }
    /// # #[idempotent(key = "d:{m.msg_id}", strategy = unique_insert, constraint = "deduction.msg_id")]
    /// # async fn deduct(tx: &mut Transaction<'_, Sqlite>, m: &Deduct) -> Result<(), sqlx::Error> { Ok(()) }
    /// # async fn f(pool: sqlx::SqlitePool) {
    /// let relay = Relay::new(pool)
    ///     .route("coupon.deduct", |d, m: Deduct| async move { deduct(d.source(), &m).await })
    ///     .spawn();
    /// // …
    /// relay.shutdown().await;
    /// # }
    /// ```
    pub fn route<P, F, Fut, T>(self, topic: impl Into<String>, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Delivery<DB>, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error>> + Send + 'static,
        T: Send + 'static,
    {
        let topic = topic.into();
        let route: Route<DB> = Arc::new(move |d: Delivery<DB>| {
            let payload: P = serde_json::from_str(&d.message.payload)?;
            let fut = handler(d, payload);
            Ok(Box::pin(async move { fut.await.map(|o| o.is_executed()) }) as BoxFuture<_>)
        });
        self.edit(|i| {
            i.routes.insert(topic.clone(), route);
            i.topics = i.routes.keys().cloned().collect();
            i.topics.sort();
            i.claim = DB::pool_dialect(&i.pool).claim_sql(i.topics.len());
        })
    }

    /// The most messages claimed per round (default 64); a round never
    /// claims more than the free handler slots (see
    /// [`concurrency`](Relay::concurrency)), so that no claimed message
    /// waits out its lease in a queue.
    pub fn batch_size(self, n: u32) -> Self {
        self.edit(|i| i.batch_size = i64::from(n.max(1)))
    }

    /// Handlers running at once (default 16).
    pub fn concurrency(self, n: usize) -> Self {
        self.edit(|i| i.concurrency = n.max(1))
    }

    /// How long a claim holds a message (default 30 s). A relay that dies
    /// lets its messages go when their lease expires. While a handler
    /// runs, the relay renews its message's lease every third of it (the
    /// heartbeat), so a handler slower than its lease is not run twice; a
    /// handler given [`Delivery::source`] also holds its message's row
    /// locked from its first statement, which claims skip.
    pub fn lease(self, d: Duration) -> Self {
        self.edit(|i| i.lease = d)
    }

    /// How long to wait when nothing is due (default 100 ms).
    pub fn poll_interval(self, d: Duration) -> Self {
        self.edit(|i| i.poll_interval = d)
    }

    /// Attempts before a message is dead-lettered (default 10).
    pub fn max_attempts(self, n: u32) -> Self {
        self.edit(|i| i.max_attempts = i32::try_from(n.max(1)).unwrap_or(i32::MAX))
    }

    /// Back-off after the first failed attempt, doubling up to `max`.
    pub fn backoff(self, base: Duration, max: Duration) -> Self {
        self.edit(|i| i.backoff = Backoff::new(base, max))
    }

    /// The lease owner name (default `relay-<pid>-<random>`); unique per
    /// relay.
    pub fn owner(self, owner: impl Into<String>) -> Self {
        let owner = owner.into();
        self.edit(|i| i.owner = owner)
    }

    /// The counters.
    pub fn stats(&self) -> &RelayStats {
        &self.inner.stats
    }

    /// The relay's settings, as configured.
    pub fn settings(&self) -> RelaySettings {
        let i = &self.inner;
        RelaySettings {
            batch_size: u32::try_from(i.batch_size).unwrap_or(u32::MAX),
            concurrency: i.concurrency,
            lease: i.lease,
            poll_interval: i.poll_interval,
            max_attempts: u32::try_from(i.max_attempts).unwrap_or(1),
            backoff_base: i.backoff.base,
            backoff_max: i.backoff.max,
        }
    }

    /// The retention policy of records written by this relay's handlers:
    /// their `ttl` (`record_ttl`) against this relay's retry horizon plus
    /// `broker_redelivery_allowance` (how late a broker, a callback sender
    /// or a relay outage can still bring a duplicate). Call
    /// [`RetentionPolicy::check`] on it at start-up.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    /// use idem_runtime::outbox::Relay;
    /// use std::time::Duration;
    /// let relay = Relay::new(pool).max_attempts(10).lease(Duration::from_secs(30));
    /// let day = Duration::from_secs(86_400);
    /// assert!(relay.retention_policy(7 * day, day).check().is_ok());
    /// assert!(relay.retention_policy(Duration::from_secs(60), day).check().is_err());
    /// # }
    /// ```
    pub fn retention_policy(
        &self,
        record_ttl: Duration,
        broker_redelivery_allowance: Duration,
    ) -> RetentionPolicy {
        let s = self.settings();
        RetentionPolicy {
            record_ttl,
            outbox_max_attempts: s.max_attempts,
            backoff_base: s.backoff_base,
            backoff_max: s.backoff_max,
            lease: s.lease,
            broker_redelivery_allowance,
        }
    }

    /// Claims one batch (at most `concurrency` messages: no more than can
    /// start at once) and runs it to the end. Returns how many messages it
    /// claimed (0: nothing was due).
    pub async fn run_once(&self) -> Result<usize, Error> {
        let batch = self.claim_up_to(self.inner.concurrency as i64).await?;
        let n = batch.len();
        let permits = Arc::new(Semaphore::new(self.inner.concurrency));
        let mut tasks = JoinSet::new();
        for row in batch {
            let permit = permits.clone().acquire_owned().await.expect("never closed");
            let me = self.clone();
            tasks.spawn(async move {
                me.deliver(row).await;
                drop(permit);
            });
        }
        while tasks.join_next().await.is_some() {}
        Ok(n)
    }

    /// Runs the relay as a tokio task until [`RelayHandle::shutdown`].
    pub fn spawn(self) -> RelayHandle {
        RelayHandle {
            task: TaskHandle::spawn(|stop| self.clone().run(stop)),
            relay: self.inner.stats_owner(),
        }
    }

    async fn run(self, mut stop: watch::Receiver<bool>) {
        let permits = Arc::new(Semaphore::new(self.inner.concurrency));
        let mut tasks = JoinSet::new();
        while !*stop.borrow() {
            while tasks.try_join_next().is_some() {}
            if permits.available_permits() == 0 {
                tokio::select! {
                    _ = tasks.join_next() => {}
                    changed = stop.changed() => if changed.is_err() { break },
                }
                continue;
            }
            // Only as many as can start now: a claimed message waiting for
            // a handler slot would spend its lease in the queue, expire and
            // run twice.
            let free = permits.available_permits() as i64;
            let batch = match self.claim_up_to(free).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox claim failed; retrying after the poll interval");
                    Vec::new()
                }
            };
            if batch.is_empty() {
                tokio::select! {
                    _ = tokio::time::sleep(self.inner.poll_interval) => {}
                    // A dropped handle stops the relay like a shutdown.
                    changed = stop.changed() => if changed.is_err() { break },
                }
                continue;
            }
            for row in batch {
                let permit = permits.clone().acquire_owned().await.expect("never closed");
                let me = self.clone();
                tasks.spawn(async move {
                    me.deliver(row).await;
                    drop(permit);
                });
            }
        }
        // Graceful shutdown: claim nothing more, finish what is in flight.
        while tasks.join_next().await.is_some() {}
    }

    async fn claim_up_to(&self, n: i64) -> Result<Vec<OutboxRow>, Error> {
        let i = &self.inner;
        if i.topics.is_empty() {
            return Ok(Vec::new());
        }
        let rows = DB::claim_outbox(
            &i.pool,
            &i.claim,
            &i.owner,
            &i.topics,
            n.min(i.batch_size),
            i.lease.as_secs_f64(),
        )
        .await?;
        i.stats
            .claimed
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        Ok(rows)
    }

    /// One attempt of one message, and its bookkeeping.
    async fn deliver(&self, row: OutboxRow) {
        let i = &self.inner;
        let (id, attempts) = (row.id, row.attempts);
        let span = tracing::info_span!("outbox_delivery", id, topic = %row.topic, msg_id = %row.msg_id, attempts);
        let Some(route) = i.routes.get(&row.topic).cloned() else {
            // Not claimable: claims filter on the routed topics.
            return;
        };
        let marked = Arc::new(AtomicBool::new(false));
        let lease = OutboxLease::new(id, row.topic.clone(), i.owner.clone(), attempts);
        let delivery = Delivery {
            pool: i.pool.clone(),
            message: row,
            lease: lease.clone(),
            marked: marked.clone(),
        };
        let result = match route(delivery) {
            Err(e) => Err((false, format!("unparsable payload: {e}"))),
            // A panicking handler is a failed attempt, not a dead relay.
            Ok(fut) => match self.heartbeat(id, tokio::spawn(fut), &span).await {
                Ok(Ok(executed)) => Ok(executed),
                Ok(Err(e)) => Err((e.is_retryable(), format!("{}: {e}", e.kind()))),
                Err(join) => Err((true, format!("handler panicked: {join}"))),
            },
        };
        match result {
            Ok(executed) => {
                let counter = if executed {
                    &i.stats.executed
                } else {
                    &i.stats.duplicates
                };
                counter.fetch_add(1, Ordering::Relaxed);
                // A handler given its outbox source marked the message in
                // its own transaction; for any other, the relay marks it.
                if !marked.load(Ordering::Relaxed) {
                    match DB::outbox_success_pool(&i.pool, &lease).await {
                        Ok(1) => {}
                        Ok(_) => {
                            i.stats.stale.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(parent: &span, "outbox message no longer held by this delivery; its current holder settles it");
                        }
                        Err(e) => {
                            tracing::warn!(parent: &span, error = %e, "could not confirm outbox success; the lease will expire and the retry will be a duplicate");
                        }
                    }
                }
            }
            Err((retryable, reason)) => {
                let dead = !retryable || attempts >= i.max_attempts;
                let reason = if dead && retryable {
                    format!("gave up after {attempts} attempts: {reason}")
                } else {
                    reason
                };
                let attempt = u32::try_from(attempts).unwrap_or(0);
                let delay = i.backoff.jittered(attempt, id);
                let reason: String = reason.chars().take(2000).collect();
                match DB::outbox_settle_failure(
                    &i.pool,
                    id,
                    &i.owner,
                    attempts,
                    dead,
                    delay.as_secs_f64(),
                    &reason,
                )
                .await
                {
                    Ok(true) if dead => {
                        i.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                        crate::metrics::outbox_dead_letter();
                        tracing::warn!(parent: &span, %reason, "outbox message dead-lettered");
                    }
                    Ok(true) => {
                        i.stats.retried.fetch_add(1, Ordering::Relaxed);
                        crate::metrics::outbox_retry();
                        tracing::info!(parent: &span, %reason, retry_in = ?delay, "outbox attempt failed; will retry");
                    }
                    Ok(false) => {
                        i.stats.stale.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        // The lease expires and the message is retried.
                        tracing::warn!(parent: &span, error = %e, "could not record the failed attempt");
                    }
                }
            }
        }
    }
}

impl<DB: Backend> Relay<DB> {
    /// Waits for a running handler, renewing its message's lease every
    /// third of the lease meanwhile.
    async fn heartbeat<T>(
        &self,
        id: i64,
        mut handler: tokio::task::JoinHandle<T>,
        span: &tracing::Span,
    ) -> Result<T, tokio::task::JoinError> {
        let i = &self.inner;
        let every = (i.lease / 3).max(Duration::from_millis(10));
        loop {
            tokio::select! {
                done = &mut handler => return done,
                _ = tokio::time::sleep(every) => {
                    match DB::renew_leases(&i.pool, &i.owner, &[id], i.lease.as_secs_f64()).await {
                        Ok(n) => crate::metrics::lease_renewals(n),
                        Err(e) => tracing::warn!(parent: span, error = %e, "could not renew the lease of a running handler"),
                    }
                }
            }
        }
    }
}

impl<DB: Backend> Inner<DB> {
    fn stats_owner(self: &Arc<Self>) -> Arc<dyn StatsView> {
        self.clone()
    }
}

trait StatsView: Send + Sync {
    fn stats(&self) -> &RelayStats;
}

impl<DB: Backend> StatsView for Inner<DB> {
    fn stats(&self) -> &RelayStats {
        &self.stats
    }
}

/// A running relay. Dropping it stops the relay as
/// [`shutdown`](Self::shutdown) does, without waiting.
#[must_use = "dropping the handle stops the relay"]
pub struct RelayHandle {
    task: TaskHandle<()>,
    relay: Arc<dyn StatsView>,
}

impl fmt::Debug for RelayHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayHandle")
            .field("task", &self.task)
            .field("stats", self.relay.stats())
            .finish()
    }
}

impl RelayHandle {
    /// Stops claiming, waits for the messages in flight, and returns.
    pub async fn shutdown(self) {
        let _ = self.task.shutdown().await;
    }

    /// The relay's counters.
    pub fn stats(&self) -> &RelayStats {
        self.relay.stats()
    }
}
