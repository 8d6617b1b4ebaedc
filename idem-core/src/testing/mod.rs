//! Fault injection for tests and demonstrations (cargo feature `testing`).
//!
//! [`set_lost_ack_rate`] makes a fraction of the commits idem issues
//! behave as if the database's commit acknowledgement were lost: the
//! transaction commits, then the caller sees an I/O error anyway — the
//! article's incident, on a database (SQLite) where no network sits
//! between the application and the commit. It covers every commit idem
//! issues: idempotent calls (and [`commit`]), and the relay's claims,
//! lease renewals, failure bookkeeping and success marking; each
//! [`Kind`] is counted on its own ([`lost_acks_on`]). Against a server,
//! use a real fault proxy instead.
//!
//! [`trace`] records the relay's and the calls' protocol events, for
//! the conformance check against the model (`idem-model`).
//!
//! Never enable this feature in production builds.

pub mod trace;

/// The row [`Backend::claim_record`](crate::Backend::claim_record) inserts,
/// for tests of the stores' own guarantees (the record's bounds, its id
/// sequence across an upgrade).
pub use crate::backend::types::NewRecord;

use std::sync::atomic::{AtomicU64, Ordering};

static RATE_PPM: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);
static INJECTED: [AtomicU64; Kind::ALL.len()] = [const { AtomicU64::new(0) }; Kind::ALL.len()];

