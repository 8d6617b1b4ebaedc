//! Fault injection and the conformance trace for idem's tests and demos,
//! as a [`idem_core::probe::Probe`] the core reports to
//! (`idem_runtime::testing`, feature `testing`).
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
//! Enabling the feature changes nothing by itself: the probe is installed
//! by the first function of this crate that turns something on (or by
//! [`install`]), in the process that calls it. The deliberately broken
//! protocol variants the controls use (`set_broken_*`) exist only in a
//! build with `--cfg idem_broken`: in any other, turning one off does
//! nothing and turning one on panics (the control cannot run, and must
//! not pass as if it had).

pub mod trace;

/// The row [`Backend::claim_record`](idem_core::Backend::claim_record)
/// inserts, for tests of the stores' own guarantees (the record's bounds,
/// its id sequence across an upgrade).
pub use idem_core::requests::NewRecord;

/// Which commit an injected fault hit.
pub use idem_core::probe::Commit as Kind;

use idem_core::probe::{self, Event, Probe};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

static RATE_PPM: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);
static INJECTED: [AtomicU64; Kind::ALL.len()] = [const { AtomicU64::new(0) }; Kind::ALL.len()];
static KINDS_OFF: AtomicU64 = AtomicU64::new(0);
static UNREADABLE: AtomicBool = AtomicBool::new(false);
static SETTLE_DELAY_MS: AtomicU64 = AtomicU64::new(0);
static BATCH_CONFLICTS: AtomicU64 = AtomicU64::new(0);
/// Claims waiting at the gate of [`hold_claims`] now.
static CLAIMS_WAITING: AtomicU64 = AtomicU64::new(0);

fn index(kind: Kind) -> usize {
    Kind::ALL
        .iter()
        .position(|k| *k == kind)
        .expect("every kind is in Kind::ALL")
}

/// The probe this crate installs: its settings are this module's statics.
#[derive(Debug)]
struct Faults;

impl Probe for Faults {
    fn lose_ack(&self, commit: Kind) -> bool {
        lose_ack_on(commit)
    }

    fn traces(&self) -> bool {
        trace::is_on()
    }

    fn event(&self, event: Event<'_>) {
        trace::record(event);
    }

    fn read_back_fails(&self) -> bool {
        UNREADABLE.load(Ordering::Relaxed)
    }

    fn before_failure_booking(&self) -> Duration {
        Duration::from_millis(SETTLE_DELAY_MS.load(Ordering::Relaxed))
    }

    fn batch_conflict(&self) -> bool {
        BATCH_CONFLICTS
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    fn before_claim(&self) -> Option<probe::BoxWait> {
        let mut open = claim_gate().subscribe();
        if *open.borrow() {
            return None;
        }
        CLAIMS_WAITING.fetch_add(1, Ordering::SeqCst);
        Some(Box::pin(async move {
            // A dropped sender never happens (a static): open either way.
            let _ = open.wait_for(|open| *open).await;
            CLAIMS_WAITING.fetch_sub(1, Ordering::SeqCst);
        }))
    }
}

/// The gate of [`hold_claims`]: open (`true`) unless a test holds claims.
fn claim_gate() -> &'static tokio::sync::watch::Sender<bool> {
    static GATE: std::sync::OnceLock<tokio::sync::watch::Sender<bool>> = std::sync::OnceLock::new();
    GATE.get_or_init(|| tokio::sync::watch::Sender::new(true))
}

/// Holds every relay claim statement in the process (`true`) before it
/// takes a connection, until released (`false`, which lets the held ones
/// run): a test makes the database change under a claim that has begun,
/// as under a claim waiting for a connection while an outage ends, in
/// that order every time. [`claims_waiting`] tells when a claim is held.
pub fn hold_claims(on: bool) {
    install();
    claim_gate().send_replace(!on);
}

/// How many claims wait at the gate of [`hold_claims`] now.
pub fn claims_waiting() -> u64 {
    CLAIMS_WAITING.load(Ordering::SeqCst)
}

/// Installs this crate's probe in the process (once; later calls do
/// nothing). Every setter below calls it; a process that only records a
/// trace through `IDEM_TRACE_FILE` (a relay a test kills) calls it at
/// start.
///
/// # Panics
/// When another probe was installed in this process first.
pub fn install() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        assert!(
            probe::install(Arc::new(Faults)),
            "another probe is installed in this process: idem_runtime::testing cannot inject faults"
        );
    });
}

/// Loses the acknowledgement of this fraction (0.0 to 1.0) of the commits
/// idem issues, process-wide. 0.0 turns injection off.
pub fn set_lost_ack_rate(rate: f64) {
    install();
    let ppm = (rate.clamp(0.0, 1.0) * 1_000_000.0) as u64;
    RATE_PPM.store(ppm, Ordering::SeqCst);
}

/// Loses acknowledgements (at [`set_lost_ack_rate`]'s rate) on the
/// commits of `kinds` only; every kind again with `Kind::ALL`.
pub fn set_lost_ack_kinds(kinds: &[Kind]) {
    install();
    let on: u64 = kinds.iter().map(|k| 1u64 << index(*k)).sum();
    KINDS_OFF.store(!on, Ordering::SeqCst);
}

/// While on, the relay's read-back of a handler commit whose outcome is
/// unknown fails, as every try of it would against a database that is
/// failing over: the relay cannot tell whether the commit landed.
pub fn set_unreadable_read_backs(on: bool) {
    install();
    UNREADABLE.store(on, Ordering::SeqCst);
}

/// How many acknowledgements were lost so far, of every kind.
pub fn lost_acks() -> u64 {
    Kind::ALL.iter().map(|k| lost_acks_on(*k)).sum()
}

