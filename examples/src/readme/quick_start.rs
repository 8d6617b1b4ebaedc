//! README, "Quick start": a whole program on embedded SQLite (no server),
//! a state-machine handler called twice, the second call a duplicate.
//! Its tables need no `readme_` prefix: the in-memory database is its own.

// README: quick_start
use idem_runtime::{idempotent, Outcome, State};
use sqlx::{SqliteConnection, SqlitePool};

#[derive(Clone, Copy, State)]            // stored as "UNUSED", "USED"
enum CouponState { Unused, Used }

#[idempotent(
    key = "coupon-deduct:{order_id}",    // the action's identity, checked at compile time
    strategy = state_machine,            // the coupon's own state decides
    table = "coupon", id = coupon_id,
    from = CouponState::Unused, to = CouponState::Used,
)]
async fn deduct_coupon(tx: &mut SqliteConnection, coupon_id: i64, order_id: i64) -> Result<(), sqlx::Error> {
    // Only the mutation: the locked read, the transition and the commit are generated.
    sqlx::query("INSERT INTO deduction (coupon_id, order_id) VALUES (?, ?)")
        .bind(coupon_id).bind(order_id).execute(&mut *tx).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = SqlitePool::connect("sqlite::memory:").await?;
    idem_runtime::migrate(&pool).await?;  // idem's tables
    sqlx::query("CREATE TABLE coupon (id INTEGER PRIMARY KEY, status TEXT NOT NULL)").execute(&pool).await?;
    sqlx::query("CREATE TABLE deduction (coupon_id INTEGER, order_id INTEGER)").execute(&pool).await?;
    sqlx::query("INSERT INTO coupon VALUES (7, 'UNUSED')").execute(&pool).await?;

    assert_eq!(deduct_coupon(&pool, 7, 42).await?, Outcome::Executed(()));
    // The retry after a lost commit acknowledgement: answered, not run again.
    assert_eq!(deduct_coupon(&pool, 7, 42).await?, Outcome::Duplicate(None));
    Ok(())
}
// README: end

/// Runs the quick start's `main` (its asserts are the test).
pub fn run() -> Result<(), Box<dyn std::error::Error>> {
    main()
}
