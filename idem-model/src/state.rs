//! The model's state: the database (outbox rows, the handlers' entity
//! rows), each relay's open transaction and round, the Redis markers, the
//! producer, and the faults left to inject.

/// How many outbox rows (messages) the model holds.
pub const ROWS: usize = 2;

/// An outbox row's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// `pending`: due, leased, or waiting out a back-off.
    Pending,
    /// `success`: the handler's transaction marked it.
    Success,
    /// `failed`: dead-lettered.
    Failed,
}

/// One `idem_outbox` row, as far as the protocol reads it.
///
/// The lease owner column holds the claim's own owner (`relay#seq`); the
/// model writes the relay's index and compares `(owner, attempts)`,
/// which tells the claims apart exactly as the per-claim owner does:
/// every committed claim of a row increments its `attempts`, and a relay
/// has one claim in flight at a time (see `MODEL.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Row {
    /// Enqueued (the producer's insert committed).
    pub exists: bool,
    /// The row's status.
    pub status: Status,
    /// `lease_owner`: the relay whose claim leased it.
    pub owner: Option<u8>,
    /// `attempts`, incremented by each claim.
    pub attempts: u8,
    /// `locked_until > now()`: the lease is running.
    pub lease: bool,
    /// `last_error` written (the reason of a retry or a dead letter).
    pub reason: bool,
}

impl Row {
    /// A row not enqueued yet.
    pub const ABSENT: Row = Row {
        exists: false,
        status: Status::Pending,
        owner: None,
        attempts: 0,
        lease: false,
        reason: false,
    };

    /// Whether the claim `(relay, attempt)` still holds this row: the
    /// fence of every bookkeeping write (`status = 'pending' AND
    /// lease_owner = ? AND attempts = ?`).
    pub fn held_by(&self, relay: u8, attempt: u8) -> bool {
        self.exists
            && self.status == Status::Pending
            && self.owner == Some(relay)
            && self.attempts == attempt
    }
}

/// The row a handler's state machine guards (`from` → `to`), with the
/// effect its body writes in the same transaction (a deduction row).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entity {
    /// In its `to` state.
    pub done: bool,
    /// Effects written (committed, in the database's copy).
    pub effects: u8,
    /// Which outbox rows' deliveries wrote them (bit `m`).
    pub by: u8,
}

/// The database: the committed rows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Db {
    /// `idem_outbox`.
    pub rows: [Row; ROWS],
    /// The handlers' entities (message `m` acts on `entity_of(m)`).
    pub entities: [Entity; ROWS],
}

/// A relay's open transaction: the rows it has written (and so holds
/// locked until it ends), with their uncommitted values.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tx {
    /// Outbox rows locked by this transaction.
    pub rows: [Option<Row>; ROWS],
    /// Entity rows locked by this transaction.
    pub entities: [Option<Entity>; ROWS],
}

/// One claimed lease: the message and the attempt the claim wrote.
pub type Token = (u8, u8);

/// A step of one message's attempt on the per-message path
/// (`Relay::deliver`, the call's `open`/`finish`, `Relay::settle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    /// The per-message path after a batch that did not commit: the lease
    /// renewed (fenced by the claim's owner, waiting for a row lock)
    /// before the attempt; not renewed, the message is left to its holder.
    Renew,
    /// The fault version only: the state read outside the transaction.
    Check,
    /// `BEGIN` and the fenced outbox success update (`dup`: the fault
    /// version's check found the action done).
    Begin {
        /// The outside check answered "already done".
        dup: bool,
    },
    /// The state check, `SELECT … FOR UPDATE`.
    Guard,
    /// The body's write.
    Effect,
    /// The guarded transition (or the body failing).
    Transition,
    /// `COMMIT` of a transaction whose body failed: rolled back to the
    /// savepoint after the fenced update, the failure bookkeeping written
    /// in it (issue 23's fix).
    CommitFailure,
    /// `COMMIT` (`dup`: a duplicate, nothing executed).
    Commit {
        /// The call answers `Duplicate`.
        dup: bool,
    },
    /// The cache marker, after the commit.
    Marker,
    /// The commit's outcome is unknown: the row read back.
    Landed,
    /// The failure bookkeeping (retry or dead letter), fenced.
    Settle {
        /// Whether the error may be retried.
        retryable: bool,
    },
    /// A route whose handler does not take its delivery's source (a
    /// publisher): the handler's effect outside the database (the publish).
    Publish,
    /// The same handler's answer, after its publish.
    Verdict,
    /// The relay-side success mark of such a route, on the pool, fenced
    /// (`outbox_success_pool`), retried and read back after a lost
    /// acknowledgement.
    Mark,
}

