//! Conformance: a trace of the relay's protocol events, as the runtime
//! records them (its `testing` feature), replayed through the model's step
//! relation. Every observed step must be one the model allows from the
//! state reached so far, with the outcome observed, and every state reached
//! must satisfy the invariants.
//!
//! # The events
//!
//! One JSON object per event, in the order the database saw them (a
//! single process's order of emission is enough for one relay process; a
//! trace of several processes must be merged in the database's order, e.g.
//! by a sequence taken in the statement's own transaction). Every event
//! names its `kind`; all but the two batch events also name the outbox
//! row (`msg`, its `id`), the claim's lease owner (`owner`, the
//! `relay#seq` the claim wrote) and the attempt the claim wrote
//! (`attempt`). Fields not listed are ignored (a `topic`, a `relay`, a
//! timestamp may be added freely).
//!
//! ```json
//! {"kind":"claim","msg":7,"attempt":1,"owner":"r1#4","outcome":"ok"}
//! {"kind":"claim","msg":7,"attempt":2,"owner":"r1#5","outcome":"lost_ack"}
//! {"kind":"claim","msg":7,"attempt":0,"owner":"r1#6","outcome":"refused"}
//! {"kind":"claim_read_back","msg":7,"attempt":2,"owner":"r1#5","held":true}
//! {"kind":"renew","msg":7,"attempt":2,"owner":"r1#5","renewed":true}
//! {"kind":"fenced_update","msg":7,"attempt":2,"owner":"r1#5","held":true}
//! {"kind":"guard","msg":7,"attempt":2,"owner":"r1#5","done":false}
//! {"kind":"effect","msg":7,"attempt":2,"owner":"r1#5"}
//! {"kind":"aborted","msg":7,"attempt":2,"owner":"r1#5"}
//! {"kind":"transition","msg":7,"attempt":2,"owner":"r1#5","ok":true}
//! {"kind":"commit","msg":7,"attempt":2,"owner":"r1#5","outcome":"ok","dup":false}
//! {"kind":"marker","msg":7,"attempt":2,"owner":"r1#5"}
//! {"kind":"landed","msg":7,"attempt":2,"owner":"r1#5","success":true}
//! {"kind":"settle","msg":7,"attempt":2,"owner":"r1#5","dead":false,"retryable":true,"applied":true}
//! {"kind":"settle","msg":7,"attempt":3,"owner":"r2#1","dead":true,"retryable":true,"applied":true,"in_tx":true}
//! {"kind":"relay_mark","msg":7,"attempt":2,"owner":"r1#5","applied":true}
//! {"kind":"batch_open","owner":"r3#2","renewed":[7,8]}
//! {"kind":"batch_open","owner":"r3#3","renewed":[],"begun":false}
//! {"kind":"batch_commit","owner":"r3#2","outcome":"ok"}
//! ```
//!
//! - `claim`: one per row a claim took, each with the claim's outcome:
//!   `ok` (committed, acknowledged), `lost_ack` (the outcome unknown to the
//!   relay: applied or not, the read-back tells), `refused` (nothing
//!   applied, known). `attempt` is the row's `attempts` after the claim;
//!   for a claim that is not `ok` it may be `0` (unknown), and is then
//!   taken from the model.
//! - `claim_read_back`: the read-back of a `lost_ack` claim (`held`: the
//!   row is pending under the claim's owner, its lease running; a failed
//!   read is `held: false`).
//! - `renew`: a lease renewal under the claim's owner. On the per-message
//!   path after a batch that did not commit, it is the step that decides
//!   whether the message is still this claim's (`renewed: false`: left to
//!   its holder); anywhere else it is the heartbeat's, and `renewed: true`
//!   requires the row to be held by the claim.
//! - `fenced_update`: the handler's transaction's fenced success update
//!   (`held`: it updated one row).
//! - `guard`: the state check (`done`: the action is already done, the
//!   call answers `Duplicate`).
//! - `effect`: the handler body's write, in the call's transaction; for a
//!   route whose handler does not take its delivery's source (a
//!   publisher), its publish (see below).
//! - `aborted`: the handler's call whose transaction aborted before its
//!   end (a statement of it failed: `BEGIN`, the fenced update, the state
//!   check; a lost connection, a Galera certification failure); replayed
//!   as the body failing, its transaction rolled back.
//! - `transition`: the guarded transition (`ok: true`), or the body's
//!   failure (`ok: false`, the transaction rolled back); for a publisher
//!   route, the handler's answer.
//! - `commit`: the handler's transaction's `COMMIT`: `ok`, `lost_ack` (the
//!   outcome unknown: applied or not), `failed` (refused, nothing
//!   applied); `dup`: the call answered `Duplicate`.
//! - `marker`: the cache marker written after an acknowledged commit
//!   (none is required: a relay without a cache writes none).
//! - `landed`: the read-back of a handler commit whose outcome was
//!   unknown (`success`: the row is `success`; a failed read is `false`).
//! - `settle`: the failure bookkeeping, fenced by owner and attempt:
//!   `dead` (the relay's decision: not retryable, or `attempt >=
//!   max_attempts`), `retryable` (the error's class), `applied` (it
//!   changed the row, after its retries and read-back). `in_tx: true`: the
//!   bookkeeping written in the handler's own transaction (rolled back to
//!   the savepoint after the fenced update, then committed with the
//!   `commit` event that follows) rather than on the pool.
//! - `relay_mark`: the relay-side success mark of a route whose handler
//!   did not take its source (`outbox_success_pool`, fenced, retried and
//!   read back after a lost acknowledgement); `applied`: the relay
//!   confirmed it (`false`: stale, or every try failed).
//! - `batch_open`: a batch's `BEGIN` and renewal (`renewed`: the ids the
//!   renewal returned with the claim's attempts; `begun: false`, default
//!   `true`: `BEGIN` failed, every message goes the per-message path).
//!   It concerns every row claimed under `owner`.
//! - `batch_commit`: the deferred success update and the batch's
//!   `COMMIT`: `ok`, `lost_ack`, `failed` (refused), `short` (the update
//!   matched fewer rows than expected: rolled back). The handlers' own
//!   steps in a batch are `guard`, `effect`, `transition` events under the
//!   batch's owner.
//!
//! # The projection
//!
//! The model holds two rows; a trace holds any number of messages and
//! claims. Each message is checked on its own (the protocol's steps for
//! one row read and write that row, its entity, and the transactions that
//! lock it): its row is the model's row 0, acting on an entity of its own,
//! and each claim of it (each lease owner) is a model relay of its own
//! (a model relay runs one claim at a time; a real relay running many is,
//! to the protocol, several relays). A claim of several rows in one batch
//! is, for each of its rows, a batch of that row: the batch's `short`
//! outcome, caused by another row, is to this row a refused commit (the
//! same per-message path follows).
//!
//! What the trace does not show, the checker supplies:
//!
//! - time: a lease runs out whenever the model lets it (`Expire`, with
//!   `long_transactions`: a transaction may outlive its lease), taken when
//!   a claim finds the row's lease running; a lease the model says was
//!   looked after is a stall (counted in [`CheckReport::stalls`]);
//! - hidden outcomes: a `lost_ack` commit is followed both as applied and
//!   as not applied (a set of candidate states, narrowed by the read-backs
//!   that follow); a failed read and a refused fence look alike;
//! - crashes: a claim whose events stop before its delivery ends is taken
//!   to have crashed after its last event, its transaction aborted (a
//!   killed process, a dropped future, the end of the test); with
//!   [`TraceConfig::killed`], also after one more statement that it never
//!   reported, with any outcome, and a claim may be missing altogether;
//! - the route: a delivery whose first event after its claim is an
//!   `effect` or a `transition` (no `fenced_update`) runs on the relay's
//!   own path (a publisher route, or a handler failing before its call);
//! - the error class: a `settle`'s `retryable` is the handler's to choose;
//! - the protocol's version: a claim with a `settle` whose `in_tx` is set
//!   is replayed on the protocol with issue 23's fix (the failure
//!   bookkeeping in the handler's transaction, or the batch's, and on the
//!   pool only after that transaction was lost), any other on the relay's
//!   earlier protocol (the bookkeeping on the pool after the rollback).
//!
//! Faults are not bounded: the trace's lost acknowledgements are whatever
//! the run injected.
//!
//! Events of a message outside [`TraceConfig::messages`] (when it is set)
//! are skipped and counted in [`CheckReport::ignored`]: a trace may hold
//! messages of routes the run does not check. Without it, every message is
//! checked; an event for a claim the trace never showed is a violation.

