//! The outbox (`idem-runtime/src/outbox/`) against the real servers:
//! `enqueue`, the relay (delivery, batches, fan-out, leases, push, recovery
//! from lost acknowledgements, the failure bookkeeping), its traces checked
//! against the model, and the operator's API. One test binary, a module
//! per file.
//!
//! The tests share one process, and some turn on the process-wide switches
//! of `idem_runtime::testing` (lost acknowledgements, broken builds for
//! the controls, the conformance trace): those hold
//! [`common::hooks::exclusive`], every other test whose calls or relays
//! commit through idem holds [`common::hooks::shared`].

#[macro_use]
#[path = "../common"]
mod common {
    pub(crate) mod coupons;
    pub(crate) mod hooks;
    pub(crate) mod http;
    #[macro_use]
    pub(crate) mod relay;
}

mod admin_actions;
mod admin_api;
mod attempt_log;
mod batch;
mod booking;
mod conformance;
mod delayed;
mod enqueue;
mod fanout;
mod faults;
mod heartbeat;
mod leases;
mod limits;
mod ordering;
mod outage_gate;
mod pause;
mod push;
mod reclaim_outage;
mod recovery;
mod relay;
