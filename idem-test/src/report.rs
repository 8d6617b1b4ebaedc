//! What a run found: per scenario, what ran, what was answered
//! `Duplicate`, the faults injected, and every action whose effect was
//! doubled or lost, with a message that names the scenario, the action,
//! its key and the likely cause.

use std::fmt;

use crate::scenario::Scenario;

/// One action of one scenario: what its calls answered and the effect
/// counted afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActionReport {
    /// Its number: the argument the run's `input` function was given.
    pub action: usize,
    /// The keys its calls derived (read from the attribute's span; empty
    /// for a handler written without `#[idempotent]`).
    pub keys: Vec<String>,
    /// Calls made for it (the duplicates and retries included).
    pub calls: u64,
    /// Calls that answered `Executed`.
    pub executed: u64,
    /// Calls that answered `Duplicate`.
    pub duplicates: u64,
    /// Calls that failed, or were dropped by a fault; the first error.
    pub failed: u64,
    /// The first error a call answered, if any.
    pub first_error: Option<String>,
    /// Faults injected into its calls.
    pub faults: u64,
    /// The effect counted once its calls were done.
    pub effect: i64,
    /// The effect expected (the run's `expect_effect`, 1 by default).
    pub expected: i64,
    /// What the scenario did to it, in words.
    pub story: String,
    /// Other actions that derived one of its keys: (action, key).
    pub sharing: Vec<(usize, String)>,
}

impl ActionReport {
    /// Whether it acted exactly once (its effect is the one expected).
    pub fn acted_once(&self) -> bool {
        self.effect == self.expected
    }

    /// "doubled", "lost" or "ok".
    pub fn verdict(&self) -> &'static str {
        match self.effect.cmp(&self.expected) {
            std::cmp::Ordering::Greater => "doubled",
            std::cmp::Ordering::Less => "lost",
            std::cmp::Ordering::Equal => "ok",
        }
    }

    fn key_text(&self) -> String {
        match self.keys.as_slice() {
            [] => "no key seen: not an #[idempotent] call, or one spawned off the call's task"
                .to_owned(),
            [one] => format!("key {one:?}"),
            many => format!("keys {many:?}"),
        }
    }

    /// The failure message, `None` when it acted once.
    fn failure(&self, scenario: Scenario) -> Option<String> {
        if self.acted_once() {
            return None;
        }
        let mut msg = format!(
            "acts_once: scenario \"{}\": action #{} ({}): effect counted {}, expected {} ({}): {}",
            scenario.name(),
            self.action,
            self.key_text(),
            self.effect,
            self.expected,
            self.verdict(),
            self.story,
        );
        if let Some(cause) = self.cause(scenario) {
            msg.push_str(": ");
            msg.push_str(&cause);
        }
        Some(msg)
    }

    /// The likely cause of a doubled or lost effect.
    fn cause(&self, scenario: Scenario) -> Option<String> {
        if let Some((other, key)) = self.sharing.first() {
            return Some(format!(
                "actions #{other} and #{} derived the same key {key:?}: the key template leaves out \
                 what tells the two actions apart, so the second is taken for a duplicate of the first",
                self.action
            ));
        }
        if self.effect < self.expected {
            return self
                .first_error
                .as_ref()
                .map(|e| format!("a call failed: {e}"));
        }
        Some(match scenario {
            Scenario::ConcurrentDuplicates => {
                "more than one concurrent call passed the duplicate check: it does not run \
                 in the call's transaction under a lock (a check outside the transaction sees \
                 what a call that has not committed yet will change)"
                    .to_owned()
            }
            Scenario::Cancelled => {
                "the cancelled call's transaction rolled back, yet its effect stayed: it is \
                 written outside the call's transaction (a second pool or connection, an HTTP call)"
                    .to_owned()
            }
            Scenario::LostAcks => {
                "the retry of a call that had committed acted again: the duplicate check does \
                 not see what the committed call wrote, or part of the effect commits on its own"
                    .to_owned()
            }
            Scenario::Single => {
                "a single call acted more than once: the effect counted is not one per action"
                    .to_owned()
            }
            Scenario::RelayRestarted => {
                "the relay that died left an effect behind that the next delivery added to: \
                 part of the effect is written outside the handler's transaction (a second \
                 pool or connection, an HTTP call), or the duplicate check does not see what \
                 the committed delivery wrote"
                    .to_owned()
            }
            Scenario::LeaseExpired => {
                "both relays' handlers acted: once the lease ran out, the old owner's handler \
                 was not fenced off, and the duplicate check does not run in the handler's \
                 transaction under a lock (pass `d.source()` to the #[idempotent] call: its \
                 transaction then marks the message, fenced by the delivery's lease)"
                    .to_owned()
            }
        })
    }
}

