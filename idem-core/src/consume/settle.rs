//! The last step of every broker delivery: its verdict turned into an
//! acknowledgement, a retry or a dead letter. The choice (and the give-up
//! rule, [`Failure::next`](super::Failure::next)) is made here once; each broker supplies only
//! how it acknowledges, retries and dead-letters ([`Settle`]).

use super::failure::{Next, Verdict};
use std::future::Future;

/// How one broker settles one delivery.
pub trait Settle: Sync {
    /// The handler's call committed, or found its effect done (`executed`
    /// false): acknowledge the delivery.
    fn ack(&self, executed: bool) -> impl Future<Output = ()> + Send;

    /// The attempt failed and may run again: hand the delivery back for a
    /// later one, after the broker's back-off.
    fn retry(&self, reason: &str) -> impl Future<Output = ()> + Send;

    /// The attempt failed for good, or was the last one allowed: move the
    /// delivery out of the way (a dead letter), with `reason`.
    fn dead_letter(&self, reason: &str) -> impl Future<Output = ()> + Send;
}

/// Settles a delivery of attempt `attempt` (counted in `counted`, out of
/// `max`) by its `verdict`.
pub async fn settle(broker: &impl Settle, verdict: Verdict, attempt: u32, max: u32, counted: &str) {
    match verdict {
        Ok(executed) => broker.ack(executed).await,
        Err(f) => match f.next(attempt, max, counted) {
            Next::Retry(reason) => broker.retry(&reason).await,
            Next::Dead(reason) => broker.dead_letter(&reason).await,
        },
    }
}
