//! The one point where a test harness observes and perturbs the protocol,
//! and the only one: the call and the relay report what they do here and
//! ask here whether to inject a fault, and hold no test code of their own.
//!
//! Nothing is installed in a normal program: every hook is then one
//! atomic load and does nothing. A harness [`install`]s a [`Probe`] once
//! per process; `idem_runtime::testing` (feature `testing`, crate
//! `idem-testing`) is the one the project's tests use: lost commit
//! acknowledgements, an unreadable read-back, injected batch conflicts, a
//! pause before the relay's failure bookkeeping, and the conformance trace
//! checked against the model (`idem-model`).
//!
//! A probe can lose an acknowledgement the database gave, delay, or make
//! a batch lose a conflict: faults real servers produce, which the
//! protocol must survive. It cannot make the protocol itself wrong. The
//! deliberately broken variants that show the tests catching a broken
//! protocol (a batch that releases a failed call's savepoint, …) exist
//! only in a build with `--cfg idem_broken` ([`Break`]), never in one a
//! user makes.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Which commit a hook reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Commit {
    /// The commit of an idempotent call (a handler's transaction).
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
    /// A relay's commit of a batch of messages.
    Batch,
}

impl Commit {
    /// Every kind.
    pub const ALL: [Commit; 6] = [
        Commit::Call,
        Commit::Claim,
        Commit::Renew,
        Commit::Settle,
        Commit::Success,
        Commit::Batch,
    ];
}

/// One protocol event of an outbox message: `kind` (`claim`, `fence`,
/// `commit`, `settle`, …; the shapes are `idem_model::trace`'s) for the
/// holder of attempt `attempt` of message `msg` under the lease owner
/// `owner`, with the kind's own `fields` (a JSON object).
#[derive(Debug)]
#[non_exhaustive]
pub struct Event<'a> {
    /// What happened.
    pub kind: &'a str,
    /// The outbox row id.
    pub msg: i64,
    /// The message's topic.
    pub topic: &'a str,
    /// The attempt the claim wrote.
    pub attempt: i32,
    /// The claim's lease owner (`relay#seq`).
    pub owner: &'a str,
    /// The kind's own fields; an `at` among them is the time the event is
    /// ordered by (taken before the statement it reports, see [`now`]).
    pub fields: serde_json::Value,
}

/// What a harness installs (see the [module documentation](self)). Every
/// method has a default that does nothing.
pub trait Probe: Send + Sync + 'static {
    /// After a commit of `commit` that succeeded: `true` reports it to its
    /// caller as an unknown outcome (the acknowledgement lost), although
    /// it committed.
    fn lose_ack(&self, commit: Commit) -> bool {
        let _ = commit;
        false
    }

    /// Whether [`event`](Probe::event) wants events now (they are built
    /// only then).
    fn traces(&self) -> bool {
        false
    }

    /// A protocol event.
    fn event(&self, event: Event<'_>) {
        let _ = event;
    }

    /// Whether the relay's read-back of a handler commit whose outcome is
    /// unknown fails, as against a database that is failing over.
    fn read_back_fails(&self) -> bool {
        false
    }

    /// A pause before the relay's own failure bookkeeping, widening the
    /// moment in which another relay may claim the message.
    fn before_failure_booking(&self) -> Duration {
        Duration::ZERO
    }

    /// Whether the next commit of a relay batch fails as the loser of a
    /// deadlock does (nothing of it committed).
    fn batch_conflict(&self) -> bool {
        false
    }

    /// A wait before each of the relay's claim statements, before it takes
    /// a connection: `None` claims at once. A harness holds a claim here to
    /// let the database change under it (an outage begin and end) before
    /// the claim runs, the order a claim waiting for a connection sees.
    fn before_claim(&self) -> Option<BoxWait> {
        None
    }
}

/// What [`Probe::before_claim`] waits for.
pub type BoxWait = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

static PROBE: OnceLock<Arc<dyn Probe>> = OnceLock::new();

/// Installs `probe` for the rest of the process: `false` if one was
/// installed already (the first stays).
pub fn install(probe: Arc<dyn Probe>) -> bool {
    PROBE.set(probe).is_ok()
}

fn probe() -> Option<&'static Arc<dyn Probe>> {
    PROBE.get()
}

/// The time an event is ordered by (nanoseconds of the system clock) when
/// events are traced, else 0. Taken before the statement an event reports.
pub fn now() -> u64 {
    match probe() {
        Some(p) if p.traces() => clock(),
        _ => 0,
    }
}

/// The clock events are ordered by: nanoseconds since the Unix epoch.
pub fn clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Reports an event, its fields built only when traced.
pub(crate) fn emit(
    kind: &str,
    msg: i64,
    topic: &str,
    attempt: i32,
    owner: &str,
    fields: impl FnOnce() -> serde_json::Value,
) {
    if let Some(p) = probe().filter(|p| p.traces()) {
        p.event(Event {
            kind,
            msg,
            topic,
            attempt,
            owner,
            fields: fields(),
        });
    }
}

/// [`emit`] for the holder of `lease`.
pub(crate) fn of_lease(
    kind: &str,
    lease: &crate::lease::OutboxLease,
    fields: impl FnOnce() -> serde_json::Value,
) {
    emit(
        kind,
        lease.id(),
        lease.topic(),
        lease.attempt(),
        lease.owner(),
        fields,
    );
}

