//! The command line.

use super::BoxError;
use clap::Parser;
use std::time::Duration;

/// Replays the coupon double-deduction incident at peak: the article's
/// fault version and an `#[idempotent]` handler, side by side.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "coupon",
    args_override_self = true,
    after_help = "DATABASE_URL selects the database (postgres://, mysql://); default: SQLite\n\
                  in a temporary file."
)]
pub struct Args {
    /// Orders, each with a coupon and a message.
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub orders: i64,
    /// Relays draining each topic at once.
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub relays: usize,
    /// Handlers running at once per relay.
    #[arg(long, value_name = "C", default_value_t = 8)]
    pub concurrency: usize,
    /// Fraction of COMMIT acknowledgements lost.
    #[arg(long, value_name = "F", default_value_t = 0.2)]
    pub lost_ack_rate: f64,
    /// Fraction of orders whose message the producer publishes twice.
    #[arg(long, value_name = "F", default_value_t = 0.3)]
    pub redelivery_rate: f64,
    /// Stop draining after this long, in seconds.
    #[arg(long = "timeout", value_name = "SECS", default_value_t = 120.0)]
    pub timeout_secs: f64,
    /// Skip the fault-free reference drain (run first, to compare drain
    /// times).
    #[arg(long)]
    pub no_reference: bool,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args::parse_from(["coupon"])
    }
}

impl Args {
    /// `--timeout`.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs)
    }

    /// The checks clap does not make: counts of at least 1, rates between 0
    /// and 1, a timeout Duration can hold.
    pub fn check(&self) -> Result<(), BoxError> {
        if self.orders < 1 || self.relays < 1 || self.concurrency < 1 {
            return Err("--orders, --relays and --concurrency must be at least 1".into());
        }
        for (name, rate) in [
            ("--lost-ack-rate", self.lost_ack_rate),
            ("--redelivery-rate", self.redelivery_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name} must be between 0 and 1").into());
            }
        }
        Duration::try_from_secs_f64(self.timeout_secs)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_flags() {
        let d = Args::default();
        assert_eq!((d.orders, d.relays, d.concurrency), (500, 3, 8));
        assert_eq!((d.lost_ack_rate, d.redelivery_rate), (0.2, 0.3));
        assert_eq!(d.timeout(), Duration::from_secs(120));
        assert!(!d.json);
        let a = Args::parse_from([
            "coupon",
            "--orders",
            "50",
            "--relays",
            "2",
            "--concurrency",
            "4",
            "--lost-ack-rate",
            "0.5",
            "--redelivery-rate",
            "0",
            "--timeout",
            "1.5",
            "--json",
            "--orders",
            "60",
        ]);
        assert_eq!((a.orders, a.relays, a.concurrency), (60, 2, 4));
        assert_eq!((a.lost_ack_rate, a.redelivery_rate), (0.5, 0.0));
        assert_eq!(a.timeout(), Duration::from_millis(1500));
        assert!(a.json);
        assert!(a.check().is_ok());
    }

    #[test]
    fn out_of_range() {
        let a = Args::parse_from(["coupon", "--lost-ack-rate", "1.5"]);
        assert_eq!(
            a.check().unwrap_err().to_string(),
            "--lost-ack-rate must be between 0 and 1"
        );
        let a = Args::parse_from(["coupon", "--relays", "0"]);
        assert!(a.check().is_err());
    }
}
