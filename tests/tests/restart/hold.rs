//! Handlers held at a gate: the messages they run are claimed (leased)
//! before the server stops, and their handlers go on only once the server
//! is down and their leases have run out: the case of a message claimed
//! before an outage, forced rather than left to timing.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Semaphore;

#[derive(Debug)]
pub(crate) struct Hold {
    /// Handlers still to hold.
    left: AtomicUsize,
    /// Handlers held so far.
    held: AtomicUsize,
    open: Semaphore,
    /// Held handlers' attempts whose bookkeeping the relay could not write.
    unrecorded: AtomicUsize,
    /// The held handlers' messages.
    ids: std::sync::Mutex<Vec<i64>>,
}

impl Default for Hold {
    fn default() -> Self {
        Hold {
            left: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            open: Semaphore::new(0),
            unrecorded: AtomicUsize::new(0),
            ids: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl Hold {
    /// Holds the next `n` handlers that pass.
    pub(crate) fn arm(&self, n: usize) {
        self.left.store(n, Ordering::SeqCst);
    }

    /// How many handlers were held.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Counts an attempt of message `id` whose bookkeeping the relay
    /// could not write, if its handler was held.
    pub(crate) fn unrecorded(&self, id: i64) {
        if self.held_ids().contains(&id) {
            self.unrecorded.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The held handlers' messages.
    pub(crate) fn held_ids(&self) -> Vec<i64> {
        self.ids.lock().expect("ids").clone()
    }

    /// How many attempts' bookkeeping the relay could not write.
    pub(crate) fn unrecorded_count(&self) -> usize {
        self.unrecorded.load(Ordering::SeqCst)
    }

    /// Lets every held handler (and every later one) go on.
    pub(crate) fn open(&self) {
        self.left.store(0, Ordering::SeqCst);
        self.open.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    /// The way through of message `id`'s handler: held while armed.
    pub(crate) async fn pass(&self, id: i64) {
        let take = |n: usize| n.checked_sub(1);
        if self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take)
            .is_ok()
        {
            self.ids.lock().expect("ids").push(id);
            self.held.fetch_add(1, Ordering::SeqCst);
            self.open.acquire().await.expect("open").forget();
        }
    }
}