/// The error a lost acknowledgement produces.
pub fn lost_ack_error() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "injected fault: the commit acknowledgement was lost",
    ))
}

/// The error a commit reports when its acknowledgement is lost, in the
/// error type its caller speaks.
pub(crate) trait LostAck {
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

/// `result`, or the lost acknowledgement's error when the probe loses
/// this successful commit of `commit`: the one hook every commit idem
/// issues goes through.
pub(crate) fn after_commit<T, E: LostAck>(commit: Commit, result: Result<T, E>) -> Result<T, E> {
    match (result, probe()) {
        (Ok(_), Some(p)) if p.lose_ack(commit) => Err(E::lost_ack()),
        (result, _) => result,
    }
}

/// Whether the read-back of an unknown commit fails (see
/// [`Probe::read_back_fails`]).
pub(crate) fn read_back_fails() -> bool {
    probe().is_some_and(|p| p.read_back_fails())
}

/// The probe's pause before the relay's failure bookkeeping, if any.
pub(crate) async fn before_failure_booking() {
    if let Some(d) = probe()
        .map(|p| p.before_failure_booking())
        .filter(|d| !d.is_zero())
    {
        tokio::time::sleep(d).await;
    }
}

/// The probe's wait before a claim statement, if any.
pub(crate) async fn before_claim() {
    if let Some(wait) = probe().and_then(|p| p.before_claim()) {
        wait.await;
    }
}

/// Whether this batch commit loses an injected conflict.
pub(crate) fn batch_conflict() -> bool {
    probe().is_some_and(|p| p.batch_conflict())
}

/// A deliberately broken variant of the protocol, for the controls that
/// show a test catching it. They exist only in a build with
/// `--cfg idem_broken`; in any other, none of them is ever on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Break {
    /// A failed call inside a relay batch's transaction *releases* its
    /// savepoint instead of rolling back to it, so its effects (and its
    /// success mark) commit with the batch.
    BatchSavepoints,
    /// A relay batch does not renew (and so lock) its messages' leases
    /// when it begins: a batch slower than its lease can be taken over.
    BatchLeases,
    /// A call driven by an outbox message leaves its failure to the
    /// relay's write after its rollback: another relay may claim the
    /// message in between, and the attempt goes unrecorded.
    FailureBooking,
    /// A message claimed ahead of a free handler slot waits for it
    /// without renewing its lease.
    QueuedRenewal,
    /// A relay batch that lost a conflict does not shrink the batch size.
    AdaptiveBatching,
    /// An attempt that failed in an outage (the broker or the database
    /// down) counts against `max_attempts` like any failure: the relay's
    /// behaviour before issue 38.
    OutageCounted,
    /// An attempt that failed in an outage closes no gate: the relay keeps
    /// claiming (and giving back) the topic's whole backlog while the
    /// outage lasts.
    OutageUngated,
    /// A broker consumer settles a delivery when it receives it, before
    /// its handler ran (the Kafka consumer stores the record's offset
    /// first, as an auto-committing consumer does): at most once, so a
    /// consumer that dies loses what it had received but not handled.
    SettleFirst,
    /// A relay's claim ignores ordering keys (renders no ordering guard,
    /// see `backend::sql::order_guard`): the messages of one key run side
    /// by side and settle in any order. Read when the relay's routes are
    /// set.
    Unordered,
    /// A claim that takes a message whose outage attempt this relay could
    /// not give back yet (the database came back during the claim) keeps
    /// the claim's attempt: the outage attempt is counted after all.
    ReclaimCounted,
    /// A relay's claim ignores `idem_topic_pause` (renders no pause guard,
    /// see `backend::sql::PAUSE_GUARD_SQL`): a paused topic's messages are
    /// delivered. Read when the relay's routes are set.
    IgnorePause,
}

#[cfg(idem_broken)]
static BROKEN: [std::sync::atomic::AtomicBool; 11] =
    [const { std::sync::atomic::AtomicBool::new(false) }; 11];

/// Turns the broken variant `b` on or off, process-wide (`--cfg
/// idem_broken` builds only).
#[cfg(idem_broken)]
pub fn set_broken(b: Break, on: bool) {
    BROKEN[b as usize].store(on, std::sync::atomic::Ordering::SeqCst);
}

/// Whether the broken variant `b` is on, for an entry-point crate that
/// has a broken variant of its own (the Kafka consumer's
/// [`Break::SettleFirst`]): never, outside a `--cfg idem_broken` build.
pub fn is_broken(b: Break) -> bool {
    broken(b)
}

/// Whether the broken variant `b` is on: never, outside a `--cfg
/// idem_broken` build.
#[cfg(idem_broken)]
pub(crate) fn broken(b: Break) -> bool {
    BROKEN[b as usize].load(std::sync::atomic::Ordering::SeqCst)
}

/// Whether the broken variant `b` is on: never, outside a `--cfg
/// idem_broken` build.
#[cfg(not(idem_broken))]
#[inline(always)]
pub(crate) const fn broken(b: Break) -> bool {
    let _ = b;
    false
}
