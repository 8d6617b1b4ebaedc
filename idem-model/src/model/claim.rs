//! Claims, their read-back, and the rounds that deliver what they took.

use super::action::Outcome;
use crate::state::{Batch, BatchStep, Delivery, ROWS, Round, State, Step, Token};
use crate::{Config, Mutation};

impl Config {
    pub(crate) fn claim(
        &self,
        s: &mut State,
        x: usize,
        (mask, reversed): (u8, bool),
        outcome: Outcome,
    ) -> Option<()> {
        if s.relays[x].round != Round::Idle {
            return None;
        }
        let mut tokens = Vec::new();
        let mut db = s.db.clone();
        for m in 0..ROWS {
            if mask & (1 << m) != 0 {
                if !self.claimable(s, m) || s.db.rows[m].attempts >= self.attempts_bound() {
                    return None;
                }
                let row = &mut db.rows[m];
                row.owner = Some(x as u8);
                row.attempts += 1;
                row.lease = true;
                tokens.push((m as u8, row.attempts));
            }
        }
        if reversed {
            tokens.reverse();
        }
        if matches!(outcome, Outcome::Ok | Outcome::LostAck) {
            s.db = db;
        }
        s.relays[x].round = match outcome {
            Outcome::Ok => self.deliver(tokens),
            Outcome::LostAck | Outcome::LostUnapplied => Round::Recover(tokens),
            _ => Round::Idle,
        };
        Some(())
    }

    pub(crate) fn recover(&self, s: &mut State, x: usize, tokens: Vec<Token>, outcome: Outcome) {
        s.relays[x].round = match outcome {
            Outcome::Ok => {
                // Still pending under the claim's owner, the lease running.
                let found: Vec<Token> = tokens
                    .into_iter()
                    .filter(|&(m, a)| {
                        let row = s.db.rows[m as usize];
                        row.held_by(x as u8, a) && row.lease
                    })
                    .collect();
                self.deliver(found)
            }
            _ => Round::Idle,
        };
    }

    /// The round that delivers a claim's `tokens`.
    pub(crate) fn deliver(&self, tokens: Vec<Token>) -> Round {
        match (tokens.is_empty(), self.batched) {
            (true, _) => Round::Idle,
            (false, true) => Round::Batch(Batch {
                rows: tokens,
                next: 0,
                step: BatchStep::Open,
                savepoint: None,
                ran: Vec::new(),
                markers: [false; ROWS],
            }),
            (false, false) => self.deliveries(&tokens),
        }
    }

    /// The first step of an attempt of message `m` on the per-message path.
    pub(crate) fn first_step(&self, m: u8) -> Step {
        if self.publisher[m as usize] {
            return match self.has(Mutation::MarkBeforePublish) {
                true => Step::Mark,
                false => Step::Publish,
            };
        }
        if self.has(Mutation::CheckOutsideTx) {
            Step::Check
        } else {
            Step::Begin { dup: false }
        }
    }

    fn deliveries(&self, tokens: &[Token]) -> Round {
        let mut queue: Vec<Delivery> = tokens
            .iter()
            .map(|&token| Delivery {
                token,
                step: self.first_step(token.0),
                published: false,
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

    /// The per-message path after a batch that did not commit: each
    /// message's lease renewed before its attempt (`Relay::deliver_each`).
    pub(crate) fn fallback(&self, tokens: &[Token]) -> Round {
        match self.deliveries(tokens) {
            Round::Work {
                mut current,
                mut queue,
            } => {
                current.step = Step::Renew;
                for d in &mut queue {
                    d.step = Step::Renew;
                }
                Round::Work { current, queue }
            }
            other => other,
        }
    }
}
