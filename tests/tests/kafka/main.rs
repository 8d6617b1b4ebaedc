//! Kafka (`idem-runtime/src/kafka/`, the `idem-kafka` crate) end to end,
//! against a Kafka-protocol broker each test starts for itself (nisshi,
//! `idem_testkit::cluster::kafka`) and the databases: consumer groups
//! acting once under duplicates and lost acknowledgements on the three
//! backends, a member killed (SIGKILL) so its partitions move, the broker
//! killed and restarted mid-run, the outbox publisher losing its
//! acknowledgements, the consumer's database down under load, a slow
//! partition paused without holding back the others. One test binary, a module per file.
//!
//! Every test but the control turns lost acknowledgements on or starts a
//! broker it kills: they run one at a time ([`common::hooks::exclusive`]
//! and [`common::hooks::own_servers`]).

#[path = "../common"]
mod common {
    pub(crate) mod hooks;
    pub(crate) mod kafka;
}

mod acts_once;
mod db_outage;
mod flow;
mod headers;
mod rebalance;
mod relay;
