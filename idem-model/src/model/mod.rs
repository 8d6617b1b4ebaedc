//! The steps: what each statement of the relay reads and writes, and the
//! outcomes the world may give it.
//!
//! - `action`: the model's actions and the outcomes of a statement;
//! - `enabled`: which outcomes, expiries and claims may happen next;
//! - `claim`: claims, their read-back, the rounds that deliver them;
//! - `work`: the per-message path, statement by statement;
//! - `batch`: batched commits and the bookkeeping after them.

mod action;
mod batch;
mod claim;
mod enabled;
mod work;

pub use action::{Action, Outcome};

use crate::state::{Db, Entity, ROWS, Relay, Round, Row, State, Status};
use crate::{Config, properties};
use action::COMMIT_OUTCOMES;
use stateright::{Model, Property};

impl Model for Config {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // Both messages enqueued before the relays start (a later insert
        // only means a claim sees fewer rows, which claims of fewer rows
        // cover); the producer's retry of each may come at any time.
        let row = Row {
            exists: true,
            ..Row::ABSENT
        };
        let mut rows = [row; ROWS];
        let mut sent = [1; ROWS];
        if self.late_head {
            // Message 0's insert commits later (`Action::Enqueue`).
            rows[0] = Row::ABSENT;
            sent[0] = 0;
        }
        vec![State {
            db: Db {
                rows,
                entities: [Entity::default(); ROWS],
            },
            relays: vec![
                Relay {
                    round: Round::Idle,
                    tx: None,
                };
                self.relays
            ],
            cache: [false; ROWS],
            sent,
            faults: self.faults,
            stalled: false,
            published: [0; ROWS],
            dead_after_publish: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for m in 0..ROWS {
            if s.sent[m] < 2 {
                actions.push(Action::Enqueue(m as u8));
            }
            let row = s.db.rows[m];
            if row.status == Status::Pending && row.lease {
                if self.unrenewed(s, m) {
                    actions.push(Action::Expire(m as u8));
                } else if s.faults > 0 {
                    actions.push(Action::Stall(m as u8));
                }
            }
        }
        let masks: &[u8] = if self.batched { &[1, 2, 3] } else { &[1, 2] };
        for x in 0..s.relays.len() {
            let relay = x as u8;
            if s.relays[x].round == Round::Idle {
                for &rows in masks {
                    let all = (0..ROWS).all(|m| rows & (1 << m) == 0 || self.claimable(s, m));
                    if !all {
                        continue;
                    }
                    let orders: &[bool] = if rows == 3 { &[false, true] } else { &[false] };
                    for &reversed in orders {
                        for outcome in COMMIT_OUTCOMES {
                            if s.faults > 0 || !outcome.is_fault() {
                                actions.push(Action::Claim {
                                    relay,
                                    rows,
                                    reversed,
                                    outcome,
                                });
                            }
                        }
                    }
                }
                continue;
            }
            for outcome in self.outcomes(s, x) {
                actions.push(Action::Step { relay, outcome });
            }
            if s.faults > 0 {
                actions.push(Action::Crash(relay));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Enqueue(m) => {
                // The first insert commits the row; a retry is ignored
                // (`ON CONFLICT (topic, msg_id) DO NOTHING`).
                s.sent[m as usize] += 1;
                s.db.rows[m as usize].exists = true;
            }
            Action::Expire(m) => s.db.rows[m as usize].lease = false,
            Action::Stall(m) => {
                s.db.rows[m as usize].lease = false;
                s.stalled = true;
            }
            Action::Claim {
                relay,
                rows,
                reversed,
                outcome,
            } => self.claim(&mut s, relay as usize, (rows, reversed), outcome)?,
            Action::Step { relay, outcome } => {
                let x = relay as usize;
                match s.relays[x].round.clone() {
                    Round::Idle => return None,
                    Round::Recover(tokens) => self.recover(&mut s, x, tokens, outcome),
                    Round::Batch(_) => self.batch(&mut s, x, outcome)?,
                    Round::Work { .. } => self.work(&mut s, x, outcome)?,
                }
            }
            Action::Crash(relay) => {
                let r = &mut s.relays[relay as usize];
                r.tx = None;
                r.round = Round::Idle;
            }
        }
        let fault = match action {
            Action::Claim { outcome, .. } | Action::Step { outcome, .. } => outcome.is_fault(),
            Action::Crash(_) | Action::Stall(_) => true,
            _ => false,
        };
        if fault {
            s.faults -= 1;
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
