//! One attempt of one message: the handler run under a renewed lease,
//! then the bookkeeping (success, retry with back-off, or dead letter).

use super::{Delivery, Relay};
use crate::OutboxLease;
use crate::backend::{Backend, OutboxRow};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

impl<DB: Backend> Relay<DB> {
    /// One attempt of one message, and its bookkeeping.
    pub(super) async fn deliver(&self, row: OutboxRow) {
        let i = &self.inner;
        let (id, attempts) = (row.id, row.attempts);
        let span = tracing::info_span!("outbox_delivery", id, topic = %row.topic, msg_id = %row.msg_id, attempts);
        let Some(route) = i.routes.get(&row.topic).cloned() else {
            // Not claimable: claims filter on the routed topics.
            return;
        };
        let marked = Arc::new(AtomicBool::new(false));
        let lease = OutboxLease::new(id, row.topic.clone(), i.owner.clone(), attempts);
        let delivery = Delivery::new(i.pool.clone(), row, lease.clone(), marked.clone());
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
