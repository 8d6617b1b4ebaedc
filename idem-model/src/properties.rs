//! The invariants (issue 13, item 2), and a few reachability checks that
//! show the model is not vacuous.

use crate::state::{BatchStep, ROWS, Round, Row, State, Status, Step};
use crate::{Config, KeyMode};
use stateright::{Model, Property};

/// The effect of a message is applied at most once (committed).
pub const AT_MOST_ONCE: &str = "the effect is applied at most once";
/// A message is never `failed` while its delivery's effect is committed.
pub const NEVER_FAILED_WITH_EFFECT: &str = "never failed while its effect is committed";
/// A message is `success` only with its effect committed.
pub const SUCCESS_WITH_EFFECT: &str = "success only with its effect committed";
/// A cache marker exists only for a committed effect.
pub const MARKER_AFTER_COMMIT: &str = "a cache marker only for a committed effect";
/// Once nothing can happen any more, every message is `success`, or
/// `failed` with a reason.
pub const ALL_SETTLED: &str = "every message ends success or failed with a reason";
/// No message's handler runs twice at once (what the lease renewal buys),
/// unless a relay stalled longer than its lease.
pub const ONE_RUN_AT_A_TIME: &str = "a handler never runs twice at once";

/// An attempt whose handler published (a publisher route) and answered
/// `Ok` never dead-letters its message: a lost acknowledgement of the
/// relay-side success mark is read back, never taken for a failure.
pub const NEVER_DEAD_AFTER_PUBLISH: &str = "never dead-lettered after its publish";
/// A publisher route's message is `success` only once published (no
/// ghost success: the outgoing side lost nothing).
pub const PUBLISHED_FOR_SUCCESS: &str = "success only once published";

/// A message whose handler never fails is never dead-lettered, unless
/// the run spent at least `max_attempts` faults (each fault may cost an
/// attempt, and a refused commit on the last attempt is a failure of that
/// attempt: the relay cannot tell it from the handler's).
pub const NEVER_FAILING_NOT_DEAD: &str =
    "a message whose handler never fails is never dead-lettered";
/// A row's `attempts` never exceed `max_attempts`, save one per fault the
/// run spent (a crash, a stall, a lost transaction may each cost an
/// attempt its bookkeeping): without faults, never.
pub const ATTEMPTS_WITHIN_MAX: &str = "attempts never exceed max_attempts";
/// Liveness: on every run (every maximal path, which the bounds make
/// finite: weak fairness holds on each), every message ends `success` or
/// `failed`.
pub const EVENTUALLY_ENDS: &str = "every message eventually ends success or failed";

/// Attempts past `max_attempts` come only from faults (at most two per
/// fault): no lease is lost in a loop.
pub const ATTEMPTS_BOUNDED: &str = "attempts stay bounded";

/// Ordering keys (both messages under one key): at most one message of
/// the key is in flight. Never do both rows hold a running lease at once
/// (committed, `pending`, `locked_until > now()`), nor do two deliveries
/// of the key run their handlers at once (from the claim's delivery to
/// its commit), unless a stall let a running handler's lease run out.
pub const ONE_IN_FLIGHT_PER_KEY: &str = "at most one message of a key in flight";
/// Ordering keys: a key's messages are settled in id order. Message 1
/// (the larger id) is never `success` while message 0 is `pending`; with
/// [`KeyMode::Hold`], nor while message 0 is `failed`.
pub const SETTLED_IN_ORDER: &str = "a key's messages settle in id order";

/// Reachable: some message is dead-lettered.
pub const SOME_DEAD_LETTER: &str = "some message is dead-lettered";
/// Reachable (batched mode): a batch commits with one of its handlers
/// failed and another succeeded.
pub const BATCH_WITH_A_FAILURE: &str = "a batch commits beside a failed handler";
/// Reachable: a handler's commit whose acknowledgement was lost is read
/// back as landed.
pub const LOST_COMMIT_LANDED: &str = "a lost commit is read back as landed";
/// Reachable: a claim whose acknowledgement was lost is read back and
/// delivered.
pub const LOST_CLAIM_RECOVERED: &str = "a lost claim is read back";
/// Reachable: every message succeeds.
pub const ALL_SUCCEED: &str = "every message succeeds";
/// Reachable (ordering keys): the key's head dead-lettered, the rest of
/// the key goes on past it ([`KeyMode::Continue`]: message 1 succeeds), or
/// waits behind it ([`KeyMode::Hold`]: nothing can happen any more, and
/// message 1 is still pending).
pub const DEAD_HEAD_BY_MODE: &str = "a key's dead-lettered head is passed or held as its mode says";

