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
mod builder;
mod claim;
mod delivery;
pub mod forward;
mod gate;
mod handle;
mod lifecycle;
mod limit;
mod progress;
mod run;
mod unreleased;
mod wake;

pub use builder::RelaySettings;
pub use delivery::Delivery;
pub use handle::{RelayHandle, RelayStats, RelayStatsSnapshot};
pub use lifecycle::StopReport;
pub use limit::TopicLimit;
pub use progress::{Settled, Settlement};
pub use run::DrainReport;
pub use wake::LISTENER_APP;

use crate::backend::{Backend, ClaimSql};
use crate::backoff::Backoff;
use crate::consume;
use crate::task::TaskHandle;
use crate::{Error, Outcome};
use serde::de::DeserializeOwned;
use sqlx::Pool;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

/// The most rows `idem_outbox_attempt` keeps per message: writing one
/// more (a failed attempt the relay settles, an operator's action) deletes
/// the oldest in the same transaction.
pub const ATTEMPT_LOG_MAX: usize = 32;

type Route<DB> = consume::Handler<Delivery<DB>>;

/// A fanned-out topic's subscriber: its name and its handler.
type Subscriber<DB> = consume::Subscriber<Delivery<DB>>;

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

// `Relay`'s methods, all of them: its builder methods and its runs. The
// steps they take are `Inner`'s: set up in `builder.rs`, claimed in
// `claim.rs`, attempted in `attempt.rs`, batched in `batch.rs`, run in
// `run.rs`.
impl<DB: Backend> Relay<DB> {
    /// The longest relay owner name ([`Relay::owner`]): the lease owner
    /// column holds 64 characters, and each claim appends `#` and up to 16
    /// hex digits.
    pub const MAX_OWNER_LEN: usize = 47;

