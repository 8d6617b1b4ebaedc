//! One model relay of a projection: the claim it delivers, its step, and
//! one model step of it.

use crate::state::{BatchStep, Round, State, Step, Token};
use crate::{Config, Outcome};

/// The claim relay `x` delivers, at its current step.
pub(super) fn token(s: &State, x: usize) -> Option<Token> {
    match &s.relays[x].round {
        Round::Idle => None,
        Round::Recover(tokens) => tokens.first().copied(),
        Round::Batch(b) => b.rows.first().copied(),
        Round::Work { current, .. } => Some(current.token),
    }
}

/// The step of relay `x`'s current delivery on the per-message path.
pub(super) fn step(s: &State, x: usize) -> Option<Step> {
    match &s.relays[x].round {
        Round::Work { current, .. } => Some(current.step),
        _ => None,
    }
}

pub(super) fn set_step(s: &mut State, x: usize, step: Step) {
    if let Round::Work { current, .. } = &mut s.relays[x].round {
        current.step = step;
    }
}

/// What relay `x` is doing, for a reason.
pub(super) fn doing(s: &State, x: usize) -> String {
    match &s.relays[x].round {
        Round::Idle => "no delivery in progress (its claim ended)".to_owned(),
        Round::Recover(_) => "the claim's read-back is due".to_owned(),
        Round::Batch(b) => format!("the batch is at {:?}", b.step),
        Round::Work { current, .. } => format!("the delivery is at {:?}", current.step),
    }
}

/// Skips relay `x`'s cache markers (none is required).
pub(super) fn skip_markers(model: &Config, s: &mut State, x: usize) {
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
pub(super) fn take(model: &Config, s: &State, x: usize, outcome: Outcome) -> Result<State, String> {
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
