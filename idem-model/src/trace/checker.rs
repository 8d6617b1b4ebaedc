//! The check: each message of a trace projected onto the model, its
//! events replayed one by one over the candidate states, the invariants
//! held after each, and a claim whose events stop taken to have crashed.

use super::event::{ClaimOutcome, Event};
use super::keys::blocks;
use super::replay::replay;
use crate::properties;
use crate::state::{Db, Entity, Relay, Round, Row, State, Status};
use crate::{Config, KeyMode};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// What the trace was recorded under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceConfig {
    /// The relay's `max_attempts`.
    pub max_attempts: u8,
    /// Only these messages are checked (their events skipped otherwise);
    /// `None`: every message in the trace.
    pub messages: Option<Vec<i64>>,
    /// The trace ran to the end: every message it names ends `success` or
    /// `failed`.
    pub complete: bool,
    /// Relay processes were killed (SIGKILL) during the run: a claim that
    /// committed just before its process died may have left no event. A
    /// claim whose attempt is past the row's is then taken as that many
    /// claims unseen, each by a process that died at once (their leases
    /// ran out); without it, it is a violation.
    pub killed: bool,
}

impl TraceConfig {
    /// Every message checked, `max_attempts` attempts, the run not
    /// required to have settled every message.
    pub fn new(max_attempts: u8) -> Self {
        TraceConfig {
            max_attempts,
            messages: None,
            complete: false,
            killed: false,
        }
    }
}

/// What a conforming trace came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Events checked.
    pub events: usize,
    /// Model steps taken for them (a batch event is one step per row; the
    /// steps the checker supplied, expiries and crashes, included).
    pub steps: usize,
    /// Messages checked.
    pub messages: usize,
    /// Claims (lease owners of a message) checked.
    pub claims: usize,
    /// Events skipped: their message is not in [`TraceConfig::messages`].
    pub ignored: usize,
    /// Leases the model had to let run out under a running handler (a
    /// stall: the one-run-at-a-time promise no longer applies).
    pub stalls: usize,
    /// `ok` claims of a keyed message checked against the other messages
    /// of its key (the head rule).
    pub keyed_claims: usize,
}

/// The first event the model does not allow, or an invariant broken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The event's index in the trace (the trace's length for a
    /// violation found at its end).
    pub index: usize,
    /// The event (`None` at the end).
    pub event: Option<Event>,
    /// The message concerned.
    pub msg: i64,
    /// Why the model refuses it.
    pub reason: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.event {
            Some(e) => write!(
                f,
                "event {} ({e:?}) of message {}: {}",
                self.index, self.msg, self.reason
            ),
            None => write!(f, "end of the trace, message {}: {}", self.msg, self.reason),
        }
    }
}

impl std::error::Error for Violation {}

/// The invariants every state reached must satisfy.
pub const INVARIANTS: [&str; 7] = [
    properties::AT_MOST_ONCE,
    properties::NEVER_FAILED_WITH_EFFECT,
    properties::SUCCESS_WITH_EFFECT,
    properties::MARKER_AFTER_COMMIT,
    properties::ONE_RUN_AT_A_TIME,
    properties::NEVER_DEAD_AFTER_PUBLISH,
    properties::PUBLISHED_FOR_SUCCESS,
];

/// One message's projection: the candidate model states and its claims.
struct Projection {
    states: Vec<State>,
    owners: Vec<String>,
}

/// Replays `events` through the model: `Ok` with what was checked, or the
/// first event the model does not allow from the state reached (or the
/// first broken invariant). Keyed claims are checked against the relay's
/// default mode for ordering keys, [`KeyMode::Continue`].
pub fn check(events: &[Event], config: &TraceConfig) -> Result<CheckReport, Violation> {
    check_ordered(events, config, KeyMode::Continue)
}

