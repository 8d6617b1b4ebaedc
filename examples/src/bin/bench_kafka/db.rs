//! The tables: each consumer its own coupons and deductions, every coupon
//! of the run created `UNUSED` up front (so the tables are the same size
//! for every round), and the check of what each run did.

use crate::BoxError;
use sqlx::PgPool;
use std::ops::RangeInclusive;

/// Which consumer a table belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Idem,
    Plain,
}

impl Side {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Side::Idem => "idem",
            Side::Plain => "plain rdkafka",
        }
    }

    /// Its coupon and deduction tables.
    pub(crate) fn tables(self) -> (&'static str, &'static str) {
        match self {
            Side::Idem => ("idem_bk_coupon_idem", "idem_bk_deduction_idem"),
            Side::Plain => ("idem_bk_coupon_plain", "idem_bk_deduction_plain"),
        }
    }
}

/// Drops and creates both sides' tables, with coupons `1..=coupons`
/// `UNUSED` in each.
pub(crate) async fn prepare(pool: &PgPool, coupons: i64) -> Result<(), BoxError> {
    for side in [Side::Idem, Side::Plain] {
        let (coupon, deduction) = side.tables();
        let statements = [
            format!("DROP TABLE IF EXISTS {deduction}"),
            format!("DROP TABLE IF EXISTS {coupon}"),
            format!("CREATE TABLE {coupon} (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)"),
            format!(
                "CREATE TABLE {deduction} (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL, \
                 msg_id VARCHAR(64) NOT NULL)"
            ),
            format!("CREATE INDEX {deduction}_coupon ON {deduction} (coupon_id)"),
            format!(
                "INSERT INTO {coupon} (id, status) \
                 SELECT g, 'UNUSED' FROM generate_series(1, {coupons}::bigint) AS g"
            ),
            format!("VACUUM ANALYZE {coupon}"),
        ];
        for s in statements {
            sqlx::raw_sql(sqlx::AssertSqlSafe(s)).execute(pool).await?;
        }
    }
    Ok(())
}

/// What one side's tables hold for the coupons of a run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Effects {
    /// Coupons of the range.
    pub(crate) coupons: i64,
    /// Of those, not `USED`.
    pub(crate) unused: i64,
    /// Of those, with other than exactly one deduction.
    pub(crate) not_once: i64,
    /// Deduction rows of the range.
    pub(crate) deductions: i64,
}

impl Effects {
    /// Every coupon `USED` with exactly one deduction.
    pub(crate) fn once(&self) -> bool {
        self.unused == 0 && self.not_once == 0 && self.deductions == self.coupons
    }

    /// Deductions beyond one per coupon: the double effects.
    pub(crate) fn doubles(&self) -> i64 {
        self.deductions - (self.coupons - self.unused)
    }
}

/// What `side`'s tables hold for the coupons `ids`.
pub(crate) async fn effects(
    pool: &PgPool,
    side: Side,
    ids: &RangeInclusive<i64>,
) -> Result<Effects, BoxError> {
    let (coupon, deduction) = side.tables();
    let sql = format!(
        "SELECT \
           (SELECT COUNT(*) FROM {coupon} WHERE id BETWEEN $1 AND $2), \
           (SELECT COUNT(*) FROM {coupon} WHERE id BETWEEN $1 AND $2 AND status <> 'USED'), \
           (SELECT COUNT(*) FROM {coupon} c WHERE c.id BETWEEN $1 AND $2 \
              AND (SELECT COUNT(*) FROM {deduction} d WHERE d.coupon_id = c.id) <> 1), \
           (SELECT COUNT(*) FROM {deduction} WHERE coupon_id BETWEEN $1 AND $2)"
    );
    let (coupons, unused, not_once, deductions): (i64, i64, i64, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(ids.start())
            .bind(ids.end())
            .fetch_one(pool)
            .await?;
    Ok(Effects {
        coupons,
        unused,
        not_once,
        deductions,
    })
}
