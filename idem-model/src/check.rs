//! Running the checker (the tests' helpers): a proof explores every reachable state; a
//! control stops at the first counterexample of its property.

use crate::{Config, properties};
use stateright::{Checker, HasDiscoveries, Model};
use std::collections::BTreeSet;
use std::time::Instant;

/// Explores every state of `config`: each safety property holds, and the
/// reachability checks are reached.
pub fn prove(name: &str, config: Config) {
    let start = Instant::now();
    let checker = config.checker().threads(2).spawn_bfs().join();
    println!(
        "model {name}: proved in {:.1?}, {} unique states ({} generated), depth {}",
        start.elapsed(),
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
    );
    for property in properties::SAFETY {
        checker.assert_no_discovery(property);
    }
    checker.assert_properties();
}

/// Explores `config` until `property` fails, and shows the counterexample.
pub fn refute(name: &str, config: Config, property: &'static str) {
    let start = Instant::now();
    let checker = config
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let Some(path) = checker.discovery(property) else {
        panic!(
            "control {name}: no counterexample of `{property}` in {} states",
            checker.unique_state_count()
        );
    };
    println!(
        "control {name}: `{property}` fails after {} steps, found in {:.1?}, {} unique states explored",
        path.clone().into_actions().len(),
        start.elapsed(),
        checker.unique_state_count(),
    );
    for (i, action) in path.clone().into_actions().iter().enumerate() {
        println!("  {:2}. {action:?}", i + 1);
    }
    println!("  final: {:?}", path.last_state());
}