/// [`check`], with keyed claims checked against the relay's `mode` for
/// ordering keys (with [`KeyMode::Hold`], a dead-lettered message holds
/// the rest of its key).
pub fn check_ordered(
    events: &[Event],
    config: &TraceConfig,
    mode: KeyMode,
) -> Result<CheckReport, Violation> {
    let per_message = Config {
        relays: 0,
        max_attempts: config.max_attempts,
        batched: false,
        copies: false,
        may_fail: [true, false],
        publisher: [false; crate::state::ROWS],
        faults: u8::MAX,
        long_transactions: true,
        ordering: None,
        late_head: false,
        mutation: None,
    };
    let batched = Config {
        batched: true,
        ..per_message.clone()
    };
    // A claim whose failure bookkeeping is written on the pool after the
    // rollback: the relay before issue 23's fix.
    let pool_side = |c: &Config| Config {
        mutation: Some(crate::Mutation::PoolSideFailure),
        ..c.clone()
    };
    let (per_message_pool, batched_pool) = (pool_side(&per_message), pool_side(&batched));
    let wanted = |m: i64| config.messages.as_ref().is_none_or(|ms| ms.contains(&m));

    // The claims delivered in a batch; the messages of each owner; the
    // last event of each claim of each message.
    let mut batch_owners = BTreeSet::new();
    let mut in_tx_owners = BTreeSet::new();
    let mut messages_of: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut last: BTreeMap<usize, Vec<(i64, &str)>> = BTreeMap::new();
    {
        let mut last_of: BTreeMap<(i64, &str), usize> = BTreeMap::new();
        for (i, e) in events.iter().enumerate() {
            match e {
                Event::BatchOpen { owner, .. } => {
                    batch_owners.insert(owner.as_str());
                }
                Event::Settle {
                    owner, in_tx: true, ..
                } => {
                    in_tx_owners.insert(owner.as_str());
                }
                Event::Claim { msg, owner, .. } if wanted(*msg) => {
                    let ms = messages_of.entry(owner).or_default();
                    if !ms.contains(msg) {
                        ms.push(*msg);
                    }
                }
                _ => {}
            }
            match e.message() {
                Some((m, _)) => {
                    last_of.insert((m, e.owner()), i);
                }
                None => {
                    for &m in messages_of.get(e.owner()).into_iter().flatten() {
                        last_of.insert((m, e.owner()), i);
                    }
                }
            }
        }
        for ((m, owner), i) in last_of {
            last.entry(i).or_default().push((m, owner));
        }
    }

    let mut report = CheckReport::default();
    let mut projections: BTreeMap<i64, Projection> = BTreeMap::new();
    // Each message's ordering key, as its first claim named it.
    let mut key_of: BTreeMap<i64, Option<String>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Event::Claim {
            msg, outcome, key, ..
        } = e
            && wanted(*msg)
        {
            let violation = |reason: String| Violation {
                index: i,
                event: Some(e.clone()),
                msg: *msg,
                reason,
            };
            match key_of.get(msg) {
                Some(before) if before != key => {
                    return Err(violation(format!(
                        "claimed with the ordering key {key:?}, but its earlier claim had {before:?}"
                    )));
                }
                Some(_) => {}
                None => {
                    key_of.insert(*msg, key.clone());
                }
            }
            if let (ClaimOutcome::Ok, Some(k)) = (outcome, key) {
                let others: Vec<i64> = key_of
                    .iter()
                    .filter(|&(n, other)| n != msg && other.as_ref() == Some(k))
                    .map(|(&n, _)| n)
                    .collect();
                for n in others {
                    let Some(p) = projections.get_mut(&n) else {
                        continue;
                    };
                    let mut reason = None;
                    p.states
                        .retain(|s| match blocks(s, &p.owners, n, *msg, mode) {
                            Some(r) => {
                                reason.get_or_insert(r);
                                false
                            }
                            None => true,
                        });
                    if p.states.is_empty() {
                        return Err(violation(format!(
                            "claimed against the head rule of its ordering key {k:?}: {}",
                            reason.unwrap_or_default()
                        )));
                    }
                }
                report.keyed_claims += 1;
            }
        }
        let targets: Vec<i64> = match e.message() {
            Some((m, _)) if !wanted(m) => {
                report.ignored += 1;
                continue;
            }
            Some((m, _)) => vec![m],
            None => messages_of.get(e.owner()).cloned().unwrap_or_default(),
        };
        report.events += 1;
        for m in targets {
            let violation = |reason: String| Violation {
                index: i,
                event: Some(e.clone()),
                msg: m,
                reason,
            };
            let p = projections.entry(m).or_insert_with(|| Projection {
                states: vec![initial()],
                owners: Vec::new(),
            });
            let x = match p.owners.iter().position(|o| o == e.owner()) {
                Some(x) => x,
                None if matches!(e, Event::Claim { .. }) => {
                    p.owners.push(e.owner().to_owned());
                    for s in &mut p.states {
                        s.relays.push(Relay {
                            round: Round::Idle,
                            tx: None,
                        });
                    }
                    report.claims += 1;
                    p.owners.len() - 1
                }
                None => {
                    return Err(violation(format!(
                        "no claim of message {m} under owner {} before this event",
                        e.owner()
                    )));
                }
            };
            let model = match (
                batch_owners.contains(e.owner()),
                in_tx_owners.contains(e.owner()),
            ) {
                (true, true) => &batched,
                (false, true) => &per_message,
                (true, false) => &batched_pool,
                (false, false) => &per_message_pool,
            };
            let mut next = Vec::new();
            let mut reasons = BTreeSet::new();
            // A step is a stall only if no state it can follow from
            // explains it without one: a claim after another relay's
            // commit whose acknowledgement was lost is no stall where that
            // commit released the lease, whatever the branch where it did
            // not needs.
            let (mut stalled, mut clean) = (false, false);
            for s in &p.states {
                let mut needed = false;
                match replay(model, s, x, e, m, config.killed, &mut needed) {
                    Ok(states) => {
                        let before = next.len();
                        for s in states {
                            match broken(model, &s) {
                                None => next.push(s),
                                Some(name) => {
                                    reasons.insert(format!("the invariant `{name}` breaks"));
                                }
                            }
                        }
                        if next.len() > before {
                            stalled |= needed;
                            clean |= !needed;
                        }
                    }
                    Err(reason) => {
                        reasons.insert(reason);
                    }
                }
            }
            if next.is_empty() {
                let reasons: Vec<String> = reasons.into_iter().collect();
                return Err(violation(reasons.join("; or ")));
            }
            if stalled && !clean {
                report.stalls += 1;
            }
            report.steps += 1;
            next.sort();
            next.dedup();
            p.states = next;
        }
        // Claims whose events end here: crashed, if still delivering.
        for &(m, owner) in last.get(&i).into_iter().flatten() {
            let Some(p) = projections.get_mut(&m) else {
                continue;
            };
            let Some(x) = p.owners.iter().position(|o| o == owner) else {
                continue;
            };
            let model = match (batch_owners.contains(owner), in_tx_owners.contains(owner)) {
                (true, true) => &batched,
                (false, true) => &per_message,
                (true, false) => &batched_pool,
                (false, false) => &per_message_pool,
            };
            let mut crashed = false;
            let mut after = Vec::new();
            for s in &mut p.states {
                if s.relays[x].round != Round::Idle || s.relays[x].tx.is_some() {
                    // A killed process may have died just after its next
                    // statement, before reporting it: that step too, with
                    // any outcome, then the crash.
                    if config.killed {
                        for o in model.outcomes(s, x) {
                            let step = crate::Action::Step {
                                relay: x as u8,
                                outcome: o,
                            };
                            if let Some(mut n) = stateright::Model::next_state(model, s, step) {
                                n.relays[x] = Relay {
                                    round: Round::Idle,
                                    tx: None,
                                };
                                after.push(n);
                            }
                        }
                    }
                    s.relays[x] = Relay {
                        round: Round::Idle,
                        tx: None,
                    };
                    crashed = true;
                }
            }
            p.states.extend(after);
            if crashed {
                report.steps += 1;
                p.states.sort();
                p.states.dedup();
            }
        }
    }
    report.messages = projections.len();
    if config.complete {
        for (&m, p) in &projections {
            let settled = p.states.iter().any(|s| {
                let row = s.db.rows[0];
                row.status == Status::Success || (row.status == Status::Failed && row.reason)
            });
            if !settled {
                return Err(Violation {
                    index: events.len(),
                    event: None,
                    msg: m,
                    reason: format!(
                        "the trace is complete but the message is still {:?}",
                        p.states[0].db.rows[0]
                    ),
                });
            }
        }
    }
    Ok(report)
}

/// The model's state before a message's first claim: its row pending,
/// the model's second row absent.
fn initial() -> State {
    State {
        db: Db {
            rows: [
                Row {
                    exists: true,
                    ..Row::ABSENT
                },
                Row::ABSENT,
            ],
            entities: [Entity::default(); crate::state::ROWS],
        },
        relays: Vec::new(),
        cache: [false; crate::state::ROWS],
        sent: [2; crate::state::ROWS],
        faults: u8::MAX,
        stalled: false,
        published: [0; crate::state::ROWS],
        dead_after_publish: false,
    }
}

/// The first invariant `s` breaks.
fn broken(model: &Config, s: &State) -> Option<&'static str> {
    properties::all()
        .into_iter()
        .filter(|p| INVARIANTS.contains(&p.name))
        .find(|p| !(p.condition)(model, s))
        .map(|p| p.name)
}