/// The properties every proof proves (each an `always`, but the last, an
/// `eventually`).
pub const SAFETY: [&str; 14] = [
    AT_MOST_ONCE,
    NEVER_FAILED_WITH_EFFECT,
    SUCCESS_WITH_EFFECT,
    MARKER_AFTER_COMMIT,
    ALL_SETTLED,
    ONE_RUN_AT_A_TIME,
    ATTEMPTS_BOUNDED,
    NEVER_FAILING_NOT_DEAD,
    ATTEMPTS_WITHIN_MAX,
    NEVER_DEAD_AFTER_PUBLISH,
    PUBLISHED_FOR_SUCCESS,
    ONE_IN_FLIGHT_PER_KEY,
    SETTLED_IN_ORDER,
    EVENTUALLY_ENDS,
];

/// The properties that hold whatever the timing (even with
/// `long_transactions`): what the fences guarantee on their own, and,
/// since the failure bookkeeping is written while the row is locked
/// (issue 23's fix), the attempt bound.
pub const TIMING_FREE: [&str; 7] = [
    AT_MOST_ONCE,
    NEVER_FAILED_WITH_EFFECT,
    SUCCESS_WITH_EFFECT,
    MARKER_AFTER_COMMIT,
    ATTEMPTS_WITHIN_MAX,
    NEVER_FAILING_NOT_DEAD,
    NEVER_DEAD_AFTER_PUBLISH,
];

pub(crate) fn all() -> Vec<Property<Config>> {
    vec![
        Property::always(AT_MOST_ONCE, |_, s: &State| {
            s.db.entities.iter().all(|e| e.effects <= 1)
        }),
        Property::always(NEVER_FAILED_WITH_EFFECT, |c: &Config, s: &State| {
            (0..ROWS).all(|m| {
                s.db.rows[m].status != Status::Failed
                    || s.db.entities[c.entity_of(m)].by & (1 << m) == 0
            })
        }),
        Property::always(SUCCESS_WITH_EFFECT, |c: &Config, s: &State| {
            (0..ROWS).all(|m| {
                s.db.rows[m].status != Status::Success
                    || s.db.entities[c.entity_of(m)].effects >= 1
                    || s.published[m] >= 1
            })
        }),
        Property::always(NEVER_DEAD_AFTER_PUBLISH, |_, s: &State| {
            !s.dead_after_publish
        }),
        Property::always(PUBLISHED_FOR_SUCCESS, |c: &Config, s: &State| {
            (0..ROWS).all(|m| {
                !c.publisher[m] || s.db.rows[m].status != Status::Success || s.published[m] >= 1
            })
        }),
        Property::always(MARKER_AFTER_COMMIT, |_, s: &State| {
            (0..ROWS).all(|e| !s.cache[e] || s.db.entities[e].effects >= 1)
        }),
        Property::always(ALL_SETTLED, |c: &Config, s: &State| {
            !quiescent(c, s) || settled(c, s)
        }),
        Property::always(ONE_RUN_AT_A_TIME, |_, s: &State| {
            s.stalled || (0..ROWS).all(|m| running(s, m) <= 1)
        }),
        Property::always(ATTEMPTS_BOUNDED, |c: &Config, s: &State| {
            s.db.rows.iter().all(|r| r.attempts < c.attempts_bound())
        }),
        Property::always(NEVER_FAILING_NOT_DEAD, |c: &Config, s: &State| {
            spent(c, s) >= c.max_attempts
                || (0..ROWS).all(|m| c.may_fail[m] || s.db.rows[m].status != Status::Failed)
        }),
        Property::always(ATTEMPTS_WITHIN_MAX, |c: &Config, s: &State| {
            let bound = c.max_attempts.saturating_add(spent(c, s));
            s.db.rows.iter().all(|r| r.attempts <= bound)
        }),
        Property::always(ONE_IN_FLIGHT_PER_KEY, |c: &Config, s: &State| {
            let leased = |r: &Row| r.exists && r.status == Status::Pending && r.lease;
            c.ordering.is_none()
                || (!s.db.rows.iter().all(leased)
                    && (s.stalled || !(0..ROWS).all(|m| handling(s, m))))
        }),
        Property::always(SETTLED_IN_ORDER, |c: &Config, s: &State| {
            let [first, second] = s.db.rows;
            let blocking = first.status == Status::Pending
                || (c.ordering == Some(KeyMode::Hold) && first.status == Status::Failed);
            c.ordering.is_none() || !(second.status == Status::Success && first.exists && blocking)
        }),
        // Every message enqueued and not pending (or, with `Hold`, held
        // behind its key's dead head): monotone, as no row goes back to
        // `pending` nor out of `failed`.
        Property::eventually(EVENTUALLY_ENDS, |c: &Config, s: &State| {
            (0..ROWS).all(|m| {
                let r = s.db.rows[m];
                r.exists && (r.status != Status::Pending || held_back(c, s, m))
            })
        }),
        Property::sometimes(SOME_DEAD_LETTER, |_, s: &State| {
            s.db.rows.iter().any(|r| r.status == Status::Failed)
        }),
        // (With ordering keys, a batch never takes both rows: only the
        // key's head is claimable.)
        Property::sometimes(BATCH_WITH_A_FAILURE, |c: &Config, s: &State| {
            !c.batched
                || c.ordering.is_some()
                || s.relays.iter().any(|r| match &r.round {
                    Round::Batch(b) => {
                        b.step == BatchStep::Markers
                            && b.ran.iter().any(|r| r.1)
                            && b.ran.iter().any(|r| !r.1)
                    }
                    _ => false,
                })
        }),
        Property::sometimes(LOST_COMMIT_LANDED, |_, s: &State| {
            s.relays.iter().any(|r| match &r.round {
                Round::Work { current, .. } => {
                    current.step == Step::Landed
                        && s.db.rows[current.token.0 as usize].status == Status::Success
                }
                _ => false,
            })
        }),
        Property::sometimes(LOST_CLAIM_RECOVERED, |_, s: &State| {
            s.relays.iter().enumerate().any(|(x, r)| match &r.round {
                Round::Recover(tokens) => tokens
                    .iter()
                    .any(|&(m, a)| s.db.rows[m as usize].held_by(x as u8, a)),
                _ => false,
            })
        }),
        Property::sometimes(ALL_SUCCEED, |_, s: &State| {
            s.db.rows.iter().all(|r| r.status == Status::Success)
        }),
        Property::sometimes(DEAD_HEAD_BY_MODE, |c: &Config, s: &State| {
            let [first, second] = s.db.rows;
            match c.ordering {
                None => true,
                Some(_) if first.status != Status::Failed => false,
                Some(KeyMode::Continue) => second.status == Status::Success,
                Some(KeyMode::Hold) => second.status == Status::Pending && quiescent(c, s),
            }
        }),
    ]
}

