//! The steps: what each statement of the relay reads and writes, and the
//! outcomes the world may give it.

use crate::state::{
    Batch, BatchStep, Db, Delivery, Entity, ROWS, Relay, Round, Row, State, Status, Step, Token, Tx,
};
use crate::{Config, Mutation, properties};
use stateright::{Model, Property};

/// What the world answers a statement or a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It ran (and committed) as asked.
    Ok,
    /// The handler's body failed (a retryable error).
    Fail,
    /// The commit was applied, its acknowledgement lost (a fault).
    LostAck,
    /// The connection died before the commit reached the server: nothing
    /// applied, the outcome unknown to the relay (a fault).
    LostUnapplied,
    /// The commit was refused: nothing applied, the relay knows (a fault).
    Refused,
    /// A read failed on every try (a fault).
    ReadFailed,
    /// A bookkeeping write failed on every try: nothing applied (a fault).
    GaveUp,
    /// A batch's `BEGIN` failed (a fault).
    BeginFailed,
}

impl Outcome {
    fn is_fault(self) -> bool {
        !matches!(self, Outcome::Ok | Outcome::Fail)
    }
}

/// One step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The producer enqueues message `m` again under the same `msg_id`
    /// (its retry after a lost acknowledgement).
    Enqueue(u8),
    /// Message `m`'s lease runs out (nobody renews it).
    Expire(u8),
    /// Message `m`'s lease runs out although its handler is running: the
    /// heartbeat's renewals failed, or the relay stalled longer than the
    /// lease (a fault).
    Stall(u8),
    /// A relay claims the messages of `rows` (a bit mask) in one
    /// transaction.
    Claim {
        /// The relay.
        relay: u8,
        /// The rows it takes.
        rows: u8,
        /// Message 1 first (the claim orders by `next_attempt_at`: after
        /// a back-off, either may be older).
        reversed: bool,
        /// Its commit's outcome.
        outcome: Outcome,
    },
    /// A relay's next statement.
    Step {
        /// The relay.
        relay: u8,
        /// Its outcome.
        outcome: Outcome,
    },
    /// A relay crashes: its transaction aborts, its memory is gone; it
    /// restarts idle (a fault).
    Crash(u8),
}

const COMMIT_OUTCOMES: [Outcome; 4] = [
    Outcome::Ok,
    Outcome::LostAck,
    Outcome::LostUnapplied,
    Outcome::Refused,
];

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

    /// Whether message `m` may be claimed: pending, due, its lease over,
    /// not locked (`FOR UPDATE SKIP LOCKED`).
    fn claimable(&self, s: &State, m: usize) -> bool {
        let row = s.db.rows[m];
        row.exists
            && row.status == Status::Pending
            && !row.lease
            && !s.row_locked(m)
            && !(self.has(Mutation::ClaimIgnoresExpiry) && row.owner.is_some())
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

/// Relay `x`'s current delivery published and its handler answered `Ok`.
fn set_published(s: &mut State, x: usize) {
    if let Round::Work { current, .. } = &mut s.relays[x].round {
        current.published = true;
    }
}

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
        vec![State {
            db: Db {
                rows: [row; ROWS],
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
            sent: [1; ROWS],
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
                // `ON CONFLICT (topic, msg_id) DO NOTHING`: the row exists.
                s.sent[m as usize] += 1;
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
