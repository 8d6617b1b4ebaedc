//! The invariants, proved over every interleaving of the bound: 2
//! messages (one of whose handlers may fail on any attempt), 3 attempts,
//! and one fault (a lost acknowledgement, a refused commit, a crash, a
//! failed read, a bookkeeping write given up) anywhere in the run.

use idem_model::Config;

#[test]
fn per_message_three_relays() {
    idem_model::check::prove("per-message, 3 relays", Config::per_message(3, 3, 1));
}

#[test]
fn per_message_two_faults() {
    idem_model::check::prove(
        "per-message, 3 relays, 2 faults",
        Config::per_message(3, 3, 2),
    );
}

#[test]
fn per_message_one_action_enqueued_twice() {
    let config = Config {
        copies: true,
        ..Config::per_message(3, 3, 1)
    };
    idem_model::check::prove("per-message, one action under two msg_ids", config);
}

#[test]
fn batched_one_message_failing() {
    idem_model::check::prove("batched, 3 relays", Config::batched(3, 3, 1));
}

#[test]
fn batched_two_faults() {
    idem_model::check::prove("batched, 3 relays, 2 faults", Config::batched(3, 3, 2));
}

#[test]
fn batched_one_action_enqueued_twice() {
    let config = Config {
        copies: true,
        ..Config::batched(3, 3, 1)
    };
    idem_model::check::prove("batched, one action under two msg_ids", config);
}
