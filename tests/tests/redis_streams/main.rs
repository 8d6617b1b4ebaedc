//! Redis Streams (the `idem-redis-streams` crate, `idem_runtime::redis_streams`)
//! end to end, against Redis (the shared one at `IDEM_TEST_REDIS_URL`, each
//! test on streams of its own; a `redis-server` of the test's own for the
//! test that restarts it) and the databases: a consumer group acting once
//! under duplicate entries and lost commit acknowledgements on the three
//! backends, a consumer process killed (SIGKILL) holding committed but
//! unacknowledged entries that a survivor claims, Redis killed and
//! restarted mid-run under the consumer and the outbox publisher, the
//! consumer's database down under load, poison entries dead-lettered with
//! their reasons, the stream lost under the consumer (its group created
//! again), and a control without idem under the same kill.
//!
//! Every test that turns lost acknowledgements on holds
//! [`common::hooks::exclusive`]; the others hold
//! [`common::hooks::shared`], and the ones that start or kill processes
//! [`common::hooks::own_servers`] too.

#[path = "../common"]
mod common {
    pub(crate) mod hooks;
    pub(crate) mod redis_streams;
}

mod acts_once;
mod db_outage;
mod dead_letter;
mod headers;
mod killed;
mod lost_stream;
mod restart;
