//! The example's tables.

use super::PENDING_PAYMENT;
use sqlx::PgPool;

/// Creates idem's tables and the example's (`merchant_orders`, `merchant_payments`)
/// if they do not exist. Safe to run twice, and concurrently.
pub async fn migrate(pool: &PgPool) -> Result<(), idem_runtime::Error> {
    idem_runtime::migrate(pool).await?;
    let mut tx = pool.begin().await?;
    // Concurrent migrations wait for each other instead of racing on the
    // catalog.
    sqlx::query("SELECT pg_advisory_xact_lock(4242424243)")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS merchant_orders (
            id BIGINT PRIMARY KEY,
            amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
            status VARCHAR(32) NOT NULL DEFAULT 'PENDING_PAYMENT',
            paid_by VARCHAR(96),
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            CONSTRAINT ck_merchant_orders_status
                CHECK (status IN ('PENDING_PAYMENT', 'PAID', 'CANCELLED')),
            CONSTRAINT ck_merchant_orders_paid CHECK ((status = 'PAID') = (paid_by IS NOT NULL))
        )",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS merchant_payments (
            platform VARCHAR(16) NOT NULL,
            serial VARCHAR(80) NOT NULL,
            order_id BIGINT NOT NULL REFERENCES merchant_orders (id),
            amount_cents BIGINT NOT NULL,
            paid_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (platform, serial),
            CONSTRAINT uk_merchant_payments_order UNIQUE (order_id)
        )",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Places an order awaiting a payment of `amount_cents`.
pub async fn create_order(pool: &PgPool, id: i64, amount_cents: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO merchant_orders (id, amount_cents, status) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(amount_cents)
        .bind(PENDING_PAYMENT)
        .execute(pool)
        .await?;
    Ok(())
}