/// How many acknowledgements of `kind` were lost so far.
pub fn lost_acks_on(kind: Kind) -> u64 {
    INJECTED[index(kind)].load(Ordering::SeqCst)
}

/// Decides, after a successful commit of `kind`, whether to report it as
/// unknown.
fn lose_ack_on(kind: Kind) -> bool {
    let ppm = RATE_PPM.load(Ordering::Relaxed);
    if ppm == 0 || KINDS_OFF.load(Ordering::Relaxed) & (1 << index(kind)) != 0 {
        return false;
    }
    // A deterministic, evenly spread sequence: the fractional parts of
    // n·φ (the top bits of the golden-ratio product), so runs are
    // reproducible and every stretch of commits sees the set rate.
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let frac = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    let lose = frac * 1_000_000 < ppm << 32;
    if lose {
        INJECTED[index(kind)].fetch_add(1, Ordering::SeqCst);
    }
    lose
}

/// Delays the relay's own failure bookkeeping (the write after a handler
/// failed) by `d` (zero: none), process-wide: widens the moment between
/// a handler's rollback and that write, where another relay may claim the
/// message, so that a test sees it every time.
pub fn set_settle_delay(d: Duration) {
    install();
    SETTLE_DELAY_MS.store(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// Makes the next `n` commits of relay batches (see
/// `Relay::commit_batch`) fail as the loser of a deadlock does: the
/// batch's transaction rolls back, nothing of it committed, and the relay
/// sees a conflict (its adaptive batching halves the batch size and
/// delivers the messages one by one). 0 turns it off.
pub fn set_batch_conflicts(n: u64) {
    install();
    BATCH_CONFLICTS.store(n, Ordering::SeqCst);
}

/// Commits `tx` under the same injection as idempotent calls: at the set
/// rate, the commit happens and then an I/O error is returned anyway. For
/// hand-written handlers (such as the article's fault version) in tests
/// and demonstrations.
pub async fn commit<DB: sqlx::Database>(tx: sqlx::Transaction<'_, DB>) -> Result<(), sqlx::Error> {
    tx.commit().await?;
    match lose_ack_on(Kind::Call) {
        true => Err(probe::lost_ack_error()),
        false => Ok(()),
    }
}

/// Turns the deliberately broken variant `b` on or off: a control that
/// shows a test catching a broken protocol. Only a build with `--cfg
/// idem_broken` has the variants; in any other, turning one off does
/// nothing and turning one on panics (the control cannot run, and must
/// not pass as if it had).
fn set_broken(b: probe::Break, on: bool) {
    #[cfg(idem_broken)]
    probe::set_broken(b, on);
    #[cfg(not(idem_broken))]
    assert!(
        !on,
        "{b:?}: the broken variants exist only in a build with RUSTFLAGS=\"--cfg idem_broken\""
    );
}

/// A failed call inside a relay batch's transaction *releases* its
/// savepoint instead of rolling back to it (a control; see the [crate documentation](crate)).
pub fn set_broken_batch_savepoints(on: bool) {
    set_broken(probe::Break::BatchSavepoints, on);
}

/// A relay batch does not renew (and so lock) its messages' leases when it
/// begins (a control; see the [crate documentation](crate)).
pub fn set_broken_batch_leases(on: bool) {
    set_broken(probe::Break::BatchLeases, on);
}

/// A call driven by an outbox message leaves its failure to the relay's
/// write after its rollback (a control; see the [crate documentation](crate)).
pub fn set_broken_failure_booking(on: bool) {
    set_broken(probe::Break::FailureBooking, on);
}

/// A message claimed ahead of a free handler slot waits without renewing
/// its lease (a control; see the [crate documentation](crate)).
pub fn set_broken_queued_renewal(on: bool) {
    set_broken(probe::Break::QueuedRenewal, on);
}

/// A relay batch that lost a conflict does not shrink the batch size (a
/// control; see the [crate documentation](crate)).
pub fn set_broken_adaptive_batching(on: bool) {
    set_broken(probe::Break::AdaptiveBatching, on);
}

/// An attempt that failed in an outage (the broker or the database down)
/// counts against `max_attempts` like any failure, as before issue 38 (a
/// control; see the [crate documentation](crate)).
pub fn set_broken_outage_counted(on: bool) {
    set_broken(probe::Break::OutageCounted, on);
}

/// A broker consumer settles each delivery when it receives it, before
/// its handler ran (the Kafka consumer stores the offset first): at most
/// once (a control; see the [crate documentation](crate)).
pub fn set_broken_settle_first(on: bool) {
    set_broken(probe::Break::SettleFirst, on);
}

/// A relay's claim ignores ordering keys: the messages of one key run side
/// by side, in any order (a control; see the [crate documentation](crate)).
/// Set it before the relay's routes.
pub fn set_broken_unordered(on: bool) {
    set_broken(probe::Break::Unordered, on);
}

/// A claim that takes a message whose outage attempt the relay could not
/// give back yet keeps the claim's attempt, so the outage attempt is
/// counted after all (a control; see the [crate documentation](crate)).
pub fn set_broken_reclaim_counted(on: bool) {
    set_broken(probe::Break::ReclaimCounted, on);
}

/// A relay's claim takes the messages of paused topics too (a control;
/// see the [crate documentation](crate)).
pub fn set_broken_ignore_pause(on: bool) {
    set_broken(probe::Break::IgnorePause, on);
}

/// An attempt that failed in an outage closes no gate on its topic: the
/// relay keeps claiming and giving back the topic's backlog while the
/// outage lasts (a control; see the [crate documentation](crate)).
pub fn set_broken_outage_ungated(on: bool) {
    set_broken(probe::Break::OutageUngated, on);
}
