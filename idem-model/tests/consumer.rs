//! The broker consumers' path (AMQP, NATS): ack after commit, redelivery,
//! the dead-letter copy before the terminate.

use idem_model::check::{prove_model, refute_model};
use idem_model::consumer::{
    ConsumerConfig, ConsumerMutation, ENDS_EXECUTED_OR_DEAD, NOT_DEAD_WITH_EFFECT,
};

#[test]
fn consumers_act_once_and_lose_nothing_one_fault() {
    prove_model("consumer, 2 consumers, 1 fault", ConsumerConfig::new(2, 1));
}

#[test]
fn consumers_act_once_and_lose_nothing_two_faults() {
    prove_model("consumer, 2 consumers, 2 faults", ConsumerConfig::new(2, 2));
}

#[test]
fn an_ack_before_the_commit_loses_the_message() {
    refute_model(
        "consumer, acknowledged before the commit",
        ConsumerConfig {
            mutation: Some(ConsumerMutation::AckBeforeCommit),
            ..ConsumerConfig::new(1, 1)
        },
        ENDS_EXECUTED_OR_DEAD,
    );
}

#[test]
fn a_terminate_before_the_dead_letter_copy_loses_the_message() {
    refute_model(
        "consumer, terminated before its dead-letter copy",
        ConsumerConfig {
            mutation: Some(ConsumerMutation::TerminateBeforeCopy),
            ..ConsumerConfig::new(1, 1)
        },
        ENDS_EXECUTED_OR_DEAD,
    );
}

/// Finding 5 (open, needs a redelivery under a running handler): the
/// broker hands the message to a second consumer while the first one's
/// handler runs; the second's fails on the last delivery and copies the
/// message to the dead-letter queue, then the first commits its effect.
/// The message is both executed and dead-lettered. A progress
/// acknowledgement (NATS `AckProgress`) while the handler runs, or a
/// state check before the dead-letter copy, closes it.
#[test]
fn finding_5_a_redelivery_under_a_running_handler_dead_letters_an_executed_message() {
    refute_model(
        "consumer, redelivered while its handler runs",
        ConsumerConfig {
            redeliver_running: true,
            ..ConsumerConfig::new(2, 0)
        },
        NOT_DEAD_WITH_EFFECT,
    );
}
