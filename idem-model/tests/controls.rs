//! The controls: each mutation of the protocol yields a counterexample.

use idem_model::properties::{
    AT_MOST_ONCE, MARKER_AFTER_COMMIT, NEVER_FAILED_WITH_EFFECT, ONE_RUN_AT_A_TIME,
};
use idem_model::{Config, Mutation};

#[test]
fn state_check_outside_the_transaction() {
    let config = Config {
        copies: true,
        ..Config::per_message(2, 3, 0)
    };
    idem_model::check::refute(
        "state check outside the transaction",
        config.with(Mutation::CheckOutsideTx),
        AT_MOST_ONCE,
    );
}

#[test]
fn outbox_update_without_the_fence() {
    idem_model::check::refute(
        "outbox update without the fence",
        Config::per_message(2, 2, 1).with(Mutation::Unfenced),
        NEVER_FAILED_WITH_EFFECT,
    );
}

#[test]
fn no_lease_renewal() {
    idem_model::check::refute(
        "no lease renewal",
        Config::per_message(2, 2, 0).with(Mutation::NoRenewal),
        ONE_RUN_AT_A_TIME,
    );
}

#[test]
fn marker_written_before_the_commit() {
    idem_model::check::refute(
        "marker before the commit",
        Config::per_message(2, 2, 1).with(Mutation::MarkerBeforeCommit),
        MARKER_AFTER_COMMIT,
    );
}

#[test]
fn batch_commits_a_failed_savepoint() {
    idem_model::check::refute(
        "batch keeps a failed handler's savepoint",
        Config::batched(2, 3, 0).with(Mutation::KeepFailedSavepoint),
        AT_MOST_ONCE,
    );
}