impl Step {
    /// Whether the handler is running (its heartbeat renews the lease).
    pub fn running(self) -> bool {
        !matches!(
            self,
            Step::Renew | Step::Landed | Step::Settle { .. } | Step::Mark
        )
    }
}

/// One message's attempt on the per-message path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Delivery {
    /// The lease it was delivered under.
    pub token: Token,
    /// What it does next.
    pub step: Step,
    /// Its handler published and answered `Ok` (a publisher route).
    pub published: bool,
}

/// A step of a batch (`Relay::deliver_batch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BatchStep {
    /// `BEGIN` and the renewal of the claimed leases (`RETURNING id`).
    Open,
    /// The current handler's state check, under its savepoint.
    Guard,
    /// The current handler's body write.
    Effect,
    /// The current handler's transition (or its failure: rollback to
    /// the savepoint).
    Transition,
    /// The deferred success update, then `COMMIT`.
    End,
    /// The deferred cache markers, after the commit.
    Markers,
}

/// A batch in progress.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Batch {
    /// The claimed leases; once opened, those the renewal returned.
    pub rows: Vec<Token>,
    /// The message whose handler runs (an index into `rows`).
    pub next: u8,
    /// What it does next.
    pub step: BatchStep,
    /// The current handler's savepoint.
    pub savepoint: Option<Tx>,
    /// Each handler's answer, in order (true: it succeeded).
    pub ran: Vec<(Token, bool)>,
    /// The cache markers deferred to the commit (by entity).
    pub markers: [bool; ROWS],
}

/// What a relay is doing: one claim and its deliveries at a time
/// (`Relay::run_once`; a relay running rounds side by side is several
/// relays to the protocol, each claim having an owner of its own).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Round {
    /// Between rounds.
    Idle,
    /// A claim whose commit outcome is unknown, to read back.
    Recover(Vec<Token>),
    /// A batch (batched mode).
    Batch(Batch),
    /// Attempts on the per-message path, one after the other.
    Work {
        /// The attempt in progress.
        current: Delivery,
        /// Those after it.
        queue: Vec<Delivery>,
    },
}

/// One relay: its round and its open transaction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Relay {
    /// What it is doing.
    pub round: Round,
    /// Its open transaction, if any.
    pub tx: Option<Tx>,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct State {
    /// The committed database.
    pub db: Db,
    /// The relays.
    pub relays: Vec<Relay>,
    /// The Redis markers, by entity.
    pub cache: [bool; ROWS],
    /// How many times the producer enqueued each message.
    pub sent: [u8; ROWS],
    /// Faults left to inject.
    pub faults: u8,
    /// A running handler's lease ran out (a stall, see `Action::Stall`).
    pub stalled: bool,
    /// Publishes of each message (the effect of a publisher route, outside
    /// the database).
    pub published: [u8; ROWS],
    /// The bookkeeping of an attempt whose handler published and answered
    /// `Ok` dead-lettered its message.
    pub dead_after_publish: bool,
}

impl State {
    /// Whether a transaction other than relay `me`'s holds outbox row `m`.
    pub fn row_locked_by_other(&self, me: usize, m: usize) -> bool {
        self.relays
            .iter()
            .enumerate()
            .any(|(x, r)| x != me && r.tx.as_ref().is_some_and(|t| t.rows[m].is_some()))
    }

    /// Whether any transaction holds outbox row `m`.
    pub fn row_locked(&self, m: usize) -> bool {
        self.relays
            .iter()
            .any(|r| r.tx.as_ref().is_some_and(|t| t.rows[m].is_some()))
    }

    /// Whether a transaction other than relay `me`'s holds entity `e`.
    pub fn entity_locked_by_other(&self, me: usize, e: usize) -> bool {
        self.relays
            .iter()
            .enumerate()
            .any(|(x, r)| x != me && r.tx.as_ref().is_some_and(|t| t.entities[e].is_some()))
    }
}

impl Tx {
    /// Applies this transaction's writes to `db` (its `COMMIT`).
    pub fn apply(&self, db: &mut Db) {
        for (m, row) in self.rows.iter().enumerate() {
            if let Some(row) = row {
                db.rows[m] = *row;
            }
        }
        for (e, entity) in self.entities.iter().enumerate() {
            if let Some(entity) = entity {
                db.entities[e] = *entity;
            }
        }
    }
}