use crate::properties;
use crate::state::{BatchStep, Db, Entity, Relay, Round, Row, State, Status, Step, Token};
use crate::{Config, Outcome};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A claim's commit outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimOutcome {
    /// Committed and acknowledged.
    Ok,
    /// Unknown to the relay (applied or not).
    LostAck,
    /// Refused: nothing applied.
    Refused,
}

/// A handler transaction's commit outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitOutcome {
    /// Committed and acknowledged.
    Ok,
    /// Unknown to the relay (applied or not).
    LostAck,
    /// Refused: nothing applied.
    Failed,
}

/// A batch's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchOutcome {
    /// Committed and acknowledged.
    Ok,
    /// Unknown to the relay (applied or not).
    LostAck,
    /// Refused: nothing applied.
    Failed,
    /// The deferred success update matched fewer rows than expected: the
    /// batch rolled back.
    Short,
}

fn yes() -> bool {
    true
}

/// One protocol event of the runtime (see the module's documentation for
/// the JSON shape of each).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A claim of the row (one event per row of the claim).
    Claim {
        /// The outbox row's id.
        msg: i64,
        /// The attempts the claim wrote (`0`: unknown, for a claim not `ok`).
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The claim's commit outcome.
        outcome: ClaimOutcome,
    },
    /// The read-back of a claim whose outcome was unknown.
    ClaimReadBack {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The row is still this claim's, its lease running.
        held: bool,
    },
    /// A lease renewal under the claim's owner.
    Renew {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// It renewed the row.
        renewed: bool,
    },
    /// The handler transaction's fenced success update.
    FencedUpdate {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// It updated the row (row count 1).
        held: bool,
    },
    /// The state check.
    Guard {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The action is already done (a duplicate).
        done: bool,
    },
    /// A handler's call whose transaction aborted before its end (a
    /// statement failed: its `BEGIN`, its fenced update, its state check;
    /// a lost connection): nothing it wrote commits. Replayed as its body
    /// failing: the steps before the transition, then the transition
    /// failing (its rollback).
    Aborted {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
    },
    /// The handler's effect (its write, or a publisher's publish).
    Effect {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
    },
    /// The transition, or the body's failure.
    Transition {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The body and its transition succeeded.
        ok: bool,
    },
    /// The handler transaction's commit.
    Commit {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// Its outcome.
        outcome: CommitOutcome,
        /// The call answered `Duplicate`.
        dup: bool,
    },
    /// The read-back of a handler commit whose outcome was unknown.
    Landed {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The row is `success`.
        success: bool,
    },
    /// The failure bookkeeping.
    Settle {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The relay's decision: dead-letter.
        dead: bool,
        /// The error may be retried.
        retryable: bool,
        /// It changed the row.
        applied: bool,
        /// Written in the handler's own transaction (committed by the
        /// `commit` that follows).
        #[serde(default)]
        in_tx: bool,
    },
    /// The relay-side success mark of a route that did not take its source.
    RelayMark {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
        /// The relay confirmed the mark.
        applied: bool,
    },
    /// The cache marker.
    Marker {
        /// The outbox row's id.
        msg: i64,
        /// The claim's attempt.
        attempt: i32,
        /// The claim's lease owner.
        owner: String,
    },
    /// A batch's `BEGIN` and renewal.
    BatchOpen {
        /// The batch's claim's lease owner.
        owner: String,
        /// The ids the renewal returned.
        renewed: Vec<i64>,
        /// `BEGIN` succeeded.
        #[serde(default = "yes")]
        begun: bool,
    },
    /// A batch's deferred success update and commit.
    BatchCommit {
        /// The batch's claim's lease owner.
        owner: String,
        /// Its outcome.
        outcome: BatchOutcome,
    },
}

