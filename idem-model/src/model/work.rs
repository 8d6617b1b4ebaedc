//! The per-message path: one delivery's statements, from the fenced
//! update to the failure bookkeeping, and a publisher route's steps.

use super::action::Outcome;
use crate::state::{Delivery, ROWS, Round, Row, State, Status, Step, Tx};
use crate::{Config, Mutation};

impl Config {
    /// The next step of relay `x`'s current attempt on the per-message
    /// path; `None` while it waits for a row lock.
    pub(crate) fn work(&self, s: &mut State, x: usize, outcome: Outcome) -> Option<()> {
        let Round::Work { current, .. } = &s.relays[x].round else {
            unreachable!()
        };
        let Delivery {
            token,
            step,
            published,
        } = *current;
        let (m, a) = (token.0 as usize, token.1);
        let e = self.entity_of(m);
        let me = x as u8;
        let next = match step {
            Step::Renew => {
                // It waits for a transaction that locks the row.
                if s.row_locked_by_other(x, m) {
                    return None;
                }
                if s.db.rows[m].held_by(me, a) {
                    s.db.rows[m].lease = true;
                    Some(self.first_step(token.0))
                } else {
                    None
                }
            }
            Step::Check => Some(Step::Begin {
                dup: s.db.entities[e].done,
            }),
            Step::Begin { dup } => {
                if s.row_locked_by_other(x, m) {
                    return None;
                }
                let row = s.db.rows[m];
                let matched = match self.has(Mutation::Unfenced) {
                    true => row.status == Status::Pending,
                    false => row.held_by(me, a),
                };
                let mut tx = Tx::default();
                if matched {
                    tx.rows[m] = Some(Row {
                        status: Status::Success,
                        owner: None,
                        lease: false,
                        ..row
                    });
                }
                if matched || self.has(Mutation::Unfenced) {
                    s.relays[x].tx = Some(tx);
                    Some(match (self.has(Mutation::CheckOutsideTx), dup) {
                        (true, true) => Step::Commit { dup: true },
                        (true, false) => Step::Effect,
                        (false, _) => Step::Guard,
                    })
                } else {
                    // LeaseLost (retryable) or not pending (permanent):
                    // the call fails, its transaction rolls back.
                    Some(Step::Settle {
                        retryable: row.status == Status::Pending,
                    })
                }
            }
            Step::Guard => {
                if s.entity_locked_by_other(x, e) {
                    return None;
                }
                let tx = s.relays[x].tx.as_mut().expect("open");
                let entity = *tx.entities[e].get_or_insert(s.db.entities[e]);
                Some(match entity.done {
                    true => Step::Commit { dup: true },
                    false => Step::Effect,
                })
            }
            Step::Effect => {
                if s.entity_locked_by_other(x, e) {
                    return None;
                }
                let tx = s.relays[x].tx.as_mut().expect("open");
                let entity = tx.entities[e].get_or_insert(s.db.entities[e]);
                entity.effects += 1;
                entity.by |= 1 << m;
                Some(Step::Transition)
            }
            Step::Transition => match outcome {
                Outcome::Fail => {
                    let tx = s.relays[x].tx.as_mut().expect("open");
                    match tx.rows[m] {
                        // Rolled back to the savepoint taken after the
                        // fenced update (the entity's lock released), the
                        // failure bookkeeping written while the row is
                        // still locked, then committed.
                        Some(row) if !self.has(Mutation::PoolSideFailure) => {
                            tx.entities = [None; ROWS];
                            tx.rows[m] = Some(self.failed(row, a, true));
                            Some(Step::CommitFailure)
                        }
                        _ => {
                            s.relays[x].tx = None;
                            Some(Step::Settle { retryable: true })
                        }
                    }
                }
                _ => {
                    let tx = s.relays[x].tx.as_mut().expect("open");
                    tx.entities[e].as_mut().expect("locked").done = true;
                    Some(Step::Commit { dup: false })
                }
            },
            Step::Commit { .. } => {
                let tx = s.relays[x].tx.take().expect("open");
                if self.has(Mutation::MarkerBeforeCommit) {
                    s.cache[e] = true;
                }
                if matches!(outcome, Outcome::Ok | Outcome::LostAck) {
                    tx.apply(&mut s.db);
                }
                match outcome {
                    Outcome::Ok if self.has(Mutation::MarkerBeforeCommit) => None,
                    Outcome::Ok => Some(Step::Marker),
                    Outcome::LostAck | Outcome::LostUnapplied => Some(Step::Landed),
                    _ => Some(Step::Settle { retryable: true }),
                }
            }
            Step::CommitFailure => {
                let tx = s.relays[x].tx.take().expect("open");
                if matches!(outcome, Outcome::Ok | Outcome::LostAck) {
                    tx.apply(&mut s.db);
                }
                match outcome {
                    Outcome::Ok => None,
                    // The transaction lost (or refused): the bookkeeping
                    // again on the pool, fenced.
                    _ => Some(Step::Settle { retryable: true }),
                }
            }
            Step::Marker => {
                s.cache[e] = true;
                None
            }
            Step::Landed => match outcome {
                Outcome::Ok if s.db.rows[m].status == Status::Success => None,
                _ => Some(Step::Settle { retryable: true }),
            },
            Step::Settle { retryable } => {
                if s.row_locked_by_other(x, m) {
                    return None;
                }
                let row = &mut s.db.rows[m];
                // `outbox_revert`: over a success of this very attempt.
                let over_success = row.exists
                    && row.status == Status::Success
                    && row.attempts == a
                    && row.owner.is_none_or(|o| o == me)
                    && (self.has(Mutation::RevertUnknownCommit)
                        || (self.has(Mutation::MarkLostAckAsFailure) && published));
                let fenced = match self.has(Mutation::StatusOnlyFence) {
                    true => row.exists && row.status == Status::Pending,
                    false => row.held_by(me, a),
                };
                if outcome == Outcome::Ok && (fenced || over_success) {
                    *row = self.failed(*row, a, retryable);
                    let dead = row.status == Status::Failed;
                    if dead && published {
                        s.dead_after_publish = true;
                    }
                }
                None
            }
            Step::Publish => match outcome {
                Outcome::Fail => Some(Step::Settle { retryable: true }),
                _ => {
                    s.published[m] = s.published[m].saturating_add(1);
                    match self.has(Mutation::MarkBeforePublish) {
                        true => None,
                        false => Some(Step::Verdict),
                    }
                }
            },
            Step::Verdict => match outcome {
                Outcome::Fail => Some(Step::Settle { retryable: true }),
                _ => {
                    set_published(s, x);
                    Some(Step::Mark)
                }
            },
            Step::Mark => {
                if s.row_locked_by_other(x, m) {
                    return None;
                }
                let row = &mut s.db.rows[m];
                let applied = outcome != Outcome::GaveUp && row.held_by(me, a);
                if applied {
                    *row = Row {
                        status: Status::Success,
                        owner: None,
                        lease: false,
                        ..*row
                    };
                }
                match outcome {
                    // Every try failed: the lease runs out, the retry
                    // publishes again.
                    Outcome::GaveUp => None,
                    // Retried, then read back (`Relay::fenced`): the row
                    // is this attempt's success.
                    Outcome::LostAck if self.has(Mutation::MarkLostAckAsFailure) => {
                        Some(Step::Settle { retryable: true })
                    }
                    _ if self.has(Mutation::MarkBeforePublish) => Some(Step::Publish),
                    _ => None,
                }
            }
        };
        let Round::Work { current, queue } = &mut s.relays[x].round else {
            unreachable!()
        };
        match next {
            Some(step) => current.step = step,
            None if queue.is_empty() => s.relays[x].round = Round::Idle,
            None => *current = queue.remove(0),
        }
        Some(())
    }

    /// `row` after the failure bookkeeping of attempt `a`: pending again,
    /// or dead after `max_attempts` (or a permanent error).
    pub(crate) fn failed(&self, row: Row, a: u8, retryable: bool) -> Row {
        let dead = !retryable || a >= self.max_attempts;
        Row {
            status: if dead {
                Status::Failed
            } else {
                Status::Pending
            },
            owner: None,
            lease: false,
            reason: true,
            ..row
        }
    }
}

/// Relay `x`'s current delivery published and its handler answered `Ok`.
fn set_published(s: &mut State, x: usize) {
    if let Round::Work { current, .. } = &mut s.relays[x].round {
        current.published = true;
    }
}
