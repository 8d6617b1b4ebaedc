//! Running the checker (the tests' helpers): a proof explores every reachable state; a
//! control stops at the first counterexample of its property.

use crate::state::{BatchStep, Round, State};
use crate::{Action, Config, properties};
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

/// Explores every state of `config`: each of `properties` holds (the
/// others may fail).
pub fn prove_only(name: &str, config: Config, properties: &[&'static str]) {
    let start = Instant::now();
    let checker = config.checker().threads(2).spawn_bfs().join();
    println!(
        "model {name}: {properties:?} proved in {:.1?}, {} unique states ({} generated), depth {}",
        start.elapsed(),
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
    );
    for property in properties {
        checker.assert_no_discovery(property);
    }
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
    let steps = path.clone().into_vec();
    for (i, (state, action)) in steps.iter().enumerate() {
        if let Some(action) = action {
            println!("  {:2}. {}", i + 1, describe(state, action));
        }
    }
    let last = path.last_state();
    println!("  rows: {:?}", last.db.rows);
    println!(
        "  entities: {:?}, cache: {:?}",
        last.db.entities, last.cache
    );
}

/// `action` taken in `state`, with the statement a relay's step runs.
fn describe(state: &State, action: &Action) -> String {
    let Action::Step { relay, outcome } = action else {
        return format!("{action:?}");
    };
    let step = match &state.relays[*relay as usize].round {
        Round::Idle => "idle".to_string(),
        Round::Recover(tokens) => format!("read back the lost claim of {tokens:?}"),
        Round::Batch(b) => match b.step {
            BatchStep::Open | BatchStep::End | BatchStep::Markers => {
                format!("batch {:?} of {:?}", b.step, b.rows)
            }
            step => format!("batch {step:?} of {:?}", b.rows[b.next as usize]),
        },
        Round::Work { current, .. } => {
            format!(
                "{:?} of (message, attempt) {:?}",
                current.step, current.token
            )
        }
    };
    format!("relay {relay}: {step} -> {outcome:?}")
}

/// Explores every state of `model` (one of the small models beside the
/// relay's: [`crate::record`], [`crate::consumer`], [`crate::galera`]):
/// every property holds as it expects (each `always` and `eventually`
/// without a counterexample, each `sometimes` reached).
pub fn prove_model<M>(name: &str, model: M)
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + Send + Sync + 'static,
    M::Action: std::fmt::Debug + Clone + Send + Sync + 'static,
{
    let start = Instant::now();
    let checker = model.checker().threads(2).spawn_bfs().join();
    println!(
        "model {name}: proved in {:.1?}, {} unique states ({} generated), depth {}",
        start.elapsed(),
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
    );
    checker.assert_properties();
}

/// Explores `model` until `property` fails, and shows the counterexample.
pub fn refute_model<M>(name: &str, model: M, property: &'static str)
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + Send + Sync + 'static,
    M::Action: std::fmt::Debug + Clone + Send + Sync + 'static,
{
    let start = Instant::now();
    let checker = model
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
    println!("  last state: {:?}", path.last_state());
}
