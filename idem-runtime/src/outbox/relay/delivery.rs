//! One delivery of an outbox message: what a route's handler gets.

use crate::backend::{Backend, OutboxRow};
use crate::{OutboxLease, Source};
use sqlx::Pool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One delivery of an outbox message to its handler.
#[derive(Debug, Clone)]
pub struct Delivery<DB: Backend> {
    pub(super) pool: Pool<DB>,
    pub(super) message: OutboxRow,
    pub(super) lease: OutboxLease,
    /// Set when the handler took its outbox source: a successful handler
    /// then marked the message itself, and the relay need not.
    pub(super) marked: Arc<AtomicBool>,
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
