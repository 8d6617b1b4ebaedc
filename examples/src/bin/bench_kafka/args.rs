//! The command line.

use crate::BoxError;
use clap::Parser;

/// idem's Kafka consumer (an `#[idempotent]` state_machine handler)
/// against a plain rdkafka consumer doing the same database work, on the
/// same records, in one run.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bench_kafka",
    args_override_self = true,
    after_help = "DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/test; \
                  the broker is a nisshi of the run's own (IDEM_NISSHI, else \
                  /opt/idem-brokers/nisshi/bin/nisshi, else nisshi on the PATH) \
                  unless --brokers names one"
)]
pub(crate) struct Args {
    /// Records per round (each consumed by both consumers).
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub(crate) records: i64,
    /// Partitions of each topic.
    #[arg(long, value_name = "P", default_value_t = 4)]
    pub(crate) partitions: i32,
    /// Rounds: both consumers once per round, taking turns at going first;
    /// the best round of each counts.
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Records of the duplicate run, each published twice (0: no
    /// duplicate run).
    #[arg(long, value_name = "N", default_value_t = 5_000)]
    pub(crate) duplicates: i64,
    /// Connections of the database pool the handlers share.
    #[arg(long, value_name = "C", default_value_t = 8)]
    pub(crate) connections: u32,
    /// Seconds a consumer may take over one run before the benchmark
    /// gives up.
    #[arg(long, value_name = "S", default_value_t = 600)]
    pub(crate) timeout: u64,
    /// A running Kafka broker (`host:port`, or several separated by
    /// commas) instead of a nisshi of the run's own.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) brokers: Option<String>,
}

impl Args {
    pub(crate) fn check(self) -> Result<Self, BoxError> {
        if self.records < 1 || self.rounds < 1 || self.partitions < 1 || self.connections < 1 {
            return Err(
                "--records, --rounds, --partitions and --connections must be at least 1".into(),
            );
        }
        if self.duplicates < 0 {
            return Err("--duplicates must not be negative".into());
        }
        Ok(self)
    }

    /// Coupons per consumer: every round's, then the duplicate run's.
    pub(crate) fn coupons(&self) -> i64 {
        self.records * self.rounds as i64 + self.duplicates
    }
}
