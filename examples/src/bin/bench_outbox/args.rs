//! The command line.

use super::BoxError;
use clap::Parser;

/// Outbox end-to-end throughput against `pgbench` running the same
/// statements.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bench_outbox",
    args_override_self = true,
    after_help = "DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/test"
)]
pub(super) struct Args {
    /// Messages per idem run.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub(super) messages: i64,
    /// Handlers of the relay, and pgbench clients.
    #[arg(long, value_name = "C", default_value_t = 16)]
    pub(super) concurrency: usize,
    /// Messages per claim (0: as many as the concurrency).
    #[arg(long, value_name = "B", default_value_t = 0)]
    pub(super) batch: u32,
    /// Seconds of each pgbench run.
    #[arg(long, value_name = "S", default_value_t = 10)]
    pub(super) pgbench_seconds: u32,
    /// Rounds of one idem run and one pgbench run.
    #[arg(long, value_name = "R", default_value_t = 2)]
    pub(super) rounds: usize,
    /// The pgbench binary.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/pgbench")]
    pub(super) pgbench: String,
    /// Skip the unmeasured warm-up of each side.
    #[arg(long)]
    pub(super) no_warmup: bool,
    /// Print the two pgbench scripts.
    #[arg(long)]
    pub(super) show_scripts: bool,
}

impl Args {
    /// The batch resolved (0 becomes the concurrency: the relay claims at
    /// most as many messages as it has free handlers), and the counts
    /// checked.
    pub(super) fn check(mut self) -> Result<Self, BoxError> {
        if self.batch == 0 {
            self.batch = self.concurrency as u32;
        }
        if self.messages < 1 || self.concurrency < 1 || self.pgbench_seconds < 1 || self.rounds < 1
        {
            return Err(
                "--messages, --concurrency, --pgbench-seconds and --rounds must be at least 1"
                    .into(),
            );
        }
        Ok(self)
    }

    /// Whether to warm up first (not `--no-warmup`).
    pub(super) fn warmup(&self) -> bool {
        !self.no_warmup
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let a = Args::parse_from(["bench_outbox"]).check().unwrap();
        assert_eq!((a.messages, a.concurrency, a.batch), (20_000, 16, 16));
        assert_eq!((a.pgbench_seconds, a.rounds), (10, 2));
        assert_eq!(a.pgbench, "/usr/bin/pgbench");
        assert!(a.warmup() && !a.show_scripts);
    }

    #[test]
    fn flags() {
        let a = Args::parse_from([
            "bench_outbox",
            "--messages",
            "5",
            "--concurrency",
            "4",
            "--batch",
            "8",
            "--pgbench-seconds",
            "3",
            "--rounds",
            "1",
            "--pgbench",
            "/bin/pgb",
            "--no-warmup",
            "--show-scripts",
        ])
        .check()
        .unwrap();
        assert_eq!((a.messages, a.concurrency, a.batch), (5, 4, 8));
        assert_eq!((a.pgbench_seconds, a.rounds), (3, 1));
        assert_eq!(a.pgbench, "/bin/pgb");
        assert!(!a.warmup() && a.show_scripts);
        assert!(
            Args::parse_from(["bench_outbox", "--rounds", "0"])
                .check()
                .is_err()
        );
    }
}
