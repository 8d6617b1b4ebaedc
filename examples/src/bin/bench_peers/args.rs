//! The command line.

use clap::Parser;
use idem_examples::bench::outbox::BoxError;

/// idem's relay beside pgbench's per-message limit and sqlxmq, on the same
/// PostgreSQL in one run; SQLite per message; optionally the cost as the
/// queue grows.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bench_peers",
    args_override_self = true,
    after_help = "DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/test"
)]
pub(crate) struct Args {
    /// Messages per idem and sqlxmq run.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub(crate) messages: i64,
    /// Handlers of the relay, pgbench clients, sqlxmq's maximum concurrency.
    #[arg(long, value_name = "C", default_value_t = 16)]
    pub(crate) concurrency: usize,
    /// Messages per claim (0: as many as the concurrency).
    #[arg(long, value_name = "B", default_value_t = 0)]
    pub(crate) batch: u32,
    /// Seconds of the pgbench run.
    #[arg(long, value_name = "S", default_value_t = 10)]
    pub(crate) pgbench_seconds: u32,
    /// Rounds: every variant once per round, in turn; the best round counts.
    #[arg(long, value_name = "R", default_value_t = 1)]
    pub(crate) rounds: usize,
    /// The pgbench binary.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/pgbench")]
    pub(crate) pgbench: String,
    /// sqlxmq's minimum concurrency (it polls for more below it; 0: C/2).
    #[arg(long, value_name = "M", default_value_t = 0)]
    pub(crate) sqlxmq_min: usize,
    /// Leave sqlxmq out (it is built from benches/peers on first use).
    #[arg(long)]
    pub(crate) no_sqlxmq: bool,
    /// Leave every job-queue peer out (sqlxmq, River, graphile_worker, apalis).
    #[arg(long)]
    pub(crate) no_peers: bool,
    /// Messages of the SQLite drain.
    #[arg(long, value_name = "N", default_value_t = 5000)]
    pub(crate) sqlite_messages: i64,
    /// Handlers of the SQLite relay.
    #[arg(long, value_name = "C", default_value_t = 4)]
    pub(crate) sqlite_concurrency: usize,
    /// Messages the SQLite relay claims ahead of its free handler slots
    /// while there is a backlog (`Relay::claim_ahead`; its claims then
    /// take up to the handlers plus these, 64 by default, as the loop's
    /// do). The relay's own default is its concurrency.
    #[arg(long, value_name = "A", default_value_t = 60)]
    pub(crate) sqlite_claim_ahead: usize,
    /// Connections of the SQLite relay's pool. Two, as the README
    /// advises: SQLite has one writer, and each connection a page cache of
    /// its own, which another connection's commit makes stale (sqlx hands
    /// out the connection idle longest, so with one per handler every
    /// transaction read its pages again).
    #[arg(long, value_name = "P", default_value_t = 2)]
    pub(crate) sqlite_connections: u32,
    /// Skip the unmeasured warm-up.
    #[arg(long)]
    pub(crate) no_warmup: bool,
    /// Where to write the chart (SVG); default docs/bench.svg of the
    /// workspace.
    #[arg(long, value_name = "PATH")]
    pub(crate) chart: Option<String>,
    /// Do not write the chart.
    #[arg(long)]
    pub(crate) no_chart: bool,
    /// Only the hot-row variants (one shared row, then ten in varying
    /// order; per message and batched), on PostgreSQL: no peers, no
    /// SQLite, no latency or enqueue runs, no chart.
    #[arg(long)]
    pub(crate) hot_only: bool,
    /// Only the SQLite runs (idem and the sqlx loop beside it, each mode),
    /// no server needed.
    #[arg(long)]
    pub(crate) sqlite_only: bool,
    /// Only the HTTP runs (wrk against the plain handler and the layer).
    #[arg(long)]
    pub(crate) http_only: bool,
    /// Only the queue-growth runs (`--scale`), not the peers.
    #[arg(long)]
    pub(crate) scale_only: bool,
    /// Also measure the cost as the queue grows: claim latency and drain
    /// rate with `--scale-large` pending messages against `--scale-small`.
    #[arg(long)]
    pub(crate) scale: bool,
    /// Pending messages of the small queue.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub(crate) scale_small: i64,
    /// Pending messages of the large queue.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub(crate) scale_large: i64,
    /// Messages drained off each queue.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub(crate) scale_drain: i64,
    /// Claim statements timed per queue.
    #[arg(long, value_name = "N", default_value_t = 300)]
    pub(crate) scale_claims: usize,
    /// Seconds of steady load per mode for the enqueue→effect latency,
    /// push wake-up on and off (0: skip it).
    #[arg(long, value_name = "S", default_value_t = 5)]
    pub(crate) latency_seconds: u64,
    /// Messages per second of that steady load.
    #[arg(long, value_name = "R", default_value_t = 200)]
    pub(crate) latency_rate: u32,
    /// Messages per mode and round of the enqueue throughput with push
    /// wake-up on and off (`bench_enqueue`'s comparison; 0: skip it).
    #[arg(long, value_name = "N", default_value_t = 4000)]
    pub(crate) enqueue_messages: usize,
    /// The producer counts of that comparison, comma-separated.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "8,32"
    )]
    pub(crate) enqueue_producers: Vec<usize>,
    /// Seconds of each `wrk` run against one axum handler, plain and
    /// behind the `Idempotency-Key` layer (new keys, replays); 0: skip it.
    #[arg(long, value_name = "S", default_value_t = 5)]
    pub(crate) http_seconds: u64,
    /// wrk's open connections.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub(crate) http_connections: u32,
    /// The wrk binary.
    #[arg(long, value_name = "PATH", default_value = "wrk")]
    pub(crate) wrk: String,
    /// With `--scale`: records of the large table for the duplicate check
    /// (against `--scale-small`; 0: skip it).
    #[arg(long, value_name = "N", default_value_t = 10_000_000)]
    pub(crate) scale_records: i64,
    /// Duplicate checks timed per table and round (three rounds).
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub(crate) scale_record_calls: u64,
}

