//! A running relay's handle and its counters.

use super::Inner;
use crate::backend::Backend;
use crate::task::TaskHandle;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Counters of one relay, since it started.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Messages claimed (each claim is one attempt), recovered ones
    /// included.
    pub claimed: AtomicU64,
    /// Claimed messages that still had a lease owner: their previous
    /// lease had expired with nobody settling them (a crashed relay, a
    /// handler's bookkeeping that could not be written). Each one waited
    /// out a whole lease.
    pub reclaimed: AtomicU64,
    /// Claims whose commit failed with the outcome unknown (a lost
    /// acknowledgement: I/O error, closed connection during `COMMIT`).
    /// Only claims that chose rows count: an empty claim leases nothing.
    pub lost_claims: AtomicU64,
    /// Claims rolled back by a conflict with a concurrent transaction (a
    /// deadlock, a serialization failure, a Galera certification failure
    /// against a claim on another node), each claimed again at once (see
    /// the relay's claim spread, which makes them rare).
    pub claim_conflicts: AtomicU64,
    /// Messages read back after a lost claim (its commit had landed) and
    /// delivered at once, as claimed: no attempt burnt, no lease waited.
    pub recovered: AtomicU64,
    /// Attempts whose handler executed the action.
    pub executed: AtomicU64,
    /// Attempts answered `Duplicate`: the action had already happened.
    pub duplicates: AtomicU64,
    /// Failed attempts put back to `pending` for a retry. A handler whose
    /// commit failed with the outcome unknown is a failed attempt too; if
    /// that commit had in fact landed (the message is `success`), nothing
    /// is put back: it counts in `stale` and `landed`, not here.
    pub retried: AtomicU64,
    /// Messages dead-lettered (`failed`).
    pub dead_lettered: AtomicU64,
    /// Failed attempts whose bookkeeping found the message no longer
    /// pending under this delivery's lease (already a success, or
    /// re-leased), and relay-side success marks that found the same.
    pub stale: AtomicU64,
    /// Of the `stale` failed attempts, those whose message was a
    /// `success`: the handler reported a failure (typically
    /// `CommitUnknown`, a lost acknowledgement) after its commit landed.
    pub landed: AtomicU64,
    /// Batches committed (see [`Relay::commit_batch`](super::Relay::commit_batch)).
    pub batches: AtomicU64,
    /// Batches whose commit failed: outcome unknown (each message read
    /// back), or refused or lost (each message delivered again, alone).
    pub lost_batches: AtomicU64,
    /// Notifications for one of the relay's topics its listener received
    /// (see [`Relay::push_wakeup`](super::Relay::push_wakeup)); each woke
    /// the relay, or found it already awake.
    pub push_wakeups: AtomicU64,
    /// Times the relay's listener lost its connection or failed to
    /// connect (and reconnected, with back-off); polling covered the gap.
    pub listener_failures: AtomicU64,
}

impl<DB: Backend> Inner<DB> {
    pub(super) fn stats_owner(self: &Arc<Self>) -> Arc<dyn StatsView> {
        self.clone()
    }
}

pub(super) trait StatsView: Send + Sync {
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
    pub(super) task: TaskHandle<()>,
    pub(super) relay: Arc<dyn StatsView>,
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
    /// (While the database is failing over, an attempt's bookkeeping is
    /// retried for up to half the lease, so the wait can be that long.)
    pub async fn shutdown(self) {
        let _ = self.task.shutdown().await;
    }

    /// The relay's counters.
    pub fn stats(&self) -> &RelayStats {
        self.relay.stats()
    }
}