impl Event {
    /// The lease owner the event is under.
    pub fn owner(&self) -> &str {
        match self {
            Event::Claim { owner, .. }
            | Event::ClaimReadBack { owner, .. }
            | Event::Renew { owner, .. }
            | Event::FencedUpdate { owner, .. }
            | Event::Guard { owner, .. }
            | Event::Effect { owner, .. }
            | Event::Aborted { owner, .. }
            | Event::Transition { owner, .. }
            | Event::Commit { owner, .. }
            | Event::Landed { owner, .. }
            | Event::Settle { owner, .. }
            | Event::RelayMark { owner, .. }
            | Event::Marker { owner, .. }
            | Event::BatchOpen { owner, .. }
            | Event::BatchCommit { owner, .. } => owner,
        }
    }

    /// The message and attempt of a per-message event (`None` for the
    /// batch events, which concern every row of their claim).
    pub fn message(&self) -> Option<(i64, i32)> {
        match self {
            Event::Claim { msg, attempt, .. }
            | Event::ClaimReadBack { msg, attempt, .. }
            | Event::Renew { msg, attempt, .. }
            | Event::FencedUpdate { msg, attempt, .. }
            | Event::Guard { msg, attempt, .. }
            | Event::Effect { msg, attempt, .. }
            | Event::Aborted { msg, attempt, .. }
            | Event::Transition { msg, attempt, .. }
            | Event::Commit { msg, attempt, .. }
            | Event::Landed { msg, attempt, .. }
            | Event::Settle { msg, attempt, .. }
            | Event::RelayMark { msg, attempt, .. }
            | Event::Marker { msg, attempt, .. } => Some((*msg, *attempt)),
            Event::BatchOpen { .. } | Event::BatchCommit { .. } => None,
        }
    }