/// With [`KeyMode::Hold`], message `m` waits behind a dead-lettered
/// message of its key with a smaller id (until an operator requeues it,
/// which the model does not do).
fn held_back(c: &Config, s: &State, m: usize) -> bool {
    c.ordering == Some(KeyMode::Hold)
        && (0..m).any(|n| s.db.rows[n].exists && s.db.rows[n].status == Status::Failed)
}

/// Whether a delivery of message `m` is in flight: claimed and not yet
/// past its handler's commit (per message: from the first step to the
/// commit, a publisher's mark included; in a batch: from its handlers'
/// first step to the batch's commit).
fn handling(s: &State, m: usize) -> bool {
    s.relays.iter().any(|r| match &r.round {
        Round::Work { current, .. } => {
            current.token.0 as usize == m
                && matches!(
                    current.step,
                    Step::Check
                        | Step::Begin { .. }
                        | Step::Guard
                        | Step::Effect
                        | Step::Transition
                        | Step::Commit { .. }
                        | Step::CommitFailure
                        | Step::Publish
                        | Step::Verdict
                        | Step::Mark
                )
        }
        Round::Batch(b) => {
            !matches!(b.step, BatchStep::Open | BatchStep::Markers)
                && b.rows.iter().any(|t| t.0 as usize == m)
        }
        _ => false,
    })
}

/// Nothing can happen any more (every run of the model is finite: claims
/// are bounded by the attempts, faults by the budget).
fn quiescent(c: &Config, s: &State) -> bool {
    let mut actions = Vec::new();
    c.actions(s, &mut actions);
    actions.into_iter().all(|a| c.next_state(s, a).is_none())
}

/// The faults the run has spent so far.
fn spent(c: &Config, s: &State) -> u8 {
    c.faults.saturating_sub(s.faults)
}

fn settled(c: &Config, s: &State) -> bool {
    (0..ROWS).all(|m| {
        let r = s.db.rows[m];
        !r.exists
            || r.status == Status::Success
            || (r.status == Status::Failed && r.reason)
            || (r.status == Status::Pending && held_back(c, s, m))
    })
}

/// How many deliveries of message `m` have their handler running.
fn running(s: &State, m: usize) -> usize {
    s.relays
        .iter()
        .filter(|r| match &r.round {
            Round::Work { current, .. } => current.token.0 as usize == m && current.step.running(),
            Round::Batch(b) => {
                matches!(
                    b.step,
                    BatchStep::Guard | BatchStep::Effect | BatchStep::Transition
                ) && b.rows[b.next as usize].0 as usize == m
            }
            _ => false,
        })
        .count()
}
