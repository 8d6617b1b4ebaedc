//! The invariants, proved over every interleaving of the bound: 2
//! messages (one of whose handlers may fail on any attempt), 3 attempts,
//! and one fault (a lost acknowledgement, a refused commit, a crash, a
//! failed read, a bookkeeping write given up) anywhere in the run.

use idem_model::Config;

fn publishers(config: Config) -> Config {
    Config {
        publisher: [false, true],
        ..config
    }
}

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

/// A publisher route (the relay marks the success on the pool after the
/// publish) beside a handler route: message 1, the publisher's, fails at
/// will, before or after its publish.
#[test]
fn publisher_routes_three_relays() {
    idem_model::check::prove(
        "publisher routes, 3 relays",
        publishers(Config::per_message(3, 3, 1)),
    );
}

#[test]
fn publisher_routes_two_faults() {
    idem_model::check::prove(
        "publisher routes, 3 relays, 2 faults",
        publishers(Config::per_message(3, 3, 2)),
    );
}
