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
//!
//! Every claim writes a lease owner of its own (the relay's owner, `#`,
//! and a sequence number starting at random), so the rows one claim
//! leased are told apart from any other claim's, this relay's included.
//! When a claim's commit fails with the outcome unknown (a lost
//! acknowledgement), the relay reads back, on a fresh connection, the rows
//! still pending under that claim's owner with their lease running: found,
//! the commit landed, and they are delivered as claimed (no attempt
//! burnt, no lease waited out); not found, it did not, and they are due
//! as before. No lease token `(id, owner, attempts)` is ever delivered
//! twice: a claim's rows are delivered either from its statement (commit
//! acknowledged) or from its read-back (outcome unknown), never both, and
//! no other claim writes that owner.
//!
//! **Claim spread.** Relays on the nodes of a multi-primary cluster
//! (MariaDB Galera) do not see each other's row locks: `SKIP LOCKED` skips
//! only the rows locked on the same node, so relays that all claim the
//! oldest due rows collide, and all but one of the colliding claims fail
//! certification at commit (MariaDB 1213). While there is a backlog (the
//! relay's previous claim filled its limit), each claim therefore starts
//! at a random one of the first [`claim_spread`](Relay::claim_spread)
//! slices of the due set (`OFFSET k·limit`, `k` in `0..spread`), and
//! claims from the oldest again when that slice is empty. Order stays
//! oldest-first within that window; with no backlog every claim takes the
//! oldest rows, in one statement. Overlaps stay safe whatever the spread:
//! the lease fencing settles each attempt once.
//!
//! **Claim conflicts.** A claim rolled back by a conflict with a
//! concurrent transaction (a deadlock, a serialization failure, a Galera
//! certification failure) is claimed again at once, after a jitter of a
//! few milliseconds (at most three times in a row, then
//! after the poll interval), logged at debug and counted in
//! [`RelayStats::claim_conflicts`].
//!
//! **Push wake-up.** On PostgreSQL, [`enqueue`](crate::outbox::enqueue)
//! notifies [`NOTIFY_CHANNEL`](crate::outbox::NOTIFY_CHANNEL) on commit,
//! and a relay with [`push_wakeup`](Relay::push_wakeup) (the default there
//! outside transaction-pooling mode) listens on a connection of its own
//! and claims at once when a message for one of its topics is committed,
//! instead of at its next poll. Polling stays: a lost notification (a
//! listener reconnecting, a producer with
//! [`notify_on_enqueue`](crate::outbox::notify_on_enqueue) off) only
//! delays a message to the next poll, never loses it.

mod attempt;
mod batch;
mod delivery;
mod handle;
mod progress;
mod wake;

pub use delivery::Delivery;
pub use handle::{RelayHandle, RelayStats, RelayStatsSnapshot};
pub use progress::{Settled, Settlement};
pub use wake::LISTENER_APP;

use crate::archive::RetentionPolicy;
use crate::backend::{Backend, ClaimError, ClaimSql, Claimed, OutboxRow};
use crate::backoff::Backoff;
use crate::consume;
use crate::task::TaskHandle;
use crate::{Error, Outcome};
use serde::de::DeserializeOwned;
use sqlx::Pool;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;

/// The waits before each read-back of a claim whose commit outcome is
/// unknown (a fresh connection each time).
const RECOVERY_WAITS: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_millis(20),
    Duration::from_millis(100),
    Duration::from_millis(400),
];

/// How many times in a row a claim that lost a conflict (see the module
/// documentation) is retried at once before the relay waits out its poll
/// interval.
const CONFLICT_RETRIES: u32 = 3;

/// The default [`Relay::claim_spread`].
const DEFAULT_SPREAD: u32 = 8;

/// One claim's rows, and the lease owner that claim wrote.
struct Batch {
    owner: Arc<str>,
    rows: Vec<OutboxRow>,
}

/// What one claim produced.
enum Round {
    /// Rows to deliver.
    Claimed(Batch),
    /// A claim whose commit outcome is unknown, to read back.
    Lost {
        owner: Arc<str>,
        chosen: Claimed,
        error: sqlx::Error,
    },
}

type Route<DB> = consume::Handler<Delivery<DB>>;

/// A fanned-out topic's subscriber: its name and its handler.
type Subscriber<DB> = consume::Subscriber<Delivery<DB>>;

/// The shortest lease with which a relay claims messages ahead of its free
/// handler slots (see [`Relay::batch_size`]).
const AHEAD_MIN_LEASE: Duration = Duration::from_secs(1);

/// A relay's settings (see [`Relay::settings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelaySettings {
    /// The most messages claimed per round (see [`Relay::batch_size`]).
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
    /// Slices of the due set a claim may start at (1: always the oldest).
    pub claim_spread: u32,
    /// Messages whose handlers share one commit (1: one commit each; see
    /// [`Relay::commit_batch`]).
    pub commit_batch: usize,
    /// Whether a spawned relay listens for enqueues (see
    /// [`Relay::pushes`]).
    pub push_wakeup: bool,
}

