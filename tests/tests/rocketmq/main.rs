//! RocketMQ (`idem-rocketmq`, `idem_runtime::rocketmq`) end to end,
//! against a name server and brokers each test starts for itself
//! (rocketmq-rust, `idem_testkit::cluster::rocketmq`) and the databases:
//! a consumer group acting once under duplicates and lost
//! acknowledgements on the three backends, the outbox relay publishing
//! through lost acknowledgements, and the article's incident: the broker
//! master killed after the consumer committed effects whose offsets it had
//! not committed. One test binary, a module per file.
//!
//! Every test but the control turns lost acknowledgements on or starts
//! servers it kills: they run one at a time ([`common::hooks::exclusive`]
//! and [`common::hooks::own_servers`]).

#[path = "../common"]
mod common {
    pub(crate) mod hooks;
    pub(crate) mod rocketmq;
}

mod acts_once;
mod db_outage;
mod headers;
mod incident;
mod relay;
