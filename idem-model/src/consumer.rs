//! The broker consumers (AMQP, NATS: `consume/`, `amqp/`, `nats/`): a
//! small model of one message delivered by a broker to a few consumers,
//! each running its handler in a transaction guarded by the entity's state
//! (`state_machine`), then acknowledging.
//!
//! The broker redelivers a delivery nobody acknowledged: after a crash
//! (AMQP: the channel closes; NATS: `AckWait`), after a lost
//! acknowledgement, and (a fault, as a relay's stall is) while a handler
//! still runs (NATS's `AckWait` shorter than the handler). The
//! acknowledgement comes after the commit; a commit whose outcome is
//! unknown is left unacknowledged (redelivered: the guard answers). A
//! handler failing on delivery `n < max_deliveries` is negatively
//! acknowledged (redelivered); on the last, the message is copied to the
//! dead-letter queue, then terminated (AMQP `reject` without requeue,
//! NATS `Term`).
//!
//! The properties: the effect at most once; the message never lost (every
//! run ends with its effect committed or its copy in the dead-letter
//! queue); never dead-lettered with its effect committed.

use stateright::{Model, Property};

/// A deliberate fault of the consumer path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConsumerMutation {
    /// The delivery acknowledged before the handler's commit.
    AckBeforeCommit,
    /// The message terminated before its dead-letter copy is published.
    TerminateBeforeCopy,
}

/// The bound of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Consumers (each one delivery at a time).
    pub consumers: usize,
    /// Deliveries before the dead letter.
    pub max_deliveries: u8,
    /// The handler may fail (retryably) on any delivery.
    pub may_fail: bool,
    /// Faults one run may inject (a crash, a lost commit or
    /// acknowledgement, a redelivery under a running handler).
    pub faults: u8,
    /// The broker may take a delivery back while its handler runs (NATS's
    /// `AckWait` shorter than the handler, no progress acknowledgement),
    /// at no fault's cost: see finding 5 in `tests/consumer.rs`.
    pub redeliver_running: bool,
    /// The deliberate fault, if any.
    pub mutation: Option<ConsumerMutation>,
}

impl ConsumerConfig {
    /// `consumers` consumers, 2 deliveries, a failing handler, `faults`.
    pub fn new(consumers: usize, faults: u8) -> Self {
        ConsumerConfig {
            consumers,
            max_deliveries: 2,
            may_fail: true,
            faults,
            redeliver_running: false,
            mutation: None,
        }
    }
}

/// The message at the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtBroker {
    /// Waiting for a consumer.
    Ready,
    /// Delivered, not acknowledged.
    InFlight,
    /// Acknowledged or terminated.
    Gone,
}

/// A consumer's delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Consumer {
    /// No delivery.
    Idle,
    /// Delivery `n` received (its handler to run).
    Received(u8),
    /// Acknowledged first (the mutation), the handler still to run.
    AckedFirst(u8),
    /// Committed (executed or a duplicate): to acknowledge.
    Committed(u8),
    /// The handler failed on delivery `n`.
    Failed(u8),
    /// The dead-letter copy published (to terminate).
    Copied,
    /// Terminated first (the mutation), the copy still to publish.
    Terminated,
}

/// The state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConsumerState {
    /// The message at the broker.
    pub broker: AtBroker,
    /// Deliveries made.
    pub deliveries: u8,
    /// The entity's `to` state committed.
    pub done: bool,
    /// Effects committed.
    pub effects: u8,
    /// Copies in the dead-letter queue.
    pub dead_letters: u8,
    /// The consumers.
    pub consumers: Vec<Consumer>,
    /// Faults left.
    pub faults: u8,
}

/// A step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConsumerAction {
    /// The broker delivers to consumer `c`.
    Deliver(u8),
    /// The broker takes back an unacknowledged delivery.
    Redeliver,
    /// Consumer `c`'s next step: ok, or the fault/failure given.
    Step(u8, Fate),
    /// Consumer `c` crashes (a fault).
    Crash(u8),
}

