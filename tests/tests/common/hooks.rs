//! The process-wide switches of `idem_runtime::testing` (lost commit
//! acknowledgements, deliberately broken builds, the relay's settle delay,
//! the conformance trace), for a test binary whose tests share one process
//! with tests that turn them on.
//!
//! A test that turns a switch on holds [`exclusive`] meanwhile: no other
//! test holding [`exclusive`] or [`shared`] runs beside it, and every
//! switch is off again when the guard drops, also on a failed assertion.
//! Every other test of such a binary whose calls or relays commit through
//! idem holds [`shared`], so that no switch is on while it runs. Tests
//! that commit nothing through idem (a builder that panics, the operator's
//! queries, `enqueue` in the caller's transaction) hold neither.

use idem_runtime::testing;
use std::time::Duration;
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static SWITCHES: RwLock<()> = RwLock::const_new(());

/// Held by a test that turns switches on; turns them all off when dropped.
#[must_use = "the switches are the test's only while this is held"]
pub(crate) struct Exclusive {
    _turn: RwLockWriteGuard<'static, ()>,
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        testing::set_lost_ack_rate(0.0);
        testing::set_lost_ack_kinds(&testing::Kind::ALL);
        testing::set_unreadable_read_backs(false);
        testing::set_settle_delay(Duration::ZERO);
        testing::set_broken_failure_booking(false);
        testing::set_broken_batch_savepoints(false);
        testing::set_broken_batch_leases(false);
        testing::set_broken_outage_counted(false);
        testing::set_broken_outage_ungated(false);
        testing::set_broken_ignore_pause(false);
        testing::set_broken_settle_first(false);
        testing::set_broken_queued_renewal(false);
        testing::set_broken_adaptive_batching(false);
        testing::set_batch_conflicts(0);
        testing::trace::stop();
    }
}

/// Waits until no other test of the binary holds [`exclusive`] or
/// [`shared`]; the switches are this test's until the guard drops.
pub(crate) async fn exclusive() -> Exclusive {
    Exclusive {
        _turn: SWITCHES.write().await,
    }
}

/// Waits until no test holds [`exclusive`]: every switch is off until the
/// guard drops.
pub(crate) async fn shared() -> RwLockReadGuard<'static, ()> {
    SWITCHES.read().await
}

static SERVERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held (after [`shared`] or [`exclusive`]) by a test that starts server
/// instances of its own (a cluster, a node it stops and starts again): one
/// such test at a time in a binary, so that on a 2-core machine their
/// servers do not starve each other into time-outs.
#[allow(dead_code)] // the binaries without such tests (outbox)
pub(crate) async fn own_servers() -> tokio::sync::MutexGuard<'static, ()> {
    SERVERS.lock().await
}
