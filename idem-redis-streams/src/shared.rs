//! What every entry task of one consumer shares, and the entries it
//! holds.

use super::message::Message;
use idem_core::backoff::Backoff;
use idem_core::consume::{self, ConsumerStats, Running};
use redis::aio::ConnectionManager;
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The handler as stored (see [`consume`]).
pub(super) type Handler = consume::Handler<Message>;

/// What every entry task of one consumer shares.
pub(super) struct Shared {
    /// The connection of every command but the blocking read.
    pub(super) conn: ConnectionManager,
    pub(super) stream: String,
    pub(super) group: String,
    pub(super) name: String,
    pub(super) handler: Handler,
    pub(super) key_field: String,
    pub(super) payload_field: String,
    pub(super) max_attempts: u32,
    /// `0`: unbounded.
    pub(super) max_deliveries: u32,
    pub(super) backoff: Backoff,
    pub(super) claim_after: Duration,
    /// A third of `claim_after` (bounded): how often entries in hand are
    /// kept and pending ones claimed, and the longest blocking read.
    pub(super) tick: Duration,
    pub(super) max_in_flight: usize,
    pub(super) dead_letter_stream: String,
    pub(super) outage_retry: Duration,
    /// The entry ids in hand (their tasks running).
    pub(super) in_flight: Mutex<HashSet<String>>,
    pub(super) claimed: AtomicU64,
    pub(super) stats: Arc<ConsumerStats>,
}

impl Running for Shared {
    fn stats(&self) -> &Arc<ConsumerStats> {
        &self.stats
    }

    fn describe(&self, f: &mut std::fmt::DebugStruct<'_, '_>) {
        f.field("stream", &self.stream)
            .field("group", &self.group)
            .field("name", &self.name);
    }
}

impl Shared {
    pub(super) fn hand(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the entry `id` in hand; `false` when it is in hand already
    /// (claimed back from this very consumer while its task runs).
    pub(super) fn take(&self, id: &str) -> bool {
        self.hand().insert(id.to_owned())
    }

    /// The entry `id` is no longer in hand.
    pub(super) fn release(&self, id: &str) {
        self.hand().remove(id);
    }
}
