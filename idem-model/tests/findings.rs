//! What the model found in the relay: behaviours that need a transaction
//! (or a batch) longer than the lease, so the proofs count them as faults
//! (stalls), or a rare pair of faults. A finding still open is asserted as
//! its counterexample, on the mutation that is the relay as implemented;
//! a finding fixed is proved on the configuration that found it.
//!
//! - Finding 1 (fixed in the model by issue 23's protocol; the relay's
//!   fix is `Mutation::PoolSideFailure` removed). A handler's
//!   transaction, or a batch, that outlives its lease lets the lease run
//!   out (the heartbeat skips the row that transaction locks; a batch
//!   renews once, when it begins). With the failure bookkeeping on the
//!   pool after the rollback (or after the batch's commit), another relay
//!   may claim the message in between: the bookkeeping, fenced, writes
//!   nothing, the attempt is never recorded, and a message whose handler
//!   keeps failing slowly is retried past `max_attempts`. With the
//!   bookkeeping written in the transaction that still locks the row
//!   (a savepoint after the fenced update; in a batch, beside the deferred
//!   success update), the bound holds whatever the timing.
//! - Finding 2 (fixed). The per-message path after a failed batch
//!   (`deliver_each`) ran the batch's messages under the batch's leases,
//!   none renewed until its turn: a lease that ran out during the batch
//!   let another relay claim and run the message, and then this relay ran
//!   it too. It now renews each lease first and leaves a message no longer
//!   held to its holder.
//! - Finding 3 (fixed; the relay as it was is `Mutation::RevertUnknownCommit`,
//!   and `tests/tests/outbox/booking.rs` shows the fix on the three backends). A handler's commit
//!   whose acknowledgement was lost, and whose read-back failed too, is
//!   settled as a failure; the bookkeeping, finding the row no longer
//!   pending, writes over the `success` of the same attempt
//!   (`outbox_revert`, meant for a handler failing after its call marked
//!   the message): on the last attempt the message is dead-lettered with
//!   its effect committed; earlier, it is retried (a duplicate, harmless).
//!   The relay now never writes over a success when the handler's commit
//!   outcome stayed unknown.
//! - Finding 6 (open, inherent to ordering by id). Ids come from a
//!   sequence taken at the insert, not at its commit: when two producers
//!   enqueue under one ordering key at once, the smaller id may commit
//!   after the larger was claimed, or even settled. The head rule cannot
//!   order what it has not seen: the larger id succeeds while the smaller
//!   is pending. Its lease check still keeps one message of the key in
//!   flight (proved in `proofs.rs`; without it, the late smaller id is
//!   claimed beside the running larger one, `controls.rs`). Enqueue order
//!   within a key holds for a producer that commits each insert before the
//!   next.

use idem_model::properties::{
    ATTEMPTS_WITHIN_MAX, NEVER_FAILED_WITH_EFFECT, ONE_RUN_AT_A_TIME, SETTLED_IN_ORDER, TIMING_FREE,
};
use idem_model::{Config, KeyMode, Mutation, check};

fn long(config: Config) -> Config {
    Config {
        long_transactions: true,
        ..config
    }
}

#[test]
fn finding_1_before_the_fix_a_slow_failing_transaction_escapes_max_attempts() {
    check::refute(
        "per-message, transactions longer than the lease, bookkeeping on the pool",
        long(Config::per_message(2, 2, 0)).with(Mutation::PoolSideFailure),
        ATTEMPTS_WITHIN_MAX,
    );
}

#[test]
fn finding_1_before_the_fix_a_slow_batch_escapes_max_attempts() {
    check::refute(
        "batched, batches longer than the lease, bookkeeping on the pool",
        long(Config::batched(2, 2, 0)).with(Mutation::PoolSideFailure),
        ATTEMPTS_WITHIN_MAX,
    );
}

#[test]
fn finding_1_fixed_per_message_attempts_stay_within_max_however_long_the_transactions() {
    check::prove_only(
        "per-message, transactions longer than the lease, 3 relays, no fault",
        long(Config::per_message(3, 3, 0)),
        &[ATTEMPTS_WITHIN_MAX],
    );
}

#[test]
fn finding_1_fixed_batched_attempts_stay_within_max_however_long_the_batches() {
    check::prove_only(
        "batched, batches longer than the lease, 3 relays, no fault",
        long(Config::batched(3, 3, 0)),
        &[ATTEMPTS_WITHIN_MAX],
    );
}

/// Found by the model, then fixed: the per-message path after a failed
/// batch renews each message's lease before its attempt
/// (`Relay::deliver_each` → `OutboxStore::renew_held`), and leaves a
/// message another relay claimed meanwhile to it.
#[test]
fn finding_2_fixed_the_per_message_path_after_a_failed_batch_runs_no_handler_twice() {
    check::prove_only(
        "batched, a refused commit, handlers longer than the lease",
        long(Config::batched(2, 3, 1)),
        &[ONE_RUN_AT_A_TIME],
    );
}

#[test]
fn finding_3_a_lost_commit_whose_read_back_failed_is_dead_lettered_with_its_effect() {
    check::refute(
        "per-message, a lost commit, its read-back failed, the last attempt",
        Config::per_message(2, 1, 2).with(Mutation::RevertUnknownCommit),
        NEVER_FAILED_WITH_EFFECT,
    );
}

/// The fences and the bookkeeping in the locking transaction guarantee
/// [`TIMING_FREE`] (the effects, the attempt bound, no wrongful dead
/// letter) whatever the timing.
#[test]
fn the_timing_free_properties_per_message_however_long_the_transactions() {
    check::prove_only(
        "per-message, transactions longer than the lease, 3 relays, 1 fault",
        long(Config::per_message(3, 3, 1)),
        &TIMING_FREE,
    );
}

#[test]
fn the_timing_free_properties_batched_however_long_the_batches() {
    check::prove_only(
        "batched, batches longer than the lease, 2 relays, 1 fault",
        long(Config::batched(2, 3, 1)),
        &TIMING_FREE,
    );
}

#[test]
fn finding_6_a_smaller_id_committed_late_settles_after_a_larger() {
    let config = Config {
        late_head: true,
        ..Config::per_message(2, 2, 0).ordered(KeyMode::Continue)
    };
    check::refute(
        "ordered key, the smaller id's insert committed after the larger ran",
        config,
        SETTLED_IN_ORDER,
    );
}