/// What a [`Relay::drain`] did.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct DrainReport {
    /// Rounds that claimed messages.
    pub rounds: u64,
    /// How long it took.
    pub elapsed: Duration,
    /// What the relay counted meanwhile.
    pub stats: RelayStatsSnapshot,
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
    /// The subscribers of each fanned-out topic, in the order subscribed
    /// (see [`Relay::subscribe`]); its route in `routes` runs them all.
    subscribers: HashMap<String, Vec<Subscriber<DB>>>,
    topics: Vec<String>,
    claim: ClaimSql,
    owner: String,
    /// The next claim's sequence number (see [`Inner::claim_owner`]).
    claims: AtomicU64,
    /// Whether a claim whose commit outcome is unknown is read back.
    recover_claims: bool,
    /// See [`Relay::claim_spread`].
    claim_spread: u32,
    /// Whether the last claim filled its limit (a backlog: spread the
    /// next one).
    backlog: AtomicBool,
    batch_size: i64,
    /// See [`Relay::commit_batch`] (1: off).
    commit_batch: usize,
    /// The batch size in force now, shrunk under contention (see
    /// [`Relay::commit_batch`]).
    adaptive: batch::Adaptive,
    concurrency: usize,
    lease: Duration,
    poll_interval: Duration,
    max_attempts: i32,
    backoff: Backoff,
    /// See [`Relay::push_wakeup`]: `None` for the default.
    push_wakeup: Option<bool>,
    /// See [`Relay::listener_catch_up`].
    listener_catch_up: bool,
    /// See [`Relay::on_settled`].
    on_settled: Option<progress::Hook>,
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
    /// The longest relay owner name ([`Relay::owner`]): the lease owner
    /// column holds 64 characters, and each claim appends `#` and up to 16
    /// hex digits.
    pub const MAX_OWNER_LEN: usize = 47;

    /// A relay on `pool` with no routes and the default settings: batches of
    /// 64, 16 handlers at once, 30 s lease, 100 ms poll, 10 attempts,
    /// back-off from 200 ms doubling to 60 s.
    pub fn new(pool: Pool<DB>) -> Self {
        let seed = std::collections::hash_map::RandomState::new()
            .hash_one((std::process::id(), std::time::SystemTime::now()));
        let owner = format!("relay-{}-{:08x}", std::process::id(), seed as u32);
        Relay {
            inner: Arc::new(Inner {
                claim: DB::pool_dialect(&pool).claim_sql(0),
                pool,
                routes: HashMap::new(),
                subscribers: HashMap::new(),
                topics: Vec::new(),
                owner,
                // Random: a restarted relay of the same name never writes
                // a lease owner its previous run wrote.
                claims: AtomicU64::new(seed.rotate_left(32)),
                recover_claims: true,
                claim_spread: DEFAULT_SPREAD,
                backlog: AtomicBool::new(true),
                batch_size: 64,
                commit_batch: 1,
                adaptive: batch::Adaptive::default(),
                concurrency: 16,
                lease: Duration::from_secs(30),
                poll_interval: Duration::from_millis(100),
                max_attempts: 10,
                backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(60)),
                push_wakeup: None,
                listener_catch_up: true,
                on_settled: None,
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
    ///
    /// # Panics
    /// When `topic` is routed already (by `route` or
    /// [`subscribe`](Relay::subscribe)): a second route would silently
    /// replace the first, whose handler would then never run. To run
    /// several handlers for one message, subscribe each.
    pub fn route<P, F, Fut, T>(self, topic: impl Into<String>, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Delivery<DB>, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error>> + Send + 'static,
        T: Send + 'static,
    {
        let topic = topic.into();
        let route = consume::handler(handler);
        self.edit(|i| {
            assert!(
                !i.routes.contains_key(&topic),
                "outbox topic `{topic}` is routed twice on one relay: the second route would \
                 replace the first. To run several handlers for one message, give each its own \
                 subscription with Relay::subscribe(topic, name, handler)"
            );
            i.routes.insert(topic, route);
            i.routed();
        })
    }

    /// Subscribes `handler`, named `name`, to `topic`: **one message, several
    /// handlers** (fan-out). Each subscriber of a topic gets every message
    /// of it, in a [`Delivery`] of its own, and acts once in its own scope
    /// (its `biz_type`, state machine or constraint: the subscribers'
    /// keys must not meet).
    ///
    /// The subscribers of a message run one after the other, in the order
    /// subscribed, each call in a transaction of its own (in the batch's,
    /// under a savepoint of its own, with [`commit_batch`](Relay::commit_batch)).
    /// The last one to run marks the message `success` in its transaction
    /// if every one before it ended well; otherwise the message is
    /// retried (back-off, dead letter, as for a single handler) and, on
    /// the next attempt, the subscribers that had acted answer
    /// `Duplicate` while the failed one acts. A subscriber that fails does
    /// not stop the others of the same attempt. The failure recorded names
    /// the subscriber.
    ///
    /// ```no_run
    /// # use idem_runtime::{idempotent, outbox::Relay};
    /// # use sqlx::{Sqlite, Transaction};
    /// # #[derive(serde::Deserialize, serde::Serialize)] struct OrderCreated { order_id: i64 }
    /// # #[idempotent(key = "stock:{o.order_id}", strategy = record, biz_type = "reserve_stock")]
    /// # async fn reserve_stock(tx: &mut Transaction<'_, Sqlite>, o: &OrderCreated) -> Result<(), sqlx::Error> { Ok(()) }
    /// # #[idempotent(key = "mail:{o.order_id}", strategy = record, biz_type = "order_mail")]
    /// # async fn send_email(tx: &mut Transaction<'_, Sqlite>, o: &OrderCreated) -> Result<(), sqlx::Error> { Ok(()) }
    /// # async fn f(pool: sqlx::SqlitePool) {
    /// let relay = Relay::new(pool)
    ///     .subscribe("order.created", "reserve_stock", |d, o: OrderCreated| async move {
    ///         reserve_stock(d.source(), &o).await
    ///     })
    ///     .subscribe("order.created", "send_email", |d, o: OrderCreated| async move {
    ///         send_email(d.source(), &o).await
    ///     })
    ///     .spawn();
    /// # relay.shutdown().await;
    /// # }
    /// ```
    ///
    /// # Panics
    /// When `topic` has a [`route`](Relay::route), or a subscriber of that
    /// `name` already.
    pub fn subscribe<P, F, Fut, T>(
        self,
        topic: impl Into<String>,
        name: impl Into<String>,
        handler: F,
    ) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(Delivery<DB>, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error>> + Send + 'static,
        T: Send + 'static,
    {
        let (topic, name) = (topic.into(), name.into());
        let route = consume::handler(handler);
        self.edit(|i| {
            let subs = i.subscribers.entry(topic.clone()).or_default();
            assert!(
                !subs.is_empty() || !i.routes.contains_key(&topic),
                "outbox topic `{topic}` has a route already: subscribe every handler of a \
                 fanned-out topic with Relay::subscribe, none with Relay::route"
            );
            consume::add(subs, &format!("outbox topic `{topic}`"), name, route);
            let fanned = consume::fan_out(subs.clone(), hand);
            i.routes.insert(topic, fanned);
            i.routed();
        })
    }

    /// The most messages claimed per round (default 64). With no backlog a
    /// round claims at most the free handler slots (see
    /// [`concurrency`](Relay::concurrency)); while there is one (and the
    /// lease is a second or longer), up to as many more as there are
    /// slots, so that the next messages are at hand when the running ones
    /// end. Those wait for a slot with their leases
    /// renewed every third of a lease: no claimed message waits out its
    /// lease in the queue.
    pub fn batch_size(self, n: u32) -> Self {
        self.edit(|i| i.batch_size = i64::from(n.max(1)))
    }

    /// Batched commits (default 1: off): with `n ≥ 2`, the messages of a
    /// claim are delivered in batches of up to `n`, each batch's handlers
    /// one after the other in **one** transaction, each under a savepoint
    /// of its own, and the batch commits once: one commit (one WAL flush)
    /// for `n` messages instead of `n`. Each batch takes one handler slot
    /// per message (see [`concurrency`](Relay::concurrency)): to run
    /// batches side by side, set the concurrency to a multiple of `n`.
    ///
    /// Handlers must run their call on [`Delivery::source`], which runs it
    /// in the batch's transaction; a handler that fails (or panics) rolls
    /// back to its savepoint, the batch goes on, and its failure is
    /// recorded after the batch's commit (back-off, dead letter) as
    /// without batching.
    ///
    /// **Trusted batches.** Once four batches in a row committed cleanly
    /// (no call failed, no conflict), the relay runs its batches without
    /// the savepoints: one statement less per message, and on PostgreSQL
    /// no subtransaction per call (more than 64 in one transaction slow
    /// down every snapshot on the server). A call that fails (or is
    /// cancelled) in such a batch undoes the whole batch: nothing of it
    /// commits, its messages are delivered again one by one at once (no
    /// attempt burnt, the failing one fails alone), and batches take
    /// savepoints again until four in a row commit cleanly. The batch's transaction holds its messages' rows
    /// locked until it ends, so no other relay takes them however long it
    /// lasts. A lost acknowledgement of the batch's commit is read back
    /// per message. On SQLite the batch holds the write lock throughout: a
    /// handler writing on its own connection instead of its source waits
    /// for it (and times out). See the module `batch.rs` for the details.
    ///
    /// **Contention (hot rows).** A batch holds every row its handlers
    /// wrote until it commits, so batches whose handlers all update one
    /// shared row (a stock counter) wait for each other, and two batches
    /// that take shared rows in different orders deadlock. When a batch's
    /// transaction fails with a conflict (a deadlock, a serialization
    /// failure, a lock-wait time-out: PostgreSQL `40P01`, `40001`, `55P03`;
    /// MariaDB/MySQL `1213`, `1205`, `1020`, `1614`), nothing of it
    /// committed: its messages are delivered again one by one **at once**
    /// (no back-off, no attempt burnt), and the batch size is halved; each
    /// batch that commits cleanly grows it by one again, up to `n`
    /// (additive increase, multiplicative decrease).
    /// [`commit_batch_now`](Relay::commit_batch_now) is the size in force.
    ///
    /// **Lock order.** A batch first locks its messages' outbox rows in
    /// message-id order (its lease renewal), then runs its handlers in
    /// message-id order, each taking its own rows. To keep batches from
    /// deadlocking, handlers should take shared rows (counters, balances)
    /// **last**, after the rows of their own message, and several shared
    /// rows always in one order (by key).
    pub fn commit_batch(self, n: usize) -> Self {
        self.edit(|i| i.commit_batch = n.max(1))
    }

    /// The batch size in force now: [`commit_batch`](Relay::commit_batch)'s
    /// `n`, less while batches meet contention (see there).
    pub fn commit_batch_now(&self) -> usize {
        self.inner.adaptive.limit(self.inner.commit_batch)
    }

    /// How many times contention halved the batch size (see
    /// [`commit_batch`](Relay::commit_batch)).
    pub fn commit_batch_shrinks(&self) -> u64 {
        self.inner.adaptive.shrinks()
    }

    /// Calls `hook` after each attempt of a message is settled, with what
    /// came of it: to drive a progress bar, feed a dashboard or count
    /// outcomes per topic. It runs on the relay's task, after the
    /// attempt's bookkeeping: keep it quick (an atomic add, a channel
    /// send). Each message has exactly one [final](Settlement::is_final)
    /// settlement, so counting those counts messages done. The same event
    /// is logged at `DEBUG` (target `idem_runtime::outbox::relay`), with
    /// the message's span.
    ///
    /// ```
    /// use idem_runtime::outbox::Relay;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    ///
    /// # async fn f(pool: sqlx::SqlitePool) {
    /// let done = Arc::new(AtomicU64::new(0));
    /// let seen = done.clone();
    /// let relay = Relay::new(pool).on_settled(move |s| {
    ///     if s.settlement.is_final() {
    ///         seen.fetch_add(1, Ordering::Relaxed);
    ///     }
    /// });
    /// # let _ = relay;
    /// # }
    /// ```
    pub fn on_settled(self, hook: impl Fn(&Settled<'_>) + Send + Sync + 'static) -> Self {
        let hook: progress::Hook = Arc::new(hook);
        self.edit(|i| i.on_settled = Some(hook))
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
    /// relay. Each claim writes it followed by `#` and a sequence number
    /// (`relay-a#1f3c…`), so a claim whose acknowledgement is lost can be
    /// read back exactly.
    ///
    /// A name longer than [`Relay::MAX_OWNER_LEN`] bytes is shortened to
    /// fit: its first 38 bytes (at a character boundary), `~`, and 8 hex
    /// digits of a SHA-256 of the whole name, so two long names that share
    /// a prefix stay two owners.
    pub fn owner(self, owner: impl Into<String>) -> Self {
        let owner = fit_owner(owner.into());
        self.edit(|i| i.owner = owner)
    }

    /// How many slices of the due set a claim may start at while there is
    /// a backlog (default 8; 1 or 0: every claim takes the oldest due
    /// rows). A claim of `limit` rows skips `k·limit` due rows, `k` drawn
    /// at random in `0..n` on each claim, and takes the oldest ones when
    /// nothing is left past that offset.
    ///
    /// For relays on several nodes of a multi-primary cluster (MariaDB
    /// Galera), which do not see each other's row locks: without the
    /// spread they all claim the same oldest rows and all but one of them
    /// fail certification. On a single server it costs nothing measurable
    /// (`SKIP LOCKED` already keeps relays apart) and only loosens the
    /// oldest-first order to within `n` claims. See the module
    /// documentation.
    pub fn claim_spread(self, n: u32) -> Self {
        self.edit(|i| i.claim_spread = n.max(1))
    }

    /// Whether a claim whose commit outcome is unknown is read back and
    /// delivered at once (default: yes). Off, its messages wait out their
    /// lease, as they did before claim recovery: for tests showing the
    /// difference.
    #[doc(hidden)]
    pub fn claim_recovery(self, on: bool) -> Self {
        self.edit(|i| i.recover_claims = on)
    }

    /// Whether the spawned relay listens for
    /// [`NOTIFY_CHANNEL`](crate::outbox::NOTIFY_CHANNEL) notifications and
    /// claims as soon as a message for one of its topics is committed,
    /// rather than at its next poll (see the module documentation).
    ///
    /// Default: on for PostgreSQL (the native backend, and `sqlx::Any` on
    /// a `postgres://` URL with idem's `any` and `postgres` features),
    /// unless [transaction-pooling mode](crate::pooler) is on — `LISTEN`
    /// is session state, which a pooler in transaction mode does not keep.
    /// A no-op on MariaDB and SQLite, which only poll. `true` in
    /// transaction-pooling mode is for a pool that reaches the server
    /// directly (the mode is process-wide).
    ///
    /// The listener holds one connection of its own (application name
    /// [`LISTENER_APP`]`:<owner>`), opened with the pool's connect options, and
    /// stops with [`RelayHandle::shutdown`]. A lost connection is
    /// reconnected with back-off, polling covering the gap
    /// ([`RelayStats::listener_failures`]). Only a spawned relay listens:
    /// [`run_once`](Relay::run_once) claims once and returns.
    pub fn push_wakeup(self, on: bool) -> Self {
        self.edit(|i| i.push_wakeup = Some(on))
    }

    /// Whether the relay claims once each time its listener (re)connects,
    /// for the messages enqueued while nobody listened (default: yes).
    /// Off, those wait for the next poll: for tests showing the
    /// difference.
    #[doc(hidden)]
    pub fn listener_catch_up(self, on: bool) -> Self {
        self.edit(|i| i.listener_catch_up = on)
    }

    /// Whether a spawned relay will listen (see [`push_wakeup`](Relay::push_wakeup)):
    /// its setting or the default, and a PostgreSQL pool.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use idem_runtime::outbox::Relay;
    /// let sqlite = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    /// assert!(!Relay::new(sqlite).push_wakeup(true).pushes(), "SQLite only polls");
    /// # #[cfg(feature = "postgres")] {
    /// let pg = sqlx::PgPool::connect_lazy("postgres://localhost/app").unwrap();
    /// assert!(Relay::new(pg.clone()).pushes());
    /// assert!(!Relay::new(pg.clone()).push_wakeup(false).pushes());
    /// idem_runtime::pooler::transaction_mode(true);
    /// assert!(!Relay::new(pg.clone()).pushes(), "no LISTEN through a transaction-mode pooler");
    /// assert!(Relay::new(pg).push_wakeup(true).pushes());
    /// # idem_runtime::pooler::transaction_mode(false);
    /// # }
    /// # }
    /// ```
    pub fn pushes(&self) -> bool {
        let i = &self.inner;
        crate::backend::Dialect::Postgres == DB::pool_dialect(&i.pool)
            && i.push_wakeup
                .unwrap_or_else(|| !crate::pooler::transaction_mode_enabled())
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
            claim_spread: i.claim_spread,
            commit_batch: i.commit_batch,
            push_wakeup: self.pushes(),
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
        let n = batch.rows.len();
        if self.inner.commit_batch >= 2 {
            self.deliver_batches(batch.rows, batch.owner).await;
            return Ok(n);
        }
        let permits = Arc::new(Semaphore::new(self.inner.concurrency));
        let mut tasks = JoinSet::new();
        for row in batch.rows {
            let permit = permits.clone().acquire_owned().await.expect("never closed");
            let (me, owner) = (self.clone(), batch.owner.clone());
            tasks.spawn(async move {
                me.deliver(row, owner).await;
                drop(permit);
            });
        }
        while tasks.join_next().await.is_some() {}
        Ok(n)
    }

    /// Runs rounds ([`run_once`](Relay::run_once)) until one claims
    /// nothing (nothing is due: a message waiting out its back-off is not),
    /// and reports what they did: for a script, a test or a one-off job
    /// that must empty the outbox before it goes on, instead of polling
    /// `idem_outbox`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # idem_runtime::migrate(&pool).await?;
    /// use idem_runtime::{outbox::{enqueue, Relay}, Outcome};
    /// let mut tx = pool.begin().await?;
    /// for n in 0..3 {
    ///     enqueue(&mut tx, "report.daily", &format!("day-{n}"), &serde_json::json!(n)).await?;
    /// }
    /// tx.commit().await?;
    /// let relay = Relay::new(pool.clone())
    ///     .route("report.daily", |_d, _n: u32| async { Ok(Outcome::Executed(())) });
    /// let report = relay.drain().await?;
    /// assert_eq!((report.stats.claimed, report.stats.executed), (3, 3));
    /// println!("{}", serde_json::to_string(&report.stats)?);
    /// # Ok(()) }
    /// ```
    pub async fn drain(&self) -> Result<DrainReport, Error> {
        let start = std::time::Instant::now();
        let before = self.inner.stats.snapshot();
        let mut rounds = 0;
        while self.run_once().await? > 0 {
            rounds += 1;
        }
        Ok(DrainReport {
            rounds,
            elapsed: start.elapsed(),
            stats: self.inner.stats.snapshot().since(&before),
        })
    }

    /// Runs the relay as a tokio task until [`RelayHandle::shutdown`].
    pub fn spawn(self) -> RelayHandle {
        RelayHandle {
            task: TaskHandle::spawn(|stop| self.clone().run(stop)),
            relay: self.inner.stats_owner(),
        }
    }

    async fn run(self, mut stop: watch::Receiver<bool>) {
        // Woken by the listener (push wake-up); a wake-up while the relay
        // is busy is kept as Notify's one permit.
        let wake = Arc::new(Notify::new());
        let listener = match self.pushes() && !self.inner.topics.is_empty() {
            true => wake::spawn_listener(
                &self.inner.pool,
                wake::Listen {
                    owner: &self.inner.owner,
                    catch_up: self.inner.listener_catch_up,
                },
                &self.inner.topics,
                wake.clone(),
                stop.clone(),
                self.inner.stats_owner(),
            ),
            false => None,
        };
        let permits = Arc::new(Semaphore::new(self.inner.concurrency));
        let mut tasks = JoinSet::new();
        // While there is a backlog, a claim waits for this many free slots
        // rather than taking one message each time a handler ends: a claim
        // is a transaction of its own, and one per message would cost as
        // much as the handlers' own. (With no backlog, a claim takes what
        // is free at once: a lone message does not wait.)
        let refill = (self
            .inner
            .concurrency
            .min(self.inner.batch_size.max(1) as usize)
            / 2)
        .max(1);
        // And, while there is a backlog, it claims up to as many messages
        // more than the free slots as there are slots: the next ones are
        // at hand when the running ones end, instead of their slots idling
        // through a claim (which takes about as long as a handler). They
        // wait for a slot with their leases renewed (see `queued`).
        // Measured (`bench_outbox`, 16 handlers): handler slots busy 53%
        // of the time claiming only free slots, 71% with half the slots
        // ahead, 86% with all.
        let waiting = Arc::new(AtomicUsize::new(0));
        while !*stop.borrow() {
            while tasks.try_join_next().is_some() {}
            let backlog = self.inner.backlog.load(Ordering::Relaxed);
            // Not with leases under a second: between two renewals of a
            // queued message, another relay would take it over (and a
            // short-leased relay claiming ahead mostly feeds the others).
            let ahead = match backlog && self.inner.lease >= AHEAD_MIN_LEASE {
                true => self.inner.concurrency,
                false => 0,
            };
            let room = (permits.available_permits() + ahead)
                .saturating_sub(waiting.load(Ordering::Relaxed));
            let starved = backlog && room < refill && !tasks.is_empty();
            if room == 0 || starved {
                tokio::select! {
                    _ = tasks.join_next() => {}
                    changed = stop.changed() => if changed.is_err() { break },
                }
                continue;
            }
            // A batched claim takes all its slots at once: never more
            // than there are.
            let room = match self.inner.commit_batch >= 2 {
                true => room.min(self.inner.concurrency),
                false => room,
            };
            let batch: Vec<_> = match self.claim_round(room as i64).await {
                Ok(Round::Claimed(b)) => b.rows.into_iter().map(|r| (r, b.owner.clone())).collect(),
                Ok(Round::Lost {
                    owner,
                    chosen,
                    error,
                }) => {
                    // Read back beside the claim loop; what is read back
                    // waits for its slots as a claimed message does.
                    let n = chosen.rows.len();
                    let me = self.clone();
                    let permits = permits.clone();
                    waiting.fetch_add(n, Ordering::Relaxed);
                    let waiting = waiting.clone();
                    tasks.spawn(async move {
                        let Ok(batch) = me.recover(owner, chosen, error).await else {
                            waiting.fetch_sub(n, Ordering::Relaxed);
                            return;
                        };
                        waiting.fetch_sub(n - batch.rows.len().min(n), Ordering::Relaxed);
                        me.deliver_claimed(batch, permits, waiting).await;
                    });
                    continue;
                }
                Err(e) if crate::error::find_sqlx(&e).is_some_and(crate::error::is_conflict) => {
                    tracing::debug!(error = %e, retries = CONFLICT_RETRIES, "outbox claim kept losing conflicts; claiming again after the poll interval");
                    Vec::new()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "outbox claim failed; retrying after the poll interval");
                    Vec::new()
                }
            };
            if batch.is_empty() {
                tokio::select! {
                    _ = tokio::time::sleep(self.inner.poll_interval) => {}
                    _ = wake.notified() => {}
                    // A dropped handle stops the relay like a shutdown.
                    changed = stop.changed() => if changed.is_err() { break },
                }
                continue;
            }
            if self.inner.commit_batch >= 2 {
                // One claim: one owner. A slot per message, as below.
                let slots = u32::try_from(batch.len()).unwrap_or(u32::MAX);
                let owner = batch[0].1.clone();
                let rows: Vec<OutboxRow> = batch.into_iter().map(|(row, _)| row).collect();
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                let me = self.clone();
                let permits = permits.clone();
                waiting.fetch_add(rows.len(), Ordering::Relaxed);
                let waiting = waiting.clone();
                tasks.spawn(async move {
                    let reserved = me
                        .queued(permits.acquire_many_owned(slots), &owner, &ids)
                        .await;
                    waiting.fetch_sub(ids.len(), Ordering::Relaxed);
                    me.deliver_batches(rows, owner).await;
                    drop(reserved);
                });
                continue;
            }
            for (row, owner) in batch {
                let me = self.clone();
                let permits = permits.clone();
                waiting.fetch_add(1, Ordering::Relaxed);
                let waiting = waiting.clone();
                tasks.spawn(async move {
                    // At once when a slot is free, as it is for all but
                    // the claim's `ahead` messages.
                    let permit = match permits.clone().try_acquire_owned() {
                        Ok(p) => p,
                        Err(_) => me.queued(permits.acquire_owned(), &owner, &[row.id]).await,
                    };
                    waiting.fetch_sub(1, Ordering::Relaxed);
                    me.deliver(row, owner).await;
                    drop(permit);
                });
            }
        }
        // Graceful shutdown: claim nothing more, finish what is in flight.
        while tasks.join_next().await.is_some() {}
        // The listener saw the same stop signal.
        if let Some(listener) = listener {
            let _ = listener.await;
        }
    }

    /// Delivers a read-back claim's messages (counted in `waiting` until
    /// each has its slot): batched, all at once when their slots are free
    /// (a batched claim is never larger than the slots); otherwise each as
    /// soon as it has a slot.
    async fn deliver_claimed(
        &self,
        batch: Batch,
        permits: Arc<Semaphore>,
        waiting: Arc<AtomicUsize>,
    ) {
        let n = batch.rows.len();
        if self.inner.commit_batch >= 2 {
            let slots = u32::try_from(n).unwrap_or(u32::MAX);
            let ids: Vec<i64> = batch.rows.iter().map(|r| r.id).collect();
            let reserved = self
                .queued(permits.acquire_many_owned(slots), &batch.owner, &ids)
                .await;
            waiting.fetch_sub(n, Ordering::Relaxed);
            self.deliver_batches(batch.rows, batch.owner).await;
            drop(reserved);
            return;
        }
        let mut deliveries = JoinSet::new();
        for row in batch.rows {
            let (me, owner) = (self.clone(), batch.owner.clone());
            let (permits, waiting) = (permits.clone(), waiting.clone());
            deliveries.spawn(async move {
                let permit = me.queued(permits.acquire_owned(), &owner, &[row.id]).await;
                waiting.fetch_sub(1, Ordering::Relaxed);
                me.deliver(row, owner).await;
                drop(permit);
            });
        }
        while deliveries.join_next().await.is_some() {}
    }

    /// Waits for `slot` (handler slots for claimed messages `ids`),
    /// renewing the messages' leases every third of a lease meanwhile: a
    /// message claimed ahead of a free slot (see `run`) never waits out its
    /// lease in the queue, however slow the running handlers are.
    async fn queued<P>(
        &self,
        slot: impl Future<Output = Result<P, tokio::sync::AcquireError>>,
        owner: &str,
        ids: &[i64],
    ) -> P {
        let i = &self.inner;
        let every = (i.lease / 3).max(Duration::from_millis(10));
        tokio::pin!(slot);
        loop {
            tokio::select! {
                got = &mut slot => return got.expect("never closed"),
                _ = tokio::time::sleep(every) => {
                    #[cfg(feature = "testing")]
                    if crate::testing::broken_queued_renewal() {
                        continue;
                    }
                    match DB::renew_leases(&i.pool, owner, ids, i.lease.as_secs_f64()).await {
                        Ok(n) => crate::metrics::lease_renewals(n),
                        Err(e) => tracing::warn!(error = %e, messages = ids.len(), "could not renew the leases of messages waiting for a handler slot"),
                    }
                }
            }
        }
    }

    /// Claims up to `n` messages, reading back a claim whose commit
    /// outcome is unknown before it returns.
    async fn claim_up_to(&self, n: i64) -> Result<Batch, Error> {
        match self.claim_round(n).await? {
            Round::Claimed(batch) => Ok(batch),
            Round::Lost {
                owner,
                chosen,
                error,
            } => self.recover(owner, chosen, error).await,
        }
    }

    /// Claims up to `n` messages: at a spread offset while there is a
    /// backlog, again at once (after a few milliseconds of jitter) when
    /// the claim lost a conflict, at most `CONFLICT_RETRIES` times.
    async fn claim_round(&self, n: i64) -> Result<Round, Error> {
        let i = &self.inner;
        let limit = n.min(i.batch_size);
        let mut conflicts = 0;
        loop {
            let owner: Arc<str> = i.claim_owner().into();
            if i.topics.is_empty() {
                return Ok(Round::Claimed(Batch {
                    owner,
                    rows: Vec::new(),
                }));
            }
            let offset = i.spread_offset(limit);
            let mut claimed = self.claim_at(&owner, limit, offset).await;
            if offset > 0 && matches!(&claimed, Ok(c) if c.rows.is_empty()) {
                // The due set ends before the offset: from the oldest.
                claimed = self.claim_at(&owner, limit, 0).await;
            }
            // A claim's `at` is taken after it: a claim can take a message
            // only once its previous holder's last write has committed
            // (whose `at` is taken before it), and on SQLite the claim
            // waits for the write lock inside its statement.
            let at = trace_now!();
            match claimed {
                Ok(claimed) => {
                    trace_claim(&claimed.rows, &owner, "ok", None, at);
                    i.backlog
                        .store(claimed.rows.len() as i64 >= limit, Ordering::Relaxed);
                    return Ok(Round::Claimed(self.counted(owner, claimed)));
                }
                Err(ClaimError::Failed(e)) if crate::error::is_conflict(&e) => {
                    i.stats.claim_conflicts.fetch_add(1, Ordering::Relaxed);
                    if conflicts >= CONFLICT_RETRIES {
                        return Err(e.into());
                    }
                    conflicts += 1;
                    let jitter = Duration::from_micros(500 + random() % 4_500);
                    tracing::debug!(
                        error = %e,
                        offset,
                        retry = conflicts,
                        retry_in = ?jitter,
                        "outbox claim lost a conflict with a concurrent claim; claiming again"
                    );
                    tokio::time::sleep(jitter).await;
                }
                Err(ClaimError::Failed(e)) => return Err(e.into()),
                Err(ClaimError::CommitUnknown { error, chosen }) => {
                    trace_claim(&chosen.rows, &owner, "lost_ack", None, at);
                    i.stats.lost_claims.fetch_add(1, Ordering::Relaxed);
                    if !i.recover_claims {
                        return Err(Error::CommitUnknown(error));
                    }
                    return Ok(Round::Lost {
                        owner,
                        chosen,
                        error,
                    });
                }
            }
        }
    }

    /// One claim statement of up to `limit` rows, skipping `offset` due
    /// rows.
    async fn claim_at(&self, owner: &str, limit: i64, offset: i64) -> Result<Claimed, ClaimError> {
        let i = &self.inner;
        DB::claim_outbox(
            &i.pool,
            &i.claim,
            owner,
            &i.topics,
            limit,
            offset,
            i.lease.as_secs_f64(),
        )
        .await
    }

    /// The rows of a claim by `owner`, counted.
    fn counted(&self, owner: Arc<str>, claimed: Claimed) -> Batch {
        let stats = &self.inner.stats;
        stats
            .claimed
            .fetch_add(claimed.rows.len() as u64, Ordering::Relaxed);
        stats
            .reclaimed
            .fetch_add(claimed.reclaimed as u64, Ordering::Relaxed);
        Batch {
            owner,
            rows: claimed.rows,
        }
    }

    /// Reads back the rows a claim by `owner` whose commit failed with
    /// `error` (outcome unknown) leased, if it landed; a few quick tries,
    /// each on a fresh connection.
    async fn recover(
        &self,
        owner: Arc<str>,
        chosen: Claimed,
        mut error: sqlx::Error,
    ) -> Result<Batch, Error> {
        let i = &self.inner;
        let ids: Vec<i64> = chosen.rows.iter().map(|r| r.id).collect();
        for wait in RECOVERY_WAITS {
            tokio::time::sleep(wait).await;
            match DB::recover_claim(&i.pool, &owner, &ids).await {
                Ok(rows) => {
                    trace_claim(&chosen.rows, &owner, "read_back", Some(&rows), trace_now!());
                    i.stats
                        .recovered
                        .fetch_add(rows.len() as u64, Ordering::Relaxed);
                    tracing::info!(
                        owner = &*owner,
                        chosen = ids.len(),
                        recovered = rows.len(),
                        "outbox claim's commit outcome was unknown; read back"
                    );
                    // The commit is all or nothing: found, every chosen
                    // row was leased, those taken over included.
                    let reclaimed = if rows.is_empty() { 0 } else { chosen.reclaimed };
                    return Ok(self.counted(owner, Claimed { rows, reclaimed }));
                }
                Err(e) => error = e,
            }
        }
        tracing::warn!(owner = &*owner, %error, "could not read back an outbox claim whose commit outcome is unknown; its messages wait out their lease");
        Err(Error::CommitUnknown(error))
    }
}

impl<DB: Backend> Inner<DB> {
    /// After a route was added: the topics claimed, and the claim for them.
    fn routed(&mut self) {
        self.topics = self.routes.keys().cloned().collect();
        self.topics.sort();
        self.claim = DB::pool_dialect(&self.pool).claim_sql(self.topics.len());
    }

    /// Where the next claim of `limit` rows starts in the due set: 0 with
    /// no backlog or no spread, else `k·limit` for a random `k` in
    /// `0..claim_spread`.
    fn spread_offset(&self, limit: i64) -> i64 {
        if self.claim_spread <= 1 || !self.backlog.load(Ordering::Relaxed) {
            return 0;
        }
        let k = random() % u64::from(self.claim_spread);
        i64::try_from(k).unwrap_or(0).saturating_mul(limit)
    }

    /// A lease owner no other claim writes: the relay's owner and the next
    /// sequence number.
    fn claim_owner(&self) -> String {
        format!(
            "{}#{:x}",
            self.owner,
            self.claims.fetch_add(1, Ordering::Relaxed)
        )
    }
}

impl<DB: Backend> consume::Incoming for Delivery<DB> {
    fn payload<P: DeserializeOwned>(&self) -> Result<P, serde_json::Error> {
        serde_json::from_str(&self.message.payload)
    }
}

/// The delivery a subscriber of a fanned-out topic gets: the relay's own
/// (its count of sources taken, its mark) for the last one when no one
/// before it failed, so that the message is marked in its transaction;
/// one that does not mark for the others (see [`Relay::subscribe`]).
fn hand<DB: Backend>(d: &Delivery<DB>, settles: bool) -> Delivery<DB> {
    match settles {
        true => d.clone(),
        false => d.unmarking(),
    }
}

/// Traces the claim of `rows` by `owner` (feature `testing`): `outcome`
/// `ok` or `lost_ack`, or `read_back` with the rows found leased.
#[cfg_attr(not(feature = "testing"), allow(unused_variables))]
fn trace_claim(
    rows: &[OutboxRow],
    owner: &str,
    outcome: &str,
    found: Option<&[OutboxRow]>,
    at: u64,
) {
    #[cfg(feature = "testing")]
    for r in rows {
        let fields = || match found {
            None => serde_json::json!({ "outcome": outcome, "at": at }),
            Some(found) => {
                serde_json::json!({ "held": found.iter().any(|x| x.id == r.id), "at": at })
            }
        };
        let kind = if found.is_some() {
            "claim_read_back"
        } else {
            "claim"
        };
        // A claim whose outcome is unknown: its attempt too (on Galera,
        // another node's claim may have taken the row meanwhile).
        let attempt = if outcome == "lost_ack" { 0 } else { r.attempts };
        crate::testing::trace::emit(kind, r.id, &r.topic, attempt, owner, fields);
    }
}

/// A random number, drawn afresh on each call.
fn random() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one(CALLS.fetch_add(1, Ordering::Relaxed))
}

/// `owner`, shortened to [`Relay::MAX_OWNER_LEN`] bytes if longer (see
/// [`Relay::owner`]).
fn fit_owner(owner: String) -> String {
    use sha2::{Digest, Sha256};
    const MAX: usize = 47;
    if owner.len() <= MAX {
        return owner;
    }
    let mut cut = MAX - 9;
    while !owner.is_char_boundary(cut) {
        cut -= 1;
    }
    let digest = Sha256::digest(owner.as_bytes());
    let tag: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}~{tag}", &owner[..cut])
}

#[cfg(test)]
mod owner_tests {
    use super::fit_owner;

    #[test]
    fn long_owners_are_shortened_to_distinct_names_that_fit() {
        assert_eq!(fit_owner("relay-a".into()), "relay-a");
        let long = |tail: &str| format!("{}{tail}", "é".repeat(30));
        let (a, b) = (fit_owner(long("-1")), fit_owner(long("-2")));
        assert!(a.len() <= 47 && b.len() <= 47, "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a, fit_owner(long("-1")), "stable");
    }
}
