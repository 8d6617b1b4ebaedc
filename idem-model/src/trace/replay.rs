//! One event replayed: the states the model reaches from a candidate state
//! by the step the event reports, with the outcome it reports.

use super::event::{BatchOutcome, ClaimOutcome, CommitOutcome, Event};
use super::relay::{doing, set_step, skip_markers, step, take, token};
use crate::state::{BatchStep, Round, State, Status, Step};
use crate::{Config, Outcome};

/// The states the model reaches from `s` by relay `x`'s step `e`.
pub(super) fn replay(
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
            outage,
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
            let decided = !*outage && (!*retryable || a >= model.max_attempts);
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
            if *outage && *applied {
                // Given back uncounted: pending, the claim's attempt
                // taken back, whatever the model's own bookkeeping
                // decided at this attempt.
                for n in &mut out {
                    n.db.rows[0].status = crate::state::Status::Pending;
                    n.db.rows[0].attempts = row.attempts.saturating_sub(1);
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
