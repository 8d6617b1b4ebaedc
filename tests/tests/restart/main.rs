//! Database restarts under a running service (issue 38): a PostgreSQL and
//! a MariaDB server of the test's own (`idem_testkit::cluster::single`,
//! its own port and data directory) stopped with SIGTERM or SIGKILL for
//! longer than the relay's back-off budget and the leases, then started
//! again on the same port and data, while a relay (`max_attempts` 3)
//! delivers to an `#[idempotent]` handler and HTTP clients send
//! `Idempotency-Key` requests, retrying the same key until answered.
//! Checked in the database: every message `success`, none dead-lettered,
//! every effect once, every request's effect once. The figures (outage,
//! drain after the restart) are printed, never asserted as timings.
//!
//! Two layouts per server: everything on the restarted server (the
//! outbox, the handler's effects, the HTTP layer's records), and the
//! outbox on the shared server with only the handler's database
//! restarted: there the relay books every attempt the outage fails, and
//! the control (an outage counted as an attempt, `--cfg idem_broken`)
//! dead-letters healthy messages.

#[path = "../common"]
mod common {
    pub(crate) mod coupons;
    // `exclusive` only: every test here runs alone.
    #[allow(dead_code)]
    pub(crate) mod hooks;
    pub(crate) mod http;
}

#[macro_use]
mod run;
#[macro_use]
mod suite;
mod clients;
mod hold;

mod mariadb;
mod postgres;

pub(crate) use idem_testkit::wait_for;
pub(crate) use std::time::{Duration, Instant};