/// What the world answers a consumer's step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fate {
    /// As asked.
    Ok,
    /// The handler fails.
    Fail,
    /// The commit's (or the acknowledgement's) answer lost, applied.
    LostApplied,
    /// The commit's (or the acknowledgement's) answer lost, not applied.
    LostUnapplied,
}

/// The effect is committed at most once.
pub const AT_MOST_ONCE: &str = "a consumed message's effect is committed at most once";
/// Liveness: every run ends with the effect committed or the message in
/// the dead-letter queue.
pub const NEVER_LOST: &str = "a consumed message is eventually executed or dead-lettered";
/// The same, checked where nothing can happen any more (the model is
/// acyclic, so this is the liveness above; the controls refute this form,
/// whose counterexample stateright reports exactly).
pub const ENDS_EXECUTED_OR_DEAD: &str = "a consumed message ends executed or dead-lettered";
/// Never copied to the dead-letter queue with its effect committed, in a
/// run without faults (a crash between the copy and the terminate
/// redelivers a dead-lettered message: the price of the copy first,
/// which never loses one).
pub const NOT_DEAD_WITH_EFFECT: &str = "a consumed message is never dead-lettered with its effect";
/// Reachable: the message is dead-lettered.
pub const DEAD_LETTERED: &str = "a consumed message is dead-lettered";
/// Reachable: a redelivery after the commit answered `Duplicate`.
pub const REDELIVERED_DUPLICATE: &str = "a redelivery finds the effect done";

impl ConsumerConfig {
    fn holds_delivery(&self, s: &ConsumerState) -> bool {
        s.consumers.iter().any(|c| {
            matches!(
                c,
                Consumer::Received(_)
                    | Consumer::Committed(_)
                    | Consumer::Failed(_)
                    | Consumer::Copied
            )
        })
    }
}

impl Model for ConsumerConfig {
    type State = ConsumerState;
    type Action = ConsumerAction;

    fn init_states(&self) -> Vec<ConsumerState> {
        vec![ConsumerState {
            broker: AtBroker::Ready,
            deliveries: 0,
            done: false,
            effects: 0,
            dead_letters: 0,
            consumers: vec![Consumer::Idle; self.consumers],
            faults: self.faults,
        }]
    }

    fn actions(&self, s: &ConsumerState, actions: &mut Vec<ConsumerAction>) {
        let running = self.holds_delivery(s);
        if s.broker == AtBroker::InFlight && (!running || self.redeliver_running) {
            actions.push(ConsumerAction::Redeliver);
        }
        for (i, c) in s.consumers.iter().enumerate() {
            let i = i as u8;
            match c {
                Consumer::Idle => {
                    if s.broker == AtBroker::Ready {
                        actions.push(ConsumerAction::Deliver(i));
                    }
                    continue;
                }
                Consumer::Received(_) | Consumer::AckedFirst(_) => {
                    actions.push(ConsumerAction::Step(i, Fate::Ok));
                    // The state check runs first: a body runs (and may
                    // fail) only while the action is not done.
                    if self.may_fail && !s.done {
                        actions.push(ConsumerAction::Step(i, Fate::Fail));
                    }
                }
                _ => actions.push(ConsumerAction::Step(i, Fate::Ok)),
            }
            if s.faults > 0 {
                actions.push(ConsumerAction::Crash(i));
                if matches!(c, Consumer::Received(_) | Consumer::Committed(_)) {
                    actions.push(ConsumerAction::Step(i, Fate::LostApplied));
                    actions.push(ConsumerAction::Step(i, Fate::LostUnapplied));
                }
            }
        }
    }

