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
mod handle;
mod progress;
mod run;
mod wake;

pub use builder::RelaySettings;
pub use delivery::Delivery;
pub use handle::{RelayHandle, RelayStats, RelayStatsSnapshot};
pub use progress::{Settled, Settlement};
pub use run::DrainReport;
pub use wake::LISTENER_APP;

use crate::backend::{Backend, ClaimSql};
use crate::backoff::Backoff;
use crate::consume;
use sqlx::Pool;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

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
    /// Whether the last claim filled its limit (a backlog: spread the
    /// next one).
    backlog: AtomicBool,
    /// Whether the last claim took every due message it could see: it
    /// read from the oldest (no spread offset) and took fewer than its
    /// limit. A claim at an offset that took fewer saw only the end of the
    /// due set.
    emptied: AtomicBool,
    batch_size: i64,
}

/// How a claimed message's attempts run.
struct Policy {
    concurrency: usize,
    lease: Duration,
    poll_interval: Duration,
    max_attempts: i32,
    backoff: Backoff,
}

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
