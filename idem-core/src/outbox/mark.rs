//! The `success` mark of an outbox message: the one module that writes
//! it. A delivery ends well in one of four ways, and each marks the
//! message fenced by the delivery's lease (pending, same topic, same owner
//! and attempt), so that a delivery whose lease was taken over marks
//! nothing:
//!
//! 1. [`in_call`]: in the handler's own transaction, before its body (the
//!    call given its outbox source, `Source::outbox`): committed with the
//!    effect or not at all.
//! 2. [`with_state_lock`]: the same, folded into the state machine's
//!    locking read (one round trip fewer, where the dialect can).
//! 3. [`batch`]: at the end of a relay batch, in its transaction, for the
//!    calls that ended well, in one statement.
//! 4. [`after_handler`]: by the relay, on its pool, after a handler that
//!    was not given its source (a publisher route): no database effect to
//!    commit with.
//!
//! A refused mark (0 rows) is read back by the caller to tell why (see
//! `call/fence.rs`; the relay counts it as stale).

use crate::backend::{Backend, LockedState, StateSql};
use crate::lease::OutboxLease;
use crate::state::EntityIdValue;
use sqlx::{Pool, Transaction};

/// 1: in the handler's transaction; the rows changed (1: the lease held).
pub(crate) async fn in_call<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    lease: &OutboxLease,
) -> Result<u64, sqlx::Error> {
    DB::outbox_success(tx, lease).await
}

/// 2: with the state machine's locking read of entity `id`: the rows
/// marked (1: the lease held) and the state found.
pub(crate) async fn with_state_lock<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    sql: &StateSql,
    lease: &OutboxLease,
    id: &EntityIdValue,
) -> Result<(i64, Option<LockedState>), sqlx::Error> {
    DB::mark_lock_state(tx, sql, lease, id).await
}

/// 3: the messages `ids` of a relay batch, in its transaction, which
/// locked them when it renewed their leases; how many were marked.
pub(crate) async fn batch<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    owner: &str,
    ids: &[i64],
) -> Result<u64, sqlx::Error> {
    DB::outbox_success_batch(tx, owner, ids).await
}

/// 4: by the relay after a handler not given its source; the rows changed
/// (1: the lease held).
pub(crate) async fn after_handler<DB: Backend>(
    pool: &Pool<DB>,
    lease: &OutboxLease,
) -> Result<u64, sqlx::Error> {
    DB::outbox_success_pool(pool, lease).await
}
