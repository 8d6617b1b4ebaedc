//! The outbox coupon workload `bench_outbox` and `bench_peers` measure:
//! idem's relay draining "deduct this coupon" messages into an
//! `#[idempotent(strategy = state_machine)]` handler ([`idem_run`]), and
//! `pgbench` running the same statements per message ([`pgbench_run`]).
//! See `bench_outbox`'s documentation for the method.

mod idem;
mod pgbench;

pub use idem::{
    Commits, CouponState, DeductCoupon, Drained, IdemRun, Rows, drain, drained, idem_run,
};
pub use pgbench::{PgbenchRun, pgbench_rows, pgbench_run, pgbench_scripts};

use idem_runtime::Dialect;
use sqlx::PgPool;

/// The benchmarks' error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The idem side's tables (the outbox is idem's own `idem_outbox`).
pub const COUPON: &str = "bench_outbox_coupon";
/// The idem side's ledger.
pub const LEDGER: &str = "bench_outbox_ledger";
/// The hot-row workload's shared stock counter (see [`Rows::Hot`]).
pub const STOCK: &str = "bench_outbox_stock";
/// The pgbench side's tables.
const PGB_COUPON: &str = "bench_outbox_pgb_coupon";
const PGB_LEDGER: &str = "bench_outbox_pgb_ledger";
const PGB_OUTBOX: &str = "bench_outbox_pgb_outbox";
/// The lease both sides claim with (the relay's default).
pub const LEASE_SECS: u64 = 30;
/// Order ids are the coupon id plus this.
pub const ORDER_OFFSET: i64 = 2_000_000_000;

/// How a run is set up: both sides use the same counts.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Messages per idem run (and the least rows of a pgbench run).
    pub messages: i64,
    /// Handlers of the relay, and pgbench clients.
    pub concurrency: usize,
    /// Messages per claim.
    pub batch: u32,
    /// The pgbench binary.
    pub pgbench: String,
}

/// Migrates idem's tables, deletes messages of interrupted earlier runs,
/// and creates fresh bench tables (the pgbench outbox is idem's own DDL,
/// renamed).
pub async fn prepare(admin: &PgPool) -> Result<(), BoxError> {
    idem_runtime::migrate(admin).await?;
    // Pending rows of a topic nobody routes would be scanned by every claim.
    sqlx::query("DELETE FROM idem_outbox WHERE topic LIKE 'bench-outbox.%'")
        .execute(admin)
        .await?;
    let mut ddl = vec![
        format!(
            "DROP TABLE IF EXISTS {LEDGER}, {COUPON}, {STOCK}, {PGB_LEDGER}, {PGB_COUPON}, \
             {PGB_OUTBOX}"
        ),
        format!("CREATE TABLE {STOCK} (id INT PRIMARY KEY, units BIGINT NOT NULL)"),
        format!("CREATE TABLE {COUPON} (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)"),
        format!("CREATE TABLE {PGB_COUPON} (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)"),
    ];
    for ledger in [LEDGER, PGB_LEDGER] {
        ddl.push(format!(
            "CREATE TABLE {ledger} (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL, \
             msg_id VARCHAR(64) NOT NULL)"
        ));
        ddl.push(format!(
            "CREATE INDEX idx_{ledger}_coupon ON {ledger} (coupon_id)"
        ));
    }
    ddl.extend(
        idem_runtime::schema::statements(Dialect::Postgres)
            .iter()
            .filter(|s| {
                s.contains("idem_outbox") && !s.contains("advisory") && !s.contains("history")
            })
            .map(|s| s.replace("idem_outbox", PGB_OUTBOX)),
    );
    // Schema version 3's columns, which idem's claim reads (its ordering
    // guard; no message of either side has a key).
    ddl.push(format!(
        "ALTER TABLE {PGB_OUTBOX} ADD COLUMN ordering_key VARCHAR(128), ADD COLUMN headers TEXT"
    ));
    ddl.push(format!(
        "CREATE INDEX idx_{PGB_OUTBOX}_order ON {PGB_OUTBOX} (ordering_key, id) \
         WHERE status = 'pending' AND ordering_key IS NOT NULL"
    ));
    for stmt in ddl {
        sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
            .execute(admin)
            .await?;
    }
    Ok(())
}

/// The median of `v`.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The largest of `v` (NaN if empty).
pub fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}
