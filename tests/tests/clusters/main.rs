//! Deployments a test starts for itself: a Galera cluster, a PostgreSQL
//! standby promoted by hand and Patroni's own failover, pgbouncer in
//! transaction mode without idem's mode (the control of `pgbouncer.rs`),
//! shards on several databases, relay processes killed mid-run. One test
//! binary, a module per file.
//!
//! Nothing here turns `idem_runtime::pooler::transaction_mode` on (the
//! pgbouncer control needs it off).

#[path = "../common"]
mod common {
    pub(crate) mod coupons;
    pub(crate) mod failover;
    pub(crate) mod pgbouncer;
}

mod galera;
mod pg_failover;
mod pg_patroni;
mod pgbouncer_control;
mod processes;
mod shards;
