//! The code of the README and of the guide (`idem_runtime::guide`),
//! compiled: each ```rust block of `README.md` and of the guide's chapters
//! (`idem-runtime/src/guide/*.md`, the `*.doctest.md` files aside) is the
//! region of one of these files between a `// README: <name>` line and the
//! next `// README: end` line (without the region's common indentation).
//! Imports, tables and wrapper functions the blocks do not show sit
//! outside the markers.
//!
//! `tests/readme_snippets.rs` fails when a block is not such a region, or
//! a region is shown nowhere, and runs the flows against the real servers
//! (PostgreSQL, Redis, RabbitMQ, NATS, Kafka; the quick start on SQLite),
//! asserting their effects in the database.
//!
//! The files are not formatted by rustfmt (`#[rustfmt::skip]` on each
//! `mod`): the regions are laid out as the blocks show them.
//!
//! Tables, topics and queues are prefixed `readme_` / `readme.` so that
//! these flows never meet another test's on a shared server (the quick
//! start's in-memory SQLite database is its own).

use sqlx::PgPool;

#[rustfmt::skip]
pub mod acts_once;
#[rustfmt::skip]
pub mod archive;
#[rustfmt::skip]
pub mod by_hand;
#[rustfmt::skip]
pub mod cache;
#[rustfmt::skip]
pub mod console;
#[rustfmt::skip]
pub mod errors;
#[rustfmt::skip]
pub mod fanout;
#[rustfmt::skip]
pub mod http;
#[rustfmt::skip]
pub mod kafka;
#[rustfmt::skip]
pub mod rocketmq;
#[rustfmt::skip]
pub mod nats;
#[rustfmt::skip]
pub mod options;
#[rustfmt::skip]
pub mod outbox;
#[rustfmt::skip]
pub mod quick_start;
#[rustfmt::skip]
pub mod rabbitmq;
#[rustfmt::skip]
pub mod record;
#[rustfmt::skip]
pub mod redis_streams;
#[rustfmt::skip]
pub mod shards;
#[rustfmt::skip]
pub mod state_machine;
#[rustfmt::skip]
pub mod transaction;
#[rustfmt::skip]
pub mod unique_insert;
#[rustfmt::skip]
pub mod using;

/// The tables the README's handlers write (idem's own come from
/// [`using::create_idem_tables`]). Safe to run concurrently.
pub async fn create_tables(pool: &PgPool) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    // Concurrent `CREATE TABLE IF NOT EXISTS` can race on PostgreSQL.
    sqlx::query("SELECT pg_advisory_xact_lock(77012)")
        .execute(&mut *tx)
        .await?;
    for stmt in [
        "CREATE TABLE IF NOT EXISTS readme_coupon (id BIGINT PRIMARY KEY, \
         status VARCHAR(16) NOT NULL, used_by VARCHAR(128))",
        "CREATE TABLE IF NOT EXISTS readme_deduction (coupon_id BIGINT NOT NULL, order_id BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS readme_orders (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL)",
        "CREATE TABLE IF NOT EXISTS readme_notice (id BIGSERIAL PRIMARY KEY, user_id BIGINT NOT NULL, text TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS readme_order_log (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL, step TEXT NOT NULL, tenant TEXT)",
        "CREATE TABLE IF NOT EXISTS readme_payment (serial VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)",
        "CREATE UNIQUE INDEX IF NOT EXISTS uk_readme_payment_serial ON readme_payment (serial)",
        "CREATE TABLE IF NOT EXISTS readme_transfer (id BIGSERIAL PRIMARY KEY, body BYTEA NOT NULL)",
    ] {
        sqlx::query(stmt).execute(&mut *tx).await?;
    }
    tx.commit().await
}