    /// Parses a trace written one JSON object per line (blank lines
    /// skipped).
    pub fn parse_lines(text: &str) -> Result<Vec<Event>, serde_json::Error> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect()
    }

    /// The events of a trace recorded as JSON values (the runtime's
    /// `testing::trace`), in order; the first value that is no event is
    /// the error, with its text.
    pub fn from_values(values: &[serde_json::Value]) -> Result<Vec<Event>, String> {
        values
            .iter()
            .map(|v| Event::deserialize(v).map_err(|e| format!("{e}: {v}")))
            .collect()
    }
}

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
/// first broken invariant).
pub fn check(events: &[Event], config: &TraceConfig) -> Result<CheckReport, Violation> {
    let per_message = Config {
        relays: 0,
        max_attempts: config.max_attempts,
        batched: false,
        copies: false,
        may_fail: [true, false],
        publisher: [false; crate::state::ROWS],
        faults: u8::MAX,
        long_transactions: true,
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
    for (i, e) in events.iter().enumerate() {
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
            let mut stalled = false;
            for s in &p.states {
                match replay(model, s, x, e, m, config.killed, &mut stalled) {
                    Ok(states) => {
                        for s in states {
                            match broken(model, &s) {
                                None => next.push(s),
                                Some(name) => {
                                    reasons.insert(format!("the invariant `{name}` breaks"));
                                }
                            }
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
            if stalled {
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

/// The claim relay `x` delivers, at its current step.
fn token(s: &State, x: usize) -> Option<Token> {
    match &s.relays[x].round {
        Round::Idle => None,
        Round::Recover(tokens) => tokens.first().copied(),
        Round::Batch(b) => b.rows.first().copied(),
        Round::Work { current, .. } => Some(current.token),
    }
}

/// The step of relay `x`'s current delivery on the per-message path.
fn step(s: &State, x: usize) -> Option<Step> {
    match &s.relays[x].round {
        Round::Work { current, .. } => Some(current.step),
        _ => None,
    }
}

fn set_step(s: &mut State, x: usize, step: Step) {
    if let Round::Work { current, .. } = &mut s.relays[x].round {
        current.step = step;
    }
}

/// What relay `x` is doing, for a reason.
fn doing(s: &State, x: usize) -> String {
    match &s.relays[x].round {
        Round::Idle => "no delivery in progress (its claim ended)".to_owned(),
        Round::Recover(_) => "the claim's read-back is due".to_owned(),
        Round::Batch(b) => format!("the batch is at {:?}", b.step),
        Round::Work { current, .. } => format!("the delivery is at {:?}", current.step),
    }
}

/// Skips relay `x`'s cache markers (none is required).
fn skip_markers(model: &Config, s: &mut State, x: usize) {
    match &s.relays[x].round {
        Round::Work { current, queue } if current.step == Step::Marker => {
            let mut queue = queue.clone();
            s.relays[x].round = match queue.is_empty() {
                true => Round::Idle,
                false => {
                    let current = queue.remove(0);
                    Round::Work { current, queue }
                }
            };
        }
        Round::Batch(b) if b.step == BatchStep::Markers => {
            s.relays[x].round =
                model.bookkeeping(&b.ran, false, !model.has(crate::Mutation::PoolSideFailure));
        }
        _ => {}
    }
}

/// One model step of relay `x` with `outcome`; `Err` if it is not
/// enabled (it would wait for a lock).
fn take(model: &Config, s: &State, x: usize, outcome: Outcome) -> Result<State, String> {
    let mut n = s.clone();
    let taken = match &n.relays[x].round {
        Round::Idle => None,
        Round::Recover(tokens) => {
            let tokens = tokens.clone();
            model.recover(&mut n, x, tokens, outcome);
            Some(())
        }
        Round::Batch(_) => model.batch(&mut n, x, outcome),
        Round::Work { .. } => model.work(&mut n, x, outcome),
    };
    match taken {
        Some(()) => {
            n.faults = u8::MAX;
            Ok(n)
        }
        None => Err(format!(
            "the step waits: another transaction locks the row ({})",
            doing(s, x)
        )),
    }
}

/// The states the model reaches from `s` by relay `x`'s step `e`.
fn replay(
    model: &Config,
    s: &State,
    x: usize,
    e: &Event,
    m: i64,
    killed: bool,
    stalled: &mut bool,
) -> Result<Vec<State>, String> {
    let mut s = s.clone();
    if !matches!(e, Event::Marker { .. }) {
        skip_markers(model, &mut s, x);
    }
    if let (Some((_, attempt)), Some((_, a))) = (e.message(), token(&s, x))
        && !matches!(e, Event::Claim { .. })
        && i32::from(a) != attempt
    {
        return Err(format!("attempt {attempt}, but the claim wrote {a}"));
    }
    let row = s.db.rows[0];
    let held = |s: &State| token(s, x).is_some_and(|(_, a)| s.db.rows[0].held_by(x as u8, a));
    match e {
        Event::Claim {
            attempt, outcome, ..
        } => {
            if s.relays[x].round != Round::Idle {
                return Err(format!("a second claim under one owner: {}", doing(&s, x)));
            }
            if row.status == Status::Pending && row.lease {
                if !model.unrenewed(&s, 0) {
                    s.stalled = true;
                    *stalled = true;
                }
                s.db.rows[0].lease = false;
            }
            let mut row = row;
            // Claims a killed process committed but never reported: they
            // leased the row, and their leases ran out.
            if killed
                && row.status == Status::Pending
                && !s.row_locked(0)
                && *attempt > i32::from(row.attempts.saturating_add(1))
            {
                row.attempts = u8::try_from(*attempt - 1).unwrap_or(u8::MAX);
                row.lease = false;
                s.db.rows[0] = row;
            }
            let wrote = row.attempts.saturating_add(1);
            if *attempt != 0 && *attempt != i32::from(wrote) {
                return Err(format!(
                    "the claim wrote attempt {attempt}, but the row had {} attempts",
                    row.attempts
                ));
            }
            let outcomes: &[Outcome] = match outcome {
                ClaimOutcome::Ok => &[Outcome::Ok],
                ClaimOutcome::LostAck => &[Outcome::LostAck, Outcome::LostUnapplied],
                ClaimOutcome::Refused => &[Outcome::Refused],
            };
            let mut out = Vec::new();
            for &o in outcomes {
                let mut n = s.clone();
                if model.claim(&mut n, x, (1, false), o).is_none() {
                    return Err(format!(
                        "the row is not claimable (status {:?}, locked by a transaction: {})",
                        row.status,
                        s.row_locked(0)
                    ));
                }
                n.faults = u8::MAX;
                out.push(n);
            }
            Ok(out)
        }
        Event::ClaimReadBack { held: seen, .. } => {
            if !matches!(s.relays[x].round, Round::Recover(_)) {
                return Err(format!("a read-back, but {}", doing(&s, x)));
            }
            let mut out = Vec::new();
            for o in [Outcome::Ok, Outcome::ReadFailed] {
                let n = take(model, &s, x, o)?;
                if (n.relays[x].round != Round::Idle) == *seen {
                    out.push(n);
                }
            }
            match out.is_empty() {
                true => Err(format!(
                    "the read-back found the row {}held, the model {:?}",
                    if *seen { "" } else { "not " },
                    row
                )),
                false => Ok(out),
            }
        }
        Event::Renew { renewed, .. } => {
            if step(&s, x) == Some(Step::Renew) {
                let n = take(model, &s, x, Outcome::Ok)?;
                let kept = token(&n, x) == token(&s, x) && step(&n, x) != Some(Step::Renew);
                if kept != *renewed {
                    return Err(format!(
                        "the renewal {}, but the row is {:?}",
                        if *renewed { "renewed" } else { "did not renew" },
                        row
                    ));
                }
                return Ok(vec![n]);
            }
            if token(&s, x).is_none() {
                // A heartbeat that was in flight when its delivery ended:
                // fenced by the lease, it renews nothing; harmless.
                if !*renewed {
                    return Ok(vec![s]);
                }
                return Err(format!("a renewal, but {}", doing(&s, x)));
            }
            if *renewed {
                if !held(&s) {
                    return Err(format!(
                        "the heartbeat renewed a row the claim no longer holds: {row:?}"
                    ));
                }
                s.db.rows[0].lease = true;
            }
            Ok(vec![s])
        }
        Event::FencedUpdate { held: seen, .. } => {
            if !matches!(step(&s, x), Some(Step::Begin { .. })) {
                return Err(format!("a fenced update, but {}", doing(&s, x)));
            }
            let n = take(model, &s, x, Outcome::Ok)?;
            let matched = step(&n, x) == Some(Step::Guard);
            if matched != *seen {
                return Err(format!(
                    "the fenced update {} the row {row:?} (the fence {} it)",
                    if *seen { "matched" } else { "missed" },
                    if matched { "matches" } else { "refuses" }
                ));
            }
            Ok(vec![n])
        }
        Event::Guard { done, .. } => {
            let expected = match &s.relays[x].round {
                Round::Work { current, .. } if current.step == Step::Guard => None,
                Round::Batch(b) if b.step == BatchStep::Guard => None,
                _ => Some(format!("a state check, but {}", doing(&s, x))),
            };
            if let Some(reason) = expected {
                return Err(reason);
            }
            let n = take(model, &s, x, Outcome::Ok)?;
            let found = match &n.relays[x].round {
                Round::Work { current, .. } => current.step == Step::Commit { dup: true },
                Round::Batch(b) => b.step != BatchStep::Effect,
                _ => false,
            };
            if found != *done {
                return Err(format!(
                    "the state check found the action {}done, but the committed entity is {:?}",
                    if *done { "" } else { "not " },
                    s.db.entities[0]
                ));
            }
            Ok(vec![n])
        }
        Event::Aborted { .. } => {
            let mut n = s;
            for _ in 0..8 {
                let at_transition = match &n.relays[x].round {
                    Round::Work { current, .. } => match current.step {
                        Step::Transition => true,
                        Step::Begin { .. } | Step::Guard | Step::Effect => false,
                        other => {
                            return Err(format!(
                                "an aborted call, but the delivery is at {other:?}"
                            ));
                        }
                    },
                    Round::Batch(b) => match b.step {
                        BatchStep::Transition => true,
                        BatchStep::Guard | BatchStep::Effect => false,
                        other => {
                            return Err(format!("an aborted call, but the batch is at {other:?}"));
                        }
                    },
                    _ => return Err(format!("an aborted call, but {}", doing(&n, x))),
                };
                if at_transition {
                    return Ok(vec![take(model, &n, x, Outcome::Fail)?]);
                }
                let before = token(&n, x);
                n = take(model, &n, x, Outcome::Ok)?;
                // The fence refused it: the delivery ended with nothing run.
                if token(&n, x) != before
                    || step(&n, x).is_none() && !matches!(n.relays[x].round, Round::Batch(_))
                {
                    return Ok(vec![n]);
                }
            }
            Err("an aborted call the model cannot place".into())
        }
        Event::Effect { .. } => {
            match step(&s, x) {
                // A call without its source: the relay's own path.
                Some(Step::Begin { dup: false }) => set_step(&mut s, x, Step::Publish),
                Some(Step::Effect | Step::Publish) => {}
                _ if matches!(&s.relays[x].round, Round::Batch(b) if b.step == BatchStep::Effect) =>
                    {}
                _ => return Err(format!("an effect, but {}", doing(&s, x))),
            }
            Ok(vec![take(model, &s, x, Outcome::Ok)?])
        }
        Event::Transition { ok, .. } => {
            match step(&s, x) {
                Some(Step::Begin { dup: false }) if !*ok => set_step(&mut s, x, Step::Publish),
                Some(Step::Begin { dup: false } | Step::Publish) => {
                    return Err(
                        "a handler without its source answered Ok without an effect".to_owned()
                    );
                }
                Some(Step::Transition | Step::Verdict) => {}
                _ if matches!(&s.relays[x].round, Round::Batch(b) if b.step == BatchStep::Transition) =>
                    {}
                _ => return Err(format!("a transition, but {}", doing(&s, x))),
            }
            let o = if *ok { Outcome::Ok } else { Outcome::Fail };
            Ok(vec![take(model, &s, x, o)?])
        }
        Event::Commit { outcome, dup, .. } => {
            match step(&s, x) {
                Some(Step::Commit { dup: d }) if d == *dup => {}
                Some(Step::CommitFailure) if !*dup => {}
                Some(Step::Commit { dup: d }) => {
                    return Err(format!(
                        "a commit answering {}, but the call {}",
                        if *dup { "Duplicate" } else { "executed" },
                        if d {
                            "found the action done"
                        } else {
                            "executed"
                        }
                    ));
                }
                _ => return Err(format!("a commit, but {}", doing(&s, x))),
            }
            let outcomes: &[Outcome] = match outcome {
                CommitOutcome::Ok => &[Outcome::Ok],
                CommitOutcome::LostAck => &[Outcome::LostAck, Outcome::LostUnapplied],
                CommitOutcome::Failed => &[Outcome::Refused],
            };
            outcomes.iter().map(|&o| take(model, &s, x, o)).collect()
        }
        Event::Marker { .. } => {
            let at_marker = match &s.relays[x].round {
                Round::Work { current, .. } => current.step == Step::Marker,
                Round::Batch(b) => b.step == BatchStep::Markers,
                _ => false,
            };
            if !at_marker {
                return Err(format!(
                    "a cache marker, but {} (a marker only after an acknowledged commit)",
                    doing(&s, x)
                ));
            }
            Ok(vec![take(model, &s, x, Outcome::Ok)?])
        }
        Event::Landed { success, .. } => {
            if step(&s, x) != Some(Step::Landed) {
                return Err(format!("a read-back of a commit, but {}", doing(&s, x)));
            }
            let mut out = Vec::new();
            for o in [Outcome::Ok, Outcome::ReadFailed] {
                let n = take(model, &s, x, o)?;
                let landed = !matches!(step(&n, x), Some(Step::Settle { .. }))
                    || token(&n, x) != token(&s, x);
                if landed == *success {
                    out.push(n);
                }
            }
            match out.is_empty() {
                true => Err(format!(
                    "the read-back found the commit {}landed, but the row is {row:?}",
                    if *success { "" } else { "not " }
                )),
                false => Ok(out),
            }
        }
        Event::Settle {
            dead,
            retryable,
            applied,
            in_tx,
            ..
        } => {
            let at_batch_end =
                matches!(&s.relays[x].round, Round::Batch(b) if b.step == BatchStep::End);
            match (step(&s, x), *in_tx) {
                (Some(Step::Settle { .. }), false) => {}
                (Some(Step::CommitFailure), true) => {}
                (None, true) if at_batch_end => {}
                _ => {
                    return Err(format!(
                        "failure bookkeeping {}, but {}",
                        if *in_tx {
                            "in the handler's transaction"
                        } else {
                            "on the pool"
                        },
                        doing(&s, x)
                    ));
                }
            }
            let (_, a) = token(&s, x).expect("delivering");
            let decided = !*retryable || a >= model.max_attempts;
            if decided != *dead {
                return Err(format!(
                    "the bookkeeping decided {}, but attempt {a} of {} ({}) is {}",
                    if *dead { "a dead letter" } else { "a retry" },
                    model.max_attempts,
                    if *retryable {
                        "retryable"
                    } else {
                        "not retryable"
                    },
                    if decided { "a dead letter" } else { "a retry" }
                ));
            }
            if *in_tx {
                // Written in the transaction that locks the row since its
                // fenced update: it cannot miss it.
                if !*applied {
                    return Err(
                        "the bookkeeping in the transaction that locks the row changed nothing"
                            .to_owned(),
                    );
                }
                if !*retryable
                    && let Some(tx) = s.relays[x].tx.as_mut()
                    && let Some(row) = tx.rows[0]
                {
                    tx.rows[0] = Some(model.failed(row, a, false));
                }
                return Ok(vec![s]);
            }
            set_step(
                &mut s,
                x,
                Step::Settle {
                    retryable: *retryable,
                },
            );
            let mut out = Vec::new();
            for o in [Outcome::Ok, Outcome::GaveUp] {
                let n = take(model, &s, x, o)?;
                if (n.db.rows[0] != row) == *applied {
                    out.push(n);
                }
            }
            match out.is_empty() {
                true => Err(format!(
                    "the bookkeeping {} the row {row:?} (the fence {} it)",
                    if *applied {
                        "changed"
                    } else {
                        "did not change"
                    },
                    if held(&s) { "matches" } else { "refuses" }
                )),
                false => Ok(out),
            }
        }
        Event::RelayMark { applied, .. } => {
            if step(&s, x) != Some(Step::Mark) {
                return Err(format!("a relay-side success mark, but {}", doing(&s, x)));
            }
            let mut out = Vec::new();
            for o in [Outcome::Ok, Outcome::LostAck, Outcome::GaveUp] {
                let confirmed = o != Outcome::GaveUp && held(&s);
                if confirmed == *applied {
                    out.push(take(model, &s, x, o)?);
                }
            }
            match out.is_empty() {
                true => Err(format!(
                    "the mark {} the row {row:?}",
                    if *applied {
                        "changed"
                    } else {
                        "did not change"
                    }
                )),
                false => Ok(out),
            }
        }
        Event::BatchOpen { renewed, begun, .. } => {
            let Round::Batch(b) = &s.relays[x].round else {
                return Err(format!("a batch's opening, but {}", doing(&s, x)));
            };
            if b.step != BatchStep::Open {
                return Err(format!("a batch's opening, but {}", doing(&s, x)));
            }
            let o = if *begun {
                Outcome::Ok
            } else {
                Outcome::BeginFailed
            };
            let n = take(model, &s, x, o)?;
            if *begun {
                let kept = matches!(n.relays[x].round, Round::Batch(_));
                if kept != renewed.contains(&m) {
                    return Err(format!(
                        "the batch's renewal {} the row {row:?}",
                        if kept { "missed" } else { "returned" }
                    ));
                }
            }
            Ok(vec![n])
        }
        Event::BatchCommit { outcome, .. } => {
            let mut s = s;
            // A batch whose transaction was lost part-way (a statement of
            // a handler failed with the connection) ends refused before
            // its other handlers run: to the protocol, they ran and the
            // commit was refused (nothing of it commits either way).
            if *outcome == BatchOutcome::Failed {
                for _ in 0..16 {
                    match &s.relays[x].round {
                        Round::Batch(b)
                            if b.step != BatchStep::End && b.step != BatchStep::Open =>
                        {
                            s = take(model, &s, x, Outcome::Ok)?;
                        }
                        _ => break,
                    }
                }
            }
            if !matches!(&s.relays[x].round, Round::Batch(b) if b.step == BatchStep::End) {
                return Err(format!("a batch's commit, but {}", doing(&s, x)));
            }
            let outcomes: &[Outcome] = match outcome {
                BatchOutcome::Ok => &[Outcome::Ok],
                BatchOutcome::LostAck => &[Outcome::LostAck, Outcome::LostUnapplied],
                BatchOutcome::Failed | BatchOutcome::Short => &[Outcome::Refused],
            };
            let mut out = Vec::new();
            for &o in outcomes {
                let n = take(model, &s, x, o)?;
                let committed =
                    matches!(&n.relays[x].round, Round::Batch(b) if b.step == BatchStep::Markers);
                if *outcome == BatchOutcome::Ok && !committed {
                    return Err(format!(
                        "the batch committed, but its success update misses the row {row:?}"
                    ));
                }
                out.push(n);
            }
            Ok(out)
        }
    }
}
