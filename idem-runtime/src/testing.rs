//! Fault injection for tests and demonstrations (cargo feature `testing`).
//!
//! [`set_lost_ack_rate`] makes a fraction of idempotent calls behave as if
//! the database's commit acknowledgement were lost: the transaction
//! commits, then the call reports [`Error::CommitUnknown`](crate::Error)
//! anyway — the article's incident, on a database (SQLite) where no network
//! sits between the application and the commit. Against a server, use a
//! real fault proxy instead.
//!
//! Never enable this feature in production builds.

use std::sync::atomic::{AtomicU64, Ordering};

static RATE_PPM: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);
static INJECTED: AtomicU64 = AtomicU64::new(0);

/// Loses the acknowledgement of this fraction (0.0 to 1.0) of commits of
/// idempotent calls, process-wide. 0.0 turns injection off.
pub fn set_lost_ack_rate(rate: f64) {
    let ppm = (rate.clamp(0.0, 1.0) * 1_000_000.0) as u64;
    RATE_PPM.store(ppm, Ordering::SeqCst);
}

/// How many acknowledgements were lost so far.
pub fn lost_acks() -> u64 {
    INJECTED.load(Ordering::SeqCst)
}

/// Decides, after a successful commit, whether to report it as unknown.
pub(crate) fn lose_ack() -> bool {
    let ppm = RATE_PPM.load(Ordering::Relaxed);
    if ppm == 0 {
        return false;
    }
    // A deterministic, evenly spread sequence: the fractional parts of
    // n·φ (the top bits of the golden-ratio product), so runs are
    // reproducible and every stretch of calls sees the set rate.
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let frac = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    let lose = frac * 1_000_000 < ppm << 32;
    if lose {
        INJECTED.fetch_add(1, Ordering::SeqCst);
    }
    lose
}

/// The error a lost acknowledgement produces.
pub(crate) fn lost_ack_error() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "injected fault: the commit acknowledgement was lost",
    ))
}

/// Commits `tx` under the same injection as idempotent calls: at the set
/// rate, the commit happens and then an I/O error is returned anyway. For
/// hand-written handlers (such as the article's fault version) in tests
/// and demonstrations.
pub async fn commit<DB: sqlx::Database>(tx: sqlx::Transaction<'_, DB>) -> Result<(), sqlx::Error> {
    tx.commit().await?;
    if lose_ack() {
        return Err(lost_ack_error());
    }
    Ok(())
}
