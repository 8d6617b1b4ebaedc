//! README, "Using it": creating idem's tables, and what a call answers.

use super::state_machine::{DeductCoupon, deduct_coupon};
use idem_runtime::Outcome;
use idem_runtime::outbox::Delivery;
use sqlx::{PgPool, Postgres};

/// Creates (or upgrades) idem's tables.
pub async fn create_idem_tables(pool: PgPool) -> Result<(), idem_runtime::Error> {
    // README: migrate
    idem_runtime::migrate(&pool).await?;   // idem_record, idem_outbox and their history tables
    // README: end
    Ok(())
}

/// What to do with a message, from the call's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Acknowledge it: done now, or done before.
    Done,
    /// Deliver it again later.
    Retry,
    /// Give up on it.
    DeadLetter,
}

/// Delivers one deduction message and says what to do with it.
pub async fn verdict(d: Delivery<Postgres>, msg: DeductCoupon) -> Verdict {
    // README: outcome
    match deduct_coupon(d.source(), &d, &msg).await {
        Ok(Outcome::Executed(())) => Verdict::Done,   // the body ran and committed
        Ok(Outcome::Duplicate(_)) => Verdict::Done,   // already done: success, body not run
        Err(e) if e.is_retryable() => Verdict::Retry, // connection lost, deadlock, commit outcome unknown
        Err(_) => Verdict::DeadLetter,                // invalid key, illegal state, key reused with another payload
    }
    // README: end
}
