//! What the model found in the relay as implemented: behaviours that need
//! a transaction (or a batch) longer than the lease, so the proofs count
//! them as faults (stalls). Each test asserts the counterexample, so that
//! a fix in the relay shows here (the test then fails: move its
//! configuration to `proofs.rs`).
//!
//! The effects stay safe all the same (the last two tests): the fences
//! alone guarantee [`TIMING_FREE`], whatever the timing.
//!
//! - A handler's transaction, or a batch, that outlives its lease lets the
//!   lease run out (the heartbeat skips the row that transaction locks; a
//!   batch renews once, when it begins). When it then fails, another
//!   relay may claim the message between the rollback (or the batch's
//!   commit) and this relay's failure bookkeeping, which finds the row no
//!   longer its own and writes nothing: the attempt is never recorded, and
//!   the dead-letter decision (`attempts >= max_attempts`, taken only by
//!   the lease holder's bookkeeping) is never taken. A message whose
//!   handler keeps failing slowly is retried past `max_attempts`.
//! - (Fixed.) The per-message path after a failed batch (`deliver_each`)
//!   ran the batch's messages under the batch's leases, none renewed until
//!   its turn: a lease that ran out during the batch let another relay
//!   claim and run the message, and then this relay ran it too. It now
//!   renews each lease first and leaves a message no longer held to its
//!   holder; the test below proves it on the configuration that found it.

use idem_model::properties::{ATTEMPTS_BOUNDED, ONE_RUN_AT_A_TIME, TIMING_FREE};
use idem_model::{Config, check};

fn long(config: Config) -> Config {
    Config {
        long_transactions: true,
        ..config
    }
}

#[test]
fn a_slow_failing_transaction_escapes_max_attempts() {
    check::refute(
        "per-message, transactions longer than the lease",
        long(Config::per_message(2, 2, 0)),
        ATTEMPTS_BOUNDED,
    );
}

#[test]
fn a_slow_batch_escapes_max_attempts() {
    check::refute(
        "batched, batches longer than the lease",
        long(Config::batched(2, 2, 0)),
        ATTEMPTS_BOUNDED,
    );
}

/// Found by the model, then fixed: the per-message path after a failed
/// batch renews each message's lease before its attempt
/// (`Relay::deliver_each` → `OutboxStore::renew_held`), and leaves a
/// message another relay claimed meanwhile to it.
#[test]
fn the_per_message_path_after_a_failed_batch_runs_no_handler_twice() {
    check::prove_only(
        "batched, a refused commit, handlers longer than the lease",
        long(Config::batched(2, 3, 1)),
        &[ONE_RUN_AT_A_TIME],
    );
}

#[test]
fn the_effects_stay_safe_per_message_however_long_the_transactions() {
    check::prove_only(
        "per-message, transactions longer than the lease, 3 relays, 1 fault",
        long(Config::per_message(3, 3, 1)),
        &TIMING_FREE,
    );
}

#[test]
fn the_effects_stay_safe_batched_however_long_the_batches() {
    check::prove_only(
        "batched, batches longer than the lease, 2 relays, 1 fault",
        long(Config::batched(2, 3, 1)),
        &TIMING_FREE,
    );
}