/// One scenario: its actions and their totals.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScenarioReport {
    /// The scenario.
    pub scenario: Scenario,
    /// Its actions.
    pub actions: Vec<ActionReport>,
}

impl ScenarioReport {
    fn sum(&self, f: impl Fn(&ActionReport) -> u64) -> u64 {
        self.actions.iter().map(f).sum()
    }

    /// Calls made.
    pub fn calls(&self) -> u64 {
        self.sum(|a| a.calls)
    }

    /// Calls that answered `Executed`.
    pub fn executed(&self) -> u64 {
        self.sum(|a| a.executed)
    }

    /// Calls that answered `Duplicate`.
    pub fn duplicates(&self) -> u64 {
        self.sum(|a| a.duplicates)
    }

    /// Calls that failed or were dropped by a fault.
    pub fn failed(&self) -> u64 {
        self.sum(|a| a.failed)
    }

    /// Faults injected.
    pub fn faults(&self) -> u64 {
        self.sum(|a| a.faults)
    }

    /// Actions whose effect was counted more than expected.
    pub fn doubled(&self) -> usize {
        self.actions
            .iter()
            .filter(|a| a.effect > a.expected)
            .count()
    }

    /// Actions whose effect was counted less than expected.
    pub fn lost(&self) -> usize {
        self.actions
            .iter()
            .filter(|a| a.effect < a.expected)
            .count()
    }
}

/// What a run found, scenario by scenario. [`assert_acts_once`](Report::assert_acts_once)
/// panics with every failure's message; `Display` prints a table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The handler's name, as given to the run.
    pub handler: String,
    /// The database it ran on.
    pub backend: &'static str,
    /// The scenarios, in the order they ran.
    pub scenarios: Vec<ScenarioReport>,
}

impl Report {
    /// Whether every action of every scenario acted exactly once.
    pub fn acts_once(&self) -> bool {
        self.failures().is_empty()
    }

    /// One message per action that did not act once, e.g.
    /// `acts_once: scenario "concurrent duplicates": action #3 (key
    /// "coupon:3"): effect counted 2, expected 1 (doubled): 2 of 8
    /// concurrent calls executed: …`.
    pub fn failures(&self) -> Vec<String> {
        self.scenarios
            .iter()
            .flat_map(|s| s.actions.iter().filter_map(|a| a.failure(s.scenario)))
            .collect()
    }

    /// The scenario's report, if it ran.
    pub fn scenario(&self, scenario: Scenario) -> Option<&ScenarioReport> {
        self.scenarios.iter().find(|s| s.scenario == scenario)
    }

    /// Panics unless every action acted exactly once, with every failure's
    /// message and then the table.
    #[track_caller]
    pub fn assert_acts_once(&self) {
        let failures = self.failures();
        if !failures.is_empty() {
            panic!("{}\n\n{self}", failures.join("\n"));
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "acts_once: {} on {}", self.handler, self.backend)?;
        writeln!(
            f,
            "{:<30} {:>7} {:>7} {:>9} {:>6} {:>6} {:>7} {:>5}",
            "scenario", "actions", "calls", "executed", "dup", "failed", "doubled", "lost"
        )?;
        for s in &self.scenarios {
            writeln!(
                f,
                "{:<30} {:>7} {:>7} {:>9} {:>6} {:>6} {:>7} {:>5}   faults injected: {}",
                s.scenario.name(),
                s.actions.len(),
                s.calls(),
                s.executed(),
                s.duplicates(),
                s.failed(),
                s.doubled(),
                s.lost(),
                s.faults(),
            )?;
        }
        Ok(())
    }
}
