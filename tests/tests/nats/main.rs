//! NATS JetStream (`idem-runtime/src/nats/`) end to end against the real
//! server and database: the relay publishing, consumers acting once,
//! redeliveries, naks and dead letters, fan-out to subscribers, and a
//! stream's leader killed in a cluster of its own. One test binary, a
//! module per file.
//!
//! The fan-out tests turn lost acknowledgements on, process-wide: they hold
//! [`common::hooks::exclusive`], every other test that consumes holds
//! [`common::hooks::shared`].

#[path = "../common"]
mod common {
    pub(crate) mod brokers;
    pub(crate) mod hooks;
    pub(crate) mod nats;
}

mod cluster;
mod db_outage;
mod end_to_end;
mod fanout;
mod headers;
mod restart;