/// Which commit an injected fault hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// The commit of an idempotent call (a handler's transaction), or of
    /// [`commit`].
    Call,
    /// A relay's claim of due messages.
    Claim,
    /// A relay's renewal of a running handler's lease (the heartbeat).
    Renew,
    /// A relay's record of a failed attempt (retry or dead letter).
    Settle,
    /// A relay's `success` mark after a handler not given its outbox
    /// source.
    Success,
    /// A relay's commit of a batch of messages (see `Relay::commit_batch`).
    Batch,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 6] = [
        Kind::Call,
        Kind::Claim,
        Kind::Renew,
        Kind::Settle,
        Kind::Success,
        Kind::Batch,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// Loses the acknowledgement of this fraction (0.0 to 1.0) of the commits
/// idem issues, process-wide. 0.0 turns injection off.
pub fn set_lost_ack_rate(rate: f64) {
    let ppm = (rate.clamp(0.0, 1.0) * 1_000_000.0) as u64;
    RATE_PPM.store(ppm, Ordering::SeqCst);
}

/// Loses acknowledgements (at [`set_lost_ack_rate`]'s rate) on the
/// commits of `kinds` only; every kind again with `Kind::ALL`.
pub fn set_lost_ack_kinds(kinds: &[Kind]) {
    let on: u64 = kinds.iter().map(|k| 1u64 << k.index()).sum();
    KINDS_OFF.store(!on, Ordering::SeqCst);
}

static KINDS_OFF: AtomicU64 = AtomicU64::new(0);

/// While on, the relay's read-back of a handler commit whose outcome is
/// unknown fails, as every try of it would against a database that is
/// failing over: the relay cannot tell whether the commit landed.
pub fn set_unreadable_read_backs(on: bool) {
    UNREADABLE.store(on, Ordering::SeqCst);
}

/// Whether [`set_unreadable_read_backs`] is on.
pub(crate) fn unreadable_read_backs() -> bool {
    UNREADABLE.load(Ordering::Relaxed)
}

static UNREADABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How many acknowledgements were lost so far, of every kind.
pub fn lost_acks() -> u64 {
    Kind::ALL.iter().map(|k| lost_acks_on(*k)).sum()
}

/// How many acknowledgements of `kind` were lost so far.
pub fn lost_acks_on(kind: Kind) -> u64 {
    INJECTED[kind.index()].load(Ordering::SeqCst)
}

/// Decides, after a successful commit of `kind`, whether to report it as
/// unknown.
pub(crate) fn lose_ack_on(kind: Kind) -> bool {
    let ppm = RATE_PPM.load(Ordering::Relaxed);
    if ppm == 0 || KINDS_OFF.load(Ordering::Relaxed) & (1 << kind.index()) != 0 {
        return false;
    }
    // A deterministic, evenly spread sequence: the fractional parts of
    // n·φ (the top bits of the golden-ratio product), so runs are
    // reproducible and every stretch of commits sees the set rate.
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let frac = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    let lose = frac * 1_000_000 < ppm << 32;
    if lose {
        INJECTED[kind.index()].fetch_add(1, Ordering::SeqCst);
    }
    lose
}

static BROKEN_SAVEPOINTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A deliberately broken build, for controls: while on, a failed call
/// inside a relay batch's transaction *releases* its savepoint instead of
/// rolling back to it, so its effects (and its success mark) commit with
/// the batch. Tests use it to show that they catch that bug.
#[doc(hidden)]
pub fn set_broken_batch_savepoints(on: bool) {
    BROKEN_SAVEPOINTS.store(on, Ordering::SeqCst);
}

/// Whether [`set_broken_batch_savepoints`] is on.
pub(crate) fn broken_batch_savepoints() -> bool {
    BROKEN_SAVEPOINTS.load(Ordering::SeqCst)
}

static BROKEN_BATCH_LEASES: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A deliberately broken build, for controls: while on, a call driven by
/// a relay's outbox message leaves its failure to the relay's write after
/// its rollback, as before failures were booked in the call's transaction
/// (see `FailureBook`): another relay may then claim the message in
/// between, and the attempt goes unrecorded.
pub fn set_broken_failure_booking(on: bool) {
    BROKEN_BOOKING.store(on, Ordering::Relaxed);
}

/// Whether [`set_broken_failure_booking`] is on.
pub(crate) fn broken_failure_booking() -> bool {
    BROKEN_BOOKING.load(Ordering::Relaxed)
}

static BROKEN_BOOKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Delays the relay's own failure bookkeeping (the write after a handler
/// failed) by `d` (zero: none), process-wide: widens the moment between
/// a handler's rollback and that write, where another relay may claim the
/// message, so that a test sees it every time.
pub fn set_settle_delay(d: std::time::Duration) {
    SETTLE_DELAY_MS.store(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// The delay [`set_settle_delay`] set.
pub(crate) fn settle_delay() -> std::time::Duration {
    std::time::Duration::from_millis(SETTLE_DELAY_MS.load(Ordering::Relaxed))
}

static SETTLE_DELAY_MS: AtomicU64 = AtomicU64::new(0);

/// A deliberately broken build, for controls: while on, a relay batch
/// does not renew (and so lock) its messages' leases in its transaction
/// when it begins, and a batch slower than its lease can be taken over.
#[doc(hidden)]
pub fn set_broken_batch_leases(on: bool) {
    BROKEN_BATCH_LEASES.store(on, Ordering::SeqCst);
}

/// Whether [`set_broken_batch_leases`] is on.
pub(crate) fn broken_batch_leases() -> bool {
    BROKEN_BATCH_LEASES.load(Ordering::SeqCst)
}

static BROKEN_QUEUED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A deliberately broken build, for controls: while on, a message a relay
/// claimed ahead of a free handler slot waits for it without renewing its
/// lease (so a slow queue lets the lease run out).
#[doc(hidden)]
pub fn set_broken_queued_renewal(on: bool) {
    BROKEN_QUEUED.store(on, Ordering::SeqCst);
}

/// Whether [`set_broken_queued_renewal`] is on.
pub(crate) fn broken_queued_renewal() -> bool {
    BROKEN_QUEUED.load(Ordering::SeqCst)
}

static BATCH_CONFLICTS: AtomicU64 = AtomicU64::new(0);

/// Makes the next `n` commits of relay batches (see
/// `Relay::commit_batch`) fail as the loser of a deadlock does: the
/// batch's transaction rolls back, nothing of it committed, and the relay
/// sees a conflict (its adaptive batching halves the batch size and
/// delivers the messages one by one). 0 turns it off.
pub fn set_batch_conflicts(n: u64) {
    BATCH_CONFLICTS.store(n, Ordering::SeqCst);
}

/// Takes one injected batch conflict, if any is left.
pub(crate) fn take_batch_conflict() -> bool {
    BATCH_CONFLICTS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

static BROKEN_ADAPTIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A deliberately broken build, for controls: while on, a relay batch
/// that lost a conflict does not shrink the batch size (no adaptive
/// batching).
#[doc(hidden)]
pub fn set_broken_adaptive_batching(on: bool) {
    BROKEN_ADAPTIVE.store(on, Ordering::SeqCst);
}

/// Whether [`set_broken_adaptive_batching`] is on.
pub(crate) fn broken_adaptive_batching() -> bool {
    BROKEN_ADAPTIVE.load(Ordering::SeqCst)
}

/// The error a lost acknowledgement produces.
pub(crate) fn lost_ack_error() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "injected fault: the commit acknowledgement was lost",
    ))
}

/// The error a commit reports when its acknowledgement is lost, in the
/// error type its caller speaks.
pub(crate) trait LostAck {
    /// The lost acknowledgement.
    fn lost_ack() -> Self;
}

impl LostAck for sqlx::Error {
    fn lost_ack() -> Self {
        lost_ack_error()
    }
}

impl LostAck for crate::Error {
    fn lost_ack() -> Self {
        crate::Error::CommitUnknown(lost_ack_error())
    }
}

/// `result`, or the lost acknowledgement's error if the injection picks
/// this successful commit of `kind`: the one hook every commit idem issues
/// goes through (by `after_commit!`).
pub(crate) fn after_commit<T, E: LostAck>(kind: Kind, result: Result<T, E>) -> Result<T, E> {
    match result {
        Ok(_) if lose_ack_on(kind) => Err(E::lost_ack()),
        other => other,
    }
}

/// Commits `tx` under the same injection as idempotent calls: at the set
/// rate, the commit happens and then an I/O error is returned anyway. For
/// hand-written handlers (such as the article's fault version) in tests
/// and demonstrations.
pub async fn commit<DB: sqlx::Database>(tx: sqlx::Transaction<'_, DB>) -> Result<(), sqlx::Error> {
    after_commit(Kind::Call, tx.commit().await)
}
