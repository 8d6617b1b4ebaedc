//! The `record` strategy with its TTL, the archiver, and the Redis marker
//! (issue 23, points 5 and 6): a small model of one idempotency key called
//! by a few callers while time passes.
//!
//! A call first asks the cache: a live marker answers `Duplicate` without
//! the database. Otherwise its transaction claims the key: a live record
//! (its `expire_time` ahead) answers `Duplicate`; an expired one, or none
//! (archived, or never written), lets the call execute, writing the record
//! for `record_ttl` ticks. The commit may lose its acknowledgement
//! (applied or not): the caller retries the call. After an acknowledged
//! commit the call writes the marker: its TTL is the cache's, bounded by
//! the record's remaining TTL (`Record::bound_marker`: read in the call's
//! transaction, measured from before the read: the deadline `asked +
//! left`), then `PSETEX` (`RedisCache::put`, `Marker::ttl`). The archiver
//! moves expired records out (`archive`).
//!
//! The invariant: the cache never answers `Duplicate` for a key the
//! database would execute (a marker never outlives its record).

use stateright::{Model, Property};

/// A deliberate fault of the record strategy's marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordMutation {
    /// The marker's TTL is the cache's alone (the relay before issue 23's
    /// point 5).
    CacheTtlOnly,
    /// The marker's TTL is the record's remaining TTL as read, not reduced
    /// by the time passed since the read.
    TtlAsRead,
}

/// The bound of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordConfig {
    /// Callers of the key (each calls once, retrying after a lost
    /// acknowledgement).
    pub callers: usize,
    /// The record's TTL, in ticks.
    pub record_ttl: u8,
    /// The cache's TTL, in ticks.
    pub cache_ttl: u8,
    /// The last tick.
    pub horizon: u8,
    /// Lost acknowledgements one run may inject.
    pub faults: u8,
    /// Time may pass between computing the marker's TTL and Redis
    /// applying it (the `PSETEX` in flight).
    pub flight: bool,
    /// The deliberate fault, if any.
    pub mutation: Option<RecordMutation>,
}

impl RecordConfig {
    /// `callers` callers, a record TTL of 2 ticks, a cache TTL of 4, 6
    /// ticks, 1 fault, no time in flight.
    pub fn new(callers: usize) -> Self {
        RecordConfig {
            callers,
            record_ttl: 2,
            cache_ttl: 4,
            horizon: 6,
            faults: 1,
            flight: false,
            mutation: None,
        }
    }
}

/// Where a caller is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    /// Not called yet.
    Start,
    /// Committed; the record's remaining TTL read at `asked`.
    Committed {
        /// When the read was asked.
        asked: u8,
        /// The remaining TTL it read.
        left: u8,
    },
    /// The marker's TTL computed, the `PSETEX` in flight.
    Flying {
        /// The TTL sent.
        ttl: u8,
    },
    /// Answered.
    Done,
}

/// The state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordState {
    /// The clock.
    pub now: u8,
    /// The record's `expire_time`, if the row exists in `idem_record`.
    pub record: Option<u8>,
    /// The marker's expiry in Redis, if written.
    pub marker: Option<u8>,
    /// Committed executions.
    pub executions: u8,
    /// The callers.
    pub callers: Vec<Caller>,
    /// Faults left.
    pub faults: u8,
    /// The cache answered `Duplicate` while the database would execute.
    pub cache_lied: bool,
}

/// A step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordAction {
    /// One tick passes.
    Tick,
    /// The archiver moves the expired record out.
    Archive,
    /// Caller `c`'s next step (`lost`: its commit's acknowledgement is
    /// lost, applied or not).
    Step {
        /// The caller.
        caller: u8,
        /// A lost acknowledgement: applied.
        lost_applied: bool,
        /// A lost acknowledgement: not applied.
        lost_unapplied: bool,
    },
}

/// The cache never answers `Duplicate` for a key the database would
/// execute.
pub const CACHE_AGREES: &str = "the cache answers Duplicate only when the database would";
/// A live marker never outlives its record.
pub const MARKER_WITHIN_RECORD: &str = "a marker never outlives its record";
/// Reachable: the key executes again once its record expired (through
/// the cache: its marker gone too).
pub const EXECUTES_AGAIN: &str = "an expired key executes again";
/// Reachable: the cache answers a duplicate.
pub const CACHE_ANSWERS: &str = "the cache answers a duplicate";

