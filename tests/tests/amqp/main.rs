//! RabbitMQ (`idem-runtime/src/amqp/`) end to end against the real broker
//! and database: the relay publishing, consumers acting once, failures
//! retried and dead-lettered, fan-out to subscribers, and a quorum queue's
//! leader killed in a cluster of its own. One test binary, a module per
//! file.
//!
//! The fan-out tests turn lost acknowledgements on, process-wide: they hold
//! [`common::hooks::exclusive`], every other test that consumes holds
//! [`common::hooks::shared`].

#[path = "../common"]
mod common {
    pub(crate) mod amqp;
    pub(crate) mod brokers;
    pub(crate) mod coupons;
    pub(crate) mod hooks;
}

mod cluster;
mod confirm_timeout;
mod db_outage;
mod end_to_end;
mod failures;
mod fanout;
mod headers;
mod heartbeat;
mod restart;