impl Args {
    /// The batch resolved (0 becomes the concurrency) and the counts checked.
    pub(crate) fn check(mut self) -> Result<Self, BoxError> {
        if self.batch == 0 {
            self.batch = self.concurrency as u32;
        }
        if self.sqlxmq_min == 0 {
            self.sqlxmq_min = self.concurrency / 2;
        }
        if self.messages < 1
            || self.concurrency < 2
            || self.pgbench_seconds < 1
            || self.sqlite_messages < 1
            || self.sqlite_concurrency < 1
            || self.rounds < 1
        {
            return Err("--messages, --pgbench-seconds, --sqlite-messages and \
                        --sqlite-concurrency and --rounds must be at least 1, --concurrency at least 2"
                .into());
        }
        if self.scale_drain > self.scale_small || self.scale_small > self.scale_large {
            return Err("--scale-drain ≤ --scale-small ≤ --scale-large".into());
        }
        if self.scale_records != 0 && self.scale_records < self.scale_small {
            return Err("--scale-records must be 0 (skip) or at least --scale-small".into());
        }
        if self.scale_only {
            self.scale = true;
        }
        if self.hot_only {
            self.no_chart = true;
            self.latency_seconds = 0;
            self.enqueue_messages = 0;
            self.http_seconds = 0;
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let a = Args::parse_from(["bench_peers"]).check().unwrap();
        assert_eq!(
            (a.messages, a.concurrency, a.batch, a.sqlxmq_min),
            (20_000, 16, 16, 8)
        );
        assert_eq!(
            (a.scale_small, a.scale_large, a.scale_drain, a.scale_records),
            (10_000, 1_000_000, 10_000, 10_000_000)
        );
        assert!(!a.scale && !a.no_sqlxmq);
        let a = Args::parse_from(["bench_peers", "--scale-only"])
            .check()
            .unwrap();
        assert!(a.scale);
        assert!(
            Args::parse_from(["bench_peers", "--scale-drain", "20000"])
                .check()
                .is_err()
        );
    }
}
