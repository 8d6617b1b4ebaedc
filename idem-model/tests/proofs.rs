//! The invariants, proved over every interleaving of the bound: 2
//! messages (one of whose handlers may fail on any attempt), 3 attempts,
//! and one fault (a lost acknowledgement, a refused commit, a crash, a
//! failed read, a bookkeeping write given up) anywhere in the run.

use idem_model::properties;
use idem_model::{Config, KeyMode};

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

/// Both messages under one ordering key (message 0, the smaller id,
/// failing at will; the rest of the key goes on past a dead letter).
fn ordered(config: Config) -> Config {
    config.ordered(KeyMode::Continue)
}

/// The same, the key held behind its dead-lettered head.
fn held(config: Config) -> Config {
    config.ordered(KeyMode::Hold)
}

#[test]
fn ordered_per_message_three_relays() {
    idem_model::check::prove(
        "ordered key, per-message, 3 relays",
        ordered(Config::per_message(3, 3, 1)),
    );
}

#[test]
fn ordered_per_message_two_faults() {
    idem_model::check::prove(
        "ordered key, per-message, 3 relays, 2 faults",
        ordered(Config::per_message(3, 3, 2)),
    );
}

#[test]
fn ordered_per_message_held_behind_a_dead_letter() {
    idem_model::check::prove(
        "ordered key (hold), per-message, 3 relays",
        held(Config::per_message(3, 3, 1)),
    );
}

#[test]
fn ordered_batched_three_relays() {
    idem_model::check::prove(
        "ordered key, batched, 3 relays",
        ordered(Config::batched(3, 3, 1)),
    );
}

#[test]
fn ordered_batched_two_faults() {
    idem_model::check::prove(
        "ordered key, batched, 3 relays, 2 faults",
        ordered(Config::batched(3, 3, 2)),
    );
}

#[test]
fn ordered_batched_held_behind_a_dead_letter() {
    idem_model::check::prove(
        "ordered key (hold), batched, 3 relays",
        held(Config::batched(3, 3, 1)),
    );
}

/// The key's head inserted late (its id taken first, its insert committed
/// last): at most one in flight still holds, by the claim's lease check;
/// the id order cannot (`findings.rs`).
#[test]
fn ordered_head_inserted_late() {
    let properties: Vec<&'static str> = properties::SAFETY
        .into_iter()
        .filter(|&p| p != properties::SETTLED_IN_ORDER)
        .collect();
    for (name, config) in [
        ("per-message", Config::per_message(3, 3, 1)),
        ("batched", Config::batched(3, 3, 1)),
    ] {
        let config = Config {
            late_head: true,
            ..ordered(config)
        };
        idem_model::check::prove_only(
            &format!("ordered key, its head inserted late, {name}, 3 relays"),
            config,
            &properties,
        );
    }
}
