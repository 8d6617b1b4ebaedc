//! The controls: each mutation of the protocol yields a counterexample.

use idem_model::properties::{
    ALL_SETTLED, AT_MOST_ONCE, ATTEMPTS_WITHIN_MAX, MARKER_AFTER_COMMIT, NEVER_DEAD_AFTER_PUBLISH,
    NEVER_FAILED_WITH_EFFECT, NEVER_FAILING_NOT_DEAD, ONE_IN_FLIGHT_PER_KEY, ONE_RUN_AT_A_TIME,
    PUBLISHED_FOR_SUCCESS, SETTLED_IN_ORDER,
};
use idem_model::{Config, KeyMode, Mutation, check};

fn publishers(config: Config) -> Config {
    Config {
        publisher: [true, true],
        ..config
    }
}

#[test]
fn state_check_outside_the_transaction() {
    let config = Config {
        copies: true,
        ..Config::per_message(2, 3, 0)
    };
    check::refute(
        "state check outside the transaction",
        config.with(Mutation::CheckOutsideTx),
        AT_MOST_ONCE,
    );
}

#[test]
fn outbox_update_without_the_fence() {
    check::refute(
        "outbox update without the fence",
        Config::per_message(2, 2, 1).with(Mutation::Unfenced),
        NEVER_FAILED_WITH_EFFECT,
    );
}

#[test]
fn no_lease_renewal() {
    check::refute(
        "no lease renewal",
        Config::per_message(2, 2, 0).with(Mutation::NoRenewal),
        ONE_RUN_AT_A_TIME,
    );
}

#[test]
fn marker_written_before_the_commit() {
    check::refute(
        "marker before the commit",
        Config::per_message(2, 2, 1).with(Mutation::MarkerBeforeCommit),
        MARKER_AFTER_COMMIT,
    );
}

#[test]
fn batch_commits_a_failed_savepoint() {
    check::refute(
        "batch keeps a failed handler's savepoint",
        Config::batched(2, 3, 0).with(Mutation::KeepFailedSavepoint),
        AT_MOST_ONCE,
    );
}

/// The bookkeeping fenced by status alone: a stale relay's retry frees a
/// row another claim holds, whose own bookkeeping then finds it not its
/// own, until the last attempt's dead-letters a message that never fails.
#[test]
fn failure_bookkeeping_fenced_by_status_only() {
    check::refute(
        "failure bookkeeping fenced by status only",
        Config::per_message(3, 2, 1).with(Mutation::StatusOnlyFence),
        NEVER_FAILING_NOT_DEAD,
    );
}

/// The relay before issue 23's fix: with a handler's transaction longer
/// than its lease, the attempt goes unrecorded (see `findings.rs`).
#[test]
fn failure_bookkeeping_on_the_pool_after_the_rollback() {
    let config = Config {
        long_transactions: true,
        ..Config::per_message(2, 2, 0)
    };
    check::refute(
        "failure bookkeeping on the pool after the rollback",
        config.with(Mutation::PoolSideFailure),
        ATTEMPTS_WITHIN_MAX,
    );
}

/// A crashed holder's message, never claimed again, never ends. (The
/// liveness is proved as `EVENTUALLY_ENDS`; refuted here in its
/// quiescent form, `ALL_SETTLED`, the same on this acyclic model, whose
/// counterexample stateright reports exactly: its `eventually`
/// discoveries may carry a path through a DAG join.)
#[test]
fn claim_skips_expired_leases() {
    check::refute(
        "claim skips every leased row",
        Config::per_message(2, 2, 1).with(Mutation::ClaimIgnoresExpiry),
        ALL_SETTLED,
    );
}

/// Issue 23, point 4: the relay-side mark's lost acknowledgement taken
/// for a failure dead-letters, on its last attempt, a published message.
#[test]
fn publisher_mark_lost_ack_taken_for_a_failure() {
    check::refute(
        "publisher: the mark's lost acknowledgement taken for a failure",
        publishers(Config::per_message(2, 1, 1)).with(Mutation::MarkLostAckAsFailure),
        NEVER_DEAD_AFTER_PUBLISH,
    );
}

/// Marked before its publish, a message whose relay crashes in between is
/// a success never published (a message lost on the outgoing side).
#[test]
fn publisher_marked_before_its_publish() {
    check::refute(
        "publisher: marked before its publish",
        publishers(Config::per_message(2, 2, 1)).with(Mutation::MarkBeforePublish),
        PUBLISHED_FOR_SUCCESS,
    );
}

/// A claim that ignores the ordering key takes message 1 while message 0,
/// earlier in the key, is pending: message 1 succeeds first.
#[test]
fn claim_ignores_the_ordering_key() {
    check::refute(
        "ordered key, the claim ignores it",
        Config::per_message(2, 2, 0)
            .ordered(KeyMode::Continue)
            .with(Mutation::ClaimIgnoresKey),
        SETTLED_IN_ORDER,
    );
}

/// The same in batched mode: one batch takes both messages of the key,
/// and runs both.
#[test]
fn batch_claim_ignores_the_ordering_key() {
    check::refute(
        "ordered key, batched, the claim ignores it",
        Config::batched(2, 2, 0)
            .ordered(KeyMode::Continue)
            .with(Mutation::ClaimIgnoresKey),
        ONE_IN_FLIGHT_PER_KEY,
    );
}

/// The head rule without its lease check: message 0 (the smaller id),
/// whose insert commits after message 1 was claimed (finding 6), is
/// claimed while message 1 runs.
#[test]
fn key_head_by_smaller_id_only() {
    let config = Config {
        late_head: true,
        ..Config::per_message(2, 2, 0).ordered(KeyMode::Continue)
    };
    check::refute(
        "ordered key, the head rule without its lease check",
        config.with(Mutation::KeyHeadByIdOnly),
        ONE_IN_FLIGHT_PER_KEY,
    );
}
