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
    pub async fn shutdown(self) {
        let _ = self.task.shutdown().await;
    }

    /// The relay's counters.
    pub fn stats(&self) -> &RelayStats {
        self.relay.stats()
    }
}