    fn next_state(&self, last: &ConsumerState, action: ConsumerAction) -> Option<ConsumerState> {
        let mut s = last.clone();
        let fault = match action {
            ConsumerAction::Crash(_) => true,
            ConsumerAction::Step(_, f) => matches!(f, Fate::LostApplied | Fate::LostUnapplied),
            ConsumerAction::Redeliver => false,
            ConsumerAction::Deliver(_) => false,
        };
        if fault {
            s.faults = s.faults.checked_sub(1)?;
        }
        match action {
            ConsumerAction::Deliver(c) => {
                s.broker = AtBroker::InFlight;
                s.deliveries += 1;
                s.consumers[c as usize] = match self.mutation {
                    Some(ConsumerMutation::AckBeforeCommit) => {
                        s.broker = AtBroker::Gone;
                        Consumer::AckedFirst(s.deliveries)
                    }
                    _ => Consumer::Received(s.deliveries),
                };
            }
            ConsumerAction::Redeliver => s.broker = AtBroker::Ready,
            ConsumerAction::Crash(c) => s.consumers[c as usize] = Consumer::Idle,
            ConsumerAction::Step(c, fate) => {
                let c = c as usize;
                s.consumers[c] = match (s.consumers[c], fate) {
                    (Consumer::Received(n) | Consumer::AckedFirst(n), Fate::Fail) => {
                        // The transaction rolls back.
                        Consumer::Failed(n)
                    }
                    (Consumer::Received(n) | Consumer::AckedFirst(n), _) => {
                        // One transaction: the guard (`FOR UPDATE`, so
                        // the consumers' transactions serialise), the
                        // effect and the transition, the commit.
                        if !s.done && fate != Fate::LostUnapplied {
                            s.done = true;
                            s.effects += 1;
                        }
                        match (fate, s.consumers[c]) {
                            (Fate::Ok, Consumer::AckedFirst(_)) => Consumer::Idle,
                            (Fate::Ok, _) => Consumer::Committed(n),
                            // Unknown: left unacknowledged, redelivered.
                            _ => Consumer::Idle,
                        }
                    }
                    (Consumer::Committed(_), fate) => {
                        if matches!(fate, Fate::Ok | Fate::LostApplied) {
                            s.broker = AtBroker::Gone;
                        }
                        Consumer::Idle
                    }
                    (Consumer::Failed(n), _) if n < self.max_deliveries => {
                        // Negatively acknowledged: redelivered.
                        if s.broker == AtBroker::InFlight {
                            s.broker = AtBroker::Ready;
                        }
                        Consumer::Idle
                    }
                    (Consumer::Failed(_), _) => match self.mutation {
                        Some(ConsumerMutation::TerminateBeforeCopy) => {
                            s.broker = AtBroker::Gone;
                            Consumer::Terminated
                        }
                        _ => {
                            s.dead_letters += 1;
                            Consumer::Copied
                        }
                    },
                    (Consumer::Copied, _) => {
                        s.broker = AtBroker::Gone;
                        Consumer::Idle
                    }
                    (Consumer::Terminated, _) => {
                        s.dead_letters += 1;
                        Consumer::Idle
                    }
                    (Consumer::Idle, _) => return None,
                };
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONCE, |_, s: &ConsumerState| s.effects <= 1),
            Property::eventually(NEVER_LOST, |_, s: &ConsumerState| {
                s.effects >= 1 || s.dead_letters >= 1
            }),
            Property::always(
                ENDS_EXECUTED_OR_DEAD,
                |c: &ConsumerConfig, s: &ConsumerState| {
                    let mut actions = Vec::new();
                    c.actions(s, &mut actions);
                    let quiescent = actions.into_iter().all(|a| c.next_state(s, a).is_none());
                    !quiescent || s.effects >= 1 || s.dead_letters >= 1
                },
            ),
            Property::always(
                NOT_DEAD_WITH_EFFECT,
                |c: &ConsumerConfig, s: &ConsumerState| {
                    s.faults < c.faults || s.dead_letters == 0 || s.effects == 0
                },
            ),
            Property::sometimes(DEAD_LETTERED, |_, s: &ConsumerState| s.dead_letters >= 1),
            Property::sometimes(REDELIVERED_DUPLICATE, |_, s: &ConsumerState| {
                s.done && s.deliveries >= 2 && s.broker == AtBroker::Gone
            }),
        ]
    }
}
