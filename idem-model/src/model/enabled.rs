//! What may happen next: the outcomes a relay's next statement may have,
//! a lease running out, a row claimed.

use super::action::{COMMIT_OUTCOMES, Outcome};
use crate::state::{BatchStep, ROWS, Round, State, Status, Step, Token};
use crate::{Config, KeyMode, Mutation};

impl Config {
    /// The outcomes the relay's next statement may have.
    pub(crate) fn outcomes(&self, s: &State, x: usize) -> Vec<Outcome> {
        let mut out = match &s.relays[x].round {
            Round::Idle => return Vec::new(),
            Round::Recover(_) => vec![Outcome::Ok, Outcome::ReadFailed],
            Round::Batch(b) => match b.step {
                BatchStep::Open => vec![Outcome::Ok, Outcome::BeginFailed],
                BatchStep::Transition if self.may_fail[b.rows[b.next as usize].0 as usize] => {
                    vec![Outcome::Ok, Outcome::Fail]
                }
                BatchStep::End => COMMIT_OUTCOMES.to_vec(),
                _ => vec![Outcome::Ok],
            },
            Round::Work { current, .. } => match current.step {
                Step::Transition if self.may_fail[current.token.0 as usize] => {
                    vec![Outcome::Ok, Outcome::Fail]
                }
                Step::Commit { .. } | Step::CommitFailure => COMMIT_OUTCOMES.to_vec(),
                Step::Publish | Step::Verdict if self.may_fail[current.token.0 as usize] => {
                    vec![Outcome::Ok, Outcome::Fail]
                }
                Step::Landed => vec![Outcome::Ok, Outcome::ReadFailed],
                Step::Settle { .. } => vec![Outcome::Ok, Outcome::GaveUp],
                Step::Mark => vec![Outcome::Ok, Outcome::LostAck, Outcome::GaveUp],
                _ => vec![Outcome::Ok],
            },
        };
        if s.faults == 0 {
            out.retain(|o| !o.is_fault());
        }
        out
    }

    /// Whether nobody looks after message `m`'s lease, so that it may run
    /// out at any time. The relay holding it looks after it from its claim
    /// to its bookkeeping: its heartbeat renews it while the handler runs;
    /// the read-back of a lost claim and the bookkeeping come well within
    /// the lease. Three waits are as long as the handlers': a handler's
    /// transaction (the heartbeat skips the row it locks, as claims do), a
    /// batch (renewed once, when it begins), and a delivery queued behind
    /// other handlers (the per-message path after a failed batch). Each is
    /// shorter than the lease (outliving it is a stall, a fault) unless
    /// `long_transactions`.
    pub(crate) fn unrenewed(&self, s: &State, m: usize) -> bool {
        if self.has(Mutation::NoRenewal) {
            return true;
        }
        let row = s.db.rows[m];
        let long = self.long_transactions;
        !s.relays.iter().enumerate().any(|(x, r)| {
            let holds = |&(n, a): &Token| n as usize == m && row.held_by(x as u8, a);
            let locked = r.tx.as_ref().is_some_and(|t| t.rows[m].is_some());
            match &r.round {
                Round::Idle => false,
                Round::Recover(tokens) => tokens.iter().any(holds),
                Round::Batch(b) => b.rows.iter().any(holds) && !(long && b.step != BatchStep::Open),
                Round::Work { current, queue } => {
                    let current_held =
                        holds(&current.token) && !(long && current.step.running() && locked);
                    let queued_held = queue
                        .iter()
                        .any(|d| holds(&d.token) && !(long && d.step.running()));
                    current_held || queued_held
                }
            }
        })
    }

    /// The most attempts a row may reach: each attempt past
    /// `max_attempts` needs a fault (a property checks it is never
    /// reached; claims stop there, so that every run is finite even in a
    /// mutation).
    pub(crate) fn attempts_bound(&self) -> u8 {
        self.max_attempts
            .saturating_add(self.faults.saturating_mul(2))
            .saturating_add(1)
    }

    /// Whether message `m` may be claimed: pending, due, its lease over,
    /// not locked (`FOR UPDATE SKIP LOCKED`), the head of its key.
    pub(super) fn claimable(&self, s: &State, m: usize) -> bool {
        let row = s.db.rows[m];
        row.exists
            && row.status == Status::Pending
            && !row.lease
            && !s.row_locked(m)
            && !(self.has(Mutation::ClaimIgnoresExpiry) && row.owner.is_some())
            && self.key_head(s, m)
    }

    /// Whether message `m` is its ordering key's head, read from the
    /// committed rows (the claim's subquery, under READ COMMITTED, sees
    /// no transaction's uncommitted writes and skips no locked row): no
    /// other `pending` row of the key has a smaller id (nor, with
    /// [`KeyMode::Hold`], a `failed` one), and no other `pending` row of
    /// the key holds a running lease. Without ordering, every row is.
    pub(crate) fn key_head(&self, s: &State, m: usize) -> bool {
        let Some(mode) = self.ordering else {
            return true;
        };
        if self.has(Mutation::ClaimIgnoresKey) {
            return true;
        }
        (0..ROWS).filter(|&n| n != m).all(|n| {
            let other = s.db.rows[n];
            let before = n < m
                && (other.status == Status::Pending
                    || (mode == KeyMode::Hold && other.status == Status::Failed));
            let leased = other.status == Status::Pending
                && other.lease
                && !self.has(Mutation::KeyHeadByIdOnly);
            !other.exists || !(before || leased)
        })
    }
}
