//! Batched commits: one transaction for the handlers of a claim, each
//! behind a savepoint, and the bookkeeping after its commit.

use super::action::Outcome;
use crate::state::{BatchStep, Delivery, Entity, ROWS, Round, Row, State, Status, Step, Token, Tx};
use crate::{Config, Mutation};

impl Config {
    /// The next step of relay `x`'s batch; `None` while it waits.
    pub(crate) fn batch(&self, s: &mut State, x: usize, outcome: Outcome) -> Option<()> {
        let Round::Batch(b) = &s.relays[x].round else {
            unreachable!()
        };
        let mut b = b.clone();
        let me = x as u8;
        match b.step {
            BatchStep::Open => {
                if outcome == Outcome::BeginFailed {
                    s.relays[x].round = self.fallback(&b.rows);
                    return Some(());
                }
                if b.rows
                    .iter()
                    .any(|&(m, _)| s.row_locked_by_other(x, m as usize))
                {
                    return None;
                }
                let mut tx = Tx::default();
                if !self.has(Mutation::NoRenewal) {
                    b.rows
                        .retain(|&(m, a)| s.db.rows[m as usize].held_by(me, a));
                    for &(m, _) in &b.rows {
                        let row = s.db.rows[m as usize];
                        tx.rows[m as usize] = Some(Row { lease: true, ..row });
                    }
                }
                if b.rows.is_empty() {
                    s.relays[x].round = Round::Idle;
                    return Some(());
                }
                b.savepoint = Some(tx.clone());
                s.relays[x].tx = Some(tx);
                b.step = BatchStep::Guard;
            }
            BatchStep::Guard | BatchStep::Effect | BatchStep::Transition => {
                let token = b.rows[b.next as usize];
                let m = token.0 as usize;
                let e = self.entity_of(m);
                if s.entity_locked_by_other(x, e) {
                    return None;
                }
                let tx = s.relays[x].tx.as_mut().expect("open");
                let entity: &mut Entity = tx.entities[e].get_or_insert(s.db.entities[e]);
                let answered = match (b.step, outcome) {
                    (BatchStep::Guard, _) if entity.done => Some(true),
                    (BatchStep::Guard, _) => {
                        b.step = BatchStep::Effect;
                        None
                    }
                    (BatchStep::Effect, _) => {
                        entity.effects += 1;
                        entity.by |= 1 << m;
                        b.step = BatchStep::Transition;
                        None
                    }
                    (_, Outcome::Fail) => {
                        if !self.has(Mutation::KeepFailedSavepoint) {
                            *tx = b.savepoint.clone().expect("taken");
                        }
                        Some(false)
                    }
                    _ => {
                        entity.done = true;
                        Some(true)
                    }
                };
                if let Some(ok) = answered {
                    if ok {
                        match self.has(Mutation::MarkerBeforeCommit) {
                            true => s.cache[e] = true,
                            false => b.markers[e] = true,
                        }
                    }
                    b.ran.push((token, ok));
                    b.next += 1;
                    b.step = match (b.next as usize) < b.rows.len() {
                        true => {
                            b.savepoint = s.relays[x].tx.clone();
                            BatchStep::Guard
                        }
                        false => BatchStep::End,
                    };
                }
            }
            BatchStep::End => {
                let done: Vec<Token> = b.ran.iter().filter(|r| r.1).map(|r| r.0).collect();
                let booked = !self.has(Mutation::PoolSideFailure);
                if b.ran
                    .iter()
                    .any(|&((m, _), _)| s.row_locked_by_other(x, m as usize))
                {
                    return None;
                }
                let mut tx = s.relays[x].tx.take().expect("open");
                let mut updated = 0;
                for &(m, a) in &done {
                    let m = m as usize;
                    let row = tx.rows[m].unwrap_or(s.db.rows[m]);
                    if row.held_by(me, a) {
                        tx.rows[m] = Some(Row {
                            status: Status::Success,
                            owner: None,
                            lease: false,
                            ..row
                        });
                        updated += 1;
                    }
                }
                // The failed handlers' bookkeeping, beside the deferred
                // success update, before the one commit.
                let failures: Vec<Token> = b.ran.iter().filter(|r| !r.1).map(|r| r.0).collect();
                let mut short = false;
                for &(m, a) in failures.iter().filter(|_| booked) {
                    let m = m as usize;
                    let row = tx.rows[m].unwrap_or(s.db.rows[m]);
                    match row.held_by(me, a) {
                        true => tx.rows[m] = Some(self.failed(row, a, true)),
                        false => short = true,
                    }
                }
                if updated < done.len() || short {
                    // Fewer rows than expected: the batch rolls back, its
                    // messages go the per-message path.
                    s.relays[x].round = self.fallback(&b.rows);
                    return Some(());
                }
                if matches!(outcome, Outcome::Ok | Outcome::LostAck) {
                    tx.apply(&mut s.db);
                }
                match outcome {
                    Outcome::Ok => b.step = BatchStep::Markers,
                    Outcome::LostAck | Outcome::LostUnapplied => {
                        s.relays[x].round = self.bookkeeping(&b.ran, true, false);
                        return Some(());
                    }
                    _ => {
                        s.relays[x].round = self.fallback(&b.rows);
                        return Some(());
                    }
                }
            }
            BatchStep::Markers => {
                for e in 0..ROWS {
                    s.cache[e] |= b.markers[e];
                }
                let booked = !self.has(Mutation::PoolSideFailure);
                s.relays[x].round = self.bookkeeping(&b.ran, false, booked);
                return Some(());
            }
        }
        s.relays[x].round = Round::Batch(b);
        Some(())
    }

    /// The bookkeeping of a batch's handlers after its commit (`unknown`:
    /// the commit's outcome is unknown, the successes are read back;
    /// `booked`: the failures were recorded in the batch's transaction).
    pub(crate) fn bookkeeping(&self, ran: &[(Token, bool)], unknown: bool, booked: bool) -> Round {
        let mut queue: Vec<Delivery> = ran
            .iter()
            .filter_map(|&(token, ok)| match (ok, unknown) {
                (true, false) => None,
                (false, false) if booked => None,
                (true, true) => Some(Delivery {
                    token,
                    step: Step::Landed,
                    published: false,
                }),
                (false, _) => Some(Delivery {
                    token,
                    step: Step::Settle { retryable: true },
                    published: false,
                }),
            })
            .collect();
        match queue.is_empty() {
            true => Round::Idle,
            false => {
                let current = queue.remove(0);
                Round::Work { current, queue }
            }
        }
    }
}