fn live(t: Option<u8>, now: u8) -> bool {
    t.is_some_and(|t| t > now)
}

impl Model for RecordConfig {
    type State = RecordState;
    type Action = RecordAction;

    fn init_states(&self) -> Vec<RecordState> {
        vec![RecordState {
            now: 0,
            record: None,
            marker: None,
            executions: 0,
            callers: vec![Caller::Start; self.callers],
            faults: self.faults,
            cache_lied: false,
        }]
    }

    fn actions(&self, s: &RecordState, actions: &mut Vec<RecordAction>) {
        if s.now < self.horizon {
            actions.push(RecordAction::Tick);
        }
        if s.record.is_some() && !live(s.record, s.now) {
            actions.push(RecordAction::Archive);
        }
        for (c, caller) in s.callers.iter().enumerate() {
            if *caller == Caller::Done {
                continue;
            }
            let caller = c as u8;
            actions.push(RecordAction::Step {
                caller,
                lost_applied: false,
                lost_unapplied: false,
            });
            if s.faults > 0 && s.callers[c] == Caller::Start {
                for (lost_applied, lost_unapplied) in [(true, false), (false, true)] {
                    actions.push(RecordAction::Step {
                        caller,
                        lost_applied,
                        lost_unapplied,
                    });
                }
            }
        }
    }

    fn next_state(&self, last: &RecordState, action: RecordAction) -> Option<RecordState> {
        let mut s = last.clone();
        match action {
            RecordAction::Tick => s.now += 1,
            RecordAction::Archive => s.record = None,
            RecordAction::Step {
                caller,
                lost_applied,
                lost_unapplied,
            } => {
                let c = caller as usize;
                let now = s.now;
                s.callers[c] = match s.callers[c] {
                    Caller::Start if live(s.marker, now) && !lost_applied && !lost_unapplied => {
                        // The cache answers; the database would execute
                        // unless the record is live.
                        if !live(s.record, now) {
                            s.cache_lied = true;
                        }
                        Caller::Done
                    }
                    Caller::Start => {
                        if lost_applied || lost_unapplied {
                            s.faults -= 1;
                        }
                        let duplicate = live(s.record, now);
                        let mut record = s.record;
                        if !duplicate {
                            record = Some(now + self.record_ttl);
                        }
                        if !lost_unapplied && !duplicate {
                            s.record = record;
                            s.executions += 1;
                        }
                        match (lost_applied || lost_unapplied, duplicate) {
                            // The caller retries.
                            (true, _) => Caller::Start,
                            (false, _) => Caller::Committed {
                                asked: now,
                                left: s.record.map_or(0, |t| t.saturating_sub(now)),
                            },
                        }
                    }
                    Caller::Committed { asked, left } => {
                        let ttl = match self.mutation {
                            Some(RecordMutation::CacheTtlOnly) => self.cache_ttl,
                            Some(RecordMutation::TtlAsRead) => self.cache_ttl.min(left),
                            None => self.cache_ttl.min((asked + left).saturating_sub(now)),
                        };
                        match (ttl, self.flight) {
                            (0, _) => Caller::Done,
                            (ttl, true) => Caller::Flying { ttl },
                            (ttl, false) => {
                                s.marker = Some(now + ttl);
                                Caller::Done
                            }
                        }
                    }
                    Caller::Flying { ttl } => {
                        s.marker = Some(now + ttl);
                        Caller::Done
                    }
                    Caller::Done => return None,
                };
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(CACHE_AGREES, |_, s: &RecordState| !s.cache_lied),
            Property::always(MARKER_WITHIN_RECORD, |_, s: &RecordState| {
                !live(s.marker, s.now) || s.record.zip(s.marker).is_some_and(|(r, m)| m <= r)
            }),
            Property::sometimes(EXECUTES_AGAIN, |_, s: &RecordState| s.executions >= 2),
            Property::sometimes(CACHE_ANSWERS, |_, s: &RecordState| {
                live(s.marker, s.now) && s.callers.contains(&Caller::Start)
            }),
        ]
    }
}