    /// A relay on `pool` with no routes and the default settings: batches of
    /// 64, 16 handlers at once, 30 s lease, 100 ms poll, 10 attempts,
    /// back-off from 200 ms doubling to 60 s.
    pub fn new(pool: Pool<DB>) -> Self {
        Relay {
            inner: Arc::new(Inner::new(pool)),
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
        let route = consume::handler(handler);
        self.edit(|i| i.add_route(topic.into(), route))
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
        let route = consume::handler(handler);
        self.edit(|i| i.add_subscriber(topic.into(), name.into(), route))
    }

    /// The most messages claimed per round (default 64). With no backlog a
    /// round claims at most the free handler slots (see
    /// [`concurrency`](Relay::concurrency)); while there is one (and the
    /// lease is a second or longer), up to [`claim_ahead`](Relay::claim_ahead)
    /// more, so that the next messages are at hand when the running ones
    /// end. Those wait for a slot with their leases
    /// renewed every third of a lease: no claimed message waits out its
    /// lease in the queue.
    pub fn batch_size(self, n: u32) -> Self {
        self.edit(|i| i.claiming.batch_size = i64::from(n.max(1)))
    }

    /// While there is a backlog, how many messages a round may claim
    /// beyond the free handler slots (default: as many as there are
    /// slots, [`concurrency`](Relay::concurrency); 0: only the free
    /// slots). They wait in this process for a slot, their leases renewed
    /// every third of a lease, and a claim waits until half of them have
    /// started: more means fewer and larger claims, each a transaction
    /// of its own, at the cost of messages that wait here rather than in
    /// the table, where another relay of the same topics could take them,
    /// and that a graceful shutdown runs before it returns. A round never
    /// claims more than [`batch_size`](Relay::batch_size), however large
    /// `n` is. With [batched commits](Relay::commit_batch) the messages of
    /// a claim larger than the slots wait in groups of at most the slots,
    /// each group delivered in its batches once all its slots are free.
    ///
    /// Worth raising on SQLite: it has one writer, and every claim takes
    /// the write lock from the handlers (`bench_peers`: 4 handlers
    /// claiming 60 ahead drained about 1.6 times the messages per second
    /// of claims of at most 4).
    ///
    /// ```
    /// # use idem_runtime::outbox::Relay;
    /// # fn build(pool: sqlx::SqlitePool) {
    /// // Claims of up to 64 messages: 4 running, up to 60 waiting.
    /// let relay = Relay::new(pool).concurrency(4).claim_ahead(60).batch_size(64);
    /// assert_eq!(relay.settings().claim_ahead, 60);
    /// # }
    /// ```
    pub fn claim_ahead(self, n: usize) -> Self {
        self.edit(|i| i.claiming.ahead = Some(n))
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
    /// that take shared rows in different orders deadlock. A conflict (a
    /// deadlock, a serialization failure, a lock-wait time-out: PostgreSQL
    /// `40P01`, `40001`, `55P03`; MariaDB/MySQL `1213`, `1205`, `1020`,
    /// `1614`) is the batch's, never a message's failure:
    /// - raised by a handler's own statement (under its savepoint; on
    ///   PostgreSQL a lock wait longer than
    ///   [`batch_lock_wait`](Relay::batch_lock_wait) is one), the batch
    ///   stops there, the handlers before it commit, and that message and
    ///   the ones after it are delivered one by one **at once**;
    /// - raised by the batch's commit (or where the database rolled the
    ///   whole transaction back, as MariaDB does on a deadlock), nothing
    ///   of it committed: all its messages are delivered one by one at
    ///   once.
    ///
    /// Either way no attempt is burnt and there is no back-off, and the
    /// batch size is halved; each batch that commits cleanly grows it by
    /// one again, up to `n` (additive increase, multiplicative decrease).
    /// [`commit_batch_now`](Relay::commit_batch_now) is the size in force.
    /// One by one, a handler that loses a conflict again runs again at once
    /// under the same attempt, up to 8 times in a row (the database rolled
    /// its transaction back); only then is its failure booked.
    ///
    /// **Lock order.** A batch first locks its messages' outbox rows in
    /// message-id order (its lease renewal), then runs its handlers in
    /// message-id order, each taking its own rows. To keep batches from
    /// deadlocking, handlers should take shared rows (counters, balances)
    /// **last**, after the rows of their own message, and several shared
    /// rows always in one order (by key).
    pub fn commit_batch(self, n: usize) -> Self {
        self.edit(|i| i.batching.commit_batch = n.max(1))
    }

    /// How long a statement in a batch's transaction waits for a row lock
    /// on PostgreSQL before the wait counts as the batch's conflict
    /// (default 20 ms, at least 1 ms; `SET LOCAL lock_timeout` in the
    /// batch's transaction only). A waiting batch holds the rows of every
    /// handler before the waiting one, so batches that wait on one another
    /// form convoys, and PostgreSQL finds a deadlock among them only after
    /// its `deadlock_timeout` (1 s by default): a short wait turns both
    /// into a quick conflict. The handlers that ran before it commit, and
    /// the waiting message and those after it are delivered one by one at
    /// once, where they wait as long as they must (see
    /// [`commit_batch`](Relay::commit_batch), "Contention"). MariaDB/MySQL
    /// report deadlocks at once and SQLite's batches hold the write lock:
    /// the setting does nothing there.
    ///
    /// The trade-off, measured with `bench_peers --hot-only` (16 handlers,
    /// batches of 16, one 2-core machine): with one shared row, which
    /// batches only queue on, longer waits are better; with 10 rows taken in
    /// varying order, which batches deadlock on, shorter ones. At 20 ms
    /// batches ran 2.2× and 0.86× per message, at 200 ms 2.3× and 0.35×,
    /// at 10 ms 1.0× and 0.84×.
    pub fn batch_lock_wait(self, wait: Duration) -> Self {
        self.edit(|i| i.batching.lock_wait = wait.max(Duration::from_millis(1)))
    }

    /// The batch size in force now: [`commit_batch`](Relay::commit_batch)'s
    /// `n`, less while batches meet contention (see there).
    pub fn commit_batch_now(&self) -> usize {
        self.inner
            .batching
            .adaptive
            .limit(self.inner.batching.commit_batch)
    }

    /// How many times contention halved the batch size (see
    /// [`commit_batch`](Relay::commit_batch)).
    pub fn commit_batch_shrinks(&self) -> u64 {
        self.inner.batching.adaptive.shrinks()
    }

    /// Calls `hook` after each attempt of a message is settled, with what
    /// came of it: to drive a progress bar, feed a dashboard or count
    /// outcomes per topic. It runs on the relay's task, after the
    /// attempt's bookkeeping: keep it quick (an atomic add, a channel
    /// send). Each message has exactly one [final](crate::outbox::Settlement::is_final)
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

    /// Limits `topic`: how many of its messages run at once, how many
    /// start per second (see [`TopicLimit`]), for a downstream that a
    /// burst would overwhelm or that rate-limits its callers (an SMS
    /// provider, a partner's API). The relay's
    /// [`concurrency`](Relay::concurrency) still bounds all topics
    /// together.
    ///
    /// A slow or limited topic does not hold back the others: while this
    /// relay holds as many of the topic's messages as its limit allows (its
    /// concurrency, or a second of its rate), its claims leave the topic
    /// out, so its backlog waits in the outbox and never takes the handler
    /// slots or the claims of other topics. The limits are per relay:
    /// three relays with `concurrency(2)` run up to six at once.
    ///
    /// ```no_run
    /// # use idem_runtime::{outbox::{Relay, TopicLimit}, Outcome};
    /// # async fn f(pool: sqlx::SqlitePool) {
    /// let relay = Relay::new(pool)
    ///     .route("sms.send", |_d, _m: serde_json::Value| async { Ok(Outcome::Executed(())) })
    ///     .topic_limit("sms.send", TopicLimit::new().concurrency(4).per_second(20.0))
    ///     .spawn();
    /// # relay.shutdown().await;
    /// # }
    /// ```
    pub fn topic_limit(self, topic: impl Into<String>, limit: TopicLimit) -> Self {
        self.edit(|i| i.limits.set(topic.into(), limit))
    }

    /// What a dead-lettered message of an ordering key does to the rest
    /// of its key (see
    /// [`EnqueueOptions::ordering_key`](crate::outbox::EnqueueOptions::ordering_key)):
    /// [`OnDeadHead::Continue`] (the default) or [`OnDeadHead::Hold`].
    /// Relays sharing topics should agree.
    pub fn on_dead_head(self, mode: OnDeadHead) -> Self {
        self.edit(|i| {
            i.claiming.hold_after_dead = mode == OnDeadHead::Hold;
            i.render_claim();
        })
    }

    /// Handlers running at once (default 16).
    pub fn concurrency(self, n: usize) -> Self {
        self.edit(|i| i.policy.concurrency = n.max(1))
    }

    /// How long a claim holds a message (default 30 s). A relay that dies
    /// lets its messages go when their lease expires. While a handler
    /// runs, the relay renews its message's lease every third of it (the
    /// heartbeat), so a handler slower than its lease is not run twice; a
    /// handler given [`Delivery::source`] also holds its message's row
    /// locked from its first statement, which claims skip. The heartbeat
    /// renews no more often than every 10 ms, so a lease under 30 ms runs
    /// out between renewals: the relay logs a warning when it starts.
    pub fn lease(self, d: Duration) -> Self {
        self.edit(|i| i.policy.lease = d)
    }

    /// How long to wait when nothing is due (default 100 ms).
    pub fn poll_interval(self, d: Duration) -> Self {
        self.edit(|i| i.policy.poll_interval = d)
    }

    /// Attempts before a message is dead-lettered (default 10).
    pub fn max_attempts(self, n: u32) -> Self {
        self.edit(|i| i.policy.max_attempts = i32::try_from(n.max(1)).unwrap_or(i32::MAX))
    }

    /// Back-off after the first failed attempt, doubling up to `max`.
    pub fn backoff(self, base: Duration, max: Duration) -> Self {
        self.edit(|i| i.policy.backoff = Backoff::new(base, max))
    }

    /// The delay before a message whose attempt failed in an outage
    /// ([`Error::is_outage`](crate::Error::is_outage): the broker or the
    /// database could not be reached) is due again (default 1 s; jittered
    /// between half and all of it). Such an attempt is not counted: the
    /// message goes back to pending with its `attempts` as before the
    /// claim, however long the outage lasts, and the relay delivers it
    /// again at most this long after the infrastructure is back. The
    /// outage also closes its topic's gate for as long: until then the
    /// relay's claims leave that topic alone (the other topics go on), so
    /// an outage costs a claimed batch of the topic per `outage_retry`,
    /// not the whole backlog claimed and given back over and over.
    pub fn outage_retry(self, d: Duration) -> Self {
        self.edit(|i| i.policy.outage_retry = d.max(Duration::from_millis(1)))
    }

    /// How often a spawned relay refreshes its row in `idem_process`
    /// (default 5 s, at least 10 ms; see [`crate::process`]). The row
    /// (id: the relay's [owner](Relay::owner), kind `relay`, name: its
    /// topics joined with `,`) is written once the schema is checked,
    /// and deleted when the relay stops; a failing write is logged, never
    /// stops the relay.
    pub fn heartbeat_interval(self, d: Duration) -> Self {
        self.edit(|i| i.policy.heartbeat = d.max(crate::process::MIN_INTERVAL))
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
        let owner = builder::fit_owner(owner.into());
        self.edit(|i| i.claiming.owner = owner)
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
        self.edit(|i| i.claiming.claim_spread = n.max(1))
    }

    /// Whether a claim whose commit outcome is unknown is read back and
    /// delivered at once (default: yes). Off, its messages wait out their
    /// lease, as they did before claim recovery: for tests showing the
    /// difference.
    #[doc(hidden)]
    pub fn claim_recovery(self, on: bool) -> Self {
        self.edit(|i| i.claiming.recover_claims = on)
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
    /// [`LISTENER_APP`](crate::outbox::LISTENER_APP)`:<owner>`), opened with the pool's connect options, and
    /// stops with [`RelayHandle::shutdown`](crate::outbox::RelayHandle::shutdown). A lost connection is
    /// reconnected with back-off, polling covering the gap
    /// ([`RelayStats::listener_failures`]). Only a spawned relay listens:
    /// [`run_once`](Relay::run_once) claims once and returns.
    pub fn push_wakeup(self, on: bool) -> Self {
        self.edit(|i| i.waking.push_wakeup = Some(on))
    }

    /// Whether the relay claims once each time its listener (re)connects,
    /// for the messages enqueued while nobody listened (default: yes).
    /// Off, those wait for the next poll: for tests showing the
    /// difference.
    #[doc(hidden)]
    pub fn listener_catch_up(self, on: bool) -> Self {
        self.edit(|i| i.waking.listener_catch_up = on)
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
        self.inner.pushes()
    }

    /// The counters.
    pub fn stats(&self) -> &RelayStats {
        &self.inner.stats
    }

    /// The relay's settings, as configured.
    pub fn settings(&self) -> RelaySettings {
        self.inner.settings()
    }

    /// Claims one batch (at most `concurrency` messages: no more than can
    /// start at once) and runs it to the end. Returns how many messages it
    /// claimed (0: nothing was due).
    pub async fn run_once(&self) -> Result<usize, Error> {
        self.inner.run_once().await
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

    /// Runs the relay as a tokio task until [`RelayHandle::shutdown`] (or
    /// [`shutdown_within`](RelayHandle::shutdown_within), a signal given to
    /// [`RelayHandle::stop_on`], or the handle dropped).
    ///
    /// **The schema is checked first.** `spawn` is not async: before its
    /// first claim the task checks that the database has idem's tables at
    /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION) or later
    /// ([`check_schema`](crate::check_schema)). On a database without them,
    /// or with an older version, the relay claims nothing: it logs the
    /// reason at error level and its task ends with that
    /// [`Error::Config`] (naming the version found and the one expected,
    /// and telling to run `idem migrate`), which
    /// [`RelayHandle::status`] shows as
    /// [`TaskStatus::Failed`](crate::task::TaskStatus::Failed) and
    /// [`shutdown_within`](RelayHandle::shutdown_within) returns. A
    /// database that cannot be reached yet is waited for (backing off,
    /// logged once). So migrate before spawning.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use idem_runtime::{outbox::Relay, task::{TaskError, TaskStatus}, Outcome};
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    /// // Not migrated: the relay refuses to run.
    /// let relay = Relay::new(pool)
    ///     .route("mail.send", |_d, _m: serde_json::Value| async { Ok(Outcome::Executed(())) })
    ///     .spawn();
    /// relay.finished().await;
    /// assert!(matches!(relay.status(), TaskStatus::Failed(ref e) if e.contains("idem migrate")));
    /// let refused = relay.shutdown_within(std::time::Duration::from_secs(1)).await;
    /// assert!(matches!(refused, Err(TaskError::Failed(idem_runtime::Error::Config { .. }))));
    /// # }
    /// ```
    pub fn spawn(self) -> RelayHandle {
        let inner = self.inner.clone();
        RelayHandle {
            task: TaskHandle::spawn(|stop| inner.run(stop)),
            relay: self.inner.stats_owner(),
        }
    }

    /// [`spawn`](Relay::spawn), stopping gracefully (claiming nothing more,
    /// finishing what is in flight) once `signal` completes: a
    /// `CancellationToken`'s `cancelled_owned()`, `tokio::signal::ctrl_c()`,
    /// a `oneshot::Receiver`… (its output is ignored). The handle says
    /// when it has stopped ([`RelayHandle::status`],
    /// [`finished`](RelayHandle::finished)); a
    /// [`shutdown_within`](RelayHandle::shutdown_within) then returns its
    /// report, or bounds the wait.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # idem_runtime::migrate(&pool).await?;
    /// use idem_runtime::{outbox::Relay, task::TaskStatus, Outcome};
    /// use std::time::Duration;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// let token = CancellationToken::new();
    /// let relay = Relay::new(pool)
    ///     .route("mail.send", |_d, _m: serde_json::Value| async { Ok(Outcome::Executed(())) })
    ///     .spawn_until(token.clone().cancelled_owned());
    /// assert!(relay.status().is_running());
    /// token.cancel(); // SIGTERM, say
    /// relay.finished().await;
    /// assert_eq!(relay.status(), TaskStatus::Stopped);
    /// let report = relay.shutdown_within(Duration::from_secs(5)).await?;
    /// assert!(report.abandoned.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn spawn_until<S>(self, signal: S) -> RelayHandle
    where
        S: Future + Send + 'static,
    {
        self.spawn().stop_on(signal)
    }

    /// Runs the relay (as [`spawn`](Relay::spawn) does) until `signal`
    /// completes or the relay ends by itself (a refused schema, a panic),
    /// then stops it within `deadline` (see
    /// [`RelayHandle::shutdown_within`]) and returns its report: the body
    /// of a worker process's `main`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # idem_runtime::migrate(&pool).await?;
    /// use idem_runtime::{outbox::Relay, Outcome};
    /// use std::time::Duration;
    ///
    /// let relay = Relay::new(pool)
    ///     .route("mail.send", |_d, _m: serde_json::Value| async { Ok(Outcome::Executed(())) });
    /// # let ctrl_c = tokio::time::sleep(Duration::from_millis(50));
    /// // let ctrl_c = tokio::signal::ctrl_c();
    /// let report = relay.run_until(ctrl_c, Duration::from_secs(30)).await?;
    /// println!("stopped in {:?}, {} abandoned", report.elapsed, report.abandoned.len());
    /// # Ok(()) }
    /// ```
    pub async fn run_until<S>(
        self,
        signal: S,
        deadline: Duration,
    ) -> Result<StopReport, crate::task::TaskError>
    where
        S: Future,
    {
        let handle = self.spawn();
        tokio::select! {
            _ = signal => {}
            _ = handle.finished() => {}
        }
        handle.shutdown_within(deadline).await
    }
}

/// What happens to the rest of an ordering key once its head is
/// dead-lettered (see [`Relay::on_dead_head`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnDeadHead {
    /// The next message of the key goes on: a dead letter is a message
    /// given up on, and the key's later messages do not depend on it (a
    /// state machine handler answers `IllegalState` where they do).
    #[default]
    Continue,
    /// The rest of the key waits until the dead message is requeued (`idem
    /// requeue`, the console) and succeeds, or is deleted or archived: for
    /// keys whose later messages must never run without the earlier ones.
    Hold,
}

/// A relay's state, by concern: what it routes, how it claims, how it runs
/// an attempt, how it batches commits and how it wakes up.
struct Inner<DB: Backend> {
    pool: Pool<DB>,
    routing: Routing<DB>,
    claiming: Claiming,
    policy: Policy,
    batching: Batching,
    waking: Waking,
    /// See [`Relay::on_settled`].
    on_settled: Option<progress::Hook>,
    stats: RelayStats,
    /// Outage attempts whose release is still to be written.
    unreleased: unreleased::Unreleased,
    /// Topics held back after an outage.
    gates: gate::Gates,
    /// See [`Relay::topic_limit`].
    limits: limit::Limits,
    /// The messages claimed and not yet settled (see
    /// [`RelayHandle::shutdown_within`]).
    in_flight: lifecycle::InFlight,
    /// Whether the database's schema was found at the version needed
    /// (checked before the first claim).
    schema_ok: AtomicBool,
}

/// The topics and their handlers.
struct Routing<DB: Backend> {
    routes: HashMap<String, Route<DB>>,
    /// The subscribers of each fanned-out topic, in the order subscribed
    /// (see [`Relay::subscribe`]); its route in `routes` runs them all.
    subscribers: HashMap<String, Vec<Subscriber<DB>>>,
    topics: Vec<String>,
}

/// How the relay claims due messages, and under which name.
struct Claiming {
    claim: ClaimSql,
    owner: String,
    /// The next claim's sequence number (see [`Inner::claim_owner`]).
    claims: AtomicU64,
    /// Whether a claim whose commit outcome is unknown is read back.
    recover_claims: bool,
    /// See [`Relay::claim_spread`].
    claim_spread: u32,
    /// See [`Relay::on_dead_head`].
    hold_after_dead: bool,
    /// Whether the last claim filled its limit (a backlog: spread the
    /// next one).
    backlog: AtomicBool,
    /// Whether the last claim took every due message it could see: it
    /// read from the oldest (no spread offset) and took fewer than its
    /// limit. A claim at an offset that took fewer saw only the end of the
    /// due set.
    emptied: AtomicBool,
    batch_size: i64,
    /// See [`Relay::claim_ahead`] (`None`: the concurrency).
    ahead: Option<usize>,
}

/// How a claimed message's attempts run.
struct Policy {
    concurrency: usize,
    lease: Duration,
    poll_interval: Duration,
    max_attempts: i32,
    backoff: Backoff,
    /// See [`Relay::outage_retry`].
    outage_retry: Duration,
    /// See [`Relay::heartbeat_interval`].
    heartbeat: Duration,
}

/// The default of [`Relay::outage_retry`].
const DEFAULT_OUTAGE_RETRY: Duration = Duration::from_secs(1);

/// Commits shared by several messages' handlers.
struct Batching {
    /// See [`Relay::commit_batch`] (1: off).
    commit_batch: usize,
    /// The batch size in force now, shrunk under contention (see
    /// [`Relay::commit_batch`]).
    adaptive: batch::Adaptive,
    /// See [`Relay::batch_lock_wait`].
    lock_wait: Duration,
    /// The transactions a batched relay keeps open at once (batches, and
    /// messages delivered alone): as many as batches of the full size
    /// would take, made at the first delivery (see `batch::Transactions`).
    open: std::sync::OnceLock<Arc<tokio::sync::Semaphore>>,
}

/// How a spawned relay learns of new messages besides polling.
struct Waking {
    /// See [`Relay::push_wakeup`]: `None` for the default.
    push_wakeup: Option<bool>,
    /// See [`Relay::listener_catch_up`].
    listener_catch_up: bool,
    /// Woken when this relay settles a message with an ordering key (the
    /// key's next message is due at once) or frees a limited topic's
    /// slot: a spawned relay waiting for the poll claims again.
    kick: Arc<tokio::sync::Notify>,
}

impl<DB: Backend> fmt::Debug for Relay<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("backend", &<DB as Backend>::NAME)
            .field("owner", &self.inner.claiming.owner)
            .field("topics", &self.inner.routing.topics)
            .field("settings", &self.settings())
            .field("stats", &self.inner.stats)
            .finish()
    }
}
